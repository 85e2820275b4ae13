"""Curriculum router: weakest stage, ties → earliest, corrective largest-regression rule, audit report."""

import json

import pytest

from bat_jax.benchmark.stages import Stage
from bat_jax.curriculum.router import RULE_NO_SCORED, RULE_REGRESSION, RULE_WEAKEST, SCORE_TOL, RouterConfig, route

STAGE_KEYS = ("S1", "S2", "S3", "S4", "S5")


def scores(*values):
    return dict(zip(STAGE_KEYS, values))


def test_weakest_stage_is_validate():
    d = route(scores(0.70, 0.55, 0.20, 0.45, 0.60), round_index=1)
    assert d.target is Stage.VALIDATE and d.rule == RULE_WEAKEST


def test_tie_goes_to_earliest_stage():
    d = route(scores(0.40, 0.40, 0.65, 0.70, 0.75))
    assert d.target is Stage.PLAN
    assert route(scores(0.9, 0.3, 0.8, 0.3, 0.3)).target is Stage.SETUP


def test_round_off_ties_go_to_the_earliest_stage_as_released():
    """Released router: values equal within 1e-12 tie (math.isclose, abs_tol=1e-12) and go to the earliest stage."""
    s1 = (0.1 + 0.2) / 2  # mean(0.1, 0.2) = 0.15000000000000002
    assert s1 != 0.15 and s1 - 0.15 < SCORE_TOL == 1e-12
    d = route(scores(s1, 0.15, 0.7, 0.8, 0.9))
    assert d.target is Stage.PLAN and d.rule == RULE_WEAKEST
    assert route(scores(0.9, 0.15 + 2e-12, 0.7, 0.15, 0.9)).target is Stage.INFERENCE  # 2e-12 apart: no tie
    assert route(scores(0.9, 0.3, 0.9, 0.3 - 1e-13, 0.9)).target is Stage.SETUP


def test_round_off_ties_after_a_held_gate_go_to_the_earliest_largest_regression():
    # regressions 0.3 - 0.1 = 0.19999999999999998 and 0.8 - 0.6 = 0.20000000000000007: a tie -> S1 (released)
    reference = scores(0.3, 0.8, 0.5, 0.5, 0.5)
    candidate = scores(0.1, 0.6, 0.5, 0.5, 0.5)
    assert (0.3 - 0.1) < (0.8 - 0.6)
    d = route(candidate, held=True, reference_scores=reference, config=RouterConfig(corrective=True))
    assert d.target is Stage.PLAN and d.rule == RULE_REGRESSION
    # a "regression" of float round-off alone (S1: 0.15000000000000002 -> 0.15) is no regression: the weakest
    # rule applies and picks S2 (the released router, testing > 0, would route to S1)
    d = route(scores(0.15, 0.1, 0.5, 0.5, 0.5), held=True, reference_scores=scores((0.1 + 0.2) / 2, 0.1, 0.5, 0.5, 0.5),
              config=RouterConfig(corrective=True))
    assert 0 < d.regressions["S1"] < SCORE_TOL
    assert d.rule == RULE_WEAKEST and d.target is Stage.SETUP


def test_held_candidate_routes_to_largest_regression():
    reference = scores(0.70, 0.55, 0.50, 0.60, 0.62)
    candidate = scores(0.70, 0.55, 0.46, 0.48, 0.62)  # Validate fell 0.04, Inference fell 0.12
    d = route(candidate, held=True, reference_scores=reference, config=RouterConfig(corrective=True))
    assert d.target is Stage.INFERENCE and d.rule == RULE_REGRESSION
    assert d.regressions["S4"] == pytest.approx(0.12) and d.regressions["S3"] == pytest.approx(0.04)
    # Without the corrective rule (paper default) the weakest stage is chosen.
    assert route(candidate, held=True, reference_scores=reference).target is Stage.VALIDATE
    # A held candidate with no stage that fell falls back to the weakest rule.
    d = route(reference, held=True, reference_scores=reference, config=RouterConfig(corrective=True))
    assert d.rule == RULE_WEAKEST and d.target is Stage.VALIDATE
    with pytest.raises(ValueError, match="reference_scores"):
        route(candidate, held=True, config=RouterConfig(corrective=True))


def test_unscored_stage_is_left_out_not_zero():
    d = route({"S1": 0.5, "S2": None, "S3": 0.6, "S4": 0.7, "S5": 0.8})
    assert d.target is Stage.PLAN and d.scores_in["S2"] is None
    # every stage unscored (e.g. the judge unreachable for a whole evaluation): the earliest stage, said so
    d = route(dict.fromkeys(STAGE_KEYS), round_index=3, held=True)
    assert (d.target, d.rule, d.held) == (Stage.PLAN, RULE_NO_SCORED, True)
    assert d.report()["scores_in"] == dict.fromkeys(STAGE_KEYS) and d.regressions == {}


def test_bad_scores_are_refused():
    with pytest.raises(ValueError, match="missing stages"):
        route({"S1": 0.5})
    with pytest.raises(ValueError, match=r"S3 \(Validate\) must be in \[0, 1\]"):
        route(scores(0.1, 0.2, 30.0, 0.4, 0.5))


def test_report_and_prescription_are_auditable_aggregates():
    d = route({"Plan": 0.70, "Setup": 0.55, "validate": 0.20, Stage.INFERENCE: 0.45, "S5": 0.60}, round_index=4)
    report = json.loads(json.dumps(d.report()))
    assert report == {"round": 4, "rule": "weakest", "held": False,
                      "scores_in": {"S1": 0.70, "S2": 0.55, "S3": 0.20, "S4": 0.45, "S5": 0.60},
                      "reference_scores": None, "regressions": {}, "target_stage": "S3",
                      "target_title": "Validate"}
    assert d.prescription() == {"round": 4, "target_stage": "S3", "stage_scores": report["scores_in"]}
