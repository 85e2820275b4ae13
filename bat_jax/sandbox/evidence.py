"""Bounded evidence collection: workspace files read host-side under caps in files, bytes and seconds.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from bat_jax.sandbox.types import FileTooLarge, Sandbox


@dataclasses.dataclass(frozen=True)
class EvidenceLimits:
    """Caps on reading one episode's workspace back to the host.

    Attributes:
      max_files: regular files read at most (the rest are skipped).
      max_file_bytes: bytes of one file at most (a larger file is skipped unread).
      max_total_bytes: bytes of all files read together at most.
      max_seconds: wall-clock seconds for the whole collection; files not reached by then are skipped.
    """

    max_files: int = 2000
    max_file_bytes: int = 64 * 2**20
    max_total_bytes: int = 256 * 2**20
    max_seconds: float = 60.0

    def __post_init__(self):
        if min(self.max_files, self.max_file_bytes, self.max_total_bytes) < 0 or self.max_seconds <= 0:
            raise ValueError(f"EvidenceLimits: caps must be non-negative and max_seconds > 0, got {self}")


def gather_files(sandbox: Sandbox, limits: EvidenceLimits = EvidenceLimits(),
                 keep: Callable[[str, bytes], bool] | None = None) -> tuple[dict[str, bytes], list[str]]:
    """Reads the sandbox's workspace files within `limits`.

    Args:
      sandbox: any `Sandbox` (its `list_files` may itself be capped).
      limits: the caps.
      keep: optional filter `(path, data) -> bool`; files it rejects are neither kept nor counted.
    Returns:
      (files: path → bytes, skipped: sorted paths left out for a cap or because they could not be read).
    Raises:
      whatever the backend raises for a dead sandbox (e.g. `SandboxError`); never an error about one file.
    """
    end = time.monotonic() + limits.max_seconds
    paths = sandbox.list_files()
    bulk = getattr(sandbox, "read_files", None)
    if bulk is not None:  # the Docker backend: a few round trips instead of one per file
        return _gather_bulk(bulk, paths, limits, keep, end)
    files: dict[str, bytes] = {}
    skipped: list[str] = []
    total = 0
    for n, path in enumerate(paths):
        if n >= limits.max_files or time.monotonic() > end:
            skipped.extend(paths[n:])
            break
        budget = min(limits.max_file_bytes, limits.max_total_bytes - total)
        try:
            data = sandbox.read_file(path, max_bytes=budget)
        except FileTooLarge:
            skipped.append(path)
            continue
        except FileNotFoundError:
            continue
        except (OSError, ValueError):  # unreadable (permissions, an odd name): left out, the agent's failure
            skipped.append(path)
            continue
        if keep is not None and not keep(path, data):
            continue
        files[path] = data
        total += len(data)
    return files, sorted(skipped)


def _gather_bulk(read_files, paths: list[str], limits: EvidenceLimits, keep, end: float
                 ) -> tuple[dict[str, bytes], list[str]]:
    files: dict[str, bytes] = {}
    skipped = list(paths[limits.max_files:])
    paths = paths[:limits.max_files]
    total = 0
    for start in range(0, len(paths), 64):
        chunk = paths[start:start + 64]
        if time.monotonic() > end:
            skipped.extend(paths[start:])
            break
        got, too_large = read_files(chunk, limits.max_file_bytes, limits.max_total_bytes - total)
        skipped.extend(too_large)
        for path in chunk:
            if path in got and (keep is None or keep(path, got[path])):
                files[path] = got[path]
                total += len(got[path])
    return files, sorted(skipped)
