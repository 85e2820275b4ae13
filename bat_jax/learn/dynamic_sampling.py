"""Dynamic sampling (DAPO; verl ``filter_groups``, slime, SkyRL, OpenRLHF): train only on groups with signal.

Details: docs/design.md.
"""

from __future__ import annotations

import collections
import dataclasses
import fractions
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

SIGNAL_TOL = 0.0  # verl's DAPO filter: a group is kept when np.std of its rewards > 0


@dataclasses.dataclass(frozen=True)
class DynamicSamplingConfig:
    """Dynamic sampling settings: drop groups without reward variance and replace them.

    Attributes:
      enabled: drop groups without reward variance and replace them (off: every drawn group is trained, as the
        paper and the released run do).
      max_extra_rows: per batch, at most this many replacement rows (each K more rollouts). It caps extra
        generation (verl ``max_num_gen_batches`` counts whole generation batches and stops the run when they
        cannot fill the batch; here rows, so the cost is bounded per batch and a batch may train on fewer
        groups). 0 drops groups without replacing them.
      signal_tol: a group has signal when the population std (``np.std``, float64) of its scored rewards exceeds
        this; 0.0 is verl's rule (:func:`has_signal`), so a group equal up to round-off, e.g. [0.1] * 3 (std 2⁻⁵⁶),
        is kept as verl keeps it (its advantages are ~1e-11: `grpo.group_advantages`).
      keep_singletons: keep a group with one scored rollout (verl's filter keeps groups of one; there its
        advantage is the reward itself, `GRPOConfig.singleton_advantage = 'reward'`). False: dropped, as a group
        with nothing to compare.
    Raises: ValueError for a negative cap or tolerance.
    """

    enabled: bool = False
    max_extra_rows: int = 8
    signal_tol: float = SIGNAL_TOL
    keep_singletons: bool = False

    def __post_init__(self):
        if self.max_extra_rows < 0:
            raise ValueError(f"DynamicSamplingConfig.max_extra_rows must be >= 0, got {self.max_extra_rows}")
        if not 0.0 <= self.signal_tol < math.inf:
            raise ValueError(f"DynamicSamplingConfig.signal_tol must be >= 0, got {self.signal_tol}")

    def keeps(self, rewards: Sequence[float | None]) -> bool:
        """Whether the filter keeps a group with these rewards (None = unscored).

        It keeps one by :func:`has_signal` with ``signal_tol``, or a single scored reward with ``keep_singletons``."""
        if self.keep_singletons and sum(r is not None for r in rewards) == 1:
            return True
        return has_signal(rewards, self.signal_tol)


def has_signal(rewards: Sequence[float | None], tol: float = SIGNAL_TOL) -> bool:
    """Whether a group has reward variance: at least two scored rewards (not None) with ``np.std`` > ``tol``.

    With ``tol = 0`` this is verl's DAPO filter, ``np.std(metric_vals) > 0`` on the float64 rewards
    (volcengine/verl ``recipe/dapo/dapo_ray_trainer.py``, ``kept_prompt_uids``, commit 004c888): [0.1] * 3 has
    std 2⁻⁵⁶ (its mean rounds to 0.1 + 2⁻⁵⁶) and is kept, [0.2] * 4 has std 0 and is dropped. verl also keeps a
    group of one (`DynamicSamplingConfig.keep_singletons`).

    Raises: ValueError on a NaN or infinite reward (a scorer defect, not a group without signal)."""
    scored = [float(r) for r in rewards if r is not None]
    if not all(math.isfinite(r) for r in scored):
        raise ValueError(f"has_signal: non-finite reward in {list(rewards)}")
    return len(scored) >= 2 and float(np.std(np.asarray(scored, dtype=np.float64))) > tol


class SpareRows:
    """Replacement rows per pool, handed out in draw order (each at most once per round)."""

    def __init__(self, spares: Mapping[str, Sequence[Any]]):
        self._left = {pool: list(items) for pool, items in spares.items()}

    def take(self, pool: str) -> Any | None:
        """The next spare row of `pool`, or None when the pool has none left."""
        left = self._left.get(pool)
        return left.pop(0) if left else None

    def available(self, pool: str) -> int:
        """Spare rows of `pool` not yet handed out."""
        return len(self._left.get(pool, ()))

    def remaining(self) -> dict[str, int]:
        return {pool: len(items) for pool, items in self._left.items()}


@dataclasses.dataclass
class Filled:
    """One batch after dynamic sampling.

    Attributes:
      groups: (row, result) of every group that goes into the step, in roll-out order; `result` is whatever the
        roll-out function returned for the row.
      drawn: groups rolled out (the batch's own rows and the replacements).
      dropped: groups rolled out and left out for lack of signal.
      extra_rows: replacement rows rolled out (≤ `max_extra_rows`).
      pools: pool → groups trained.
    """

    groups: list[tuple[Any, Any]]
    drawn: int
    dropped: int
    extra_rows: int
    pools: dict[str, int]


def fill_batch(rows: Sequence[Any], roll: Callable[[list[Any]], list[Any]], rewards_of: Callable[[Any], Sequence],
               spares: SpareRows, config: DynamicSamplingConfig) -> Filled:
    """Rolls out a batch's rows and, with dynamic sampling, replaces groups without signal.

    Groups are replaced until the batch holds ``len(rows)`` groups with signal, the cap is spent or the pools have no
    spare rows.

    Args:
      rows: the batch's rows, each with a ``pool`` attribute (`stage_bank.pools.RoundItem`).
      roll: rolls out and scores a list of rows; returns one result per row, in order (one call per wave).
      rewards_of: a result's K rewards (None = unscored).
      spares: replacement rows per pool, shared by the round's batches.
      config: `DynamicSamplingConfig` (`DynamicSamplingConfig.keeps` is the filter); disabled, the batch is rolled
        out once and every group kept.
    Returns: `Filled`.
    """
    wave, kept, drawn, dropped, extra = list(rows), [], 0, 0, 0
    while wave:
        results = roll(wave)
        drawn += len(wave)
        lost = []
        for row, result in zip(wave, results, strict=True):
            if not config.enabled or config.keeps(rewards_of(result)):
                kept.append((row, result))
            else:
                lost.append(row)
        dropped += len(lost)
        wave = _replacements(rows, kept, lost, spares, min(len(rows) - len(kept), config.max_extra_rows - extra))
        extra += len(wave)
    pools = dict(collections.Counter(row.pool for row, _ in kept))
    return Filled(groups=kept, drawn=drawn, dropped=dropped, extra_rows=extra, pools=pools)


def _replacements(rows: Sequence[Any], kept: Sequence[tuple[Any, Any]], lost: Sequence[Any], spares: SpareRows,
                  budget: int) -> list[Any]:
    """Spare rows for the next wave: at most one per lost row of the same pool and `budget` in all.

    They are handed one at a time to the pool missing the largest share of its count in `rows` (counting kept
    groups and the wave so far; ties to the pool that comes first in `rows`). A 4 / 2 / 2 batch without signal
    and a budget of 4 trains 2 / 1 / 1."""
    quota = collections.Counter(row.pool for row in rows)
    order = list(dict.fromkeys(row.pool for row in rows))
    have = collections.Counter(row.pool for row, _ in kept)
    slots = collections.Counter(row.pool for row in lost)
    wave: list[Any] = []
    while len(wave) < budget:
        open_pools = [p for p in order if slots[p] > 0 and spares.available(p) > 0]
        if not open_pools:
            break
        pool = max(open_pools, key=lambda p: (fractions.Fraction(quota[p] - have[p], quota[p]), -order.index(p)))
        wave.append(spares.take(pool))
        slots[pool] -= 1
        have[pool] += 1
    return wave
