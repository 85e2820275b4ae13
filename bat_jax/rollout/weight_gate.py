"""Weight syncs while episodes are in flight: `WeightGate` puts a learner's sync between engine calls.

Details: docs/design.md.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from bat_jax.rollout.engine import Completion, RolloutEngine, SamplingParams


class WeightGate:
    """`RolloutEngine` around `inner` whose `update_weights` is safe with `generate` calls in flight.

    The module docstring explains how. Attributes: `inner`; `syncs_waited`, syncs that found calls in flight and waited
    for them."""

    def __init__(self, inner: RolloutEngine):
        self.inner = inner
        self._cond = threading.Condition()
        self._calls = 0  # generate calls in flight
        self._syncing = False  # a sync holds or waits for the gate: new calls wait
        self.syncs_waited = 0

    @property
    def weight_version(self) -> int:
        return self.inner.weight_version

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
                 max_new_tokens: Sequence[int] | None = None,
                 seeds: Sequence[int] | None = None) -> list[Completion]:
        """`inner.generate`, started only while no sync is under way; errors of the inner engine propagate."""
        with self._cond:
            self._cond.wait_for(lambda: not self._syncing)
            self._calls += 1
        try:
            return self.inner.generate(prompts, params, max_new_tokens=max_new_tokens, seeds=seeds)
        finally:
            with self._cond:
                self._calls -= 1
                self._cond.notify_all()

    def update_weights(self, params: Any) -> int:
        """Waits for the calls in flight, installs `params` on `inner` and returns the new weight version.

        New calls wait meanwhile. An engine with `swaps_in_flight` swaps between its decode steps instead, without
        waiting. Syncs from several threads run one after the other."""
        if getattr(self.inner, "swaps_in_flight", False):
            with self._cond:
                self._cond.wait_for(lambda: not self._syncing)
                self._syncing = True
            try:
                return self.inner.update_weights(params, in_flight=True)
            finally:
                with self._cond:
                    self._syncing = False
                    self._cond.notify_all()
        with self._cond:
            self._cond.wait_for(lambda: not self._syncing)
            self._syncing = True
            if self._calls:
                self.syncs_waited += 1
            self._cond.wait_for(lambda: self._calls == 0)
        try:
            return self.inner.update_weights(params)
        finally:
            with self._cond:
                self._syncing = False
                self._cond.notify_all()

    def __getattr__(self, name: str) -> Any:
        """Anything else (e.g. a simulated engine's counters, `close`) is the inner engine's."""
        if name == "inner":  # not yet set (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)
