"""The versioned on-disk Stage Bank: immutable admitted rows, append-only versions, atomic writes, an index.

Source: paper Section 2.1 ("The bank indexes rows by task type, stage, outcome label, and reward source") and
Appendix A.1 ("Stage Bank is a versioned set Z of rows").

Details: docs/design.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from bat_jax.atomic_io import atomic_write, fsync_dir
from bat_jax.sandbox import snapshot
from bat_jax.sandbox.types import SandboxState
from bat_jax.stage_bank.row import RLRow, SFTRow, StateRef
from bat_jax.stage_bank.row_parse import rl_row_from_dict, sft_row_from_dict
from bat_jax.stage_bank.row_validation import RowValidationError

FORMAT = 1
#: Index dimensions (paper: task type, stage, outcome label, reward source).
INDEX_KEYS: tuple[str, ...] = ("track", "focus", "outcome", "reward_source")


class BankError(RuntimeError):
    """A bank operation failed (corrupt version, duplicate row, unknown version, concurrent writer)."""


class BankLocked(BankError):
    """Another writer holds the bank (the message names its pid, host and lock file)."""


LOCK_FILE = "writer.lock"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


@contextlib.contextmanager
def writer_lock(root: str | os.PathLike, owner: str = "") -> Iterator[Path]:
    """Holds the bank's one writer lock (`<root>/writer.lock`, created with O_CREAT | O_EXCL) for the `with` block.

    A lock held by a live process, or by a process on another host, refuses this writer; a lock whose pid is dead
    on this host is stale (its writer was killed) and is reclaimed. The lock file is removed when the block ends.

    Raises:
      BankLocked: naming the holder (pid, host, what it said it was) and the lock file.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_FILE
    me = {"pid": os.getpid(), "host": socket.gethostname(), "owner": owner, "since_unix": time.time()}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                holder = json.loads(path.read_text("utf-8"))
                pid, host = int(holder["pid"]), str(holder["host"])
            except FileNotFoundError:
                continue  # released meanwhile: try again
            except (OSError, ValueError, KeyError, TypeError):
                holder, pid, host = {}, -1, "?"  # a lock being written this instant, or garbage
                if time.time() - path.stat().st_mtime < 5.0:
                    raise BankLocked(f"{path}: the Stage Bank at {root} has another writer (lock being written); "
                                     "one writer at a time") from None
            if pid <= 0 or (host == me["host"] and not _pid_alive(pid)):
                print(f"[bat_jax] {path}: reclaiming a stale writer lock (pid {pid} on {host} is gone)", flush=True)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                continue
            raise BankLocked(f"{path}: the Stage Bank at {root} is held by another writer: pid {pid} on host {host}"
                             f"{' (' + holder['owner'] + ')' if holder.get('owner') else ''}; one writer at a time "
                             "(stop it, or remove the lock file if that process is gone)") from None
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
            f.flush()
            os.fsync(f.fileno())
        break
    else:
        raise BankLocked(f"{path}: could not take the Stage Bank writer lock after 3 tries")
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            if json.loads(path.read_text("utf-8")).get("pid") == me["pid"]:
                os.unlink(path)


@dataclasses.dataclass(frozen=True)
class BankView:
    """All rows of one bank version (read-only).

    Attributes:
      version: version number (≥ 1), or 0 for an empty bank.
      rl_rows: RL rows in admission order.
      sft_rows: SFT rows in admission order.
    """

    version: int
    rl_rows: tuple[RLRow, ...]
    sft_rows: tuple[SFTRow, ...]

    def __post_init__(self):
        index: dict[tuple[str, str], list[int]] = defaultdict(list)
        for i, row in enumerate(self.rl_rows):
            for key in INDEX_KEYS:
                index[(key, getattr(row, key))].append(i)
        object.__setattr__(self, "_index", {k: tuple(v) for k, v in index.items()})
        object.__setattr__(self, "_by_state_id", {r.state_id: r for r in self.rl_rows})

    def query(self, **criteria: str) -> list[RLRow]:
        """RL rows matching every given index key, e.g. `query(track='vqa', focus='S3', outcome='failure')`.

        Raises:
          KeyError: an unknown criterion (allowed: INDEX_KEYS).
        """
        unknown = set(criteria) - set(INDEX_KEYS)
        if unknown:
            raise KeyError(f"unknown index keys {sorted(unknown)}; allowed {INDEX_KEYS}")
        sets = [set(self._index.get((k, v), ())) for k, v in criteria.items()]
        picked = set.intersection(*sets) if sets else set(range(len(self.rl_rows)))
        return [self.rl_rows[i] for i in sorted(picked)]

    def counts(self, key: str) -> dict[str, int]:
        """Number of RL rows per value of one index key, sorted by value."""
        if key not in INDEX_KEYS:
            raise KeyError(f"unknown index key {key!r}; allowed {INDEX_KEYS}")
        return {v: len(ids) for (k, v), ids in sorted(self._index.items()) if k == key}

    def row(self, state_id: str) -> RLRow:
        """The RL row with this state_id. Raises KeyError."""
        return self._by_state_id[state_id]


class StageBank:
    """A versioned, append-only Stage Bank rooted at a directory (created on first write)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    @property
    def _versions_dir(self) -> Path:
        return self.root / "versions"

    # ------------------------------------------------------------------------------------ states
    def put_state(self, state: SandboxState) -> StateRef:
        """Stores a sandbox state as a `bat_jax.sandbox.snapshot` tar (idempotent, atomic); returns its reference."""
        ref = StateRef(state.digest(), f"states/{state.digest()}.tar")
        path = self.root / ref.path
        if not path.exists():
            snapshot.save(state, path)
        return ref

    def state_path(self, ref: StateRef) -> Path:
        return self.root / ref.path

    def load_state(self, ref: StateRef) -> SandboxState:
        """Reads a stored state and checks its digest. Raises BankError (missing file or digest mismatch)."""
        path = self.state_path(ref)
        if not path.is_file():
            raise BankError(f"{path}: state archive for digest {ref.digest} is missing")
        try:
            state = snapshot.load(path)
        except ValueError as e:
            raise BankError(str(e)) from e
        if state.digest() != ref.digest:
            raise BankError(f"{path}: state digest {state.digest()} does not match reference {ref.digest}")
        return state

    # ---------------------------------------------------------------------------------- versions
    def versions(self) -> list[int]:
        """Published version numbers, ascending (staging directories are ignored)."""
        if not self._versions_dir.is_dir():
            return []
        out = []
        for p in self._versions_dir.iterdir():
            if p.is_dir() and p.name.startswith("v") and p.name[1:].isdigit():
                out.append(int(p.name[1:]))
        return sorted(out)

    def latest(self) -> int:
        """The newest published version, 0 for an empty bank."""
        v = self.versions()
        return v[-1] if v else 0

    def writer(self, owner: str = "") -> contextlib.AbstractContextManager[Path]:
        """The bank's one writer lock for a `with` block (`writer_lock`). Raises BankLocked naming the holder."""
        return writer_lock(self.root, owner)

    def _version_dir(self, version: int) -> Path:
        return self._versions_dir / f"v{version:06d}"

    def note(self, version: int) -> str:
        """The free-text note version `version` was admitted with.

        Raises:
          BankError: the version's manifest is missing or unreadable.
        """
        mpath = self._version_dir(version) / "manifest.json"
        try:
            return str(json.loads(mpath.read_text("utf-8")).get("note", ""))
        except (OSError, json.JSONDecodeError) as e:
            raise BankError(f"{mpath}: unreadable manifest ({e})") from e

    def rl_count(self, version: int) -> int:
        """RL rows in version `version` (0 for version 0), from the manifests alone (no row is parsed).

        Raises:
          BankError: an unknown version or an unreadable manifest.
        """
        published = [v for v in self.versions() if v <= version]
        if version and version not in published:
            raise BankError(f"{self.root}: unknown version {version}; published {self.versions()}")
        total = 0
        for v in published:
            mpath = self._version_dir(v) / "manifest.json"
            try:
                total += int(json.loads(mpath.read_text("utf-8"))["rl"]["count"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise BankError(f"{mpath}: unreadable manifest ({e})") from e
        return total

    def _read_segment(self, version: int) -> tuple[list[RLRow], list[SFTRow]]:
        vdir = self._version_dir(version)
        mpath = vdir / "manifest.json"
        try:
            manifest = json.loads(mpath.read_text("utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise BankError(f"{mpath}: unreadable manifest ({e})") from e
        out: dict[str, list] = {}
        for kind, parse in (("rl", rl_row_from_dict), ("sft", sft_row_from_dict)):
            entry = manifest[kind]
            fpath = vdir / entry["file"]
            data = fpath.read_bytes()
            if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                raise BankError(f"{fpath}: content does not match the manifest's SHA-256 (corrupt version)")
            rows = []
            for i, line in enumerate(data.decode("utf-8").splitlines()):
                try:
                    rows.append(parse(json.loads(line), file=str(fpath), row=i))
                except json.JSONDecodeError as e:
                    raise RowValidationError(f"invalid JSON ({e})", file=str(fpath), row=i) from e
            if len(rows) != entry["count"]:
                raise BankError(f"{fpath}: {len(rows)} rows, manifest says {entry['count']}")
            out[kind] = rows
        return out["rl"], out["sft"]

    def read(self, version: int | None = None, *, base: BankView | None = None) -> BankView:
        """Reads version `version` (default: latest) as the union of segments 1..version.

        With `base` (a view of an earlier or the same version of this bank) only the segments after it are read:
        a round moving to a newer version reads just the rows admitted since.

        Raises:
          BankError: unknown version or a segment whose bytes do not match its manifest.
          RowValidationError: a stored row fails validation (names file, row, field).
        """
        published = self.versions()
        if version is None:
            version = published[-1] if published else 0
        if version == 0:
            return BankView(0, (), ())
        if version not in published:
            raise BankError(f"{self.root}: unknown version {version}; published {published}")
        if base is not None and base.version > version:
            raise BankError(f"{self.root}: base view v{base.version} is newer than the version read, v{version}")
        rl: list[RLRow] = list(base.rl_rows) if base is not None else []
        sft: list[SFTRow] = list(base.sft_rows) if base is not None else []
        start = base.version if base is not None else 0
        for v in published:
            if v > version:
                break
            if v <= start:
                continue
            seg_rl, seg_sft = self._read_segment(v)
            rl += seg_rl
            sft += seg_sft
        return BankView(version, tuple(rl), tuple(sft))

    def admit(
        self,
        rl_rows: Iterable[RLRow] = (),
        sft_rows: Iterable[SFTRow] = (),
        *,
        note: str = "",
        on_staged: Callable[[Path], None] | None = None,
    ) -> int:
        """Admits rows as a new version and returns its number.

        Rows are immutable once admitted: a row whose state_id (RL) or digest (SFT) is already in the bank,
        or repeated inside this call, is refused. Every RL row's state archive must already be stored.

        Args:
          rl_rows, sft_rows: rows to admit (at least one in total).
          note: free text kept in the manifest.
          on_staged: fault-injection hook called with the staging directory after every file is written and
            fsynced and before the publishing rename (tests kill the process here).

        Raises:
          BankError: no rows, a duplicate, a missing state archive, or a concurrent writer published the same
            version number first.
        """
        rl_rows, sft_rows = list(rl_rows), list(sft_rows)
        if not rl_rows and not sft_rows:
            raise BankError("admit() needs at least one row")
        current = self.read()
        seen_rl = {r.state_id for r in current.rl_rows}
        seen_sft = {r.digest for r in current.sft_rows}
        for i, r in enumerate(rl_rows):
            if not isinstance(r, RLRow):
                raise BankError(f"rl_rows[{i}] is a {type(r).__name__}, not an RLRow")
            if r.state_id in seen_rl:
                raise BankError(f"rl_rows[{i}]: state_id {r.state_id} is already admitted (rows are immutable)")
            if not (self.root / r.state.path).is_file():
                raise BankError(f"rl_rows[{i}] ({r.state_id}): state archive {r.state.path} is not stored; "
                                "call put_state() first")
            seen_rl.add(r.state_id)
        for i, r in enumerate(sft_rows):
            if not isinstance(r, SFTRow):
                raise BankError(f"sft_rows[{i}] is a {type(r).__name__}, not an SFTRow")
            if r.digest in seen_sft:
                raise BankError(f"sft_rows[{i}]: digest {r.digest} is already admitted")
            seen_sft.add(r.digest)

        version = current.version + 1
        staging = self.root / ".staging" / f"v{version:06d}-{uuid.uuid4().hex}"
        staging.mkdir(parents=True)
        try:
            manifest = {"format": FORMAT, "version": version, "parent": current.version or None,
                        "created_unix": time.time(), "note": note}
            for kind, rows in (("rl", rl_rows), ("sft", sft_rows)):
                data = "".join(json.dumps(r.to_record(), sort_keys=True, ensure_ascii=False) + "\n"
                               for r in rows).encode("utf-8")
                atomic_write(staging / f"{kind}.jsonl", data)
                manifest[kind] = {"file": f"{kind}.jsonl", "sha256": hashlib.sha256(data).hexdigest(),
                                  "count": len(rows)}
            atomic_write(staging / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True).encode())
            if on_staged is not None:
                on_staged(staging)
            self._versions_dir.mkdir(parents=True, exist_ok=True)
            target = self._version_dir(version)
            try:
                os.rename(staging, target)  # atomic publish; fails if another writer took this number
            except OSError as e:
                raise BankError(f"{target}: version {version} was published concurrently ({e})") from e
            fsync_dir(self._versions_dir)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        return version

    def clean_staging(self) -> int:
        """Removes staging directories left by killed writers; returns how many were removed.

        Only call this when no writer is running."""
        d = self.root / ".staging"
        if not d.is_dir():
            return 0
        n = 0
        for p in d.iterdir():
            shutil.rmtree(p, ignore_errors=True)
            n += 1
        return n

