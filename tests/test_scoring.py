"""Scoring contract tests, with the paper's own numbers where it gives them."""

import math

import pytest

from bat_jax.benchmark import scoring
from bat_jax.benchmark.scoring import NOT_APPLICABLE, Cell, aggregate, agentic_score, display, overall_score
from bat_jax.benchmark.stages import DEFAULT_STAGE_WEIGHTS, STAGES, Stage, validate_stage_weights


def _uniform(value):
    return {s: value for s in STAGES}


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
    assert [DEFAULT_STAGE_WEIGHTS[s] for s in STAGES] == [0.25, 0.15, 0.35, 0.15, 0.10]
    scores = {Stage.PLAN: 1.0, Stage.SETUP: 0.0, Stage.VALIDATE: 1.0, Stage.INFERENCE: 0.0, Stage.SUBMIT: 1.0}
    assert agentic_score(scores) == pytest.approx(0.25 + 0.35 + 0.10)


def test_not_applicable_submit_renormalises_other_four():
    scores = {"S1": 1.0, "S2": 0.0, "S3": 1.0, "S4": 0.0, "S5": NOT_APPLICABLE}
    # (0.25 + 0.35) / (0.25 + 0.15 + 0.35 + 0.15) = 0.6 / 0.9
    assert agentic_score(scores) == pytest.approx(0.6 / 0.9)
    all_ones = {"S1": 1.0, "S2": 1.0, "S3": 1.0, "S4": 1.0, "S5": NOT_APPLICABLE}
    assert agentic_score(all_ones) == pytest.approx(1.0)


def test_unscored_stage_makes_cell_unscored_not_zero():
    full = Cell("seg", 0, _uniform(0.8), task=0.8)
    partial = Cell("seg", 1, {**_uniform(0.8), Stage.VALIDATE: None}, task=0.8)
    assert partial.agentic() is None and not partial.scored()
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


def test_bad_weights_name_the_problem():
    with pytest.raises(ValueError, match="sum to 1.*S1=0.3"):
        validate_stage_weights({"S1": 0.3, "S2": 0.15, "S3": 0.35, "S4": 0.15, "S5": 0.10})
    with pytest.raises(ValueError, match=r"missing stages \['S5'\]"):
        validate_stage_weights({"S1": 0.25, "S2": 0.15, "S3": 0.45, "S4": 0.15})
    with pytest.raises(ValueError, match="unknown stage 'S9'"):
        validate_stage_weights({"S9": 1.0})


def test_scores_outside_range_are_rejected_with_their_field():
    with pytest.raises(ValueError, match=r"stage S3.*\[0, 1\].*1\.5"):
        Cell("seg", 2, {**_uniform(0.5), "S3": 1.5}, task=0.5)
    with pytest.raises(ValueError, match=r"task.*-0\.1"):
        Cell("seg", 2, _uniform(0.5), task=-0.1)
    with pytest.raises(ValueError, match="task score"):
        overall_score(53.4, 0.5)  # a 0-100 value passed where 0-1 is expected


def test_stage_parse_accepts_names_and_ids():
    assert Stage.parse("validate") is Stage.VALIDATE
    assert Stage.parse("S4") is Stage.INFERENCE
    assert Stage.VALIDATE.index == 2 and Stage.SUBMIT.title == "Submit"
