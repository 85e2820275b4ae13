"""All-or-nothing writes (`bat_jax.atomic_io`): the new content or the old, never a part, and no temporary left."""

import os

import pytest

from bat_jax.atomic_io import atomic_directory, atomic_file, atomic_write


def test_atomic_write_replaces_the_file_and_leaves_nothing_else(tmp_path):
    path = tmp_path / "sub" / "out.json"
    atomic_write(path, b"old")
    atomic_write(path, b"new")
    assert path.read_bytes() == b"new" and os.listdir(path.parent) == ["out.json"]
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "out.bin"
    atomic_write(path, b"old")
    with pytest.raises(RuntimeError, match="half way"):
        with atomic_file(path) as f:
            f.write(b"partial")
            raise RuntimeError("half way")
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["out.bin"]


def test_atomic_directory_replaces_a_directory_or_keeps_it(tmp_path):
    out = tmp_path / "ckpt"
    with atomic_directory(out) as d:
        (d / "a.txt").write_text("1")
    with atomic_directory(out) as d:
        (d / "b.txt").write_text("2")
    assert sorted(os.listdir(out)) == ["b.txt"] and (out.stat().st_mode & 0o777) == 0o755
    with pytest.raises(ValueError, match="stop"):
        with atomic_directory(out) as d:
            (d / "c.txt").write_text("3")
            raise ValueError("stop")
    assert sorted(os.listdir(out)) == ["b.txt"] and os.listdir(tmp_path) == ["ckpt"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
