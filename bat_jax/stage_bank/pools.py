"""S-target / S-mix / E2E pools and per-round views (paper Eq. 5 and Appendix A.1/A.4 "Pool weights and sampling").

Pools (Appendix A.1): Z_target(s*) = {z : s = s*}, Z_mix(s*) = {z : s ∈ S \\ {s*}}, Z_E2E = {z : s = E2E}.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import defaultdict
from collections.abc import Mapping, Sequence
from fractions import Fraction

import numpy as np

from bat_jax.benchmark.stages import E2E
from bat_jax.stage_bank.row import RLRow, canonical_json

#: Pool names, in the order used for tie-breaking and inside each batch.
POOLS: tuple[str, ...] = ("target", "mix", "e2e")


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    """Round mixture settings (gin binds these; defaults from the paper).

    Attributes:
      target, mix, e2e: proportions ρ (≥ 0; renormalised over the pools that are not omitted).
      batch_size: rows per batch (paper: train minibatch 8).
      omit: pool names left out of training (ablations), subset of POOLS.
      seed: base seed; round r uses SeedSequence([seed, r]).
      refill: a round that needs more rows of a pool than it holds draws further passes over it (module
        docstring) instead of raising; e.g. GRPO-E2E on a small bank, whose one pool must fill every batch.
    """

    target: float = 0.5
    mix: float = 0.25
    e2e: float = 0.25
    batch_size: int = 8
    omit: tuple[str, ...] = ()
    seed: int = 42
    refill: bool = False

    def proportions(self) -> dict[str, Fraction]:
        """Renormalised proportions of the included pools, as exact fractions.

        Raises:
          ValueError: an unknown omitted pool, a negative proportion, batch_size < 1, or nothing left.
        """
        bad = [p for p in self.omit if p not in POOLS]
        if bad:
            raise ValueError(f"PoolConfig.omit has unknown pools {bad}; expected a subset of {POOLS}")
        if self.batch_size < 1:
            raise ValueError(f"PoolConfig.batch_size must be >= 1, got {self.batch_size}")
        raw = {}
        for name in POOLS:
            value = float(getattr(self, name))
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"PoolConfig.{name} must be a finite proportion >= 0, got {value}")
            if name not in self.omit and value > 0:
                raw[name] = Fraction(value).limit_denominator(1_000_000)
        total = sum(raw.values())
        if total == 0:
            raise ValueError(f"PoolConfig leaves no pool with a positive proportion (omit={self.omit})")
        return {k: v / total for k, v in raw.items()}


def partition_pools(rows: Sequence[RLRow], target: str) -> dict[str, list[RLRow]]:
    """Splits RL rows into the three pools for selected stage id `target` (Appendix A.1), order preserved.

    Rows of focus `target`, rows of every other stage, E2E rows."""
    s_star = target
    pools: dict[str, list[RLRow]] = {p: [] for p in POOLS}
    for row in rows:
        if row.focus == E2E:
            pools["e2e"].append(row)
        elif row.focus == s_star:
            pools["target"].append(row)
        else:
            pools["mix"].append(row)
    return pools


def batch_counts(proportions: Mapping[str, Fraction], batch_size: int, n_batches: int) -> list[dict[str, int]]:
    """Rows per pool for each of `n_batches` batches.

    Each batch gets floor(ρ_k · B) rows of pool k, and the remaining slots go to the pools with the largest
    cumulative deficit (quota so far − rows so far), ties to the earlier pool. With ρ = (½, ¼, ¼), B = 8 every
    batch is exactly {target: 4, mix: 2, e2e: 2}.
    """
    names = [p for p in POOLS if p in proportions]
    assigned = {k: 0 for k in names}
    out = []
    for b in range(n_batches):
        counts = {k: int(proportions[k] * batch_size) for k in names}  # floor (non-negative)
        spare = batch_size - sum(counts.values())
        quota = {k: proportions[k] * batch_size * (b + 1) for k in names}
        for _ in range(spare):
            k = max(names, key=lambda n: (quota[n] - assigned[n] - counts[n], -names.index(n)))
            counts[k] += 1
        for k in names:
            assigned[k] += counts[k]
        out.append(counts)
    return out


def max_batches(pool_sizes: Mapping[str, int], config: PoolConfig) -> int:
    """Largest number of batches one round can draw without replacement from pools of these sizes."""
    props = config.proportions()
    # Cumulative counts stay within one row of the quota, so this bound is never below the answer.
    upper = min(int(pool_sizes.get(k, 0) / (p * config.batch_size)) + 2 for k, p in props.items())
    needed = {k: 0 for k in props}
    for n, counts in enumerate(batch_counts(props, config.batch_size, upper)):
        if any(needed[k] + counts[k] > pool_sizes.get(k, 0) for k in props):
            return n
        for k in props:
            needed[k] += counts[k]
    return upper


#: Balancing hierarchy: tracks first, then outcome buckets, then stage (S-mix holds several stages).
_STRATA = (lambda r: r.track, lambda r: r.outcome, lambda r: r.focus)


def _stratified_order(rows: Sequence[RLRow], rng: np.random.Generator,
                      indices: list[int] | None = None, level: int = 0) -> list[int]:
    """Indices of `rows` in a nested round-robin over tracks, outcome buckets and stages.

    Over shuffled tracks, inside each over shuffled outcome buckets, inside each over shuffled stages; so every prefix
    is balanced over tracks, then outcomes."""
    if indices is None:
        indices = list(range(len(rows)))
    if level == len(_STRATA):
        return [indices[j] for j in rng.permutation(len(indices))]
    groups: dict[str, list[int]] = defaultdict(list)
    for i in indices:
        groups[_STRATA[level](rows[i])].append(i)
    keys = sorted(groups)
    queues = [_stratified_order(rows, rng, groups[keys[j]], level + 1) for j in rng.permutation(len(keys))]
    order: list[int] = []
    for depth in range(max(len(q) for q in queues)):
        order += [q[depth] for q in queues if depth < len(q)]
    return order


def round_state_id(row: RLRow, *, round_index: int, pool: str, view_index: int) -> str:
    """Round-scoped id 'rs-<24 hex>' from source identity, stage, pool, round and view index."""
    key = canonical_json([row.provenance.source_id, row.state_id, row.focus, pool, round_index, view_index])
    return "rs-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]


@dataclasses.dataclass(frozen=True)
class RoundItem:
    """One drawn row: its pool, batch, position in the round (`view_index`) and round-scoped id."""

    row: RLRow
    pool: str
    batch: int
    view_index: int
    round_state_id: str

    @property
    def state_id(self) -> str:
        return self.row.state_id


@dataclasses.dataclass(frozen=True)
class RoundView:
    """The rows one round trains on.

    Attributes:
      round_index: the round r.
      target: selected stage s* (a stage id).
      batches: `n_batches` tuples of `batch_size` RoundItems (pool order target, mix, e2e inside a batch).
      pool_sizes: rows available per included pool before drawing.
      spares: per included pool, rows drawn after the batches' own (batch index -1) to replace groups without
        reward variance (`learn/dynamic_sampling.py`); empty unless asked for.
    """

    round_index: int
    target: str
    batches: tuple[tuple[RoundItem, ...], ...]
    pool_sizes: Mapping[str, int]
    spares: Mapping[str, tuple[RoundItem, ...]] = dataclasses.field(default_factory=dict)

    @property
    def items(self) -> list[RoundItem]:
        return [item for batch in self.batches for item in batch]

    def pool_counts(self) -> dict[str, int]:
        """Rows drawn per pool over the whole round (the ledger's pool counts)."""
        counts = {k: 0 for k in self.pool_sizes}
        for item in self.items:
            counts[item.pool] += 1
        return counts

    def state_ids(self) -> list[str]:
        """Bank state_ids in draw order."""
        return [item.state_id for item in self.items]


def build_round_view(
    rows: Sequence[RLRow],
    target: str,
    *,
    round_index: int,
    n_batches: int,
    config: PoolConfig = PoolConfig(),
    spares_per_pool: int = 0,
) -> RoundView:
    """Draws one round's batches from the pools (see module docstring).

    Args:
      rows: all RL rows of the bank version used this round.
      target: selected stage s*, a stage id of the bank's benchmark (the router's choice).
      round_index: r (≥ 0); seeds the round's generator together with `config.seed`.
      n_batches: batches in the round (≥ 1).
      spares_per_pool: up to this many more rows per pool, drawn after the batches' (so the batches are the same
        for any value): the rest of the pool's pass, and further passes with `config.refill`.

    Raises:
      ValueError: a round needing more rows from a pool than it holds (names the pool, rows needed and
        available), bad proportions, or n_batches < 1.
    """
    if n_batches < 1:
        raise ValueError(f"n_batches must be >= 1, got {n_batches}")
    s_star = target
    props = config.proportions()
    pools = {k: v for k, v in partition_pools(rows, s_star).items() if k in props}
    counts = batch_counts(props, config.batch_size, n_batches)
    need = {k: sum(c[k] for c in counts) for k in pools}
    for k, pool in pools.items():
        if need[k] > len(pool) and not (config.refill and pool):
            raise ValueError(f"round {round_index}: pool {k!r} (target {s_star}) has {len(pool)} rows but "
                             f"{n_batches} batches need {need[k]} without replacement; use fewer batches "
                             f"(max_batches), a larger bank, or PoolConfig.refill = True (further passes)")
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, round_index]))
    orders = {k: _stratified_order(pools[k], rng) for k in POOLS if k in pools}
    # refill: further passes, drawn after the first ones (a round that fits draws the same rows as without refill)
    for k in POOLS:
        while k in pools and len(orders[k]) < need[k]:
            orders[k] = orders[k] + _stratified_order(pools[k], rng)
    cursor = {k: 0 for k in pools}
    batches = []
    view_index = 0
    for b, c in enumerate(counts):
        batch = []
        for k in POOLS:
            for _ in range(c.get(k, 0)):
                row = pools[k][orders[k][cursor[k]]]
                cursor[k] += 1
                batch.append(RoundItem(row, k, b, view_index,
                                       round_state_id(row, round_index=round_index, pool=k, view_index=view_index)))
                view_index += 1
        batches.append(tuple(batch))
    spares: dict[str, tuple[RoundItem, ...]] = {}
    for k in POOLS:
        if k not in pools or spares_per_pool < 1:
            continue
        while config.refill and len(orders[k]) - cursor[k] < spares_per_pool:
            orders[k] = orders[k] + _stratified_order(pools[k], rng)
        picked = []
        for i in orders[k][cursor[k]:cursor[k] + spares_per_pool]:
            row = pools[k][i]
            picked.append(RoundItem(row, k, -1, view_index,
                                    round_state_id(row, round_index=round_index, pool=k, view_index=view_index)))
            view_index += 1
        spares[k] = tuple(picked)
    return RoundView(round_index, s_star, tuple(batches), {k: len(v) for k, v in pools.items()}, spares)
