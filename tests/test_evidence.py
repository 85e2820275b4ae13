"""Bounded reading of a workspace back to the host (bat_jax/sandbox/evidence.py): file count, per-file and total byte
caps, the keep filter, and files that vanish or cannot be read, on a dict-backed sandbox with hand-set sizes."""

import pytest

from bat_jax.sandbox.evidence import EvidenceLimits, gather_files
from bat_jax.sandbox.types import FileTooLarge


class DictSandbox:
    """`list_files` / `read_file` over a dict; a None value reads as a vanished file, an int as unreadable."""

    def __init__(self, files):
        self.files = files

    def list_files(self):
        return list(self.files)

    def read_file(self, path, max_bytes=None):
        data = self.files[path]
        if data is None:
            raise FileNotFoundError(path)
        if isinstance(data, int):
            raise PermissionError(path)
        if max_bytes is not None and len(data) > max_bytes:
            raise FileTooLarge(path)
        return data


def test_files_are_read_until_a_cap_and_the_rest_are_named_as_skipped():
    box = DictSandbox({"a": b"x" * 4, "big": b"y" * 9, "b": b"z" * 4, "c": b"w" * 4, "d": b"v"})
    # per file ≤ 8 bytes skips 'big'; 10 bytes in all read 'a' and 'b' (8), then 'c' (4 > 2 left) is skipped and
    # 'd' (1) fits
    files, skipped = gather_files(box, EvidenceLimits(max_file_bytes=8, max_total_bytes=10))
    assert files == {"a": b"xxxx", "b": b"zzzz", "d": b"v"} and skipped == ["big", "c"]
    files, skipped = gather_files(box, EvidenceLimits(max_files=2))
    assert list(files) == ["a", "big"] and skipped == ["b", "c", "d"]


def test_the_keep_filter_vanished_and_unreadable_files():
    box = DictSandbox({"keep.txt": b"1", "drop.bin": b"2", "gone": None, "locked": 13})
    files, skipped = gather_files(box, keep=lambda path, data: path.endswith(".txt"))
    assert files == {"keep.txt": b"1"} and skipped == ["locked"]  # a vanished file is neither read nor skipped


def test_limits_are_checked():
    with pytest.raises(ValueError, match="caps must be non-negative and max_seconds > 0"):
        EvidenceLimits(max_files=-1)
    with pytest.raises(ValueError, match="max_seconds > 0"):
        EvidenceLimits(max_seconds=0)
