"""Total readers of agent-written bytes: JSON, text and arrays (.npy, .png, a benchmark's own) under decoded-size caps.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

#: Largest integer a JSON artefact may hold (magnitude): the int64 range.
_MAX_JSON_INT = 2**63


class ArtefactError(ValueError):
    """An agent artefact that cannot be read within the caps (invalid, over a cap, unsupported).

    The message names the path and the reason. Reading it is the agent's failure, never the host's."""


@dataclasses.dataclass(frozen=True)
class DecodeLimits:
    """Caps on decoding one agent artefact on the host (gin: `readers.DecodeLimits`).

    Attributes:
      max_json_bytes: bytes of one JSON file (submission, prediction entry, report) at most.
      max_json_depth: nesting depth of a JSON value at most (a scalar has depth 0).
      max_text_bytes: bytes of one text file (plan, notes) read at most.
      max_array_bytes: bytes of one decoded array as float64 (the working copy the metrics use) at most; the
        compressed or encoded bytes of its file are bounded by `EvidenceLimits.max_file_bytes`.
      max_array_dims: dimensions of one array at most.
    Raises:
      ValueError: a cap below 1 (named).
    """

    max_json_bytes: int = 1 << 20
    max_json_depth: int = 32
    max_text_bytes: int = 1 << 20
    max_array_bytes: int = 64 << 20
    max_array_dims: int = 8

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if getattr(self, field.name) < 1:
                raise ValueError(f"DecodeLimits.{field.name} must be >= 1, got {getattr(self, field.name)}")


DEFAULT_LIMITS = DecodeLimits()


# ---- JSON -----------------------------------------------------------------------------------------------------
def _bad_constant(name: str):
    raise ArtefactError(f"non-finite number {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ArtefactError(f"number {text[:40]} overflows a float")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 19:
        raise ArtefactError(f"integer with {len(text)} digits is beyond the 64-bit range")
    value = int(text)
    if abs(value) >= _MAX_JSON_INT:
        raise ArtefactError(f"integer {text} is beyond the 64-bit range")
    return value


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a parsed JSON value, iteratively (no recursion); stops once past `limit`."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            stack.extend((v, depth) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def load_json(data: bytes, path: str = "", limits: DecodeLimits = DEFAULT_LIMITS) -> Any:
    """The JSON value of agent-written bytes.

    Returns:
      dict / list / str / int / float / bool / None; numbers finite, ints within 64 bits, depth within the cap.
    Raises:
      ArtefactError (only): not bytes / str, over `max_json_bytes`, not UTF-8 JSON, NaN / Infinity, an
        overflowing number, or nested deeper than `max_json_depth`.
    """
    if not isinstance(data, (bytes, bytearray, str)):
        raise ArtefactError(f"{path}: not a file's bytes ({type(data).__name__})")
    if len(data) > limits.max_json_bytes:
        raise ArtefactError(f"{path}: {len(data)} bytes of JSON, over the {limits.max_json_bytes}-byte cap")
    try:
        value = json.loads(data, parse_constant=_bad_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except ArtefactError as exc:
        raise ArtefactError(f"{path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ArtefactError(f"{path}: invalid JSON ({exc})") from None
    except (ValueError, RecursionError, TypeError, OverflowError) as exc:  # UnicodeDecodeError, deep nesting
        raise ArtefactError(f"{path}: invalid JSON ({type(exc).__name__}: {str(exc)[:200]})") from None
    if _depth(value, limits.max_json_depth) > limits.max_json_depth:
        raise ArtefactError(f"{path}: JSON nested deeper than {limits.max_json_depth} levels")
    return value


def json_or_none(data: bytes | None, path: str = "", limits: DecodeLimits = DEFAULT_LIMITS) -> Any:
    """`load_json(data)`, or None when `data` is None or invalid (never raises)."""
    if data is None:
        return None
    try:
        return load_json(data, path, limits)
    except ArtefactError:
        return None


def text_or_none(data: bytes | None, limits: DecodeLimits = DEFAULT_LIMITS) -> str | None:
    """UTF-8 text (undecodable bytes replaced) of at most `max_text_bytes` bytes.

    None when `data` is None, not bytes, or over the cap (never raises)."""
    if not isinstance(data, (bytes, bytearray)) or len(data) > limits.max_text_bytes:
        return None
    return bytes(data).decode("utf-8", errors="replace")


# ---- arrays ---------------------------------------------------------------------------------------------------
#: Array extensions `load_array` reads; a benchmark adds its own formats with `decoders`.
ARRAY_EXTENSIONS = (".npy", ".png")
#: A decoder of one array format: (bytes, path, limits) -> np.ndarray; raises ArtefactError (anything else is read as
#: "unreadable"). It checks a header against `limits` (`check_dtype`, `check_shape`) before it inflates the data.
ArrayDecoder = Callable[[bytes, str, "DecodeLimits"], Any]


def check_shape(shape, itemsize: int, path: str, limits: DecodeLimits) -> None:
    """Raises ArtefactError unless `shape` is a tuple of non-negative ints within the dimension and size caps."""
    shape = tuple(int(n) for n in shape)
    if len(shape) > limits.max_array_dims or any(n < 0 for n in shape):
        raise ArtefactError(f"{path}: array shape {shape[:12]} (at most {limits.max_array_dims} dimensions)")
    count = math.prod(shape)
    if count * max(8, itemsize) > limits.max_array_bytes:
        raise ArtefactError(f"{path}: array of shape {shape} holds {count} values, over the "
                            f"{limits.max_array_bytes}-byte decoded cap")


def check_dtype(dtype, path: str) -> None:
    """Raises ArtefactError unless `dtype` is a plain bool, int or float type."""
    import numpy as np

    dtype = np.dtype(dtype)
    if dtype.kind not in "biuf" or dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise ArtefactError(f"{path}: dtype {dtype.str} is not a plain bool, int or float type")


def _npy(data: bytes, path: str, limits: DecodeLimits):
    import numpy as np
    from numpy.lib import format as npy_format

    buf = io.BytesIO(data)
    version = npy_format.read_magic(buf)
    if version == (1, 0):
        shape, fortran, dtype = npy_format.read_array_header_1_0(buf)
    elif version in ((2, 0), (3, 0)):
        shape, fortran, dtype = npy_format.read_array_header_2_0(buf)
    else:
        raise ArtefactError(f"{path}: .npy format version {version} is not supported")
    check_dtype(dtype, path)
    check_shape(shape, dtype.itemsize, path, limits)
    if len(data) - buf.tell() < math.prod(shape) * dtype.itemsize:
        raise ArtefactError(f"{path}: .npy data shorter than its header's shape {shape}")
    return np.load(io.BytesIO(data), allow_pickle=False)


def _png(data: bytes, path: str, limits: DecodeLimits):
    import numpy as np
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pillow's DecompressionBombWarning: our cap is checked below
        with Image.open(io.BytesIO(data)) as im:
            if im.format != "PNG":
                raise ArtefactError(f"{path}: not a PNG image ({im.format})")
            width, height = im.size
            check_shape((height, width, len(im.getbands())), 8, path, limits)
            im.load()
            return np.asarray(im, dtype=np.float64) / 255.0


_DECODERS: dict[str, ArrayDecoder] = {".npy": _npy, ".png": _png}


def array_extension(path: str, decoders: Mapping[str, ArrayDecoder] | None = None) -> str:
    """The array extension `path` ends with (one of `ARRAY_EXTENSIONS` or of `decoders`, longest first), or ''."""
    extensions = sorted({*ARRAY_EXTENSIONS, *(decoders or {})}, key=len, reverse=True)
    return next((ext for ext in extensions if isinstance(path, str) and path.endswith(ext)), "")


def load_array(data: bytes, path: str, limits: DecodeLimits = DEFAULT_LIMITS,
               decoders: Mapping[str, ArrayDecoder] | None = None):
    """The array of an agent-written `.png` or `.npy` file, or of a format a benchmark's `decoders` read.

    Values: `.png` float64 in 0-1 per 8-bit sample; `.npy` its stored numeric dtype. A decoder's array is held to the
    same dtype and size caps.

    Returns:
      an np.ndarray of a bool / int / float dtype within `limits`; its values may be non-finite (the caller
      decides whether that is valid).
    Raises:
      ArtefactError (only): unsupported extension, not bytes, corrupt, non-numeric dtype, or over a cap.
    """
    table = {**_DECODERS, **(decoders or {})}
    ext = array_extension(path, table)
    if not ext:
        raise ArtefactError(f"{path}: unsupported extension (expected one of {', '.join(sorted(table))})")
    if not isinstance(data, (bytes, bytearray)):
        raise ArtefactError(f"{path}: not a file's bytes ({type(data).__name__})")
    try:
        array = table[ext](bytes(data), path, limits)
        check_dtype(array.dtype, path)
        check_shape(array.shape, array.dtype.itemsize, path, limits)
        return array
    except ArtefactError:
        raise
    except Exception as exc:  # noqa: BLE001 — any decoder failure means an unreadable artefact
        raise ArtefactError(f"{path}: unreadable ({type(exc).__name__}: {str(exc)[:200]})") from None


# ---- the workspace as the readers see it ----------------------------------------------------------------------
class Workspace(Mapping):
    """An episode's workspace files (workspace-relative path → bytes) with the `DecodeLimits` of their readers.

    Every reader of them applies the limits: scoring code passes it wherever it passes files, so the caps travel with
    the bytes.

    A read-only Mapping (equal to a dict with the same items); `limits_of(files)` gives the caps of any mapping.
    """

    def __init__(self, files: Mapping[str, bytes] = (), limits: DecodeLimits = DEFAULT_LIMITS):
        self._files = dict(files)
        self.limits = limits

    def __getitem__(self, path: str) -> bytes:
        return self._files[path]

    def __iter__(self):
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)

    def __repr__(self) -> str:
        return f"Workspace({len(self._files)} files, {self.limits})"


def limits_of(files: Mapping[str, bytes]) -> DecodeLimits:
    """The caps a reader applies to `files`: a `Workspace`'s own, the defaults for any other mapping."""
    return getattr(files, "limits", DEFAULT_LIMITS) if isinstance(files, Workspace) else DEFAULT_LIMITS


def workspace(files: Mapping[str, bytes], limits: DecodeLimits | None = None) -> Workspace:
    """`files` as a `Workspace` with `limits` (None: its own caps when it already is one, else the defaults)."""
    if isinstance(files, Workspace) and (limits is None or limits == files.limits):
        return files
    return Workspace(files, limits if limits is not None else limits_of(files))
