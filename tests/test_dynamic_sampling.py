"""Dynamic sampling (bat_jax/learn/dynamic_sampling.py) and the round view's spare rows (stage_bank/pools.py)."""

import dataclasses

import numpy as np
import pytest

from bat_jax.learn.dynamic_sampling import DynamicSamplingConfig, SpareRows, fill_batch, has_signal


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    pool: str


def test_signal_needs_two_scored_rewards_that_differ():
    assert has_signal([0.0, 0.25, None, 0.0])
    assert not has_signal([0.5, 0.5, 0.5, 0.5])
    assert not has_signal([0.3, None, None, None])  # one scored reward: nothing to compare
    assert not has_signal([0.2] * 4)  # float mean 0.2 exactly: std 0
    assert not has_signal([None] * 4)
    with pytest.raises(ValueError, match="non-finite"):
        has_signal([float("nan"), 0.1])


def test_round_off_groups_are_kept_as_verl_keeps_them():
    """verl's DAPO filter keeps np.std > 0: [0.1] * 3 (equal, but its float mean is 0.1 + 2⁻⁵⁶: std 2⁻⁵⁶) and
    [0.15 + 2⁻⁵⁵, 0.15, 0.15, 0.15] (std 2.4e-17) are kept, [0.2] * 4 (std 0) is not; a tolerance drops them."""
    assert float(np.std([0.1] * 3)) == 2 ** -56
    assert has_signal([0.1] * 3) and has_signal([0.15000000000000002, 0.15, 0.15, 0.15])
    assert DynamicSamplingConfig().keeps([0.1, 0.1, None, 0.1])
    assert not DynamicSamplingConfig(signal_tol=1e-12).keeps([0.1] * 3)
    assert has_signal([0.0, 1e-12], tol=4e-13) and not has_signal([0.0, 1e-12], tol=5e-13)  # std 5e-13


def test_a_capped_budget_keeps_the_pool_mix_over_the_trained_groups():
    """A 4 / 2 / 2 batch without any signal and 4 replacement rows: 2 / 1 / 1 trained, not 4 target rows."""
    batch = [Row(f"{p}{i}", pool) for p, pool, n in (("t", "target", 4), ("m", "mix", 2), ("e", "e2e", 2))
             for i in range(n)]
    spares = SpareRows({pool: [Row(f"x{p}{i}", pool) for i in range(4)] for p, pool in (("t", "target"), ("m", "mix"),
                                                                                       ("e", "e2e"))})

    def roll(rows):
        return [[0, 1, 0, 0] if r.name.startswith("x") else [0] * 4 for r in rows]

    filled = fill_batch(batch, roll, lambda r: r, spares, DynamicSamplingConfig(enabled=True, max_extra_rows=4))
    assert [r.name for r, _ in filled.groups] == ["xt0", "xm0", "xe0", "xt1"]
    assert filled.pools == {"target": 2, "mix": 1, "e2e": 1}
    assert (filled.drawn, filled.dropped, filled.extra_rows) == (12, 8, 4)


def test_groups_without_signal_are_replaced_from_their_own_pool_until_the_batch_is_full():
    rewards = {"t1": [0, 1, 0, 0], "t2": [0] * 4, "t3": [0.5] * 4, "t4": [0, 0, 1, 1], "m1": [0] * 4,
               "m2": [1, 0, 0, 0], "e1": [0] * 4, "e2": [0, 0.2, 0, 0],
               "t5": [0] * 4, "t6": [1, 0, 1, 0], "t7": [0, 1, 1, 1], "m3": [0, 0, 0, 1], "e3": [1, 1, 1, 0]}
    batch = [Row(n, {"t": "target", "m": "mix", "e": "e2e"}[n[0]]) for n in ("t1", "t2", "t3", "t4", "m1", "m2",
                                                                          "e1", "e2")]
    spares = SpareRows({"target": [Row("t5", "target"), Row("t6", "target"), Row("t7", "target")],
                        "mix": [Row("m3", "mix")], "e2e": [Row("e3", "e2e")]})
    waves = []

    def roll(rows):
        waves.append([r.name for r in rows])
        return [rewards[r.name] for r in rows]

    filled = fill_batch(batch, roll, lambda r: r, spares, DynamicSamplingConfig(enabled=True, max_extra_rows=8))
    # wave 1 drops t2, t3, m1, e1; wave 2 replaces each from its pool, the pool missing the largest share first
    # (target 2/4, mix 1/2, e2e 1/2 missing: target by order, then mix, e2e, target): t5 (no signal), m3, e3, t6;
    # wave 3: t7
    assert waves == [["t1", "t2", "t3", "t4", "m1", "m2", "e1", "e2"], ["t5", "m3", "e3", "t6"], ["t7"]]
    assert [r.name for r, _ in filled.groups] == ["t1", "t4", "m2", "e2", "m3", "e3", "t6", "t7"]
    assert all(has_signal(result) for _, result in filled.groups)
    assert (filled.drawn, filled.dropped, filled.extra_rows) == (13, 5, 5)
    assert filled.pools == {"target": 4, "mix": 2, "e2e": 2}  # the 4 / 2 / 2 mix kept
    assert spares.remaining() == {"target": 0, "mix": 0, "e2e": 0}


def test_the_cap_and_empty_pools_end_the_filling_and_disabled_keeps_every_group():
    rewards = {"a": [0] * 4, "b": [0] * 4, "c": [1, 0, 0, 0], "s1": [0] * 4, "s2": [0] * 4}
    batch = [Row("a", "target"), Row("b", "mix"), Row("c", "target")]

    def roll(rows):
        return [rewards[r.name] for r in rows]

    capped = fill_batch(batch, roll, lambda r: r, SpareRows({"target": [Row("s1", "target"), Row("s2", "target")]}),
                        DynamicSamplingConfig(enabled=True, max_extra_rows=1))
    assert [r.name for r, _ in capped.groups] == ["c"] and (capped.drawn, capped.dropped, capped.extra_rows) == (4, 3, 1)
    dry = fill_batch(batch, roll, lambda r: r, SpareRows({}), DynamicSamplingConfig(enabled=True))
    assert [r.name for r, _ in dry.groups] == ["c"] and (dry.drawn, dry.dropped, dry.extra_rows) == (3, 2, 0)
    off = fill_batch(batch, roll, lambda r: r, SpareRows({"target": [Row("s1", "target")]}), DynamicSamplingConfig())
    assert [r.name for r, _ in off.groups] == ["a", "b", "c"] and (off.drawn, off.dropped, off.extra_rows) == (3, 0, 0)
    with pytest.raises(ValueError, match="max_extra_rows"):
        DynamicSamplingConfig(max_extra_rows=-1)
