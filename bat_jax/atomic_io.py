"""All-or-nothing writes of files and directories, the one implementation every writer of the package uses.

Files: run-directory files, the ledger, Stage Bank versions and work cache, state archives, the held-out manifest,
plots. Directories: Hugging Face checkpoint exports, GGUF imports, the tiny tokenizer.

Details: docs/design.md.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def fsync_dir(path: str | os.PathLike) -> None:
    """Flushes the entries of directory `path` (a rename or a new file in it) to disk. Raises OSError."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file opened for writing that becomes `path` when the `with` block ends without an exception.

    Parent directories are created. On an exception nothing at `path` changes and the temporary file is gone.

    Raises:
      OSError: the directory or file cannot be written (the exception of the block itself propagates as it is).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "xb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    fsync_dir(path.parent)


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Writes `data` to `path` all or nothing (`atomic_file`). Raises OSError."""
    with atomic_file(path) as f:
        f.write(data)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """A new empty directory to fill in the `with` block that then replaces `path` whole.

    The directory (mode 0755) is made beside `path`. When the block ends without an exception it replaces `path` (a
    directory or nothing; parents are created), otherwise it is removed and `path` is unchanged. Replacing an existing
    directory takes two renames (the old one aside, the new one in, then the old one removed): a reader sees the old
    directory, the new one or, between the renames, none; never a part of one.

    Raises:
      OSError: the directory cannot be created or renamed (the exception of the block itself propagates as it is).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        tmp.chmod(0o755)
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.{uuid.uuid4().hex}.old")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old)
        else:
            os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
