"""VQA track: questions in the manifest, accuracy on hand-built answers, expert on a held-out task."""

import csv
import io

import pytest

from bat_jax.benchmark.scoring import overall_score
from bat_jax.rollout.play import play
from bat_jax.benchmarks.imaging.heldout import heldout_suite
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.registry import get_track
from bat_jax.benchmarks.imaging.stages import STAGES
from bat_jax.benchmarks.imaging.teacher import ScriptedExpert
from bat_jax.benchmarks.imaging.vqa import QUESTIONS

IMAGING = ImagingBenchmark()
TRACK = get_track("vqa")


def test_questions_are_public_answers_hidden():
    inst = TRACK.generate(10)
    rows = list(csv.DictReader(io.StringIO(inst.files[inst.layout.cases_csv].decode())))
    assert [r["question"] for r in rows] == [c.meta["question"] for c in inst.cases]
    assert all(r["question"] in QUESTIONS[0].values() for r in rows)
    assert set(rows[0]) == {"case_id", "file", "question"}
    assert not set(QUESTIONS[0].values()) & set(QUESTIONS[1].values())


def test_accuracy_on_hand_built_answers():
    inst = TRACK.generate(10)
    preds = {c.case_id: {"answer": f"The {c.target.upper()}."} for c in inst.cases}
    assert TRACK.task_metric(inst, preds, inst.files) == pytest.approx(1.0)  # normalised exact match
    preds[inst.case_ids[0]] = {"answer": "banana"}
    assert TRACK.task_metric(inst, preds, inst.files) == pytest.approx(5 / 6)


def test_expert_scores_high_on_heldout_recovery_task(factory):
    inst = heldout_suite(1, ("recovery",), tracks=["vqa"])[0]
    assert all(c.meta["question"] in QUESTIONS[1].values() for c in inst.cases)
    cell = play(IMAGING, inst, ScriptedExpert(), make_sandbox=factory).score.to_cell("vqa", 0, STAGES)
    assert cell.agentic(STAGES) == pytest.approx(1.0)
    assert overall_score(cell.task, cell.agentic(STAGES)) >= 0.9
