"""Detection track: AP on hand-built submissions, format checker, expert on a held-out task."""

import pytest

from bat_jax.benchmark.scoring import overall_score
from bat_jax.rollout.play import play
from bat_jax.benchmarks.imaging.heldout import heldout_suite
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.registry import get_track
from bat_jax.benchmarks.imaging.stages import STAGES
from bat_jax.benchmarks.imaging.teacher import ScriptedExpert

IMAGING = ImagingBenchmark()
TRACK = get_track("detection")


def test_generation_is_deterministic_with_valid_boxes():
    a, b = TRACK.generate(2), TRACK.generate(2)
    assert a.files == b.files
    for c in a.cases:
        assert 1 <= len(c.target) <= 2
        assert all(0 <= x0 < x1 <= 32 and 0 <= y0 < y1 <= 32 for x0, y0, x1, y1 in c.target)


def test_average_precision_on_hand_built_submissions():
    inst = TRACK.generate(2)
    preds = {c.case_id: {"boxes": [[*b, 1.0] for b in c.target]} for c in inst.cases}
    assert TRACK.task_metric(inst, preds, inst.files) == pytest.approx(1.0)
    n_gt = sum(len(c.target) for c in inst.cases)
    first = inst.cases[0]
    preds[first.case_id] = {"boxes": []}
    # every remaining detection is a true positive at score 1 → AP = recall reached = (n_gt - k) / n_gt
    assert TRACK.task_metric(inst, preds, inst.files) == pytest.approx((n_gt - len(first.target)) / n_gt)


def test_format_checker_rejects_malformed_boxes():
    assert TRACK.check_entry({"boxes": [[0, 0, 4, 4, 0.5]]}, {}) == []
    assert TRACK.check_entry({"boxes": [[4, 0, 2, 4, 0.5]]}, {})[0].startswith("boxes[0]")
    assert TRACK.check_entry({"boxes": [[0, 0, 4]]}, {})[0].startswith("boxes[0]")
    assert TRACK.check_entry({"box": []}, {}) == ["entry must be an object with a list 'boxes'"]


def test_expert_scores_high_on_heldout_recovery_task(factory):
    inst = heldout_suite(1, ("recovery",), tracks=["detection"])[0]
    cell = play(IMAGING, inst, ScriptedExpert(), make_sandbox=factory).score.to_cell("detection", 0, STAGES)
    assert cell.agentic(STAGES) == pytest.approx(1.0)
    assert overall_score(cell.task, cell.agentic(STAGES)) >= 0.9
