"""Segmentation track: generation, metric on hand-built submissions, format checker, expert vs baselines."""

import gzip
import json

import numpy as np
import pytest

from bat_jax.benchmark.scoring import overall_score
from bat_jax.benchmarks.imaging.stages import STAGES, Stage
from bat_jax.benchmarks.imaging.base import decode_array, encode_input
from bat_jax.rollout.play import play
from bat_jax.benchmarks.imaging.heldout import heldout_suite
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.registry import get_track
from bat_jax.benchmarks.imaging.teacher import DoNothingPolicy, ScriptedExpert

IMAGING = ImagingBenchmark()
TRACK = get_track("segmentation")


def _files_with_masks(inst, masks):
    files = dict(inst.files)
    preds = {}
    for cid, mask in masks.items():
        path = f"{inst.layout.pred_dir}/{cid}.nii.gz"
        files[path] = encode_input(mask, "nii.gz")
        preds[cid] = {"mask": path}
    sub = {"task_id": inst.task_id, "predictions": preds, "failed": {}}
    files[inst.layout.submission] = json.dumps(sub).encode()
    return files, preds


def test_generation_is_deterministic_and_hides_targets():
    a, b = TRACK.generate(5, "recovery"), TRACK.generate(5, "recovery")
    assert a.files == b.files and a.task_id == b.task_id and a.fault == b.fault
    assert TRACK.generate(6, "recovery").files != a.files
    for c in a.cases:
        assert c.target.shape == (16, 16, 8) and set(np.unique(c.target)) == {0, 1, 2}
    assert not any("mask" in p or "label" in p for p in a.files)
    header = a.files[a.layout.cases_csv].decode().splitlines()[0]
    assert header == "case_id,file,modality,spacing_mm"


def test_dice_metric_on_hand_built_submissions():
    inst = TRACK.generate(5)
    perfect = {c.case_id: c.target for c in inst.cases}
    files, preds = _files_with_masks(inst, perfect)
    assert TRACK.check_submission(inst, files[inst.layout.submission], files) == []
    assert TRACK.task_metric(inst, preds, files) == pytest.approx(1.0)
    swapped = dict(perfect)
    first = inst.cases[0]
    swapped[first.case_id] = np.where(first.target == 1, 2, np.where(first.target == 2, 1, 0))
    files, preds = _files_with_masks(inst, swapped)
    # labels 1 and 2 swapped in one of four cases: that case's Dice is 0 → mean 3/4
    assert TRACK.task_metric(inst, preds, files) == pytest.approx(0.75)
    del preds[first.case_id]
    assert TRACK.task_metric(inst, preds, files) == pytest.approx(0.75)  # missing case scores 0


def test_format_checker_names_the_bad_field():
    inst = TRACK.generate(5)
    files, preds = _files_with_masks(inst, {inst.case_ids[0]: inst.cases[0].target})
    bad = {"task_id": "other", "predictions": {inst.case_ids[0]: {"mask": "nowhere.nii.gz"}, "zz": {}}}
    errors = TRACK.check_submission(inst, json.dumps(bad).encode(), files)
    assert any("task_id" in e for e in errors)
    assert any("does not exist" in e and inst.case_ids[0] in e for e in errors)
    assert any("'zz'" in e and "unknown case id" in e for e in errors)
    assert TRACK.check_submission(inst, b"{", files)[0].endswith("invalid JSON (Expecting property name "
                                                                  "enclosed in double quotes: line 1 column 2 (char 1))")


def test_expert_scores_high_on_heldout_recovery_task(factory):
    inst = heldout_suite(1, ("recovery",), tracks=["segmentation"])[0]
    assert inst.fault is not None and inst.fault.recoverable
    result = play(IMAGING, inst, ScriptedExpert(), make_sandbox=factory)
    cell = result.score.to_cell("segmentation", 0, STAGES)
    assert cell.agentic(STAGES) == pytest.approx(1.0)
    assert result.score.task >= 0.9
    assert overall_score(cell.task, cell.agentic(STAGES)) >= 0.9


def test_do_nothing_scores_zero():
    inst = TRACK.generate(8, "success")
    result = play(IMAGING, inst, DoNothingPolicy())
    cell = result.score.to_cell("segmentation", 0, STAGES)
    assert cell.task == 0.0 and cell.agentic(STAGES) == 0.0


def test_wrong_voxel_spacing_is_diagnosed_and_repaired():
    import nibabel as nib

    inst = TRACK.generate(3, "recovery")
    assert inst.fault.kind == "spacing" and inst.fault.recoverable
    victim = inst.case(inst.fault.case_id)
    header = nib.Nifti1Image.from_bytes(gzip.decompress(inst.files[victim.file])).header
    assert tuple(float(z) for z in header.get_zooms()) == (2.0, 2.0, 4.0)  # manifest says 1,1,2
    full = play(IMAGING, inst, ScriptedExpert())
    issues = json.loads(full.evidence.files[inst.layout.validation_json])["issues"]
    assert issues == [{"case_id": victim.case_id, "kind": "spacing", "action": "repaired"}]
    assert full.score.to_cell("segmentation", 0, STAGES).agentic(STAGES) == pytest.approx(1.0)
    blind = play(IMAGING, inst, ScriptedExpert(diagnose=False))
    pred = json.loads(blind.evidence.files[f"{inst.layout.pred_dir}/{victim.case_id}.json"])["mask"]
    # unrepaired: the method resamples the volume by 2x → a 32x32x16 mask, which scores 0 for that case
    assert decode_array(blind.evidence.files[pred], pred).shape == (32, 32, 16)
    assert full.score.task - blind.score.task == pytest.approx(0.25)
    v = blind.score.verdicts
    assert v[Stage.VALIDATE].items["validate.issues"] is False
    assert v[Stage.INFERENCE].items["inference.fault_handled"] is False
