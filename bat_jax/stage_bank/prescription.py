"""The prescription firewall: what the BiCuRL router may tell the data side (aggregates only).

Details: docs/design.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from bat_jax.benchmark.stages import StageSet


class PrescriptionError(ValueError):
    """A router prescription carries a field or value that may not cross the firewall."""


_TRACK_KEY = re.compile(r"^[a-z][a-z0-9_]*$")


def _number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PrescriptionError(f"prescription field {field!r} must be a finite number, got {value!r}")
    return float(value)


def _stage_map(value: Any, field: str, stages: StageSet) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise PrescriptionError(f"prescription field {field!r} must map stages to numbers")
    return {_stage_name(k, field, stages): _number(v, f"{field}.{k}") for k, v in value.items()}


def _track_map(value: Any, field: str, *, integer: bool = False) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise PrescriptionError(f"prescription field {field!r} must map names to numbers")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not _TRACK_KEY.match(k):
            raise PrescriptionError(f"prescription field {field!r} has key {k!r}; only aggregate names "
                                    "(lowercase identifiers such as track names) may cross the firewall")
        if integer and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise PrescriptionError(f"prescription field {field}.{k} must be a count (int >= 0), got {v!r}")
        out[k] = v if integer else _number(v, f"{field}.{k}")
    return out


def _round_index(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PrescriptionError(f"prescription field {field!r} must be a round index (int >= 0), got {value!r}")
    return value


def _stage_name(value: Any, field: str, stages: StageSet) -> str:
    if not isinstance(value, str):
        raise PrescriptionError(f"prescription field {field!r} must name a stage, got {value!r}")
    try:
        return stages.parse(value)
    except ValueError as e:
        raise PrescriptionError(f"prescription field {field!r}: {e}") from None


def _counts(value: Any, field: str) -> dict[str, float]:
    return _track_map(value, field, integer=True)


def _focus_counts(value: Any, field: str, stages: StageSet) -> dict[str, int]:
    """Row counts per focus ('E2E' or a stage of `stages`)."""
    if not isinstance(value, Mapping):
        raise PrescriptionError(f"prescription field {field!r} must map foci to counts")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str):
            raise PrescriptionError(f"prescription field {field!r} must name foci, got {k!r}")
        try:
            focus = stages.parse_focus(k)
        except ValueError as e:
            raise PrescriptionError(f"prescription field {field!r}: {e}") from None
        out[focus] = _round_index(v, f"{field}.{k}")
    return out


#: Router → data-side prescription fields and their checkers (aggregates only); the stage checkers also take the
#: benchmark's `StageSet`.
PRESCRIPTION_FIELDS: Mapping[str, Callable[..., Any]] = {
    "round": _round_index,
    "target_stage": _stage_name,
    "overall": _number,
    "task_mean": _number,
    "stage_scores": _stage_map,
    "stage_changes": _stage_map,
    "track_task_means": _track_map,
    "track_changes": _track_map,
    "counts": _counts,
    "bank_version": _round_index,
    "rows_by_pool": _counts,
    "rows_by_focus": _focus_counts,
}


_STAGE_FIELDS = ("target_stage", "stage_scores", "stage_changes", "rows_by_focus")


def check_prescription(payload: Mapping[str, Any], stages: StageSet, *,
                       tracks: Iterable[str] | None = None) -> dict[str, Any]:
    """Returns a clean copy of a router prescription, or raises if anything but aggregates would cross.

    Allowed fields: PRESCRIPTION_FIELDS (round, target_stage, overall, task_mean, stage_scores, stage_changes,
    track_task_means, track_changes, counts, bank_version, rows_by_pool, rows_by_focus); values are numbers or maps of stage/track names to numbers. Stage
    names must be stages of `stages` (ids or titles; ids come out). When `tracks` is given, the keys of
    track_task_means / track_changes must be among them.

    Raises:
      PrescriptionError: naming the offending field (unknown field, free text, nested data, ids, paths).
    """
    if not isinstance(payload, Mapping):
        raise PrescriptionError(f"a prescription must be a mapping, got {type(payload).__name__}")
    out = {}
    for key, value in payload.items():
        check = PRESCRIPTION_FIELDS.get(key)
        if check is None:
            raise PrescriptionError(f"prescription field {key!r} is not an allowed aggregate field; "
                                    f"allowed {sorted(PRESCRIPTION_FIELDS)}")
        out[key] = check(value, key, stages) if key in _STAGE_FIELDS else check(value, key)
        if tracks is not None and key in ("track_task_means", "track_changes"):
            unknown = sorted(set(out[key]) - set(tracks))
            if unknown:
                raise PrescriptionError(f"prescription field {key!r} names unknown tracks {unknown}")
    return out
