"""Scoring contract tests, with the paper's own numbers where it gives them."""

import math

import pytest

from bat_jax.benchmark import scoring
from bat_jax.benchmark.scoring import NOT_APPLICABLE, Cell, agentic_score, display, overall_score
from bat_jax.benchmark.stages import StageSet
from bat_jax.benchmarks.imaging.stages import STAGES, Stage


def aggregate(cells, stages=STAGES):
    return scoring.aggregate(cells, stages)


def _uniform(value):
    return {s: value for s in STAGES.ids}


@pytest.mark.parametrize("agentic,task,expected", [(0.647, 0.421, "53.4"), (0.688, 0.470, "57.9")])
def test_overall_is_mean_of_task_and_agentic_paper_numbers(agentic, task, expected):
    value = overall_score(task, agentic)
    assert value == pytest.approx((agentic + task) / 2)
    assert display(value) == expected


def test_differences_come_from_unrounded_values():
    candidate, baseline = 0.53460, 0.52540  # display 53.5 and 52.5
    assert display(candidate) == "53.5" and display(baseline) == "52.5"
    # rounding first would give 1.0; the paper's rule (difference of unrounded values, then round) gives 0.9
    assert display(candidate - baseline) == "0.9"


def test_agentic_weights_are_the_papers():
    assert list(STAGES.weights.values()) == [0.25, 0.15, 0.35, 0.15, 0.10]
    scores = {Stage.PLAN: 1.0, Stage.SETUP: 0.0, Stage.VALIDATE: 1.0, Stage.INFERENCE: 0.0, Stage.SUBMIT: 1.0}
    assert agentic_score(scores, STAGES) == pytest.approx(0.25 + 0.35 + 0.10)


def test_not_applicable_submit_renormalises_other_four():
    scores = {"S1": 1.0, "S2": 0.0, "S3": 1.0, "S4": 0.0, "S5": NOT_APPLICABLE}
    # (0.25 + 0.35) / (0.25 + 0.15 + 0.35 + 0.15) = 0.6 / 0.9
    assert agentic_score(scores, STAGES) == pytest.approx(0.6 / 0.9)
    all_ones = {"S1": 1.0, "S2": 1.0, "S3": 1.0, "S4": 1.0, "S5": NOT_APPLICABLE}
    assert agentic_score(all_ones, STAGES) == pytest.approx(1.0)


def test_unscored_stage_makes_cell_unscored_not_zero():
    full = Cell("seg", 0, _uniform(0.8), task=0.8)
    partial = Cell("seg", 1, {**_uniform(0.8), Stage.VALIDATE: None}, task=0.8)
    assert partial.agentic(STAGES) is None and not partial.scored(STAGES)
    summary = aggregate([full, partial])
    assert summary.overall == pytest.approx(0.8)  # zeroing S3 would give (0.8 + 0.52) / 2 ... → 0.73
    assert summary.n_unscored == 1 and summary.tracks["seg"]["n"] == 1


def test_two_level_aggregation_differs_from_flat_mean():
    # 7 tracks x 10 repeats = 70 runs. Track t0 lost 5 runs to infrastructure failures (unscored); its 5 scored
    # runs are perfect. The other 6 tracks score 0 everywhere.
    cells = []
    for track in range(7):
        for repeat in range(10):
            if track == 0:
                if repeat < 5:
                    cells.append(Cell("t0", repeat, _uniform(1.0), task=1.0))
                else:
                    cells.append(Cell("t0", repeat, {**_uniform(1.0), Stage.SETUP: None}, task=None))
            else:
                cells.append(Cell(f"t{track}", repeat, _uniform(0.0), task=0.0))
    flat_over_scored = 5 / 65
    flat_over_all = 5 / 70
    summary = aggregate(cells)
    assert summary.overall == pytest.approx(1 / 7)
    assert summary.overall != pytest.approx(flat_over_scored)
    assert summary.overall != pytest.approx(flat_over_all)
    assert summary.n_cells == 70 and summary.n_unscored == 5
    assert summary.stages[Stage.PLAN] == pytest.approx(1 / 7)


def test_half_width_is_student_t_over_track_means():
    # track means 0.1, 0.2, 0.3: sd = 0.1, n = 3, t_{0.975, 2} = 4.302652729749464
    cells = [Cell(f"t{i}", 0, _uniform(v), task=v) for i, v in enumerate([0.1, 0.2, 0.3])]
    summary = aggregate(cells)
    assert summary.overall == pytest.approx(0.2)
    assert summary.overall_hw == pytest.approx(4.302652729749464 * 0.1 / math.sqrt(3))
    assert scoring.half_width([0.5]) == 0.0


def test_paired_comparison_at_track_level():
    base = aggregate([Cell("a", 0, _uniform(0.2), 0.2), Cell("b", 0, _uniform(0.4), 0.4), Cell("c", 0, _uniform(0.5), 0.5)])
    cand = aggregate([Cell("a", 0, _uniform(0.3), 0.3), Cell("b", 0, _uniform(0.6), 0.6), Cell("c", 0, _uniform(0.5), 0.5)])
    cmp = scoring.paired_comparison(cand, base, "overall")
    assert cmp.per_track == pytest.approx({"a": 0.1, "b": 0.2, "c": 0.0})
    assert cmp.mean_diff == pytest.approx(0.1)
    assert cmp.half_width == pytest.approx(4.302652729749464 * 0.1 / math.sqrt(3))
    assert scoring.paired_comparison(cand, base, "S3").mean_diff == pytest.approx(0.1)


def test_bad_stage_sets_name_the_benchmark_and_the_problem():
    five = [("S1", "Plan", 0.3), ("S2", "Setup", 0.15), ("S3", "Validate", 0.35), ("S4", "Inference", 0.15),
            ("S5", "Submit", 0.10)]
    with pytest.raises(ValueError, match=r"benchmark 'demo': stages: weights must sum to 1.*S1=0.3"):
        StageSet.of(five, "demo")
    with pytest.raises(ValueError, match=r"'demo'.*duplicate stage ids \['a'\]"):
        StageSet.of([("a", "A", 0.5), ("a", "B", 0.5)], "demo")
    with pytest.raises(ValueError, match="non-empty string"):
        StageSet.of([("", "A", 0.5), ("b", "B", 0.5)], "demo")
    with pytest.raises(ValueError, match="at least 2 stages"):
        StageSet.of([("a", "A", 1.0)], "demo")
    with pytest.raises(ValueError, match="reserved for the end-to-end focus"):
        StageSet.of([("e2e", "A", 0.5), ("b", "B", 0.5)], "demo")
    with pytest.raises(ValueError, match="weight of stage 'b' must be finite and >= 0"):
        StageSet.of([("a", "A", 1.5), ("b", "B", -0.5)], "demo")
    with pytest.raises(ValueError, match=r"duplicate stage titles \['a'\]"):
        StageSet.of([("a", "A", 0.5), ("b", "a", 0.5)], "demo")
    with pytest.raises(ValueError, match=r"missing stages \['S5'\]"):
        agentic_score({"S1": 0.25, "S2": 0.15, "S3": 0.45, "S4": 0.15}, STAGES)
    with pytest.raises(ValueError, match="unknown stage 'S9' for benchmark 'imaging'"):
        agentic_score({**_uniform(0.5), "S9": 1.0}, STAGES)


def test_scores_outside_range_are_rejected_with_their_field():
    with pytest.raises(ValueError, match=r"stage S3.*\[0, 1\].*1\.5"):
        Cell("seg", 2, {**_uniform(0.5), "S3": 1.5}, task=0.5)
    with pytest.raises(ValueError, match=r"task.*-0\.1"):
        Cell("seg", 2, _uniform(0.5), task=-0.1)
    with pytest.raises(ValueError, match="task score"):
        overall_score(53.4, 0.5)  # a 0-100 value passed where 0-1 is expected


def test_stage_parse_accepts_names_and_ids():
    assert STAGES.parse("validate") == Stage.VALIDATE == "S3"
    assert STAGES.parse("S4") == Stage.INFERENCE
    assert STAGES.index(Stage.VALIDATE) == 2 and STAGES.title(Stage.SUBMIT) == "Submit"
    assert STAGES.label("S3") == "S3 Validate" and STAGES.foci == ("E2E", "S1", "S2", "S3", "S4", "S5")


# ---- any number and meaning of stages (paper Appendix A.3) ---------------------------------------------------

TWO = StageSet.of([("draft", "Draft", 0.4), ("check", "Check", 0.6)], "two")
THREE = StageSet.of([("inspect", "Inspect", 0.2), ("clean", "Clean", 0.3), ("report", "Report", 0.5)], "three")
SEVEN = StageSet.of([(f"p{i}", f"Phase {i}", w) for i, w in enumerate((0.1, 0.1, 0.2, 0.2, 0.1, 0.2, 0.1))], "seven")


@pytest.mark.parametrize("stages, scores, expected", [
    (TWO, {"draft": 1.0, "check": 0.5}, 0.4 + 0.6 * 0.5),
    (THREE, {"inspect": 0.0, "clean": 1.0, "report": 0.5}, 0.3 + 0.25),
    (STAGES, {"S1": 1.0, "S2": 1.0, "S3": 0.0, "S4": 0.0, "S5": 0.0}, 0.40),
    (SEVEN, {f"p{i}": float(i % 2) for i in range(7)}, 0.1 + 0.2 + 0.2),
])
def test_agentic_score_on_two_three_five_and_seven_stages(stages, scores, expected):
    assert agentic_score(scores, stages) == pytest.approx(expected)
    cells = [Cell("t0", 0, scores, 0.2), Cell("t1", 0, scores, 0.4)]
    summary = aggregate(cells, stages)
    assert summary.agentic == pytest.approx(expected) and summary.task == pytest.approx(0.3)
    assert summary.overall == pytest.approx((expected + 0.3) / 2)
    assert list(summary.stages) == list(stages.ids) and summary.stages == pytest.approx(scores)


def test_renaming_and_reordering_stages_leaves_scores_unchanged():
    """Stage ids are names: the same (weight, score) pairs under other ids and in another order give the same
    Agentic, Overall and per-stage means."""
    import random

    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(2, 8)
        raw = [rng.random() for _ in range(n)]
        weights = [w / sum(raw) for w in raw]
        weights[-1] = 1.0 - sum(weights[:-1])
        values = [rng.choice([0.0, 1.0, rng.random()]) for _ in range(n)]
        base = StageSet.of([(f"s{i}", f"T{i}", w) for i, w in enumerate(weights)], "base")
        order = list(range(n))
        rng.shuffle(order)
        renamed = StageSet.of([(f"x{i}_{rng.randint(0, 99)}", f"U{i}", weights[i]) for i in order], "renamed")
        mapping = dict(zip((f"s{i}" for i in order), renamed.ids))
        scores = {f"s{i}": values[i] for i in range(n)}
        moved = {mapping[k]: v for k, v in scores.items()}
        assert agentic_score(moved, renamed) == pytest.approx(agentic_score(scores, base), abs=1e-12)
        a, b = aggregate([Cell("t", 0, scores, 0.5)], base), aggregate([Cell("t", 0, moved, 0.5)], renamed)
        assert b.overall == pytest.approx(a.overall, abs=1e-12)
        assert {k: b.stages[mapping[k]] for k in scores} == pytest.approx(dict(a.stages))
