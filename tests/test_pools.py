"""S-target / S-mix / E2E pools and round views (paper Eq. 5, Appendix A.1 and A.4)."""

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest

from bat_jax.benchmarks.imaging.stages import STAGES, Stage
from bat_jax.stage_bank.pools import (PoolConfig, batch_counts, build_round_view, max_batches, partition_pools,
                                      round_state_id)
from doubles import make_bank


BANK = make_bank()


def test_partition_follows_appendix_a1():
    pools = partition_pools(BANK, STAGES.parse("Validate"))
    assert {r.focus for r in pools["target"]} == {"S3"} and len(pools["target"]) == 400
    assert {r.focus for r in pools["mix"]} == {"S1", "S2", "S4", "S5"} and len(pools["mix"]) == 1600
    assert {r.focus for r in pools["e2e"]} == {"E2E"} and len(pools["e2e"]) == 400


def test_default_proportions_give_4_2_2():
    assert PoolConfig().proportions() == {"target": Fraction(1, 2), "mix": Fraction(1, 4), "e2e": Fraction(1, 4)}
    assert batch_counts(PoolConfig().proportions(), 8, 2) == [{"target": 4, "mix": 2, "e2e": 2}] * 2


def test_1000_batches_are_4_2_2_with_no_repeat_inside_a_round():
    config = PoolConfig(seed=7)
    n_batches = 0
    previous = None
    for r in range(10):  # 10 rounds x 100 batches; a round uses all 400 S-target rows
        target = STAGES_CYCLE[r % 5]
        view = build_round_view(BANK, target, round_index=r, n_batches=100, config=config)
        for batch in view.batches:
            assert len(batch) == 8
            assert Counter(item.pool for item in batch) == {"target": 4, "mix": 2, "e2e": 2}
            assert Counter(item.row.focus == target for item in batch)[True] == 4
            assert Counter(item.row.focus for item in batch)["E2E"] == 2
            n_batches += 1
        ids = view.state_ids()
        assert len(ids) == 800 and len(set(ids)) == 800
        assert view.pool_counts() == {"target": 400, "mix": 200, "e2e": 200}
        rsids = [item.round_state_id for item in view.items]
        assert len(set(rsids)) == 800
        if previous is not None and previous.target == view.target:
            assert set(previous.state_ids()) & set(ids)  # pools reset between rounds
        previous = view
    assert n_batches == 1000


STAGES_CYCLE = (Stage.PLAN, Stage.VALIDATE, Stage.SUBMIT, Stage.SETUP, Stage.INFERENCE)


def test_deterministic_given_seed_and_round():
    a = build_round_view(BANK, "S3", round_index=2, n_batches=20, config=PoolConfig(seed=1))
    b = build_round_view(BANK, "S3", round_index=2, n_batches=20, config=PoolConfig(seed=1))
    assert a.state_ids() == b.state_ids()
    assert a.state_ids() != build_round_view(BANK, "S3", round_index=3, n_batches=20,
                                             config=PoolConfig(seed=1)).state_ids()
    assert a.state_ids() != build_round_view(BANK, "S3", round_index=2, n_batches=20,
                                             config=PoolConfig(seed=2)).state_ids()


def test_round_too_large_for_a_pool_is_refused():
    assert max_batches({"target": 400, "mix": 1600, "e2e": 400}, PoolConfig()) == 100
    with pytest.raises(ValueError, match="pool 'target'.*400 rows.*need 404"):
        build_round_view(BANK, "S3", round_index=0, n_batches=101)


def test_omitting_s_mix_renormalises_to_two_thirds_one_third():
    config = PoolConfig(omit=("mix",))
    assert config.proportions() == {"target": Fraction(2, 3), "e2e": Fraction(1, 3)}
    counts = batch_counts(config.proportions(), 8, 3)
    assert counts == [{"target": 5, "e2e": 3}, {"target": 6, "e2e": 2}, {"target": 5, "e2e": 3}]
    view = build_round_view(BANK, "S2", round_index=0, n_batches=75, config=config)
    assert view.pool_counts() == {"target": 400, "e2e": 200}  # exactly 2/3 and 1/3 of 600
    assert all(len(b) == 8 for b in view.batches)
    assert not any(item.row.focus not in ("S2", "E2E") for item in view.items)
    with pytest.raises(ValueError, match="unknown pools"):
        PoolConfig(omit=("warmup",)).proportions()
    with pytest.raises(ValueError, match="no pool"):
        PoolConfig(omit=("target", "mix", "e2e")).proportions()


def test_draws_are_balanced_over_tracks_and_outcomes():
    view = build_round_view(BANK, "S4", round_index=5, n_batches=21, config=PoolConfig(seed=3))
    target = [item.row for item in view.items if item.pool == "target"]  # 84 rows over 21 strata
    strata = Counter((r.track, r.outcome) for r in target)
    assert len(strata) == 21 and set(strata.values()) == {4}
    e2e = [item.row for item in view.items if item.pool == "e2e"]  # 42 rows: 2 per stratum
    assert set(Counter((r.track, r.outcome) for r in e2e).values()) == {2}
    mix = [item.row for item in view.items if item.pool == "mix"]  # 42 rows: 6 per track, 2 per (track, outcome)
    assert set(Counter(r.track for r in mix).values()) == {6}
    assert set(Counter((r.track, r.outcome) for r in mix).values()) == {2}
    assert len({r.focus for r in mix}) == 4


def test_round_state_id_derivation():
    view = build_round_view(BANK, "S1", round_index=4, n_batches=1)
    item = view.items[5]
    key = json.dumps([item.row.provenance.source_id, item.row.state_id, item.row.focus, item.pool, 4, 5],
                     separators=(",", ":"))
    assert item.view_index == 5 and item.batch == 0
    assert item.round_state_id == "rs-" + hashlib.sha256(key.encode()).hexdigest()[:24]
    assert round_state_id(item.row, round_index=5, pool=item.pool, view_index=5) != item.round_state_id


def test_same_view_in_fresh_processes_with_different_hash_seeds():
    code = ("import sys; sys.path.insert(0, 'tests'); from doubles import make_bank; BANK = make_bank(); "
            "from bat_jax.stage_bank.pools import build_round_view; "
            "print(','.join(build_round_view(BANK, 'S2', round_index=1, n_batches=5).state_ids()))")
    outs = [subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], check=True,
                           capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
            for seed in ("1", "2")]
    assert outs[0] == outs[1] == ",".join(build_round_view(BANK, "S2", round_index=1, n_batches=5).state_ids()) + "\n"


def test_refill_draws_further_passes_when_a_round_needs_more_rows_than_a_pool_holds():
    """GRPO-E2E on the tiny bank: one pool of 21 E2E rows, 3 batches of 8. Without refill the round is an error
    that names the option; with it the first 21 draws are every row once (a pass), the last 3 come back from a
    second pass, every draw has its own round_state_id, and a round that fits draws exactly as without refill."""
    small = [r for r in make_bank(per_focus=21)]
    config = PoolConfig(omit=("target", "mix"), seed=3)
    with pytest.raises(ValueError, match=r"pool 'e2e' .* has 21 rows but 3 batches need 24 .*refill"):
        build_round_view(small, "S3", round_index=1, n_batches=3, config=config)
    view = build_round_view(small, "S3", round_index=1, n_batches=3, config=PoolConfig(omit=("target", "mix"), seed=3,
                                                                                       refill=True))
    ids = [item.row.state.digest for item in view.items]
    assert len(ids) == 24 and len(set(ids[:21])) == 21 and set(ids[21:]) <= set(ids[:21])
    assert len({item.round_state_id for item in view.items}) == 24  # the GRPO groups stay apart
    assert [len(b) for b in view.batches] == [8, 8, 8]
    fits = dict(round_index=1, n_batches=2)
    assert (build_round_view(small, "S3", config=PoolConfig(omit=("target", "mix"), seed=3, refill=True), **fits)
            .state_ids() == build_round_view(small, "S3", config=config, **fits).state_ids())


def test_spares_follow_the_batches_and_leave_them_unchanged():
    """Spare rows (dynamic sampling's replacements) are drawn after the batches: the batches are the same with and
    without them; without refill they are the rest of the pool's pass, with refill further passes."""
    bank = make_bank(per_focus=10)  # target S3: 10 rows; 2 batches of 8 take 8 of them
    cfg = PoolConfig(batch_size=8, seed=3)
    plain = build_round_view(bank, "S3", round_index=1, n_batches=2, config=cfg)
    view = build_round_view(bank, "S3", round_index=1, n_batches=2, config=cfg, spares_per_pool=3)
    assert view.batches == plain.batches and plain.spares == {}
    used = {item.row.state_id for item in plain.items if item.pool == "target"}
    assert len(view.spares["target"]) == 2 and not {i.row.state_id for i in view.spares["target"]} & used
    assert len(view.spares["mix"]) == len(view.spares["e2e"]) == 3
    ids = [i.round_state_id for i in plain.items] + [i.round_state_id for v in view.spares.values() for i in v]
    assert len(set(ids)) == len(ids) and all(i.batch == -1 for v in view.spares.values() for i in v)
    refill = build_round_view(bank, "S3", round_index=1, n_batches=2, config=dataclasses.replace(cfg, refill=True),
                              spares_per_pool=3)
    assert refill.batches == plain.batches and len(refill.spares["target"]) == 3
    assert build_round_view(bank, "S3", round_index=1, n_batches=2, config=cfg, spares_per_pool=3).spares == view.spares


@pytest.mark.parametrize("ids", [("draft", "check"), ("inspect", "clean", "report"), tuple(f"p{i}" for i in range(7))])
def test_pools_of_two_three_and_seven_stage_benchmarks_keep_the_half_quarter_quarter_mix(ids):
    """S-target holds the routed stage's rows, S-mix every other stage's, E2E the end-to-end rows; a batch of 8 is
    4 / 2 / 2 whatever the stage count (one S-mix stage for a 2-stage benchmark)."""
    bank = make_bank(per_focus=40, foci=("E2E",) + ids)
    target = ids[-1]
    pools = partition_pools(bank, target)
    assert {r.focus for r in pools["target"]} == {target} and len(pools["target"]) == 40
    assert {r.focus for r in pools["mix"]} == set(ids[:-1]) and len(pools["mix"]) == 40 * (len(ids) - 1)
    view = build_round_view(bank, target, round_index=1, n_batches=5)
    for batch in view.batches:
        assert Counter(item.pool for item in batch) == {"target": 4, "mix": 2, "e2e": 2}
        assert sum(item.row.focus == target for item in batch) == 4
    assert view.target == target and view.pool_counts() == {"target": 20, "mix": 10, "e2e": 10}
