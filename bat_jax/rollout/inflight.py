"""In-flight serving of one step-driven engine to many calling threads.

Details: docs/design.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any


@dataclasses.dataclass
class _Call:
    """One `run` call: its request ids, the finished outputs by id, and how it ended."""

    ids: list[str]
    outputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    error: BaseException | None = None


class InflightDriver:
    """Serves `run` calls from any number of threads with one engine stepped by one driver thread.

    Args:
      add: `(request_id, item) -> None`, adds one request to the engine (called in the driver thread).
      step: `() -> [(request_id, output), ...]`, one engine step; returns the requests that finished in it
        (driver thread). Outputs of ids this driver did not add are an error.
      abort: `(request_ids) -> None`, drops unfinished requests after an engine error (best effort).
      name: names the driver thread and the errors.
    """

    def __init__(self, add: Callable[[str, Any], None], step: Callable[[], Sequence[tuple[str, Any]]],
                 abort: Callable[[list[str]], None] = lambda ids: None, name: str = "engine"):
        self._add, self._step, self._abort, self.name = add, step, abort, name
        self._cond = threading.Condition()
        self._queue: list[tuple[str, Any, _Call]] = []
        self._running: dict[str, _Call] = {}
        self._exclusive = False  # a caller holds the engine (`exclusive`): nothing runs, queued calls wait
        self._aborted: set[str] = set()  # ids aborted after an error: their late outputs are dropped
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.steps = 0  # engine steps taken (tests, benchmarks)

    def run(self, items: Sequence[Any]) -> list[Any]:
        """Adds one request per item and waits for them; returns their outputs in the order of `items`.

        Raises: RuntimeError when the driver is closed, or (from the engine's exception) when an engine step
        failed while these requests were queued or running.
        """
        if not items:
            return []
        call = _Call([])
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self.name}: the in-flight driver is closed")
            for item in items:
                request_id = f"inflight-{next(self._ids)}"
                call.ids.append(request_id)
                self._queue.append((request_id, item, call))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=f"{self.name}-driver", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        call.done.wait()
        if call.error is not None:
            raise RuntimeError(f"{self.name}: engine step failed: {type(call.error).__name__}: "
                               f"{call.error}") from call.error
        return [call.outputs[i] for i in call.ids]

    def in_flight(self) -> int:
        """Requests queued or running."""
        with self._cond:
            return len(self._queue) + len(self._running)

    @contextlib.contextmanager
    def exclusive(self, what: str) -> Iterator[None]:
        """The engine for the calling thread alone (no request may be queued or running meanwhile).

        Raises: RuntimeError naming `what` when requests are queued or running (the caller must wait for its
        rollouts first: e.g. weights are never swapped under a running request).
        """
        with self._cond:
            if self._queue or self._running or self._exclusive:
                busy = "another caller holds the engine" if self._exclusive else (
                    f"{len(self._queue) + len(self._running)} requests are in flight")
                raise RuntimeError(f"{self.name}: {what} while {busy}; wait for the running calls to return first")
            self._exclusive = True  # the driver takes no request while set, and none is running
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()

    def close(self) -> None:
        """Stops the driver thread once the requests in flight are done; later `run` calls raise."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    while not ((self._queue and not self._exclusive) or self._running or self._closed):
                        self._cond.wait()
                    if self._closed and not (self._queue or self._running):
                        return
                    new = [] if self._exclusive else self._queue
                    if not self._exclusive:
                        self._queue = []
                    for request_id, _, call in new:
                        self._running[request_id] = call
                try:
                    for request_id, item, _ in new:
                        self._add(request_id, item)
                    finished = list(self._step())
                    self.steps += 1
                    self._deliver(finished)
                except BaseException as exc:  # noqa: BLE001 — every call in flight gets the error
                    self._fail(exc)
        finally:  # also if the loop itself broke: no caller is left waiting, the next `run` starts a driver
            with self._cond:
                self._thread = None
            self._fail(RuntimeError(f"{self.name}: the driver thread stopped"))

    def _deliver(self, finished: Sequence[tuple[str, Any]]) -> None:
        """Hands finished outputs to their calls (driver thread).

        Raises RuntimeError for outputs of requests this driver never added (those it aborted are dropped)."""
        unknown = []
        with self._cond:
            for request_id, output in finished:
                call = self._running.pop(request_id, None)
                if call is None:
                    if request_id not in self._aborted:
                        unknown.append(request_id)
                    continue
                call.outputs[request_id] = output
                if len(call.outputs) == len(call.ids):
                    call.done.set()
        if unknown:
            raise RuntimeError(f"engine returned outputs of requests it was not given: {unknown[:4]}")

    def _fail(self, exc: BaseException) -> None:
        """Aborts the running requests, then fails every running and queued call with `exc` (driver thread).

        The requests stay `running` until aborted, so `exclusive` cannot take the engine before that."""
        with self._cond:
            if not (self._running or self._queue):  # e.g. the driver stopping after `close`: nothing to fail
                return
            ids = list(self._running)
        try:
            self._abort(ids)
        except BaseException:  # noqa: BLE001 — best effort; the calls get the original error
            pass
        with self._cond:
            self._aborted.update(ids)
            calls = {id(c): c for c in self._running.values()} | {id(c): c for _, _, c in self._queue}
            self._running, self._queue = {}, []
            self._cond.notify_all()
        for call in calls.values():
            call.error = exc
            call.done.set()
