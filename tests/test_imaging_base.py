"""The imaging suite's task framework base (bat_jax/benchmarks/imaging/base.py): input encodings, array entries, a task
instance's cases and faults, and the submission checker, on hand-made values."""

import dataclasses
import json

import numpy as np
import pytest

from bat_jax.benchmarks.imaging.base import Fault, array_entry_errors, artefact_array, decode_array, encode_input
from bat_jax.benchmarks.imaging.registry import get_track

VQA = get_track("vqa")


def test_inputs_round_trip_through_their_encodings():
    x = np.array([[0.0, 0.25], [0.5, 1.0]], np.float32)
    np.testing.assert_array_equal(decode_array(encode_input(x, "npy"), "a.npy"), x)
    # png: 8-bit grey, rint(v · 255) → 0, 64, 128, 255, read back as value / 255
    np.testing.assert_allclose(decode_array(encode_input(x, "png"), "a.png"), [[0, 64 / 255], [128 / 255, 1]])
    vol = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(decode_array(encode_input(vol, "nii.gz"), "a.nii.gz"), vol)
    with pytest.raises(ValueError, match="unknown input extension 'tif'"):
        encode_input(x, "tif")


def test_array_entry_errors_name_the_key_and_path():
    ok, bad = np.zeros((2, 2), np.float32), np.array([np.nan, 1.0], np.float32)
    files = {"p/a.npy": encode_input(ok, "npy"), "p/b.npy": encode_input(bad, "npy")}
    assert array_entry_errors({"image": "p/a.npy"}, "image", "npy", files) == []
    assert array_entry_errors("p/a.npy", "image", "npy", files) == ["entry must be an object with a string 'image'"]
    assert array_entry_errors({"image": "p/a.png"}, "image", "npy", files) == ["image: 'p/a.png' must end with .npy"]
    assert array_entry_errors({"image": "p/c.npy"}, "image", "npy", files) == [
        "image: 'p/c.npy' does not exist in the workspace"]
    assert array_entry_errors({"image": "p/b.npy"}, "image", "npy", files) == ["image: 'p/b.npy' has non-finite values"]
    with pytest.raises(ValueError, match="'p/c.npy' does not exist in the workspace"):
        artefact_array(files, "p/c.npy")


def test_task_instance_cases_and_an_unrecoverable_fault():
    inst = VQA.generate(3, "success")
    assert inst.method_version == "vqa-method-4.3"  # 1 + 3 % 7, 3 % 5
    assert inst.fault is None and inst.recoverable_ids() == inst.case_ids and len(inst.case_ids) == 6
    assert inst.case(inst.case_ids[2]).case_id == inst.case_ids[2]
    with pytest.raises(KeyError, match=f"task {inst.task_id} has no case 'nope'"):
        inst.case("nope")
    lost = dataclasses.replace(inst, fault=Fault(inst.case_ids[1], "missing", recoverable=False))
    assert lost.recoverable_ids() == [inst.case_ids[0]] + inst.case_ids[2:]
    kept = dataclasses.replace(inst, fault=Fault(inst.case_ids[1], "missing", recoverable=True))
    assert kept.recoverable_ids() == inst.case_ids
    assert dict(inst.state().files) == dict(inst.files)


def test_submission_checker_names_the_field_and_case():
    inst = VQA.generate(3, "success")
    path = inst.layout.submission
    assert VQA.check_submission(inst, None, {}) == [f"{path}: missing"]
    assert VQA.check_submission(inst, b"[1, 2]", {}) == ["submission: top level must be an object"]
    sub = {"task_id": "other", "predictions": {"nope": {}}, "failed": {inst.case_ids[0]: ""}}
    assert VQA.check_submission(inst, json.dumps(sub).encode(), {}) == [
        f"submission.task_id: expected {inst.task_id!r}, got 'other'",
        "submission.failed: must map case_id -> non-empty reason",
        "submission.predictions['nope']: unknown case id"]
    no_preds = {"task_id": inst.task_id, "predictions": []}
    assert VQA.check_submission(inst, json.dumps(no_preds).encode(), {}) == [
        "submission.predictions: must be an object case_id -> entry"]


def test_a_task_scores_zero_unless_its_submission_was_submitted():
    inst = VQA.generate(3, "success")
    assert VQA.score_task(inst, {}, None) == 0.0
    assert VQA.score_task(inst, {inst.layout.submission: b"{}"}, "elsewhere.json") == 0.0
    assert VQA.score_task(inst, {inst.layout.submission: b"not json"}, inst.layout.submission) == 0.0


def test_a_method_writes_floats_that_differ_in_the_last_bits_as_the_same_bytes(tmp_path):
    """The provided method's entries keep 12 significant digits: the scores two numpy versions computed for one
    case (measured: numpy 1.24.2 in the sandbox image, 2.3.5 on the host) are written byte for byte alike."""
    from bat_jax.benchmarks.imaging.base import METHOD_PRELUDE
    ns: dict = {"__file__": str(tmp_path / "model.py")}
    exec(compile(METHOD_PRELUDE, "model.py", "exec"), ns)  # noqa: S102 — the prelude the sandbox runs
    a = {"label": "nevus", "scores": {"nevus": 0.001659012576622161, "n": 3, "ok": True}, "boxes": [(1.0, 2.5)]}
    b = {"label": "nevus", "scores": {"nevus": 0.0016590125766221611, "n": 3, "ok": True}, "boxes": [(1.0, 2.5)]}
    assert a != b
    ns["_write_entry"](str(tmp_path / "a"), "c1", a)
    written = ns["_write_entry"](str(tmp_path / "b"), "c1", b)
    assert (tmp_path / "a" / "c1.json").read_bytes() == (tmp_path / "b" / "c1.json").read_bytes()
    assert written == {"label": "nevus", "scores": {"nevus": 0.00165901257662, "n": 3, "ok": True},
                       "boxes": [[1.0, 2.5]]}
