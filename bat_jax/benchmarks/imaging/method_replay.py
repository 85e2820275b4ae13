"""Host-side replay of a task's provided method: "the method ran" is checked on what it produced.

Details: docs/design.md.
"""

from __future__ import annotations

import csv
import functools
import gzip
import io
import json
import math
import os
import tempfile
import types
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePosixPath

import numpy as np

from bat_jax.sandbox.readers import array_extension, json_or_none, limits_of
from bat_jax.sandbox.types import Receipt, sha256_hex
from bat_jax.benchmarks.imaging.base import TaskInstance, artefact_array, decode_array
from bat_jax.benchmarks.imaging.nifti import DECODERS

#: Absolute tolerance on array and float values when comparing an artefact with the replay (float32 outputs,
#: the same numpy / scipy code on both sides).
ATOL = 1e-4
#: Grid of "round" numbers: a float within `ATOL` of a multiple of it has few plausible values.
ROUND_STEP = 0.01
#: An output carrying fewer bits than this (`information_bits`; a chance above ~1e-6 of writing it without the
#: method) is guessable: it does not count alone as evidence that the method ran.
GUESS_BITS = 20.0


@functools.lru_cache(maxsize=64)
def _respaced(data: bytes, spacing_mm: str) -> bytes:
    """A NIfTI input with its header's voxel size rewritten from the manifest's `spacing_mm`.

    The input is task data, gzip'd. It is rewritten as the brief tells the agent to repair it (same voxel data, diagonal
    affine)."""
    import nibabel as nib

    img = nib.Nifti1Image.from_bytes(gzip.decompress(data))
    zooms = [float(v) for v in spacing_mm.split(",")]
    fixed = nib.Nifti1Image(np.asarray(img.dataobj), np.diag(zooms + [1.0] * (4 - len(zooms))))
    return gzip.compress(fixed.to_bytes(), mtime=0)


def _replay_inputs(inst: TaskInstance, case_id: str) -> list[tuple[str, bytes, dict[str, str]]]:
    """(input path, input bytes, manifest row) of each input the method may be run on for `case_id`.

    The correct one comes first; [] when there is none."""
    L = inst.layout
    rows = {r["case_id"]: r for r in csv.DictReader(io.StringIO(inst.files[L.cases_csv].decode()))}
    row = rows.get(case_id)
    if row is None:
        return []
    path = row["file"]
    data = inst.files.get(path)
    if inst.fault is not None and inst.fault.case_id == case_id:
        if inst.fault.kind == "spacing":
            return [] if data is None else [(path, _respaced(data, row["spacing_mm"]), row), (path, data, row)]
        archived = inst.files.get(f"{L.archive_dir}/{PurePosixPath(path).name}.gz")
        return [] if archived is None else [(path, gzip.decompress(archived), row)]
    return [] if data is None else [(path, data, row)]


@functools.lru_cache(maxsize=256)
def _run_method(model_py: bytes, config_json: bytes, input_name: str, input_bytes: bytes,
                row_items: tuple[tuple[str, str], ...]) -> tuple[str, tuple[tuple[str, np.ndarray], ...]] | None:
    """Runs the method on one input in a temp dir.

    Returns (JSON text of the entry's non-file values, (key, read-only decoded array) of each file the entry names), or
    None when the method raises on this input. Cached, so nothing it returns may be mutable."""
    with tempfile.TemporaryDirectory(prefix="bat_replay_") as tmp:
        mdir = os.path.join(tmp, "method")
        os.makedirs(mdir)
        with open(os.path.join(mdir, "config.json"), "wb") as f:
            f.write(config_json)
        src = os.path.join(tmp, "in" + _ext(input_name))
        with open(src, "wb") as f:
            f.write(input_bytes)
        module = types.ModuleType("bat_replay_method")
        module.__file__ = os.path.join(mdir, "model.py")
        try:
            exec(compile(model_py, module.__file__, "exec"), module.__dict__)  # noqa: S102 — the task's own method
            pred = module.predict(module.load_input(src), dict(row_items), module.load_config())
            entry = module.save_prediction(pred, os.path.join(tmp, "out"), "case")
        except Exception:  # noqa: BLE001 — an input the method rejects has no replay
            return None
        arrays = []
        for key, value in entry.items():
            if isinstance(value, str) and value.startswith(tmp):
                with open(value, "rb") as f:
                    array = decode_array(f.read(), value)
                array.setflags(write=False)
                arrays.append((key, array))
        files = {k for k, _ in arrays}
        return json.dumps({k: v for k, v in entry.items() if k not in files}, sort_keys=True), tuple(arrays)


def _ext(name: str) -> str:
    for ext in (".nii.gz", ".npy", ".png", ".nii"):
        if name.endswith(ext):
            return ext
    return ""


Output = tuple[dict, dict[str, np.ndarray]]


def method_outputs(inst: TaskInstance, case_id: str) -> list[Output]:
    """Every output the provided method gives for one case of `inst`, replayed on the host.

    The correct one comes first (module docstring).

    Returns:
      [(values, arrays)]: the entry's non-file values (e.g. {'label': ..., 'scores': {...}}) and, for each entry
      key that names a written file, its decoded content (float64 / int arrays, read-only); [] when the case
      has no replayable input or the method rejects it.
    """
    L = inst.layout
    outs = []
    for path, data, row in _replay_inputs(inst, case_id):
        out = _run_method(inst.files[f"{L.method_dir}/model.py"], inst.files[f"{L.method_dir}/config.json"], path,
                          data, tuple(sorted(row.items())))
        if out is not None:
            outs.append((json.loads(out[0]), dict(out[1])))
    return outs


def method_output(inst: TaskInstance, case_id: str) -> Output | None:
    """The correct output of the method for one case, or None when it has none.

    It is `method_outputs`' first: a 'spacing' case's on its repaired input."""
    outs = method_outputs(inst, case_id)
    return outs[0] if outs else None


def _close(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or isinstance(b, str) or a is None:
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(float(a) - float(b)) <= ATOL
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return False


def _equals(expected: Output, entry, files: Mapping[str, bytes]) -> bool:
    values, arrays = expected
    if not isinstance(entry, dict) or set(entry) != set(values) | set(arrays):
        return False
    if not all(_close(values[k], entry[k]) for k in values):
        return False
    for key, want in arrays.items():
        try:
            got = artefact_array(files, entry[key])
        except ValueError:
            return False
        if got.shape != want.shape or not np.allclose(got, want, rtol=0.0, atol=ATOL):
            return False
    return True


def case_matches(inst: TaskInstance, case_id: str, entry, files: Mapping[str, bytes],
                 correct_only: bool = False) -> bool | None:
    """Whether `entry` equals one of the method's replayed outputs for `case_id`.

    `entry` is a prediction entry as the agent saved it, file paths workspace-relative, contents in `files`, read within
    `readers.limits_of(files)`. Only the correct output counts with `correct_only`. A match needs every non-file value
    within `ATOL`, every file present with the replay's shape and values within `ATOL`. None when the case has no
    replay; never raises."""
    outs = method_outputs(inst, case_id)
    if correct_only:
        outs = outs[:1]
    if not outs:
        return None
    try:
        return any(_equals(out, entry, files) for out in outs)
    except (RecursionError, TypeError, ValueError, OverflowError):  # an entry no replay can equal
        return False


def is_method_output(inst: TaskInstance, case_id: str, entry, files: Mapping[str, bytes]) -> bool:
    """True when `entry` equals one of the method's replayed outputs for `case_id` (`case_matches`).

    False for anything else (no replay, other keys, missing or unreadable files)."""
    return case_matches(inst, case_id, entry, files) is True


def entry_files(entry) -> list[str]:
    """Workspace paths an entry names (its string values that look like files), for write-trace checks."""
    if not isinstance(entry, dict):
        return []
    return [v for v in entry.values() if isinstance(v, str) and _ext(v)]


def information_bits(value) -> float:
    """A rough count of the bits an agent must get right to write `value` without running the method.

    None / bool 1. A string 4 (an answer from a small vocabulary, or text written from a few decisions). An integer
    log2(2 + |v|). A float on the `ROUND_STEP` grid log2(2 + |v| / ROUND_STEP). Any other float log2(1 / (2 · ATOL))
    (pinned to ±`ATOL`). An array its value's bits when constant, else unbounded (inf). A dict or list the sum over its
    values (keys are fixed by the output format)."""
    if value is None or isinstance(value, bool):
        return 1.0
    if isinstance(value, str):
        return 4.0
    if isinstance(value, int):
        return math.log2(2 + abs(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            return 0.0
        if value == round(value):
            return math.log2(2 + abs(value))
        if abs(value - ROUND_STEP * round(value / ROUND_STEP)) <= ATOL:
            return math.log2(2 + abs(value) / ROUND_STEP)
        return math.log2(1 / (2 * ATOL))
    if isinstance(value, np.ndarray):
        if value.size and np.ptp(value) > 0:
            return math.inf
        return information_bits(float(value.flat[0])) if value.size else 0.0
    if isinstance(value, dict):
        return sum(information_bits(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(information_bits(v) for v in value)
    return 0.0


def guessable(inst: TaskInstance, case_id: str) -> bool:
    """True when the method's correct output for the case carries fewer than `GUESS_BITS` bits.

    Bits are `information_bits`. An agent could write it without running the method often enough (a short answer, a few
    decisions, round numbers, a constant array), so such an output equal to the replay proves nothing alone. True when
    the case has no replay."""
    out = method_output(inst, case_id)
    if out is None:
        return True
    values, arrays = out
    return information_bits(values) + sum(information_bits(a) for a in arrays.values()) < GUESS_BITS


# ---- which calls ran the method ----------------------------------------------------------------------------
def _entry_candidates(value, limit: int = 64) -> Iterable[dict]:
    """The dicts in a parsed JSON value (itself and nested ones, breadth first, at most `limit`)."""
    queue, found = [value], 0
    while queue and found < limit:
        item = queue.pop(0)
        if isinstance(item, dict):
            found += 1
            yield item
            queue.extend(item.values())
        elif isinstance(item, list):
            queue.extend(item)


def preexisting_cases(inst: TaskInstance, start: Mapping[str, bytes]) -> set[str]:
    """Cases whose method output the start state already holds, in any encoding.

    That is an entry in one of its JSON files (a prediction entry, a validation report's 'entry') that equals a replay,
    or an array file whose content equals one of a replay's arrays. Output copied from there is not evidence of any
    call."""
    if not start:
        return set()
    limits = limits_of(start)
    candidates = [c for path, data in start.items() if path.endswith(".json")
                  for c in _entry_candidates(json_or_none(data, path, limits))]
    arrays: dict[str, np.ndarray] = {}
    found = set()
    for cid in inst.case_ids:
        outs = method_outputs(inst, cid)
        if any(_equals(out, c, start) for out in outs for c in candidates):
            found.add(cid)
            continue
        for _, want in ((k, a) for out in outs for k, a in out[1].items()):
            for path in start:
                if array_extension(path, DECODERS) and path not in arrays:
                    try:
                        arrays[path] = artefact_array(start, path)
                    except ValueError:
                        arrays[path] = np.zeros(0)
                got = arrays.get(path)
                if got is not None and got.shape == want.shape and np.allclose(got, want, rtol=0.0, atol=ATOL):
                    found.add(cid)
    return found


def _changed(receipt: Receipt, path: str, data: bytes) -> bool:
    """True when `path` no longer holds what `receipt`'s call wrote there (per its recorded digest)."""
    digest = receipt.written_digest(path)
    return digest is not None and digest != sha256_hex(data)


def _call_verdict(inst: TaskInstance, receipt: Receipt, out_dir: str, files: Mapping[str, bytes],
                  known: set[str], pre: set[str]) -> bool:
    """Whether one call that read the method and an input ran it into `out_dir`.

    The module docstring's rules 1 and 2 decide. `known`: digests the call could have copied (start files, files it
    read); `pre`: `preexisting_cases`."""
    evidence = False
    limits = limits_of(files)
    for cid in inst.case_ids:
        path = f"{out_dir}/{cid}.json"
        if path not in receipt.writes or path not in files or _changed(receipt, path, files[path]):
            continue  # not written by this call, or changed since: not this call's to check
        entry = json_or_none(files[path], path, limits)
        named = entry_files(entry)
        if any(f in files and f in receipt.writes and _changed(receipt, f, files[f]) for f in named):
            continue
        match = case_matches(inst, cid, entry, files)
        if match is False:
            return False  # a case entry this call wrote that is not the method's output
        if match is None or cid in pre or not all(f in receipt.writes and f in files for f in named):
            continue
        if any(sha256_hex(files[f]) in known for f in [path, *named]) or guessable(inst, cid):
            continue
        evidence = True
    return evidence


def method_run_calls(inst: TaskInstance, receipts: Sequence[Receipt], candidates: Sequence[Receipt],
                     out_dir: str, files: Mapping[str, bytes], start: Mapping[str, bytes]) -> list[Receipt]:
    """The calls of `candidates` that ran the method into `out_dir` (module docstring).

    Candidates are successful calls that read the method and a case input and wrote under `out_dir`.

    Args:
      receipts: every receipt of the episode, in call order (their writes tell what each call could read).
      candidates: a subset of `receipts`.
      files: the final workspace; start: the workspace the episode started from ({} when unknown).
    Never raises for agent-written content.
    """
    todo = {id(r) for r in candidates}
    if not todo:
        return []
    start_digests = {sha256_hex(data) for data in start.values()}
    current = {path: sha256_hex(data) for path, data in start.items()}  # path -> digest as of the next call
    pre = preexisting_cases(inst, start)
    ran = []
    for r in receipts:
        if id(r) in todo:
            known = start_digests | {current[p] for p in r.reads if current.get(p)}
            if _call_verdict(inst, r, out_dir, files, known, pre):
                ran.append(r)
        for path in r.writes:
            current[path] = r.written_digest(path) or ""
    return ran
