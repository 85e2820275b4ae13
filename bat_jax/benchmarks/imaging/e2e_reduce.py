"""The imaging suite's E2E surrogate: the reduction R_λ (paper Eq. 12) of a task, and its validation passes.

Details: docs/design.md.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import math

import numpy as np

from bat_jax.staged_benchmark.contract import Reduction
from bat_jax.benchmarks.imaging.base import TaskInstance, Track, decode_array, encode_input
from bat_jax.benchmarks.imaging.brief import render_brief
from bat_jax.verify.rubric import Evidence


def _crop_file(data: bytes, path: str, fraction: float) -> bytes:
    """An input file cut to its leading ⌈fraction · n₀⌉ entries on axis 0.

    NIfTI keeps its header affine (true or, for a 'spacing' fault, the injected wrong voxel size); .npy/.png are
    re-encoded."""
    if path.endswith(".nii.gz"):
        import nibabel as nib

        img = nib.Nifti1Image.from_bytes(gzip.decompress(data))
        arr = np.asarray(img.get_fdata(), np.float32)
        out = nib.Nifti1Image(_crop(arr, fraction), img.affine)
        return gzip.compress(out.to_bytes(), mtime=0)
    return encode_input(_crop(decode_array(data, path), fraction), path.split(".", 1)[1])


def _crop(array: np.ndarray, fraction: float) -> np.ndarray:
    return array[: max(1, math.ceil(fraction * array.shape[0]))]


def reduce_task(track: Track, inst: TaskInstance, lam: Reduction, template: int) -> tuple[TaskInstance, dict]:
    """R_λ(ξ): the reduced task and the parameters actually applied (recorded in provenance).

    Args:
      track: the task's track.
      inst: the source task ξ.
      lam: the reduction λ.
      template: the brief template the source used (the reduced brief is re-rendered with it).

    Returns:
      (ξ̃, params) with params {'cases', 'input_fraction', 'input_fraction_applied', 'validation_passes',
      'kept_cases'}.

    Raises:
      ValueError: a bad λ.
    """
    lam.validate()
    L = inst.layout
    must = [inst.fault.case_id] if inst.fault is not None else []
    keep = set(must)
    for cid in inst.case_ids:
        if len(keep) >= min(lam.cases, len(inst.cases)):
            break
        keep.add(cid)
    kept = tuple(c for c in inst.cases if c.case_id in keep)
    aligned = all(isinstance(c.target, np.ndarray) for c in inst.cases)
    fraction = lam.input_fraction if aligned else 1.0
    files = dict(inst.files)
    cases = []
    for c in inst.cases:
        archive = f"{L.archive_dir}/{c.file.rsplit('/', 1)[-1]}.gz"
        if c.case_id not in keep:
            files.pop(c.file, None)
            files.pop(archive, None)
            continue
        target = c.target
        if fraction < 1.0:
            if c.file in files and not (inst.fault and inst.fault.case_id == c.case_id
                                        and inst.fault.kind == "unreadable"):
                files[c.file] = _crop_file(files[c.file], c.file, fraction)
            if archive in files:
                files[archive] = gzip.compress(_crop_file(gzip.decompress(files[archive]), c.file, fraction),
                                               mtime=0)
            target = _crop(np.asarray(c.target), fraction)
        cases.append(dataclasses.replace(c, target=target))
    text = inst.files[L.cases_csv].decode()
    rows = [r for r in csv.DictReader(io.StringIO(text)) if r["case_id"] in keep]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    files[L.cases_csv] = buf.getvalue().encode()
    brief = render_brief(track, inst.task_id, L, len(kept), template) + (
        f"\n## Budget\nThis is a reduced workflow: at most {lam.validation_passes} validation pass(es) (smoke runs "
        f"of the method into `{L.validation_dir}`) are allowed.\n")
    files["task.md"] = brief.encode()
    reduced = dataclasses.replace(inst, brief=brief, files=files, cases=tuple(cases))
    params = {"cases": lam.cases, "input_fraction": lam.input_fraction, "input_fraction_applied": fraction,
              "validation_passes": lam.validation_passes, "kept_cases": [c.case_id for c in cases]}
    return reduced, params


def validation_passes(evidence: Evidence, inst: TaskInstance) -> int:
    """Successful smoke runs of the method into the validation directory.

    Each is the rubric's smoke-run receipt: a call the kernel saw read `model.py` and a case input and write under the
    validation directory."""
    L = inst.layout
    return len(evidence.ran((f"{L.method_dir}/model.py",), (L.images_dir,), writes_under=L.validation_dir))
