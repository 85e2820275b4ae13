"""Classification track: generation, accuracy on hand-built submissions, format checker, expert vs baselines."""

import json

import pytest

from bat_jax.benchmark.scoring import overall_score
from bat_jax.benchmarks.imaging.classification import CLASSES
from bat_jax.rollout.play import play
from bat_jax.benchmarks.imaging.heldout import heldout_suite
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.registry import get_track
from bat_jax.benchmarks.imaging.stages import STAGES
from bat_jax.benchmarks.imaging.teacher import DoNothingPolicy, RandomCommandPolicy, ScriptedExpert

IMAGING = ImagingBenchmark()
TRACK = get_track("classification")


def test_generation_is_deterministic_and_hides_labels():
    a, b = TRACK.generate(3, "failure"), TRACK.generate(3, "failure")
    assert a.files == b.files and a.fault == b.fault and not a.fault.recoverable
    assert all(c.target in CLASSES for c in a.cases)
    manifest_csv = a.files[a.layout.cases_csv].decode()
    assert not any(label in manifest_csv for label in CLASSES)
    # the unrecoverable input is truncated and has no archive copy
    victim = a.case(a.fault.case_id)
    assert victim.file in a.files and not any(p.startswith(a.layout.archive_dir) for p in a.files)


def test_accuracy_on_hand_built_submissions():
    inst = TRACK.generate(3)
    preds = {c.case_id: {"label": c.target} for c in inst.cases}
    assert TRACK.task_metric(inst, preds, inst.files) == 1.0
    first = inst.cases[0]
    preds[first.case_id] = {"label": next(c for c in CLASSES if c != first.target)}
    assert TRACK.task_metric(inst, preds, inst.files) == pytest.approx(5 / 6)
    preds[first.case_id] = {"label": "not-a-class"}  # invalid entry scores 0 for that case
    assert TRACK.task_metric(inst, preds, inst.files) == pytest.approx(5 / 6)


def test_format_checker():
    inst = TRACK.generate(3)
    good = {"task_id": inst.task_id, "predictions": {inst.case_ids[0]: {"label": "nevus"}},
            "failed": {inst.case_ids[1]: "unreadable input"}}
    assert TRACK.check_submission(inst, json.dumps(good).encode(), inst.files) == []
    bad = dict(good, predictions={inst.case_ids[0]: {"label": "cat"}}, failed={inst.case_ids[1]: ""})
    errors = TRACK.check_submission(inst, json.dumps(bad).encode(), inst.files)
    assert any("label" in e and inst.case_ids[0] in e for e in errors)
    assert any("submission.failed" in e for e in errors)
    assert TRACK.check_submission(inst, None, inst.files) == [f"{inst.layout.submission}: missing"]


def test_expert_scores_high_on_heldout_recovery_task(factory):
    inst = heldout_suite(1, ("recovery",), tracks=["classification"])[0]
    result = play(IMAGING, inst, ScriptedExpert(), make_sandbox=factory)
    cell = result.score.to_cell("classification", 0, STAGES)
    assert cell.agentic(STAGES) == pytest.approx(1.0) and cell.task == pytest.approx(1.0)
    assert overall_score(cell.task, cell.agentic(STAGES)) >= 0.9


def test_expert_on_failure_variant_reports_the_lost_case():
    inst = TRACK.generate(4, "failure")
    result = play(IMAGING, inst, ScriptedExpert())
    sub = json.loads(result.evidence.files[inst.layout.submission])
    assert list(sub["failed"]) == [inst.fault.case_id] and inst.fault.case_id not in sub["predictions"]
    assert result.score.task == pytest.approx(5 / 6)  # the lost case scores 0
    assert result.score.to_cell("classification", 0, STAGES).agentic(STAGES) == pytest.approx(1.0)


def test_baselines_score_at_most_ten_percent():
    inst = TRACK.generate(9)
    for policy in (DoNothingPolicy(), RandomCommandPolicy(seed=1, n_turns=6)):
        cell = play(IMAGING, inst, policy).score.to_cell("classification", 0, STAGES)
        assert overall_score(cell.task, cell.agentic(STAGES)) <= 0.10
