"""Report track: label F1 on hand-written reports, disjoint reference phrasing, expert on a held-out task."""

import pytest

from bat_jax.benchmark.scoring import overall_score
from bat_jax.rollout.play import play
from bat_jax.benchmarks.imaging.heldout import heldout_suite
from bat_jax.benchmarks.imaging.layout import HELDOUT_LAYOUT
from bat_jax.benchmarks.imaging.metrics import report_labels
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.registry import get_track
from bat_jax.benchmarks.imaging.report_generation import FINDINGS
from bat_jax.benchmarks.imaging.stages import STAGES
from bat_jax.benchmarks.imaging.teacher import ScriptedExpert

IMAGING = ImagingBenchmark()
TRACK = get_track("report")


def test_reference_reports_encode_the_labels_in_both_phrasings():
    train = TRACK.generate(6)
    held = TRACK.generate(6, layout=HELDOUT_LAYOUT, id_prefix="hx", template=2)
    for inst in (train, held):
        for c in inst.cases:
            assert report_labels(TRACK.manifest_extra(c)["report_text"], FINDINGS) == set(c.target)
    train_texts = {TRACK.manifest_extra(c)["report_text"] for c in train.cases}
    held_texts = {TRACK.manifest_extra(c)["report_text"] for c in held.cases}
    assert not train_texts & held_texts


def test_label_f1_on_hand_written_reports():
    inst = TRACK.generate(6)
    preds = {c.case_id: {"report": TRACK.manifest_extra(c)["report_text"]} for c in inst.cases}
    assert TRACK.task_metric(inst, preds, inst.files) == pytest.approx(1.0)
    c0 = inst.cases[0]
    wrong = {f for f in FINDINGS if f not in c0.target}
    preds[c0.case_id] = {"report": " ".join(f"There is {f}." for f in wrong) or "Normal study."}
    # the complement of the true set has F1 0 (or 0 when the truth is empty but a finding is claimed)
    assert TRACK.task_metric(inst, preds, inst.files) == pytest.approx(0.75)
    assert TRACK.check_entry({"report": "  "}, {}) == ["entry must be an object with a non-empty string 'report'"]


def test_expert_scores_high_on_heldout_recovery_task(factory):
    inst = heldout_suite(1, ("recovery",), tracks=["report"])[0]
    cell = play(IMAGING, inst, ScriptedExpert(), make_sandbox=factory).score.to_cell("report", 0, STAGES)
    assert cell.agentic(STAGES) == pytest.approx(1.0)
    assert overall_score(cell.task, cell.agentic(STAGES)) >= 0.9
