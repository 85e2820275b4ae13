"""Total readers of agent-written bytes (bat_jax/sandbox/readers.py) on hand-made inputs: JSON within its byte and
depth caps with finite numbers, text, `.npy` arrays, a benchmark's own array decoders, and the workspace that carries
its caps. (The hostile inputs are in tests/test_artefact_properties.py.)"""

import io

import numpy as np
import pytest

from bat_jax.sandbox.readers import (DEFAULT_LIMITS, ArtefactError, DecodeLimits, Workspace, array_extension,
                                     json_or_none, limits_of, load_array, load_json, text_or_none, workspace)


def test_json_within_its_caps():
    assert load_json(b'{"a": [1, 2.5, "x", null, true]}') == {"a": [1, 2.5, "x", None, True]}
    limits = DecodeLimits(max_json_bytes=10, max_json_depth=2)
    assert load_json(b"[[1]]", "p.json", limits) == [[1]]  # depth 2
    with pytest.raises(ArtefactError, match="p.json: JSON nested deeper than 2 levels"):
        load_json(b"[[[1]]]", "p.json", limits)
    with pytest.raises(ArtefactError, match="p.json: 11 bytes of JSON, over the 10-byte cap"):
        load_json(b'"abcdefghi"', "p.json", limits)
    for bad in (b"NaN", b"[Infinity]", b"1e400", str(2**63).encode(), b"{", b"\xff"):
        with pytest.raises(ArtefactError):
            load_json(bad, "bad.json")
        assert json_or_none(bad) is None
    assert load_json(str(2**63 - 1).encode()) == 2**63 - 1 and json_or_none(None) is None


def test_text_is_capped_and_never_raises():
    assert text_or_none(b"caf\xc3\xa9 \xff") == "café \ufffd"
    assert text_or_none(b"x" * 5, DecodeLimits(max_text_bytes=4)) is None
    assert text_or_none(None) is None and text_or_none("str, not bytes") is None


def test_npy_arrays_and_their_caps():
    buf = io.BytesIO()
    np.save(buf, np.arange(6, dtype=np.int16).reshape(2, 3))
    array = load_array(buf.getvalue(), "out/pred.npy")
    assert array.dtype == np.int16 and array.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert [array_extension(p) for p in ("a.nii.gz", "b.png", "c.npy", "d.nii")] == ["", ".png", ".npy", ""]
    with pytest.raises(ArtefactError, match=r"d.nii: unsupported extension \(expected one of .npy, .png\)"):
        load_array(b"", "d.nii")
    with pytest.raises(ArtefactError, match="x.npy"):
        load_array(buf.getvalue(), "x.npy", DecodeLimits(max_array_bytes=40))  # 6 values as float64: 48 bytes
    with pytest.raises(ArtefactError, match="x.npy: unreadable"):
        load_array(b"not an npy file", "x.npy")


def _ints(data: bytes, path: str, limits: DecodeLimits) -> np.ndarray:
    """A benchmark's decoder of a made-up '.ints' format: whitespace-separated integers."""
    if data.startswith(b"huge"):
        raise ArtefactError(f"{path}: header claims a huge array")
    if data.startswith(b"object"):
        return np.array([None, 1], dtype=object)
    return np.array([int(x) for x in data.split()], dtype=np.int64)


def test_a_benchmarks_decoders_add_formats_held_to_the_same_caps():
    decoders = {".ints": _ints, ".i.ints": _ints}
    assert [array_extension(p, decoders) for p in ("a.i.ints", "b.ints", "c.npy", "d.int")] == [
        ".i.ints", ".ints", ".npy", ""]
    assert load_array(b"3 1 2", "p/x.ints", DEFAULT_LIMITS, decoders).tolist() == [3, 1, 2]
    with pytest.raises(ArtefactError, match=r"x.ints: unsupported extension \(expected one of .npy, .png\)"):
        load_array(b"3 1 2", "x.ints")  # not without the decoder
    with pytest.raises(ArtefactError, match="x.ints: header claims a huge array"):
        load_array(b"huge", "x.ints", DEFAULT_LIMITS, decoders)
    with pytest.raises(ArtefactError, match="x.ints: dtype |O8 is not a plain bool, int or float type"):
        load_array(b"object", "x.ints", DEFAULT_LIMITS, decoders)
    with pytest.raises(ArtefactError, match=r"x.ints: array of shape \(6,\) holds 6 values, over the 40-byte"):
        load_array(b"1 2 3 4 5 6", "x.ints", DecodeLimits(max_array_bytes=40), decoders)  # 6 × 8 bytes
    with pytest.raises(ArtefactError, match=r"x.ints: unreadable \(ValueError: invalid literal"):
        load_array(b"1 two", "x.ints", DEFAULT_LIMITS, decoders)


def test_a_workspace_carries_its_caps():
    limits = DecodeLimits(max_text_bytes=3)
    ws = workspace({"a.txt": b"abc"}, limits)
    assert isinstance(ws, Workspace) and dict(ws) == {"a.txt": b"abc"} and limits_of(ws) is limits
    assert workspace(ws).limits is limits and limits_of({"a.txt": b"abc"}) is DEFAULT_LIMITS
    with pytest.raises(ValueError, match="DecodeLimits.max_json_depth must be >= 1, got 0"):
        DecodeLimits(max_json_depth=0)
