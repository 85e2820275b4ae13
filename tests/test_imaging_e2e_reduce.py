"""The imaging suite's E2E surrogate R_λ (bat_jax/benchmarks/imaging/e2e_reduce.py): kept cases, cropped inputs, the
rewritten manifest and brief, and its validation passes."""

import gzip

import numpy as np
import pytest

from bat_jax.sandbox.types import Receipt
from bat_jax.staged_benchmark.contract import Reduction
from bat_jax.benchmarks.imaging import e2e_reduce
from bat_jax.benchmarks.imaging.base import decode_array
from bat_jax.benchmarks.imaging.heldout import training_task
from bat_jax.benchmarks.imaging.registry import TRACKS
from bat_jax.verify.rubric import Evidence


def _recovery_task(track, kind):
    """The first recovery task (seed >= 3) whose injected fault has this kind."""
    for seed in range(3, 200):
        inst = training_task(track, seed, "recovery")
        if inst.fault.kind == kind and inst.fault.case_id != inst.case_ids[0]:
            return inst
    pytest.skip(f"no {kind!r} fault drawn for {track.name}")


def test_reduce_task_keeps_fault_case_and_crops_aligned_inputs():
    import nibabel as nib

    track = TRACKS["segmentation"]
    inst = _recovery_task(track, "unreadable")  # a truncated input with an intact archive copy
    fault_case = inst.case(inst.fault.case_id)
    red, params = e2e_reduce.reduce_task(track, inst, Reduction(2, 0.5, 1), template=0)
    assert red.case_ids == [inst.case_ids[0], fault_case.case_id]  # first case + the fault's case, in order
    assert params["kept_cases"] == red.case_ids and params["input_fraction_applied"] == 0.5
    csv_ids = [line.split(",")[0] for line in red.files["data/cases.csv"].decode().splitlines()[1:]]
    assert csv_ids == red.case_ids
    for dropped in inst.cases:
        if dropped.case_id not in red.case_ids:
            assert dropped.file not in red.files
    good = red.cases[0]
    assert decode_array(red.files[good.file], good.file).shape == (8, 16, 8)  # ⌈0.5 · 16⌉ slices
    np.testing.assert_array_equal(good.target, inst.cases[0].target[:8])
    arch = gzip.decompress(red.files["data/archive/" + fault_case.file.rsplit("/", 1)[1] + ".gz"])
    assert decode_array(arch, fault_case.file).shape == (8, 16, 8)
    assert red.files[fault_case.file] == inst.files[fault_case.file]  # the truncated input stays as it was
    assert "each of the 2 cases" in red.brief and "at most 1 validation pass" in red.brief
    assert red.files["task.md"].decode() == red.brief and red.task_id == inst.task_id

    inst = _recovery_task(track, "spacing")  # wrong voxel size in the header must survive the crop
    red, _ = e2e_reduce.reduce_task(track, inst, Reduction(2, 0.5, 1), template=0)
    f = inst.case(inst.fault.case_id).file
    zooms = [nib.Nifti1Image.from_bytes(gzip.decompress(x[f])).header.get_zooms() for x in (inst.files, red.files)]
    assert zooms[0] == zooms[1] and decode_array(red.files[f], f).shape[0] == 8

    cls = TRACKS["classification"]
    inst = training_task(cls, 5, "success")
    red, params = e2e_reduce.reduce_task(cls, inst, Reduction(3, 0.5, 2), template=1)
    assert params["input_fraction_applied"] == 1.0 and len(red.cases) == 3  # labels: input kept whole
    assert red.files[red.cases[0].file] == inst.files[red.cases[0].file]


def _call(reads, writes=()):
    """A successful call whose kernel trace shows it read `reads` and wrote `writes`."""
    return Receipt(0, "execute_code", "python", "x", 0, "", "", 0.0, 1.0, False, "", reads=tuple(reads),
                   writes=tuple(writes), trace_complete=True)


def test_validation_passes_count_smoke_runs_into_the_validation_directory():
    inst = training_task(TRACKS["classification"], 5, "success")
    L = inst.layout
    model, case = f"{L.method_dir}/model.py", inst.cases[0].file
    smoke = _call([model, case], [f"{L.validation_dir}/{inst.case_ids[0]}.json"])
    elsewhere = _call([model, case], [f"{L.pred_dir}/{inst.case_ids[0]}.json"])  # inference, not validation
    no_input = _call([model], [f"{L.validation_dir}/x.json"])  # never read a case input
    assert e2e_reduce.validation_passes(Evidence((smoke, elsewhere, no_input, smoke), {}), inst) == 2
    assert e2e_reduce.validation_passes(Evidence((), {}), inst) == 0
