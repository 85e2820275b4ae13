"""BiCuRL controller: Eq. 6 patience/KL fallback and the released code's non-inferiority gate."""

import pytest

from bat_jax.benchmarks.imaging.stages import LATE_STAGES, STAGES
from bat_jax.curriculum.controller import (ACCEPT, DECISIONS, FALLBACK, HOLD, RULE_GATE, UNSCORED, Controller,
                                           ControllerConfig, ControllerState, Evaluation, NonInferiorityMargins,
                                           gate_failures)


def run(overalls, kls=None, config=ControllerConfig()):
    c = Controller(config)
    kls = kls or [None] * len(overalls)
    return c, [c.observe(r, f"ckpt-{r}", m, kl) for r, (m, kl) in enumerate(zip(overalls, kls), start=1)]


@pytest.mark.parametrize("scale", [0.01, 1.0])  # the 0-100 numbers and the library's 0-1 scale
def test_three_consecutive_drops_fall_back_to_round_2(scale):
    c, ds = run([s * scale for s in (30, 35, 34, 33, 32)])
    assert [d.decision for d in ds] == [ACCEPT, ACCEPT, ACCEPT, ACCEPT, FALLBACK]
    assert [d.drops for d in ds] == [0, 0, 1, 2, 0]
    assert ds[4].retained_checkpoint == "ckpt-2" and ds[4].best_checkpoint == "ckpt-2"
    assert ds[4].best_overall == pytest.approx(35 * scale) and ds[4].held
    assert "3 consecutive" in ds[4].reasons[0]
    assert c.state.previous_overall == pytest.approx(35 * scale) and c.state.drops == 0


@pytest.mark.parametrize("scale", [0.01, 1.0])
def test_counter_resets_on_a_rise(scale):
    _, ds = run([s * scale for s in (30, 29, 31, 30, 29)])
    assert all(d.decision == ACCEPT for d in ds)
    assert [d.drops for d in ds] == [0, 1, 0, 1, 2]
    assert ds[-1].retained_checkpoint == "ckpt-5" and ds[-1].best_checkpoint == "ckpt-3"


def test_kl_above_tau_falls_back_whatever_the_score():
    _, ds = run([0.30, 0.35, 0.90], kls=[None, 0.02, 0.11])
    assert ds[2].decision == FALLBACK and ds[2].retained_checkpoint == "ckpt-2"
    assert ds[2].best_checkpoint == "ckpt-2" and ds[2].reasons == ("kl 0.11 > tau 0.1",)
    _, ds = run([0.30, 0.35, 0.36], kls=[None, 0.02, 0.10])  # exactly tau is not above tau
    assert ds[2].decision == ACCEPT and ds[2].best_checkpoint == "ckpt-3"
    _, ds = run([0.30, 0.35, 0.36], kls=[None, None, 0.5], config=ControllerConfig(kl_threshold=None))
    assert ds[2].decision == ACCEPT


def test_after_fallback_drops_are_counted_against_the_best():
    _, ds = run([0.30, 0.35, 0.34, 0.33, 0.32, 0.34, 0.33, 0.32, 0.31])
    # round 5 falls back to ckpt-2 (0.35); 0.34 < 0.35 starts a new run of drops
    assert [d.drops for d in ds[4:]] == [0, 1, 2, 0, 1]
    assert [d.decision for d in ds[4:]] == [FALLBACK, ACCEPT, ACCEPT, FALLBACK, ACCEPT]
    assert ds[7].retained_checkpoint == "ckpt-2"


def test_state_roundtrip_resumes_identically():
    c, _ = run([0.30, 0.35, 0.34])
    resumed = Controller(ControllerConfig(), ControllerState.from_dict(c.state.to_dict()))
    a = c.observe(4, "ckpt-4", 0.33)
    b = resumed.observe(4, "ckpt-4", 0.33)
    assert a == b and a.drops == 2


#: The released gate's margins on the imaging suite (its late stages S3-S5).
MARGINS = NonInferiorityMargins(late_stages=LATE_STAGES)


def ev(overall, task=0.5, stages=(0.5,) * 5, tracks=None, cells=None):
    return Evaluation(overall, task, dict(zip(("S1", "S2", "S3", "S4", "S5"), stages)), tracks or {"vqa": 0.5}, cells)


def released_gate(candidate, incumbent):
    """The released gate's checks (scripts/check_bat_core_gate.py: evaluate_gate, training healthy), in plain
    Python: promote iff every check passes."""
    t = {"maximum_overall_drop": 0.01, "maximum_task_drop": 0.03, "maximum_per_track_drop": 0.05,
         "maximum_late_stage_drop": 0.03, "catastrophic_overall_drop": 0.20}
    od, td = incumbent.overall - candidate.overall, incumbent.task - candidate.task
    tracks = [incumbent.track_scores[k] - candidate.track_scores[k] for k in incumbent.track_scores]
    late = [incumbent.stage_scores[s] - candidate.stage_scores[s] for s in ("S3", "S4", "S5")]
    return (od <= t["maximum_overall_drop"] and td <= t["maximum_task_drop"]
            and max(tracks, default=0.0) <= t["maximum_per_track_drop"]
            and max(late) <= t["maximum_late_stage_drop"] and od < t["catastrophic_overall_drop"])


def test_noninferiority_gate_margins():
    assert NonInferiorityMargins().late_stages is None  # the run's benchmark fills them in (the imaging suite: S3-S5)
    m = MARGINS
    assert (m.overall, m.task, m.track, m.late_stage, m.catastrophic_overall, m.late_stages) == (
        0.01, 0.03, 0.05, 0.03, 0.20, ("S3", "S4", "S5"))  # REFERENCE.md / released THRESHOLDS
    base = ev(0.50)
    assert gate_failures(ev(0.491), base, m) == []
    assert gate_failures(ev(0.485), base, m) == ["overall fell 0.0150 > 0.01"]
    assert gate_failures(ev(0.50, task=0.46), base, m) == ["task fell 0.0400 > 0.03"]
    assert gate_failures(ev(0.50, tracks={"vqa": 0.44}), base, m) == ["track vqa fell 0.0600 > 0.05"]
    assert gate_failures(ev(0.50, stages=(0.5, 0.5, 0.46, 0.5, 0.5)), base, m) == ["stage S3 fell 0.0400 > 0.03"]
    # S1 / S2 have no margin and no per-stage catastrophic limit (released: the 0.20 drop is Overall's)
    assert gate_failures(ev(0.50, stages=(0.29, 0.5, 0.5, 0.5, 0.5)), base, m) == []
    assert gate_failures(ev(0.29), base, m) == ["catastrophic: overall fell 0.2100 >= 0.2"]
    assert gate_failures(ev(0.30), base, m) == ["catastrophic: overall fell 0.2000 >= 0.2"]  # released: drop < 0.20


def test_gate_applies_the_catastrophic_drop_to_overall_only_as_released():
    """The issue's case: S2 falls 0.235, all else equal: the released gate promotes."""
    base = ev(0.50)
    cand = ev(0.50, stages=(0.5, 0.265, 0.5, 0.5, 0.5))
    assert gate_failures(cand, base, MARGINS) == [] and released_gate(cand, base)
    c = Controller(ControllerConfig(acceptance=RULE_GATE, margins=MARGINS))
    c.observe(1, "a", base)
    d = c.observe(2, "b", cand)
    assert d.decision == ACCEPT and d.best_checkpoint == "b"


def test_gate_agrees_with_the_released_checks_on_random_pairs():
    import random

    rng = random.Random(0)
    m = MARGINS
    agree = promoted = 0
    for _ in range(300):
        base = ev(rng.uniform(0.3, 0.7), rng.uniform(0.3, 0.7), [rng.uniform(0.3, 0.7) for _ in range(5)],
                  {"vqa": rng.uniform(0.3, 0.7), "seg": rng.uniform(0.3, 0.7)})
        jitter = lambda x: x + rng.choice([0.0, rng.uniform(-0.25, 0.05), rng.uniform(-0.04, 0.04)])  # noqa: E731
        cand = ev(jitter(base.overall), jitter(base.task), [jitter(v) for v in base.stage_scores.values()],
                  {k: jitter(v) for k, v in base.track_scores.items()})
        ours = not gate_failures(cand, base, m)
        agree += ours == released_gate(cand, base)
        promoted += ours
    assert agree == 300 and 20 < promoted < 280


def test_gate_round_off_never_decides():
    base = ev(0.50, task=0.50, stages=(0.5, 0.5, 0.50, 0.5, 0.5), tracks={"vqa": 0.50})
    # drops of exactly the margins, as float arithmetic gives them: 0.010000000000000009, 0.030000000000000027, ...
    cand = ev(0.49, task=0.47, stages=(0.5, 0.5, 0.47, 0.47, 0.47), tracks={"vqa": 0.45})
    assert 0.50 - 0.49 > 0.01 and 0.50 - 0.47 > 0.03
    assert gate_failures(cand, base, MARGINS) == []
    assert gate_failures(ev(0.49 - 1e-9), base, MARGINS) != []


def test_gate_refuses_evaluations_of_different_cells():
    cells = {("vqa", r) for r in range(3)}
    base = ev(0.5, cells=cells)
    m = MARGINS
    assert gate_failures(ev(0.5, cells=list(cells)), base, m) == []
    with pytest.raises(ValueError, match=r"not evaluated on the same cells.*only the incumbent has cells \[\('vqa', 2\)\]"):
        gate_failures(ev(0.5, cells={("vqa", 0), ("vqa", 1)}), base, m)
    with pytest.raises(ValueError, match=r"only the candidate has cells \[\('seg', 0\)\]"):
        gate_failures(ev(0.5, cells=cells | {("seg", 0)}), base, m)
    with pytest.raises(ValueError, match="the candidate's evaluation records no cells"):
        gate_failures(ev(0.5), base, m)
    with pytest.raises(ValueError, match=r"only the candidate has tracks \['seg'\]"):
        gate_failures(ev(0.5, tracks={"vqa": 0.5, "seg": 0.5}), ev(0.5), m)
    with pytest.raises(ValueError, match=r"only the incumbent has scored stages \['S4'\]"):
        gate_failures(Evaluation(0.5, 0.5, {"S1": 0.5, "S2": 0.5, "S3": 0.5, "S4": None, "S5": 0.5}, {"vqa": 0.5}),
                      ev(0.5), m)
    # in a run the gate holds an unpaired candidate (no evidence of non-inferiority), naming the cells
    c = Controller(ControllerConfig(acceptance=RULE_GATE, margins=MARGINS))
    c.observe(1, "a", base)
    d = c.observe(2, "b", ev(0.6, cells={("vqa", 0)}))
    assert d.decision == HOLD and d.retained_checkpoint == "a" and d.best_checkpoint == "a"
    assert len(d.reasons) == 1 and d.reasons[0].startswith("unpaired: non-inferiority gate")
    assert "only the incumbent has cells [('vqa', 1), ('vqa', 2)]" in d.reasons[0]
    assert c.state.held and c.state.last_decision == HOLD
    # the paper's fallback policy compares Overall only: no pairing needed
    f = Controller(ControllerConfig())
    f.observe(1, "a", base)
    assert f.observe(2, "b", ev(0.6, cells={("vqa", 0)})).decision == ACCEPT


def test_evaluation_cells_roundtrip_and_the_summary_cells():
    from bat_jax.benchmark.scoring import Cell, aggregate

    stages = dict.fromkeys(("S1", "S2", "S3", "S4", "S5"), 0.5)
    cells = [Cell("vqa", 0, stages, 0.5), Cell("vqa", 1, stages, None), Cell("seg", 0, stages, 0.2)]
    keys = aggregate(cells, STAGES).cells
    assert keys == {("vqa", 0), ("seg", 0)}
    from_summary = Evaluation.from_summary(aggregate(cells, STAGES))
    assert from_summary.cells == keys and from_summary.overall == pytest.approx((0.5 + (0.2 + 0.5) / 2) / 2)
    e = ev(0.5, cells=keys)
    assert Evaluation.from_dict(e.to_dict()) == e and e.to_dict()["cells"] == [["seg", 0], ["vqa", 0]]
    assert "cells" not in ev(0.5).to_dict()  # ledger lines without cells stay as they were
    with pytest.raises(ValueError, match="cell key"):
        ev(0.5, cells=[("vqa", 0.5)])


def test_fallback_counts_no_drop_for_round_off():
    _, ds = run([0.30, 0.35, (0.1 + 0.2) / 2 + 0.2, 0.35 - 1e-13, 0.34])
    assert [d.drops for d in ds] == [0, 0, 0, 0, 1]
    assert ds[2].best_checkpoint == "ckpt-2"  # 0.35000000000000003 does not beat 0.35


def test_gate_policy_holds_and_keeps_incumbent():
    c = Controller(ControllerConfig(acceptance=RULE_GATE, margins=MARGINS))
    assert c.observe(1, "a", ev(0.50)).decision == ACCEPT
    d = c.observe(2, "b", ev(0.495))  # within -0.01: accepted, becomes the incumbent
    assert d.decision == ACCEPT and d.best_checkpoint == "b"
    d = c.observe(3, "c", ev(0.60, stages=(0.5, 0.5, 0.5, 0.4, 0.5)))  # S4 fell 0.10
    assert d.decision == HOLD and d.retained_checkpoint == "b" and d.reasons == ("stage S4 fell 0.1000 > 0.03",)
    d = c.observe(4, "d", ev(0.52), kl=0.2)
    assert d.decision == HOLD and d.reasons == ("kl 0.2 > tau 0.1",)


def test_bad_config_and_inputs():
    with pytest.raises(ValueError, match="patience"):
        ControllerConfig(patience=0)
    with pytest.raises(ValueError, match="acceptance"):
        ControllerConfig(acceptance="greedy")
    c = Controller()
    with pytest.raises(ValueError, match="finite"):
        c.observe(1, "a", float("nan"))
    c.observe(1, "a", 0.3)
    with pytest.raises(ValueError, match="kl must be >= 0"):
        c.observe(2, "b", 0.3, kl=-0.1)


def test_an_unscored_evaluation_is_neither_accepted_nor_a_drop():
    c = Controller()
    d = c.observe(0, "ckpt-0", Evaluation(None))  # round 0 unscored: ckpt-0 retained, nothing is best yet
    assert (d.decision, d.retained_checkpoint, d.best_checkpoint, d.best_overall) == (UNSCORED, "ckpt-0", "ckpt-0",
                                                                                      None)
    assert c.state.best is None and not c.state.held
    d = c.observe(1, "ckpt-1", 0.3)  # the first scored evaluation is accepted and becomes the best
    assert (d.decision, d.best_checkpoint, d.best_overall) == (ACCEPT, "ckpt-1", 0.3)
    c.observe(2, "ckpt-2", 0.2)  # one drop
    d = c.observe(3, "ckpt-3", None)  # unscored: the retained round-2 candidate stays, the drop count too
    assert (d.decision, d.retained_checkpoint, d.drops, d.best_overall) == (UNSCORED, "ckpt-2", 1, 0.3)
    assert c.state.previous_overall == 0.2 and c.state.last_decision == UNSCORED
    assert ControllerState.from_dict(c.state.to_dict()) == c.state
    d = c.observe(4, "ckpt-4", 0.1)  # the second drop, counted against round 2's 0.2
    assert d.drops == 2 and d.decision == ACCEPT
    assert set(DECISIONS) == {ACCEPT, FALLBACK, HOLD, UNSCORED}


def test_state_written_before_last_decision_reads_it_from_the_ledger():
    old = {"best_checkpoint": "ckpt-1", "best": {"overall": 0.3}, "previous_overall": 0.3, "drops": 0,
           "retained_checkpoint": "ckpt-1"}
    assert ControllerState.from_dict(old, last_decision=FALLBACK).held
    assert not ControllerState.from_dict(old).held


@pytest.mark.parametrize("ids, late", [(("draft", "check"), ("check",)),
                                       (("inspect", "clean", "report"), ("clean", "report")),
                                       (tuple(f"p{i}" for i in range(7)), ("p5", "p6"))])
def test_the_gate_holds_late_stages_of_any_benchmark(ids, late):
    """Late-stage margins apply to the stages the benchmark names, whatever they are; the others have none."""
    margins = NonInferiorityMargins(late_stages=late)
    base = Evaluation(0.5, 0.5, dict.fromkeys(ids, 0.5), {"t": 0.5})
    early = Evaluation(0.5, 0.5, {**dict.fromkeys(ids, 0.5), ids[0]: 0.2}, {"t": 0.5})
    assert gate_failures(early, base, margins) == []  # an early stage fell 0.30: no margin on it
    fell = Evaluation(0.5, 0.5, {**dict.fromkeys(ids, 0.5), late[-1]: 0.46}, {"t": 0.5})
    assert gate_failures(fell, base, margins) == [f"stage {late[-1]} fell 0.0400 > 0.03"]
    c = Controller(ControllerConfig(acceptance=RULE_GATE, margins=margins))
    c.observe(1, "a", base)
    assert c.observe(2, "b", fell).decision == HOLD and c.state.reference_scores == dict.fromkeys(ids, 0.5)
