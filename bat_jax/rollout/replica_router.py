"""Which rollout replica serves a row.

An episode stays on one replica for its whole life; new episodes go to the replica holding the fewest live tokens.

Details: docs/design.md.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence

import numpy as np


class ReplicaRouter:
    """Routes rows to `num_replicas` replicas (module docstring). Thread safe.

    Args:
      num_replicas: >= 1.
      max_remembered: most finished sequences remembered in all (oldest dropped first).
    Attributes (totals, for tests and benchmarks): continued (rows routed to the replica of their episode),
      started (rows that started an episode), rows_per_replica (rows routed to each replica).
    Raises:
      ValueError: a bound < 1.
    """

    def __init__(self, num_replicas: int, max_remembered: int = 1024):
        if num_replicas < 1 or max_remembered < 1:
            raise ValueError(f"ReplicaRouter: num_replicas and max_remembered must be >= 1, got {num_replicas}, "
                             f"{max_remembered}")
        self.num_replicas = int(num_replicas)
        self.max_remembered = int(max_remembered)
        self._lock = threading.Lock()
        self._live = [0] * self.num_replicas  # tokens of the rows each replica is running
        self._seen: collections.OrderedDict[bytes, tuple] = collections.OrderedDict()  # sequence -> replica, ...
        self.continued = self.started = 0
        self.rows_per_replica = [0] * self.num_replicas

    def live_tokens(self) -> list[int]:
        """Tokens (prompt + budget) of the rows each replica runs now."""
        with self._lock:
            return list(self._live)

    def route(self, prompt: Sequence[int], budget: int) -> int:
        """The replica for one row (`prompt` token ids, `budget` new tokens at most).

        It counts its tokens as live on that replica until `finish`."""
        ids = np.asarray(prompt, np.int32)
        with self._lock:
            replica, key = None, None
            for seq, (r, n, tail) in self._seen.items():  # the longest remembered sequence this prompt extends
                if (n < len(ids) and (key is None or n > len(key) // 4) and ids[max(0, n - 8):n].tobytes() == tail
                        and ids[:n].tobytes() == seq):
                    replica, key = r, seq
            if key is not None:
                del self._seen[key]
                self.continued += 1
            else:
                replica = min(range(self.num_replicas), key=lambda r: (self._live[r], r))
                self.started += 1
            self._live[replica] += len(ids) + int(budget)
            self.rows_per_replica[replica] += 1
            return replica

    def finish(self, replica: int, prompt: Sequence[int], budget: int, completion: Sequence[int] | None) -> None:
        """Marks a row routed to `replica` done.

        Its tokens stop being live; with its `completion` (None: the row failed), the sequence prompt + completion is
        remembered for the episode's next turn."""
        with self._lock:
            self._live[replica] -= len(prompt) + int(budget)
            if completion is None:
                return
            ids = np.concatenate([np.asarray(prompt, np.int32), np.asarray(completion, np.int32)])
            seq = ids.tobytes()
            self._seen.pop(seq, None)
            self._seen[seq] = (replica, len(ids), ids[-8:].tobytes())  # the last tokens: a cheap first check
            while len(self._seen) > self.max_remembered:
                self._seen.popitem(last=False)

    def forget(self) -> None:
        """Drops every remembered sequence (new weights: the replicas' prefix caches were reset)."""
        with self._lock:
            self._seen.clear()
