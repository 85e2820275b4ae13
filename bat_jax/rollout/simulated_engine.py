"""A rollout engine with the latency of a large model on an accelerator, for benchmarking the agent loop.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from bat_jax.rollout.engine import Completion, RolloutEngine, SamplingParams


@dataclasses.dataclass(frozen=True)
class SimulatedLatency:
    """Cost model of one engine call (module docstring); every time in seconds.

    Attributes:
      prefill_s: fixed cost per wave (a batched prefill plus scheduling), s.
      prefill_s_per_token: cost per prompt token of the call, s/token (0: prefix caching makes prompts cheap).
      decode_s_per_step: cost of one batched decode step, s/step, whatever the wave's number of rows.
      max_batch: rows per wave and, with `inflight`, rows in flight in all (0 = no limit).
      inflight: concurrent calls overlap (a server batching requests in flight) instead of queueing.
    Raises:
      ValueError: naming the field, for a negative cost or max_batch.
    """

    prefill_s: float = 0.05
    prefill_s_per_token: float = 0.0
    decode_s_per_step: float = 0.03
    max_batch: int = 0
    inflight: bool = False

    def __post_init__(self):
        for name in ("prefill_s", "prefill_s_per_token", "decode_s_per_step", "max_batch"):
            if getattr(self, name) < 0:
                raise ValueError(f"SimulatedLatency.{name} must be >= 0, got {getattr(self, name)}")

    def call_seconds(self, prompt_lengths: Sequence[int], completion_lengths: Sequence[int]) -> float:
        """Modelled seconds of one call with rows of these prompt and completion lengths.

        Lengths are in tokens, in row order; waves take consecutive rows. Returns 0.0 for an empty call. Raises
        ValueError when the two lists differ in length."""
        if len(prompt_lengths) != len(completion_lengths):
            raise ValueError(f"call_seconds: {len(prompt_lengths)} prompt lengths but {len(completion_lengths)} "
                             "completion lengths")
        n = len(completion_lengths)
        if n == 0:
            return 0.0
        size = self.max_batch or n
        waves = [completion_lengths[lo:lo + size] for lo in range(0, n, size)]
        return (len(waves) * self.prefill_s + self.prefill_s_per_token * sum(prompt_lengths)
                + self.decode_s_per_step * sum(max(wave) for wave in waves))


class SimulatedLatencyEngine:
    """`RolloutEngine` that returns `inner`'s completions after the modelled latency (module docstring).

    Args:
      inner: the engine that makes the tokens (its `weight_version` and `update_weights` are passed through).
      latency: the cost model.
      clock: monotonic seconds (default `time.monotonic`); sleep: blocks for seconds (default `time.sleep`).
    Attributes (totals since construction, for benchmarks): calls, rows, modelled_s (sum of modelled costs),
      busy_s (sum of the calls' wall seconds; with `inflight` calls overlap, so it can exceed elapsed time).
    """

    def __init__(self, inner: RolloutEngine, latency: SimulatedLatency = SimulatedLatency(), *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self.inner, self.latency, self.clock, self.sleep = inner, latency, clock, sleep
        self._lock = threading.Condition()
        self._rows_in_flight = 0
        self.calls = self.rows = 0
        self.modelled_s = self.busy_s = 0.0

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    def update_weights(self, params: Any) -> int:
        return self.inner.update_weights(params)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
                 max_new_tokens: Sequence[int] | None = None,
                 seeds: Sequence[int] | None = None) -> list[Completion]:
        """`inner.generate(...)`, lasting `latency.call_seconds` (or longer, if the inner engine is slower).

        Without `latency.inflight` calls from several threads run one at a time, with it they overlap (up to `max_batch`
        rows in flight). Errors of the inner engine propagate."""
        n = len(prompts)
        cap = self.latency.max_batch if self.latency.inflight else 0
        with self._lock:  # admission: one call at a time, or rows in flight within the cap
            self._lock.wait_for(lambda: self._rows_in_flight == 0 or (
                self.latency.inflight and (not cap or self._rows_in_flight + n <= cap)))
            self._rows_in_flight += max(n, 1)
        try:
            start = self.clock()
            out = self.inner.generate(prompts, params, max_new_tokens=max_new_tokens, seeds=seeds)
            cost = self.latency.call_seconds([len(p) for p in prompts], [len(c.token_ids) for c in out])
            left = cost - (self.clock() - start)
            if left > 0:
                self.sleep(left)
            took = self.clock() - start
        finally:
            with self._lock:
                self._rows_in_flight -= max(n, 1)
                self._lock.notify_all()
        with self._lock:
            self.calls += 1
            self.rows += n
            self.modelled_s += cost
            self.busy_s += took
        return out
