"""Common task framework: task instances, input encoding, outcome variants and the Track base class.

Details: docs/design.md.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from bat_jax.sandbox.readers import DecodeLimits, json_or_none, limits_of, load_array, load_json, workspace
from bat_jax.sandbox.types import SandboxState
from bat_jax.benchmarks.imaging import nifti
from bat_jax.benchmarks.imaging.brief import HELDOUT_TEMPLATE, render_brief
from bat_jax.benchmarks.imaging.layout import TRAIN_LAYOUT, Layout

VARIANTS = ("success", "recovery", "failure")
#: Fault kinds the agent must name in its validation report ('spacing' only on tracks with `spacing`).
FAULT_KINDS = ("missing", "unreadable", "spacing")


@dataclasses.dataclass(frozen=True)
class Case:
    """One case: id, workspace path of its input, public metadata columns, hidden target."""

    case_id: str
    file: str
    meta: Mapping[str, str]
    target: Any


@dataclasses.dataclass(frozen=True)
class Fault:
    """An injected fault on one case.

    kind ∈ FAULT_KINDS; recoverable → an archive copy exists (missing, unreadable) or the manifest holds the true
    spacing (spacing)."""

    case_id: str
    kind: str
    recoverable: bool


@dataclasses.dataclass(frozen=True)
class TaskInstance:
    """One generated task. `files` is the initial workspace; `cases[*].target` is the hidden answer key."""

    task_id: str
    track: str
    seed: int
    variant: str
    layout: Layout
    brief: str
    files: Mapping[str, bytes]
    cases: tuple[Case, ...]
    fault: Fault | None
    method_version: str

    def state(self) -> SandboxState:
        """The executable initial sandbox state p."""
        return SandboxState(files=dict(self.files))

    @property
    def case_ids(self) -> list[str]:
        return [c.case_id for c in self.cases]

    def recoverable_ids(self) -> list[str]:
        """Cases that can be completed (all but an unrecoverable fault's case)."""
        bad = self.fault.case_id if self.fault and not self.fault.recoverable else None
        return [c for c in self.case_ids if c != bad]

    def case(self, case_id: str) -> Case:
        for c in self.cases:
            if c.case_id == case_id:
                return c
        raise KeyError(f"task {self.task_id} has no case {case_id!r}")


def encode_input(array: np.ndarray, ext: str, spacing: tuple[float, ...] = (1.0, 1.0, 2.0)) -> bytes:
    """Serialises an input array: 'nii.gz' (nibabel, float32, diag affine), 'png' (uint8 grey), 'npy'."""
    if ext == "nii.gz":
        import nibabel as nib

        affine = np.diag(list(spacing[: array.ndim]) + [1.0] * (4 - array.ndim))
        img = nib.Nifti1Image(np.asarray(array, np.float32), affine)
        return gzip.compress(img.to_bytes(), mtime=0)
    if ext == "png":
        from PIL import Image

        buf = io.BytesIO()
        Image.fromarray(np.clip(np.rint(array * 255.0), 0, 255).astype(np.uint8), mode="L").save(buf, "PNG")
        return buf.getvalue()
    if ext == "npy":
        buf = io.BytesIO()
        np.save(buf, np.asarray(array, np.float32), allow_pickle=False)
        return buf.getvalue()
    raise ValueError(f"unknown input extension {ext!r}; expected nii.gz, png or npy")


#: In-sandbox helpers shared by every provided method (stdlib + numpy + nibabel + PIL only).
METHOD_PRELUDE = '''"""Provided method for this task. Functions: load_config, load_input, predict, save_prediction,
summarize. Inputs must be finite; predict raises ValueError otherwise."""
import json, os
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def load_config():
    with open(os.path.join(HERE, "config.json")) as f:
        return json.load(f)


def load_input(path):
    """Loads one case input as float32 (PNG scaled to 0-1). Raises on missing or corrupt files."""
    if path.endswith(".nii.gz") or path.endswith(".nii"):
        import nibabel as nib
        img = nib.load(path)
        x = np.asarray(img.get_fdata(), dtype=np.float32)
        target = load_config().get("target_spacing")
        if target:  # resample to the method's working spacing using the header's voxel size
            factors = [float(z) / t for z, t in zip(img.header.get_zooms()[: x.ndim], target)]
            if not np.allclose(factors, 1.0):
                from scipy import ndimage
                x = ndimage.zoom(x, factors, order=1).astype(np.float32)
    elif path.endswith(".png"):
        from PIL import Image
        with Image.open(path) as im:
            im.load()
            x = np.asarray(im, dtype=np.float32) / 255.0
    else:
        x = np.load(path, allow_pickle=False).astype(np.float32)
    if not np.all(np.isfinite(x)):
        raise ValueError("non-finite values in " + path)
    return x


def _portable(value):
    """`value` with every float at 12 significant digits, so the last bits that numpy's version or the CPU's SIMD
    path leave in a float (0.001659012576622161 vs 0.0016590125766221611) do not reach the files."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_portable(v) for v in value]
    return value


def _write_entry(out_dir, case_id, entry):
    entry = _portable(entry)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, case_id + ".json"), "w") as f:
        json.dump(entry, f)
    return entry
'''


class Track:
    """Base class of a track family. Subclasses set the class attributes and implement the hooks."""

    name: str = ""
    title: str = ""
    input_ext: str = "npy"
    metric_name: str = ""
    method_summary: str = ""
    output_summary: str = ""
    method_body: str = ""
    method_config: Mapping[str, Any] = {}
    n_cases: int = 4
    #: Voxel spacing (mm) of NIfTI inputs, written to the header and the manifest column `spacing_mm`;
    #: None for 2D tracks (then the 'spacing' fault is not drawn).
    spacing: tuple[float, ...] | None = None

    # ---- hooks -------------------------------------------------------------------------------------
    def make_case(self, rng: np.random.Generator, case_id: str, phrasing: int = 0) -> tuple[np.ndarray, dict, Any]:
        """Returns (input array, public metadata columns, hidden target).

        `phrasing` selects the text templates of questions/reports: 0 training, 1 held-out (disjoint)."""
        raise NotImplementedError

    def check_entry(self, entry: Any, files: Mapping[str, bytes]) -> list[str]:
        """Format errors of one prediction entry (empty list = valid)."""
        raise NotImplementedError

    def case_score(self, entry: Mapping, files: Mapping[str, bytes], case: Case) -> float:
        """Task metric contribution of one valid entry, 0–1 (used when the track metric is a case mean)."""
        raise NotImplementedError

    def expected_shape(self, case: Case) -> list[int]:
        """Shape `summarize` must report for the case's prediction."""
        raise NotImplementedError

    def nondegenerate(self, entry: Mapping, files: Mapping[str, bytes]) -> bool:
        """Host-side check that a prediction is not trivial (e.g. an all-background mask)."""
        raise NotImplementedError

    def manifest_extra(self, case: Case) -> dict:
        """Track-specific manifest fields (questions, answers, report texts) for the leakage preflight."""
        return {}

    def task_metric(self, instance: TaskInstance, predictions: Mapping[str, Any],
                    files: Mapping[str, bytes]) -> float:
        """Metric over all cases (missing/invalid predictions score 0), 0–1. Override for set metrics."""
        return float(np.mean([self.valid_case_score(predictions.get(case.case_id), files, case)
                              for case in instance.cases]))

    def valid_case_score(self, entry: Any, files: Mapping[str, bytes], case: Case) -> float:
        """`case_score` of a valid entry; 0.0 for a missing or invalid one, or one whose scoring raises.

        What the agent wrote is then unreadable: its failure. Never raises.

        Raises:
          ScorerError (`verify.rubric`): the metric returned a non-finite value for a valid entry (a bug in the
            metric, never the agent's doing: entries with non-finite values are invalid).
        """
        try:
            if entry is None or self.check_entry(entry, files):
                return 0.0
            value = float(self.case_score(entry, files, case))
        except Exception:  # noqa: BLE001 - agent-written content the metric cannot read scores 0
            return 0.0
        if not math.isfinite(value):
            from bat_jax.verify.rubric import ScorerError

            raise ScorerError(f"{self.name} metric gave {value} for case {case.case_id}")
        return value

    # ---- generation --------------------------------------------------------------------------------
    def method_version(self, seed: int) -> str:
        return f"{self.name}-method-{1 + seed % 7}.{seed % 5}"

    def generate(self, seed: int, variant: str = "success", layout: Layout = TRAIN_LAYOUT,
                 id_prefix: str = "tr", template: int = 0) -> TaskInstance:
        """Writes a task deterministically from (seed, variant, layout, id_prefix, template).

        Raises:
          ValueError: unknown variant.
        """
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")
        rng = np.random.default_rng(seed)
        task_id = f"{id_prefix}-{self.name[:3]}-{seed:08d}-{variant[:3]}"
        files: dict[str, bytes] = {}
        cases = []
        rows = []
        arrays = {}
        for k in range(self.n_cases):
            case_id = f"{id_prefix}{seed % 1000:03d}{chr(97 + k)}{int(rng.integers(100, 999))}"
            array, meta, target = self.make_case(rng, case_id, int(template == HELDOUT_TEMPLATE))
            path = f"{layout.images_dir}/{case_id}.{self.input_ext}"
            if self.spacing:
                meta = {**meta, "spacing_mm": ",".join(str(v) for v in self.spacing)}
                files[path] = encode_input(array, self.input_ext, self.spacing)
            else:
                files[path] = encode_input(array, self.input_ext)
            arrays[case_id] = array
            cases.append(Case(case_id, path, dict(meta), target))
            rows.append({"case_id": case_id, "file": path, **meta})
        fault = None
        if variant != "success":
            victim = cases[1 + int(rng.integers(0, self.n_cases - 1))]
            kinds = FAULT_KINDS if self.spacing else FAULT_KINDS[:2]
            kind = kinds[int(rng.integers(0, len(kinds)))] if variant == "recovery" else "unreadable"
            fault = Fault(victim.case_id, kind, recoverable=variant == "recovery")
            good = files[victim.file]
            if kind == "missing":
                del files[victim.file]
            elif kind == "spacing":
                files[victim.file] = encode_input(arrays[victim.case_id], self.input_ext,
                                                  tuple(2.0 * v for v in self.spacing))
            else:
                files[victim.file] = good[: len(good) // 3]
            if fault.recoverable and kind != "spacing":
                files[f"{layout.archive_dir}/{victim.file.rsplit('/', 1)[-1]}.gz"] = gzip.compress(good, mtime=0)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        files[layout.cases_csv] = buf.getvalue().encode()
        version = self.method_version(seed)
        files[f"{layout.method_dir}/model.py"] = (METHOD_PRELUDE + self.method_body).encode()
        files[f"{layout.method_dir}/config.json"] = json.dumps(
            {"version": version, **self.method_config}, indent=1).encode()
        brief = render_brief(self, task_id, layout, len(cases), template)
        files["task.md"] = brief.encode()
        return TaskInstance(task_id, self.name, seed, variant, layout, brief, files, tuple(cases), fault, version)

    # ---- submission --------------------------------------------------------------------------------
    def check_submission(self, instance: TaskInstance, data: bytes | None,
                         files: Mapping[str, bytes]) -> list[str]:
        """Deterministic format checker of `submission.json` (errors name the field / case).

        Total: any bytes give a list of errors (the JSON is read within `limits_of(files)`), never an exception."""
        path = instance.layout.submission
        if data is None:
            return [f"{path}: missing"]
        try:
            sub = load_json(data, path, limits_of(files))
        except ValueError as exc:
            return [str(exc)]
        if not isinstance(sub, dict):
            return ["submission: top level must be an object"]
        errors = []
        if sub.get("task_id") != instance.task_id:
            errors.append(f"submission.task_id: expected {instance.task_id!r}, got {_short(sub.get('task_id'))}")
        preds, failed = sub.get("predictions"), sub.get("failed", {})
        if not isinstance(preds, dict):
            return errors + ["submission.predictions: must be an object case_id -> entry"]
        if not isinstance(failed, dict) or not all(isinstance(v, str) and v for v in failed.values()):
            errors.append("submission.failed: must map case_id -> non-empty reason")
            failed = {}
        known = set(instance.case_ids)
        for cid, entry in preds.items():
            if cid not in known:
                errors.append(f"submission.predictions[{_short(cid)}]: unknown case id")
                continue
            errors.extend(f"submission.predictions[{cid!r}]: {e}" for e in self._entry_errors(entry, files))
        for cid in failed:
            if cid not in known:
                errors.append(f"submission.failed[{_short(cid)}]: unknown case id")
        return errors

    def _entry_errors(self, entry: Any, files: Mapping[str, bytes]) -> list[str]:
        """`check_entry`, with an exception turned into an error (never raises)."""
        try:
            return list(self.check_entry(entry, files))
        except Exception as exc:  # noqa: BLE001 - an entry the checker cannot read is invalid
            return [f"unreadable entry ({type(exc).__name__})"]

    def submission_predictions(self, instance: TaskInstance, files: Mapping[str, bytes]) -> dict:
        """The predictions object of a parseable submission (read within `limits_of(files)`), else {}.

        Entries for a case the task declares unrecoverable are left out: such a case scores as declared failed, whatever
        is submitted for it (no input to predict it from, so any entry is made up)."""
        sub = json_or_none(files.get(instance.layout.submission), instance.layout.submission, limits_of(files))
        preds = sub.get("predictions", {}) if isinstance(sub, dict) else {}
        if not isinstance(preds, dict):
            return {}
        usable = set(instance.recoverable_ids())
        return {cid: entry for cid, entry in preds.items() if cid in usable}

    def score_task(self, instance: TaskInstance, files: Mapping[str, bytes], submitted: str | None,
                   limits: DecodeLimits | None = None) -> float:
        """Task metric of an episode's final workspace, 0–1.

        It is 0 unless the submission was submitted and the file has a valid top-level structure; invalid entries score
        0 individually.

        Total over agent-written bytes: `files` are read within `limits` (default: `limits_of(files)`); an entry
        that cannot be read scores 0 and a metric that raises on what the agent wrote gives 0, never an
        exception. Always a finite number in [0, 1].
        Raises:
          ScorerError (`verify.rubric`): the metric returned a non-finite value (a bug in the metric).
        """
        from bat_jax.verify.rubric import ScorerError

        if submitted != instance.layout.submission:
            return 0.0
        files = workspace(files, limits)
        try:
            value = float(self.task_metric(instance, self.submission_predictions(instance, files), files))
        except ScorerError:
            raise
        except Exception:  # noqa: BLE001 - what the agent wrote broke a set metric: its failure, scored 0
            return 0.0
        if not math.isfinite(value):
            raise ScorerError(f"{self.name} task metric gave {value} for {instance.task_id}")
        return value


def _short(value: Any, chars: int = 80) -> str:
    """`repr(value)` cut to `chars` characters (agent-written values in error messages)."""
    text = repr(value)
    return text if len(text) <= chars else text[:chars] + "..."


def decode_array(data: bytes, path: str, limits: DecodeLimits | None = None) -> np.ndarray:
    """Host-side load of an artefact by extension ('.nii.gz', '.png', '.npy'), within `limits`.

    It calls `readers.load_array` with the suite's NIfTI decoder. Raises ValueError (`readers.ArtefactError`) if
    unreadable, and nothing else."""
    return load_array(data, path, limits or DecodeLimits(), nifti.DECODERS)


def artefact_array(files: Mapping[str, bytes], path: str) -> np.ndarray:
    """The decoded array of workspace file `path`, within `limits_of(files)`.

    Raises:
      ValueError: missing, unreadable or over a cap (the message names the path).
    """
    if not isinstance(path, str) or path not in files:
        raise ValueError(f"{_short(path)} does not exist in the workspace")
    return decode_array(files[path], path, limits_of(files))


def array_entry_errors(entry, key: str, ext: str, files: Mapping[str, bytes]) -> list[str]:
    """Format errors of an entry {key: workspace path of an array artefact with extension `ext`}.

    The file must exist, decode within `limits_of(files)` and hold only finite values."""
    if not isinstance(entry, dict) or not isinstance(entry.get(key), str):
        return [f"entry must be an object with a string {key!r}"]
    path = entry[key]
    if not path.endswith("." + ext):
        return [f"{key}: {_short(path)} must end with .{ext}"]
    if path not in files:
        return [f"{key}: {_short(path)} does not exist in the workspace"]
    try:
        arr = artefact_array(files, path)
    except ValueError as exc:
        return [str(exc)[:300]]
    if not np.all(np.isfinite(arr)):
        return [f"{key}: {_short(path)} has non-finite values"]
    return []


class ImageToImageTrack(Track):
    """Shared scoring of tracks whose output per case is one NPY image of the target's shape.

    Tracks: enhancement, synthesis. Entry field 'image', metric SSIM against the hidden target (data range 1),
    non-degenerate when the image is not constant."""

    def check_entry(self, entry, files):
        return array_entry_errors(entry, "image", "npy", files)

    def case_score(self, entry, files, case: Case) -> float:
        from bat_jax.benchmarks.imaging.metrics import ssim

        img = artefact_array(files, entry["image"])
        if img.shape != case.target.shape:
            return 0.0
        return ssim(case.target, img, data_range=1.0)

    def expected_shape(self, case):
        return list(case.target.shape)

    def nondegenerate(self, entry, files):
        img = artefact_array(files, entry["image"])
        scale = float(np.max(np.abs(img), initial=0.0))  # std of the image scaled into [-1, 1]: no overflow
        return bool(math.isfinite(scale) and scale > 0.0 and float(np.std(img / scale)) * scale > 1e-3)
