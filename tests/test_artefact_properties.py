"""Property-based tests (hypothesis): random and adversarial artefacts thrown at every track's scoring and at the
evidence readers — JSON nested past any limit, numbers too large for a float, NaN / inf / 1e200 arrays, every
dtype, bombs in every array format the tracks read (.nii.gz, .png, .npy), truncated and random bytes, odd file
names. None raises, none yields a NaN or an out-of-range score, none costs the host more than its caps.
"""

import functools
import gzip
import io
import json
import math
import struct
import tracemalloc
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bat_jax.sandbox.readers import ArtefactError, DecodeLimits, json_or_none, load_array, load_json, text_or_none
from bat_jax.sandbox.types import Receipt, sha256_hex
from bat_jax.benchmarks.imaging.nifti import DECODERS
from bat_jax.benchmarks.imaging.registry import TRACKS, get_track
from bat_jax.benchmarks.imaging.rubric import build_rubric
from bat_jax.verify.rubric import Evidence, score

#: Small caps, so that a property run exercises them quickly; what a reader may cost is bounded by them.
LIMITS = DecodeLimits(max_json_bytes=64 << 10, max_json_depth=16, max_text_bytes=64 << 10,
                      max_array_bytes=4 << 20, max_array_dims=4)
#: Peak traced memory one scoring may take: a few float64 working copies of one capped array.
PEAK_BYTES = 8 * LIMITS.max_array_bytes

SETTINGS = settings(max_examples=40, deadline=None, database=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@functools.lru_cache(maxsize=None)
def _instance(name):
    variant = "recovery" if name == "segmentation" else "success"
    return get_track(name).generate(7, variant)


# ---- generators of adversarial bytes ------------------------------------------------------------------------
def _gzip_zeros(head: bytes, zeros: int) -> bytes:
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    out = [z.compress(head)]
    while zeros > 0:
        out.append(z.compress(bytes(min(zeros, 1 << 20))))
        zeros -= 1 << 20
    return b"".join(out) + z.flush()


def _nifti_header(shape, dtype) -> bytes:
    import nibabel as nib

    header = nib.Nifti1Header()
    header.set_data_dtype(dtype)
    header.set_data_shape(shape)
    header.set_data_offset(352)
    return header.binaryblock + b"\0" * 4


def _png_bomb(width: int, height: int) -> bytes:
    """A valid 8-bit grey PNG of zeros, written row by row (never holding the image)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    z = zlib.compressobj(9)
    row = bytes(width + 1)
    idat = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def _npy_header_only(shape) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": tuple(shape)})
    return buf.getvalue() + b"\0" * 64


ELEMENT_VALUES = st.sampled_from([0.0, 1.0, -1.0, 0.5, 1e-300, 1e200, -1e300, 1.7e308, float("nan"), float("inf"),
                                  -float("inf"), 3.0e38, 255.0, 2.0])
DTYPES = st.sampled_from(["float64", "float32", "float16", "int64", "int32", "int16", "uint8", "bool",
                          "complex64", "<U3"])


@st.composite
def arrays(draw, shape=None):
    shape = shape or draw(st.sampled_from([(), (0,), (3,), (32, 32), (16, 16, 8), (32, 32, 3), (2, 2, 2, 2),
                                            (1, 1, 1, 1, 1, 1)]))
    dtype = draw(st.one_of(st.just("float64"), DTYPES))
    finite = ELEMENT_VALUES.filter(math.isfinite)
    fill = draw(st.lists(st.one_of(finite, ELEMENT_VALUES) if draw(st.booleans()) else finite, min_size=1, max_size=4))
    values = np.resize(np.asarray(fill, np.float64), int(np.prod(shape)) or 0).reshape(shape)
    with np.errstate(all="ignore"):
        return values.astype(dtype) if dtype != "<U3" else values.astype(str).astype(dtype)


@st.composite
def array_files(draw, ext, target_shape):
    """Bytes a file named `*.ext` may hold: a valid encoding of an adversarial array (often of the target's
    shape), a bomb, a header claiming a huge shape, truncated or random bytes."""
    kind = draw(st.sampled_from(["valid", "valid_target_shape", "valid_target_shape", "huge_target_shape",
                                 "huge_target_shape", "bomb", "truncated", "random"]))
    if kind == "huge_target_shape":  # finite float64 values past what a square can hold, signs mixed
        big = draw(st.sampled_from([1e155, 1e200, 1e300, 1.7e308]))
        signs = np.where(np.random.default_rng(draw(st.integers(0, 9))).uniform(size=target_shape) > 0.5, 1.0, -1.0)
        data = _encode(big * signs if draw(st.booleans()) else np.full(target_shape, big), ext)
    elif kind in ("valid", "valid_target_shape"):
        array = draw(arrays(tuple(target_shape) if kind == "valid_target_shape" else None))
        try:
            data = _encode(array, ext)
        except Exception:  # noqa: BLE001 - this array has no encoding in this format
            data = b""
    elif kind == "bomb":
        side = draw(st.sampled_from([300, 400, 4000]))
        if ext == ".nii.gz":
            data = _gzip_zeros(_nifti_header((side, side, 8), np.float32), 0 if side > 400 else side * side * 32)
        elif ext == ".png":
            data = _png_bomb(side * 4, side * 4) if side <= 400 else _png_bomb(100, 100)[:33] + b"\0" * 64
        else:
            data = _npy_header_only((side, side, side))
    else:
        data = draw(st.binary(max_size=2048))
        if kind == "truncated":
            data = _encode(np.zeros(target_shape, np.float32), ext)[: draw(st.integers(0, 400))]
    return data


def _encode(array: np.ndarray, ext: str) -> bytes:
    if ext == ".npy":
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)
        return buf.getvalue()
    if ext == ".nii.gz":
        import nibabel as nib

        return gzip.compress(nib.Nifti1Image(array if array.ndim >= 1 else array.reshape(1), np.eye(4)).to_bytes())
    from PIL import Image

    with np.errstate(all="ignore"):
        pixels = np.asarray(array, np.uint8) if array.ndim in (2, 3) else np.zeros((2, 2), np.uint8)
    img = Image.fromarray(pixels)
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                        st.text(max_size=20), st.sampled_from(["..x", "...", "a/../../b", "/etc/passwd", "x.npy"]))
JSON_VALUES = st.recursive(JSON_LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                st.dictionaries(st.text(max_size=8), inner,
                                                                                max_size=4)), max_leaves=20)


@st.composite
def json_bytes(draw):
    """JSON-ish bytes: a dump of a random value (NaN, Infinity, 70-bit integers included), nesting far past any
    limit, a number of thousands of digits, invalid UTF-8, or random bytes."""
    kind = draw(st.sampled_from(["value", "deep", "digits", "not_utf8", "random", "huge"]))
    if kind == "value":
        return json.dumps(draw(JSON_VALUES)).encode()
    if kind == "deep":
        n = draw(st.sampled_from([17, 500, 5000, 200_000]))
        return b"[" * n + b"]" * n
    if kind == "digits":
        return b'{"a": ' + b"9" * draw(st.integers(20, 6000)) + b"}"
    if kind == "not_utf8":
        return b'{"a": "\xff\xfe\xfd"}'
    if kind == "huge":
        return b'{"a": [' + b"0," * (40 << 10) + b"0]}"
    return draw(st.binary(max_size=512))


# ---- the readers --------------------------------------------------------------------------------------------
@SETTINGS
@given(data=json_bytes())
def test_json_and_text_readers_return_or_raise_artefact_error_only(data):
    try:
        value = load_json(data, "x.json", LIMITS)
    except ArtefactError:
        value = None
    else:
        text = json.dumps(value, allow_nan=False)  # finite numbers, no recursion trouble
        assert len(text) <= 4 * LIMITS.max_json_bytes
    assert json_or_none(data, "x.json", LIMITS) == value
    text = text_or_none(data, LIMITS)
    assert text is None or len(text) <= LIMITS.max_text_bytes


@pytest.mark.parametrize("ext", [".npy", ".nii.gz", ".png"])
def test_array_readers_are_total_and_capped(ext):
    @SETTINGS
    @given(data=array_files(ext, (32, 32)))
    def check(data):
        tracemalloc.start()
        try:
            array = load_array(data, "f" + ext, LIMITS, DECODERS)
        except ArtefactError:
            array = None
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < PEAK_BYTES, f"decoding took {peak / 2**20:.1f} MiB"
        if array is not None:
            assert array.dtype.kind in "biuf" and array.size * 8 <= LIMITS.max_array_bytes

    check()


# ---- every track's scoring -------------------------------------------------------------------------------------
ENTRY_KEYS = {"segmentation": ("mask", ".nii.gz"), "enhancement": ("image", ".npy"), "synthesis": ("image", ".npy"),
              "classification": ("label", None), "detection": ("boxes", None), "vqa": ("answer", None),
              "report": ("report", None)}
ODD_NAMES = st.sampled_from(["p/{c}", "p/..{c}", "p/.../{c}", "p/{c}\n", "p/{c} ", "p/\u00e9{c}", "p/" + "d/" * 40 + "{c}"])


@st.composite
def episodes(draw, name):
    """(files, receipts, submitted) of an adversarial final workspace of a task of track `name`: a submission and
    prediction entries naming adversarial artefacts under odd names, and a receipt that 'ran the method'."""
    track, inst = get_track(name), _instance(name)
    L = inst.layout
    key, ext = ENTRY_KEYS[name]
    files = dict(inst.files)
    preds, written = {}, []
    for case in inst.cases:
        if ext is not None:
            path = draw(ODD_NAMES).format(c=case.case_id) + ext
            path = path.replace("p/", f"{L.pred_dir}/", 1)
            files[path] = draw(array_files(ext, tuple(np.shape(case.target))))
            entry = draw(st.sampled_from([{key: path}] * 3 + [{key: path, "extra": 1}, {}, [path], {key: 7}]))
            written.append(path)
        else:
            entry = draw(st.one_of(JSON_VALUES.map(lambda v: {key: v}), JSON_VALUES,
                                   st.just({"boxes": [[0, 0, 1e308, 1e308, 1e200], [3, 3, 2, 2, 0.5]]}),
                                   st.just({"boxes": [[True, 0, 2**70, 5, float("inf")]]})))
        preds[case.case_id] = entry
        entry_path = f"{L.pred_dir}/{case.case_id}.json"
        try:
            files[entry_path] = json.dumps(entry).encode()
        except (TypeError, ValueError):
            files[entry_path] = b"{"
        written.append(entry_path)
    submission = draw(st.sampled_from([{"task_id": inst.task_id, "predictions": preds, "failed": {}}] * 3
                                      + [{"task_id": inst.task_id, "predictions": list(preds.values())}]))
    files[L.submission] = draw(st.sampled_from([json.dumps(submission).encode()] * 3
                                               + [draw(json_bytes()), b"{" * 300_000]))
    files[L.validation_json] = draw(json_bytes())
    receipt = Receipt(0, "execute_code", "python", "", 0, "", "", 0.0, 1.0, False, "",
                      reads=(f"{L.method_dir}/model.py", f"{L.method_dir}/config.json", inst.cases[0].file),
                      writes=tuple(sorted(written)), trace_complete=True,
                      write_digests=tuple(sorted((p, sha256_hex(files[p])) for p in written if p in files)))
    return track, inst, files, (receipt,), L.submission


@pytest.mark.parametrize("name", list(TRACKS))
def test_scoring_any_workspace_is_total_finite_and_capped(name):
    @SETTINGS
    @given(episode=episodes(name))
    def check(episode):
        track, inst, files, receipts, submitted = episode
        tracemalloc.start()
        try:
            task = track.score_task(inst, files, submitted, LIMITS)
            errors = track.check_submission(inst, files[submitted], files)
            evidence = Evidence(receipts, files, submitted, start_files=inst.files, limits=LIMITS)
            result = score(build_rubric(track, inst), evidence, task)  # E2E: every stage and the task metric
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert isinstance(task, float) and 0.0 <= task <= 1.0
        assert all(isinstance(e, str) for e in errors)
        assert result.reward is not None and math.isfinite(result.reward) and 0.0 <= result.reward <= 1.0
        assert peak < PEAK_BYTES + (16 << 20), f"scoring took {peak / 2**20:.1f} MiB"

    check()
