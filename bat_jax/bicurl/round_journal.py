"""The round journal: what a GRPO block rolled out, kept on disk so a killed round resumes without losing it.

Details: docs/design.md.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pathlib
import pickle
import shutil
import threading
from collections.abc import Callable, Sequence
from typing import Any

from bat_jax.atomic_io import atomic_write

JOURNAL_DIR = "journal"


def _rebased(trajectory: Any, delta: int) -> Any:
    """`trajectory` with its weight versions (`turn_versions`, `weight_version`) moved by `delta`."""
    if not hasattr(trajectory, "turn_versions"):
        return trajectory
    fields = {"turn_versions": tuple(int(v) + delta for v in trajectory.turn_versions),
              "weight_version": int(getattr(trajectory, "weight_version", 0)) + delta}
    if dataclasses.is_dataclass(trajectory):
        return dataclasses.replace(trajectory, **fields)
    out = copy.copy(trajectory)
    for name, value in fields.items():
        setattr(out, name, value)
    return out


class RoundJournal:
    """One round's journal (module docstring); `RoundJournal(None)` keeps nothing (every unit rolled out).

    Attributes:
      directory: the round's journal directory, or None.
      reused: units read back instead of rolled out (since this object was made).
      reissued: units rolled out again that were issued before this object was made but never finished (in flight
        at the kill).
      rolled: units rolled out (reissued ones included).
    """

    def __init__(self, directory: str | pathlib.Path | None):
        self.directory = None if directory is None else pathlib.Path(directory)
        self.reused = self.reissued = self.rolled = 0
        self._lock = threading.Lock()
        self._issued_before = set(self._keys("issued", ".json"))
        self._done_before = set(self._keys("done", ".pkl"))

    def _keys(self, kind: str, suffix: str) -> list[str]:
        if self.directory is None or not (self.directory / kind).is_dir():
            return []
        return sorted(p.name[: -len(suffix)] for p in (self.directory / kind).iterdir()
                      if p.name.endswith(suffix) and not p.name.startswith("."))

    def unfinished(self) -> list[str]:
        """Keys issued before this object was made and never finished: the units in flight when the run died."""
        return sorted(self._issued_before - self._done_before)

    def finished(self) -> list[str]:
        """Keys finished before this object was made (reusable when their state ids and seed match)."""
        return sorted(self._done_before)

    def _read(self, key: str, state_ids: list[str], seed: int) -> tuple[list, list] | None:
        """The recorded (trajectories, rewards) of `key` when it was issued with `state_ids` and `seed`, else None."""
        path = self.directory / "done" / f"{key}.pkl"
        if key not in self._done_before or not path.exists():
            return None
        with open(path, "rb") as f:
            record = pickle.load(f)
        if record["state_ids"] != state_ids or record["seed"] != seed:
            return None  # another unit under the same key (e.g. a refill drew another spare): not this one
        return record["trajectories"], record["rewards"]

    def rolled_out(self, key: str, state_ids: Sequence[str], seed: int, base_version: int,
                   roll: Callable[[], tuple[list, list]]) -> tuple[list, list]:
        """(trajectories, rewards) of unit `key`, read back or rolled out.

        Read back from the journal when it finished there with the same `state_ids` and `seed`, else `roll()`,
        recorded as issued before and as done after (thread-safe; units of one block have distinct keys). Versions
        are stored relative to `base_version` (module docstring).

        Raises: whatever `roll` raises (the unit stays issued, unfinished); OSError when the journal cannot be written.
        """
        state_ids = [str(s) for s in state_ids]
        if self.directory is not None:
            found = self._read(key, state_ids, seed)
            if found is not None:
                with self._lock:
                    self.reused += 1
                trajectories, rewards = found
                return [_rebased(t, base_version) for t in trajectories], rewards
            atomic_write(self.directory / "issued" / f"{key}.json",
                         json.dumps({"state_ids": state_ids, "seed": seed}).encode())
        with self._lock:
            self.rolled += 1
            self.reissued += key in self._issued_before and key not in self._done_before
        trajectories, rewards = roll()
        if self.directory is not None:
            record = {"state_ids": state_ids, "seed": seed, "rewards": list(rewards),
                      "trajectories": [_rebased(t, -base_version) for t in trajectories]}
            atomic_write(self.directory / "done" / f"{key}.pkl", pickle.dumps(record, pickle.HIGHEST_PROTOCOL))
        return trajectories, rewards

    def line(self) -> str:
        """One log line of what a resumed block took from the journal.

        '' when it reused nothing and re-issued nothing."""
        if not (self.reused or self.reissued):
            return ""
        return (f"[bat_jax] round journal {self.directory}: {self.reused} finished units reused, {self.reissued} "
                f"in flight at the kill re-issued, {self.rolled - self.reissued} more rolled out")

    def clear(self) -> None:
        """Deletes the journal (its round is in the ledger)."""
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def for_round(run_dir: str | pathlib.Path, round_index: int, enabled: bool = True) -> RoundJournal:
    """The journal of round `round_index` under `run_dir` (kept from a killed run; None-backed unless `enabled`).

    The journals of earlier rounds are deleted: their rounds reached the ledger."""
    root = pathlib.Path(run_dir) / JOURNAL_DIR
    if root.is_dir():
        for old in root.iterdir():
            if old.name.startswith("round_") and old.name[6:].isdigit() and int(old.name[6:]) < round_index:
                shutil.rmtree(old, ignore_errors=True)
    return RoundJournal(root / f"round_{round_index:03d}" if enabled else None)

