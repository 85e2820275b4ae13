"""Host-side replay of a task's provided method: "the method ran" is checked on what it produced (issue 13).

A call's kernel-observed reads and writes show which files it touched, not that it imported and called the
method: `cat model.py case.npy > outputs/validation/x` touches the same files. What only a real run of the
method gives is its output. The host holds the task's method (`model.py`, `config.json`) and the case inputs in
the task's initial workspace (`TaskInstance.files`), so it runs the method itself on a case, the way the brief
tells the agent to (`predict(load_input(file), row, load_config())`, then `save_prediction`), and an artefact
counts as the method's output only when it equals that replay: the same entry values and the same array content
(within `ATOL`).

Replayable cases are those whose initial input loads: every case except a 'spacing' fault, and the archived
original of a 'missing' / 'unreadable' one (the input the agent is told to restore). The method code is the
task's own (never the agent's workspace copy) and runs on the host in a temporary directory; results are cached
per method and input bytes.
"""

from __future__ import annotations

import csv
import functools
import gzip
import io
import json
import os
import tempfile
import types
from collections.abc import Mapping
from pathlib import PurePosixPath

import numpy as np

from bat_jax.tasks.base import TaskInstance, decode_array

#: Absolute tolerance on array and float values when comparing an artefact with the replay (float32 outputs,
#: the same numpy / scipy code on both sides).
ATOL = 1e-4


def _replay_input(inst: TaskInstance, case_id: str) -> tuple[str, bytes, dict[str, str]] | None:
    """(input path, input bytes, manifest row) the method should be run on for `case_id`, or None."""
    L = inst.layout
    rows = {r["case_id"]: r for r in csv.DictReader(io.StringIO(inst.files[L.cases_csv].decode()))}
    row = rows.get(case_id)
    if row is None:
        return None
    path = row["file"]
    if inst.fault is not None and inst.fault.case_id == case_id:
        if inst.fault.kind == "spacing":
            return None
        data = inst.files.get(f"{L.archive_dir}/{PurePosixPath(path).name}.gz")
        return None if data is None else (path, gzip.decompress(data), row)
    data = inst.files.get(path)
    return None if data is None else (path, data, row)


@functools.lru_cache(maxsize=256)
def _run_method(model_py: bytes, config_json: bytes, input_name: str, input_bytes: bytes,
                row_items: tuple[tuple[str, str], ...]) -> tuple[str, tuple[tuple[str, np.ndarray], ...]] | None:
    """Runs the method on one input in a temp dir. Returns (JSON text of the entry's non-file values,
    (key, read-only decoded array) of each file the entry names), or None when the method raises on this input.
    Cached, so nothing it returns may be mutable."""
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


def method_output(inst: TaskInstance, case_id: str) -> tuple[dict, dict[str, np.ndarray]] | None:
    """The provided method's output for one case of `inst`, replayed on the host.

    Returns:
      (values, arrays): the entry's non-file values (e.g. {'label': ..., 'scores': {...}}) and, for each entry key
      that names a written file, its decoded content (`decode_array`, float64 / int arrays, read-only); None when
      the case has no replayable input (see the module docstring) or the method rejects it.
    """
    got = _replay_input(inst, case_id)
    if got is None:
        return None
    path, data, row = got
    L = inst.layout
    out = _run_method(inst.files[f"{L.method_dir}/model.py"], inst.files[f"{L.method_dir}/config.json"], path, data,
                      tuple(sorted(row.items())))
    if out is None:
        return None
    values, arrays = out
    return json.loads(values), dict(arrays)


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


def is_method_output(inst: TaskInstance, case_id: str, entry, files: Mapping[str, bytes]) -> bool:
    """True when `entry` (a prediction entry as the agent saved it, file paths workspace-relative, contents in
    `files`) equals the method's replayed output for `case_id`: every non-file value within `ATOL`, every file
    present with the replay's shape and values within `ATOL`. False for anything else (no replay, other keys,
    missing or unreadable files)."""
    expected = method_output(inst, case_id)
    if expected is None or not isinstance(entry, dict):
        return False
    values, arrays = expected
    if set(entry) != set(values) | set(arrays):
        return False
    if not all(_close(values[k], entry[k]) for k in values):
        return False
    for key, want in arrays.items():
        path = entry[key]
        if not isinstance(path, str) or path not in files:
            return False
        try:
            got = decode_array(files[path], path)
        except ValueError:
            return False
        if got.shape != want.shape or not np.allclose(got, want, rtol=0.0, atol=ATOL):
            return False
    return True


def entry_files(entry) -> list[str]:
    """Workspace paths an entry names (its string values that look like files), for write-trace checks."""
    if not isinstance(entry, dict):
        return []
    return [v for v in entry.values() if isinstance(v, str) and _ext(v)]
