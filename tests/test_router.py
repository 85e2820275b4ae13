"""Curriculum router: weakest stage, ties → earliest, corrective largest-regression rule, audit report."""

import json

import pytest

from bat_jax.benchmark.stages import StageSet
from bat_jax.curriculum import router
from bat_jax.curriculum.router import RULE_NO_SCORED, RULE_REGRESSION, RULE_WEAKEST, SCORE_TOL, RouterConfig
from bat_jax.benchmarks.imaging.stages import STAGES, Stage


def route(stage_scores, stages=STAGES, **kwargs):
    return router.route(stage_scores, stages, **kwargs)

STAGE_KEYS = ("S1", "S2", "S3", "S4", "S5")


def scores(*values):
    return dict(zip(STAGE_KEYS, values))


def test_weakest_stage_is_validate():
    d = route(scores(0.70, 0.55, 0.20, 0.45, 0.60), round_index=1)
    assert d.target == Stage.VALIDATE and d.rule == RULE_WEAKEST


def test_tie_goes_to_earliest_stage():
    d = route(scores(0.40, 0.40, 0.65, 0.70, 0.75))
    assert d.target == Stage.PLAN
    assert route(scores(0.9, 0.3, 0.8, 0.3, 0.3)).target == Stage.SETUP


def test_round_off_ties_go_to_the_earliest_stage_as_released():
    """Released router: values equal within 1e-12 tie (math.isclose, abs_tol=1e-12) and go to the earliest stage."""
    s1 = (0.1 + 0.2) / 2  # mean(0.1, 0.2) = 0.15000000000000002
    assert s1 != 0.15 and s1 - 0.15 < SCORE_TOL == 1e-12
    d = route(scores(s1, 0.15, 0.7, 0.8, 0.9))
    assert d.target == Stage.PLAN and d.rule == RULE_WEAKEST
    assert route(scores(0.9, 0.15 + 2e-12, 0.7, 0.15, 0.9)).target == Stage.INFERENCE  # 2e-12 apart: no tie
    assert route(scores(0.9, 0.3, 0.9, 0.3 - 1e-13, 0.9)).target == Stage.SETUP


def test_round_off_ties_after_a_held_gate_go_to_the_earliest_largest_regression():
    # regressions 0.3 - 0.1 = 0.19999999999999998 and 0.8 - 0.6 = 0.20000000000000007: a tie -> S1 (released)
    reference = scores(0.3, 0.8, 0.5, 0.5, 0.5)
    candidate = scores(0.1, 0.6, 0.5, 0.5, 0.5)
    assert (0.3 - 0.1) < (0.8 - 0.6)
    d = route(candidate, held=True, reference_scores=reference, config=RouterConfig(corrective=True))
    assert d.target == Stage.PLAN and d.rule == RULE_REGRESSION
    # a "regression" of float round-off alone (S1: 0.15000000000000002 -> 0.15) is no regression: the weakest
    # rule applies and picks S2 (the released router, testing > 0, would route to S1)
    d = route(scores(0.15, 0.1, 0.5, 0.5, 0.5), held=True, reference_scores=scores((0.1 + 0.2) / 2, 0.1, 0.5, 0.5, 0.5),
              config=RouterConfig(corrective=True))
    assert 0 < d.regressions["S1"] < SCORE_TOL
    assert d.rule == RULE_WEAKEST and d.target == Stage.SETUP


def test_held_candidate_routes_to_largest_regression():
    reference = scores(0.70, 0.55, 0.50, 0.60, 0.62)
    candidate = scores(0.70, 0.55, 0.46, 0.48, 0.62)  # Validate fell 0.04, Inference fell 0.12
    d = route(candidate, held=True, reference_scores=reference, config=RouterConfig(corrective=True))
    assert d.target == Stage.INFERENCE and d.rule == RULE_REGRESSION
    assert d.regressions["S4"] == pytest.approx(0.12) and d.regressions["S3"] == pytest.approx(0.04)
    # Without the corrective rule (paper default) the weakest stage is chosen.
    assert route(candidate, held=True, reference_scores=reference).target == Stage.VALIDATE
    # A held candidate with no stage that fell falls back to the weakest rule.
    d = route(reference, held=True, reference_scores=reference, config=RouterConfig(corrective=True))
    assert d.rule == RULE_WEAKEST and d.target == Stage.VALIDATE
    with pytest.raises(ValueError, match="reference_scores"):
        route(candidate, held=True, config=RouterConfig(corrective=True))


def test_unscored_stage_is_left_out_not_zero():
    d = route({"S1": 0.5, "S2": None, "S3": 0.6, "S4": 0.7, "S5": 0.8})
    assert d.target == Stage.PLAN and d.scores_in["S2"] is None
    # every stage unscored (e.g. the judge unreachable for a whole evaluation): the earliest stage, said so
    d = route(dict.fromkeys(STAGE_KEYS), round_index=3, held=True)
    assert (d.target, d.rule, d.held) == (Stage.PLAN, RULE_NO_SCORED, True)
    assert d.report()["scores_in"] == dict.fromkeys(STAGE_KEYS) and d.regressions == {}


def test_bad_scores_are_refused():
    with pytest.raises(ValueError, match="missing stages"):
        route({"S1": 0.5})
    with pytest.raises(ValueError, match=r"S3 Validate must be in \[0, 1\]"):
        route(scores(0.1, 0.2, 30.0, 0.4, 0.5))


def test_report_and_prescription_are_auditable_aggregates():
    d = route({"Plan": 0.70, "Setup": 0.55, "validate": 0.20, Stage.INFERENCE: 0.45, "S5": 0.60}, round_index=4)
    report = json.loads(json.dumps(d.report()))
    assert report == {"round": 4, "rule": "weakest", "held": False,
                      "scores_in": {"S1": 0.70, "S2": 0.55, "S3": 0.20, "S4": 0.45, "S5": 0.60},
                      "reference_scores": None, "regressions": {}, "target_stage": "S3",
                      "target_title": "Validate"}
    assert d.prescription(STAGES) == {"round": 4, "target_stage": "S3", "stage_scores": report["scores_in"]}


# ---- any number and meaning of stages (paper Appendix A.3) ---------------------------------------------------

TWO = StageSet.of([("draft", "Draft", 0.4), ("check", "Check", 0.6)], "two")
THREE = StageSet.of([("inspect", "Inspect", 0.2), ("clean", "Clean", 0.3), ("report", "Report", 0.5)], "three")
SEVEN = StageSet.of([(f"p{i}", f"Phase {i}", w) for i, w in enumerate((0.1, 0.1, 0.2, 0.2, 0.1, 0.2, 0.1))], "seven")


@pytest.mark.parametrize("stages, values, weakest, corrective", [
    (TWO, (0.5, 0.5), "draft", None),  # a tie goes to the earlier stage
    (TWO, (0.6, 0.2), "check", None),
    (THREE, (0.3, 0.1, 0.1), "clean", "report"),  # report fell 0.4, clean 0.1
    (STAGES, (0.7, 0.55, 0.2, 0.45, 0.6), "S3", "S4"),
    (SEVEN, (0.9, 0.8, 0.7, 0.3, 0.3, 0.5, 0.9), "p3", "p5"),
])
def test_routing_on_two_three_five_and_seven_stages(stages, values, weakest, corrective):
    scores_in = dict(zip(stages.ids, values))
    d = route(scores_in, stages, round_index=2)
    assert (d.target, d.rule, d.target_title) == (weakest, RULE_WEAKEST, stages.title(weakest))
    assert list(d.scores_in) == list(stages.ids)
    if corrective is not None:  # θ*'s scores: 0.4 higher on `corrective`, 0.1 higher on the weakest
        reference = dict(scores_in)
        reference[corrective] = min(1.0, scores_in[corrective] + 0.4)
        reference[weakest] = scores_in[weakest] + 0.1
        d = route(scores_in, stages, held=True, reference_scores=reference, config=RouterConfig(corrective=True))
        assert (d.target, d.rule) == (corrective, RULE_REGRESSION)
    d = route(dict.fromkeys(stages.ids), stages)
    assert (d.target, d.rule) == (stages.ids[0], RULE_NO_SCORED)


def test_renaming_and_reordering_stages_leaves_routing_unchanged():
    """The route follows the scores, the weights play no part and a tie follows workflow order: stages renamed
    and (with their scores) reordered route to the renamed stage of the same score, ties to the earliest."""
    import random

    rng = random.Random(1)
    for _ in range(100):
        n = rng.randint(2, 8)
        values = [rng.choice([0.1, 0.2, 0.3, 0.5, 0.9]) for _ in range(n)]
        base = StageSet.of([(f"s{i}", f"T{i}", 1.0 / n) for i in range(n)], "base")
        target = route(dict(zip(base.ids, values)), base).target
        order = list(range(n))
        rng.shuffle(order)
        renamed = StageSet.of([(f"y{i}", f"V{i}", 1.0 / n) for i in order], "renamed")
        moved = {f"y{i}": values[i] for i in order}
        got = route(moved, renamed).target
        low = min(values)
        assert moved[got] == low and values[int(target[1:])] == low
        assert got == next(s for s in renamed.ids if moved[s] == low)  # the earliest in the new order


def test_a_stage_of_another_benchmark_is_refused():
    with pytest.raises(ValueError, match=r"unknown stage 'S1' for benchmark 'two'"):
        route({"S1": 0.5, "draft": 0.4, "check": 0.2}, TWO)
    with pytest.raises(ValueError, match=r"missing stages \['check'\] of benchmark 'two'"):
        route({"draft": 0.4}, TWO)


def test_random_rule_draws_each_round_from_its_seed_whatever_the_scores():
    """The routing ablation: a uniform draw from random.Random(1_000_003 * seed + round) over the stage ids."""
    config = RouterConfig(rule="random", seed=3)
    picks = [route(scores(0.9, 0.9, 0.0, 0.9, 0.9), round_index=r, config=config) for r in range(1, 401)]
    import random
    assert [d.target for d in picks[:5]] == [random.Random(3_000_009 + r).choice(STAGE_KEYS) for r in range(1, 6)]
    assert all(d.rule == router.RULE_RANDOM for d in picks)
    counts = {s: sum(d.target == s for d in picks) for s in STAGE_KEYS}
    assert all(55 <= n <= 105 for n in counts.values()), counts  # 80 expected each; the weakest rule gives S3 x 400
    same = route(scores(0.1, 0.9, 0.9, 0.9, 0.9), round_index=7, config=config)
    assert same.target == picks[6].target  # the scores never change the draw
    assert route(scores(0.1, 0.9, 0.9, 0.9, 0.9), round_index=7, config=RouterConfig(rule="random", seed=4)).target \
        == random.Random(4_000_012 + 7).choice(STAGE_KEYS)


def test_unknown_rule_is_named():
    with pytest.raises(ValueError, match=r"RouterConfig.rule must be one of .*'weakest'.*got 'easiest'"):
        RouterConfig(rule="easiest")


def test_bottleneck_rule_routes_to_the_largest_drop_in_the_stage_funnel():
    """Drops 1 − 0.667, 0.667 − 0.25, 0.25 − 0.083, 0.083 − 0.021 (the tabular SFT policy's scores): the second stage
    loses most, though the last is the weakest; unscored stages are skipped, ties go to the earliest."""
    config = RouterConfig(rule="bottleneck")
    d = route(scores(0.667, 0.25, 0.083, 0.021, 0.02), config=config)
    assert d.target == Stage.SETUP and d.rule == router.RULE_BOTTLENECK
    assert route(scores(0.667, 0.25, 0.083, 0.021, 0.02)).target == Stage.SUBMIT  # the weakest rule
    drops = router.funnel_drops(scores(0.9, None, 0.3, 0.25, 0.1), STAGES)
    assert drops == pytest.approx({"S1": 0.1, "S3": 0.6, "S4": 0.05, "S5": 0.15})
    assert route(scores(0.9, None, 0.3, 0.25, 0.1), config=config).target == Stage.VALIDATE
    assert route(scores(0.5, 0.0, 0.0, 0.0, 0.0), config=config).target == Stage.PLAN  # 0.5 = 0.5: earliest
