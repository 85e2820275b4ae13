"""The round journal (bat_jax/bicurl/round_journal.py): a GRPO block killed mid-round and resumed reuses the units it
finished, re-issues the ones in flight at the kill, skips no state, and at max_staleness = 0 trains exactly what an
uninterrupted block trains (slow: the micro BiCuRL run killed mid-round ends with the uninterrupted run's ledger)."""

import dataclasses
import threading
import types

import numpy as np
import pytest

from bat_jax.bicurl import async_block as ab
from bat_jax.bicurl import grpo_round as gr
from bat_jax.bicurl import round_journal as rj
from bat_jax.learn import grpo
from bat_jax.learn.staleness import StalenessConfig
from bat_jax.rollout.trajectory import Trajectory

from doubles import FakeLearner, patch_rollout_scoring

REWARDS = {"s0": [1.0, 0.0, 0.0, 0.0], "s1": [0.0, 1.0, 1.0, 0.0], "s2": [0.0, 1.0, 0.0, 1.0],
           "s3": [1.0, 0.0, 1.0, 1.0], "s4": [0.0, 0.0, 1.0, 1.0], "s5": [1.0, 1.0, 0.0, 0.0]}
BATCHES = (("s0", "s1"), ("s2", "s3"), ("s4", "s5"))
BATCH_ROWS = gr.batch_rows


class Killed(RuntimeError):
    """The injected kill."""


class Engine:
    def __init__(self, version=0):
        self.weight_version = version

    def update_weights(self, model):
        self.weight_version += 1
        return self.weight_version


class Loop:
    """K = 4 episodes per request, logprobs drawn from (seed, i, k), turns on the engine's version. After
    `kill_after` calls every call raises `Killed` (the kill: units issued from then on never finish)."""

    def __init__(self, kill_after=None, version=0):
        self.engine, self.kill_after, self.calls, self.lock = Engine(version), kill_after, [], threading.Lock()

    def run_episodes(self, episodes, seed, on_trajectory):
        with self.lock:
            self.calls.append(tuple(dict.fromkeys(e[0] for e in episodes)))
            if self.kill_after is not None and len(self.calls) > self.kill_after:
                raise Killed(f"killed at call {len(self.calls)}")
        version = self.engine.weight_version
        out = []
        for position, (state, i, k) in enumerate(episodes):
            draw = np.random.default_rng([seed, i, k]).uniform(-1, 0, 3).astype(np.float32)
            out.append(types.SimpleNamespace(state_id=state, ids=np.arange(6, dtype=np.int32), agent_error=None,
                                             loss_mask=np.array([0, 0, 1, 1, 1, 0], np.int32),
                                             logprobs=np.concatenate([[0, 0], draw, [0]]).astype(np.float32),
                                             turn_versions=(version,), weight_version=version, infra_error=""))
            on_trajectory(position, out[-1])
        return out

    def run(self, requests, seed, on_trajectory):
        return self.run_episodes([(r, i, k) for i, r in enumerate(requests) for k in range(4)], seed, on_trajectory)


def _view():
    item = lambda name: types.SimpleNamespace(round_state_id=name, pool="target",  # noqa: E731
                                              row=types.SimpleNamespace(state=None, name=name,
                                                                        provenance=types.SimpleNamespace(track="t")))
    return types.SimpleNamespace(batches=[[item(n) for n in b] for b in BATCHES], spares={"target": []})


def _block(monkeypatch, loop, s, journal=None):
    """One round's block at max_staleness `s` on the doubles: (learner, stats, state ids of each trained batch)."""
    patch_rollout_scoring(monkeypatch, lambda rows: [REWARDS[row.name][i % 4] for i, row in enumerate(rows)])
    trained = []

    def recording(learner, trajectories, block):
        trained.append(sorted({t.state_id for t in trajectories}))
        return BATCH_ROWS(learner, trajectories, block)

    monkeypatch.setattr(gr, "batch_rows", recording)
    learner = FakeLearner()
    c = gr.GRPOBlockConfig(grpo=grpo.GRPOConfig(kl_coef=0.0, tis_cap=2.0), micro_batches=1, max_response_tokens=48,
                           staleness=StalenessConfig(max_staleness=s))
    stats = ab.run_grpo_block(learner, loop, types.SimpleNamespace(load_state=lambda s: None), _view(), c,
                              benchmark=None, seed=3, journal=journal)
    return learner, stats, trained


def _trajectory(versions):
    n = 4
    return Trajectory(state_id="s0", episode=0, stage="S1", ids=np.arange(n, dtype=np.int32),
                      loss_mask=np.array([0, 1, 1, 0], np.int32), logprobs=np.zeros(n, np.float32), prompt_len=1,
                      finish_reason="submitted", truncated=False, num_turns=len(versions), num_tool_calls=1,
                      response_tokens=2, artefacts={"out.txt": b"x"}, turn_versions=tuple(versions),
                      weight_version=versions[-1])


def test_a_unit_is_read_back_with_its_versions_counted_from_the_resumed_blocks_first_sync(tmp_path):
    """Rolled with the block's first sync at version 7 (turns on 8 and 9): stored as 1, 2; read back by a block whose
    first sync is version 3 as 4, 5. Another unit's record under the same key (other state ids or seed) is not
    reused: it is rolled out again."""
    journal = rj.RoundJournal(tmp_path / "round_001")
    rolls = []

    def roll():
        rolls.append(1)
        return [_trajectory([8, 9])], [types.SimpleNamespace(reward=0.5)]

    trajs, rewards = journal.rolled_out("b0000-i000-w000", ["s0"], 11, 7, roll)
    assert trajs[0].turn_versions == (8, 9) and rolls == [1]
    again = rj.RoundJournal(tmp_path / "round_001")
    assert again.finished() == ["b0000-i000-w000"] and again.unfinished() == []
    trajs, rewards = again.rolled_out("b0000-i000-w000", ["s0"], 11, 3, roll)
    assert rolls == [1] and again.reused == 1 and again.rolled == 0
    assert trajs[0].turn_versions == (4, 5) and trajs[0].weight_version == 5 and rewards[0].reward == 0.5
    assert trajs[0].artefacts == {"out.txt": b"x"}
    assert isinstance(trajs[0], Trajectory)
    again.rolled_out("b0000-i000-w000", ["r9"], 11, 3, roll)  # a refill drew another row into the same slot
    again.rolled_out("b0000-i000-w000", ["s0"], 12, 3, roll)  # another seed
    assert rolls == [1, 1, 1] and again.reused == 1


def test_a_unit_that_raised_stays_issued_and_unfinished_and_is_reissued_on_resume(tmp_path):
    journal = rj.RoundJournal(tmp_path / "j")
    with pytest.raises(Killed):
        journal.rolled_out("k", ["s0"], 1, 0, lambda: (_ for _ in ()).throw(Killed()))
    assert not any((tmp_path / "j").rglob(".*.tmp"))  # atomic writes leave no temporary file
    resumed = rj.RoundJournal(tmp_path / "j")
    assert resumed.unfinished() == ["k"] and resumed.finished() == []
    resumed.rolled_out("k", ["s0"], 1, 0, lambda: ([], []))
    assert (resumed.reissued, resumed.rolled, resumed.reused) == (1, 1, 0)
    assert "0 finished units reused, 1 in flight at the kill re-issued, 0 more rolled out" in resumed.line()


def test_without_a_directory_nothing_is_kept(tmp_path):
    journal = rj.RoundJournal(None)
    assert journal.rolled_out("k", ["s0"], 1, 0, lambda: ([1], [2])) == ([1], [2])
    assert journal.finished() == journal.unfinished() == [] and journal.line() == "" and journal.rolled == 1


def test_for_round_deletes_the_journals_of_earlier_rounds(tmp_path):
    for r in (1, 2, 3):
        rj.RoundJournal(tmp_path / "journal" / f"round_{r:03d}").rolled_out("k", ["s"], 0, 0, lambda: ([], []))
    journal = rj.for_round(tmp_path, 3)
    assert sorted(p.name for p in (tmp_path / "journal").iterdir()) == ["round_003"]
    assert journal.finished() == ["k"]
    assert rj.for_round(tmp_path, 4, enabled=False).directory is None


def test_a_synchronous_block_killed_mid_round_resumes_to_the_uninterrupted_blocks_batches(monkeypatch, tmp_path):
    """s = 0, three batches of one wave each. The kill comes at the third wave (batch 2 issued, never finished).
    Resumed on a fresh learner, loop and engine: waves 0 and 1 are read back (no episode rolled), batch 2's wave is
    re-issued with its own seed, then the after-block probe; every host batch, the learner's passes and the round's
    statistics equal the uninterrupted block's."""
    learner, stats, trained = _block(monkeypatch, Loop(), 0)
    with pytest.raises(Killed):
        _block(monkeypatch, Loop(kill_after=2), 0, rj.RoundJournal(tmp_path / "j"))
    journal = rj.RoundJournal(tmp_path / "j")
    assert journal.finished() == ["sync-b0000-w000", "sync-b0001-w000"]
    assert journal.unfinished() == ["sync-b0002-w000"]
    loop = Loop(version=40)  # a fresh process's engine counts from elsewhere
    resumed, resumed_stats, resumed_trained = _block(monkeypatch, loop, 0, journal)
    assert loop.calls == [("s4", "s5"), ("s0", "s1")]  # batch 2 re-issued, then the probe over batch 0
    assert (journal.reused, journal.reissued, journal.rolled) == (2, 1, 1)  # the probe is not journaled
    assert resumed_trained == trained == [["s0", "s1"], ["s2", "s3"], ["s4", "s5"]]
    assert len(resumed.seen) == len(learner.seen) == 3
    for a, b in zip(learner.seen, resumed.seen):
        assert set(a) == set(b)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert resumed.calls == learner.calls and resumed.params == learner.params
    assert resumed_stats == stats


@pytest.mark.parametrize("kill_after", [1, 3, 5])
def test_a_bounded_staleness_block_killed_mid_round_skips_no_state(monkeypatch, tmp_path, kill_after):
    """s = 1: groups are killed from the (kill_after + 1)-th on (which ones finished first depends on the threads).
    On resume every finished group is reused, every group in flight at the kill re-issued, the others rolled; the
    state ids trained, batch by batch, are the uninterrupted block's, and nothing is dropped or refilled."""
    _, stats, trained = _block(monkeypatch, Loop(), 1)
    with pytest.raises(Killed):
        _block(monkeypatch, Loop(kill_after=kill_after), 1, rj.RoundJournal(tmp_path / "j"))
    journal = rj.RoundJournal(tmp_path / "j")
    finished, unfinished = journal.finished(), journal.unfinished()
    assert len(finished) == kill_after and unfinished
    _, resumed_stats, resumed_trained = _block(monkeypatch, Loop(version=9), 1, journal)
    assert journal.reused == kill_after and journal.reissued == len(unfinished)
    assert journal.rolled == 6 - kill_after  # the groups of the round's 6 slots (the probe is not journaled)
    assert resumed_trained == trained == [["s0", "s1"], ["s2", "s3"], ["s4", "s5"]]
    assert resumed_stats.groups_trained == resumed_stats.groups_drawn == 6
    assert resumed_stats.groups_dropped_stale == resumed_stats.groups_refilled == 0
    assert resumed_stats.staleness_max <= 1 and stats.groups_trained == 6


# --------------------------------------------------------------------------- the micro BiCuRL run, killed mid-round


def _micro_run(run_dir, comps, kill_after=None, monkeypatch=None):
    """The micro run (1 round of 2 GRPO steps); with `kill_after`, the round's rollouts raise from that unit on."""
    from bat_jax.bicurl import experiment as ex

    if kill_after is not None:
        calls, real_roll, real_group = [], gr.rollouts, ab._roll_group

        def counted(real):
            def call(*args, **kwargs):
                calls.append(1)
                if len(calls) > kill_after:
                    raise Killed(f"killed at rollout unit {len(calls)}")
                return real(*args, **kwargs)
            return call

        monkeypatch.setattr(gr, "rollouts", counted(real_roll))
        monkeypatch.setattr(ab, "_roll_group", counted(real_group))
    run_dir.mkdir(exist_ok=True)
    try:
        ex.run(run_dir, ex.BiCuRLConfig(rounds=1, grpo_steps_per_round=2, backend="local"), comps)
    finally:
        if kill_after is not None:
            monkeypatch.undo()


@pytest.mark.slow
def test_a_micro_run_killed_mid_round_resumes_to_the_uninterrupted_ledger(tmp_path, monkeypatch, capfd):
    """s = 0: the micro run killed after its first batch's wave (the second batch's issued, in flight) and resumed
    ends with the uninterrupted run's ledger line; s = 1: killed after 3 of 8 groups, resumed, every group of the
    round trained (none dropped or skipped). The journal is gone once the round is in the ledger."""
    import micro_config

    from bat_jax.ledger import Ledger

    comps = micro_config.components(micro_config.seeded(tmp_path / "bank"))
    comps = dataclasses.replace(comps, pools=dataclasses.replace(comps.pools, refill=True))  # 2 batches
    _micro_run(tmp_path / "whole", comps)
    with pytest.raises(Killed):
        _micro_run(tmp_path / "killed", comps, kill_after=1, monkeypatch=monkeypatch)
    journal = rj.RoundJournal(tmp_path / "killed" / "journal" / "round_001")
    assert journal.finished() == ["sync-b0000-w000"] and journal.unfinished() == ["sync-b0001-w000"]
    capfd.readouterr()
    _micro_run(tmp_path / "killed", comps)
    assert "1 finished units reused, 1 in flight at the kill re-issued" in capfd.readouterr().out
    (whole,) = Ledger(tmp_path / "whole" / "ledger.jsonl").read()
    assert Ledger(tmp_path / "killed" / "ledger.jsonl").read() == [whole]
    assert not (tmp_path / "killed" / "journal" / "round_001").exists()

    async_comps = dataclasses.replace(
        comps, block=dataclasses.replace(comps.block, staleness=StalenessConfig(max_staleness=1)))
    with pytest.raises(Killed):
        _micro_run(tmp_path / "async", async_comps, kill_after=3, monkeypatch=monkeypatch)
    journal = rj.RoundJournal(tmp_path / "async" / "journal" / "round_001")
    assert len(journal.finished()) == 3 and journal.unfinished()
    capfd.readouterr()
    _micro_run(tmp_path / "async", async_comps)
    assert "3 finished units reused" in capfd.readouterr().out
    (record,) = Ledger(tmp_path / "async" / "ledger.jsonl").read()
    g = record.grpo
    assert g.groups_trained == g.groups_drawn == 8 and g.groups_dropped_stale == g.groups_evicted == 0
    assert record.state_ids == whole.state_ids
