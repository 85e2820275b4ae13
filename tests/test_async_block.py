"""The bounded-staleness GRPO block (bat_jax/bicurl/async_block.py) with test doubles: max_staleness = 0 trains the
same batches as the synchronous block, s = 1 lets the next batch's groups start one version early, and stale,
failed and aborted groups are dropped and refilled from the same pool, with the round's counts."""

import threading
import types

import numpy as np
import pytest

from bat_jax.bicurl import async_block as ab
from bat_jax.bicurl import grpo_round as gr
from bat_jax.learn import grpo
from bat_jax.learn.dynamic_sampling import DynamicSamplingConfig
from bat_jax.learn.staleness import StalenessConfig

from doubles import FakeLearner, patch_rollout_scoring

REWARDS = {"s0": [1.0, 0.0, 0.0, 0.0], "s1": [0.0, 1.0, 1.0, 0.0], "s2": [0.0, 1.0, 0.0, 1.0],
           "s3": [1.0, 0.0, 1.0, 1.0], "s4": [0.0, 0.0, 1.0, 1.0], "s5": [1.0, 1.0, 0.0, 0.0],
           "r0": [0.0, 1.0, 1.0, 1.0], "r1": [1.0, 0.0, 0.0, 1.0]}


class Engine:
    def __init__(self):
        self.weight_version = 0

    def update_weights(self, model):
        self.weight_version += 1
        return self.weight_version


class Loop:
    """K = 4 episodes per request: logprobs drawn from (seed, i, k), so a batch shows which seeds it was sampled
    with; `lag[state]` makes a state's rollouts report beginning that many versions before the engine's;
    `infra[state]` fails its episode 1; `crossed[state]` (a count) makes that many first roll-outs span a sync."""

    def __init__(self, lag=None, infra=(), crossed=None, gate=None):
        self.engine, self.lag, self.infra, self.crossed = Engine(), dict(lag or {}), set(infra), dict(crossed or {})
        self.gate, self.began, self.lock = gate, [], threading.Lock()

    def _trajectory(self, state, i, k, seed, version):
        draw = np.random.default_rng([seed, i, k]).uniform(-1, 0, 3).astype(np.float32)
        first = version - self.lag.get(state, 0)
        versions = (first - 1, first) if self.crossed.get(state, 0) > 0 else (first,)
        return types.SimpleNamespace(state_id=state, ids=np.arange(6, dtype=np.int32), agent_error=None,
                                     loss_mask=np.array([0, 0, 1, 1, 1, 0], np.int32),
                                     logprobs=np.concatenate([[0, 0], draw, [0]]).astype(np.float32),
                                     turn_versions=versions, weight_version=versions[-1],
                                     infra_error="sandbox down" if state in self.infra and k == 1 else "")

    def run_episodes(self, episodes, seed, on_trajectory):
        version = self.engine.weight_version
        with self.lock:
            self.began.append((episodes[0][0], version))
        if self.gate is not None:
            self.gate(len(self.began))
        out = [self._trajectory(req, i, k, seed, version) for req, i, k in episodes]
        state = episodes[0][0]
        if self.crossed.get(state, 0) > 0:
            self.crossed[state] -= 1
        for position, t in enumerate(out):
            on_trajectory(position, t)
        return out

    def run(self, requests, seed, on_trajectory):
        return self.run_episodes([(r, i, k) for i, r in enumerate(requests) for k in range(4)], seed, on_trajectory)


def block(monkeypatch, loop, *, batches, spares=(), staleness=StalenessConfig(), cfg=None,
          dynamic=DynamicSamplingConfig(), sync=False):
    patch_rollout_scoring(monkeypatch, lambda rows: [REWARDS[row.name][i % 4] for i, row in enumerate(rows)])
    item = lambda name: types.SimpleNamespace(round_state_id=name, pool="target",  # noqa: E731
                                              row=types.SimpleNamespace(state=None, name=name,
                                                                        provenance=types.SimpleNamespace(track="t")))
    view = types.SimpleNamespace(batches=[[item(n) for n in b] for b in batches],
                                 spares={"target": [item(n) for n in spares]})
    learner = FakeLearner()
    c = gr.GRPOBlockConfig(grpo=cfg or grpo.GRPOConfig(kl_coef=0.0, tis_cap=2.0), micro_batches=1,
                           dynamic_sampling=dynamic, max_response_tokens=48, staleness=staleness)
    run = gr.grpo_block if sync else ab.async_grpo_block
    stats = run(learner, loop, types.SimpleNamespace(load_state=lambda s: None), view, c, benchmark=None, seed=3)
    return learner, stats


BATCHES = (("s0", "s1"), ("s2", "s3"), ("s4", "s5"))


@pytest.mark.parametrize("cfg", [grpo.GRPOConfig(kl_coef=0.0, tis_cap=2.0, epochs=2),
                                 grpo.GRPOConfig(kl_coef=0.0, old_logprobs="bypass")])
def test_max_staleness_0_trains_what_the_synchronous_block_trains(monkeypatch, cfg):
    """The async machinery with s = 0 (no group starts before its step's sync) gives the synchronous block's
    batches (ids, advantages, behaviour logprobs, importance weights) and round statistics, field for field; and
    `run_grpo_block` with s = 0 is the synchronous block itself."""
    sync_learner, sync_stats = block(monkeypatch, Loop(), batches=BATCHES, cfg=cfg, sync=True)
    async_learner, async_stats = block(monkeypatch, Loop(), batches=BATCHES, cfg=cfg)
    assert len(sync_learner.seen) == len(async_learner.seen) == 3 * cfg.epochs
    for a, b in zip(sync_learner.seen, async_learner.seen):
        assert set(a) == set(b)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert sync_learner.calls == async_learner.calls and sync_learner.params == async_learner.params
    expected = {**sync_stats.__dict__, "staleness_mean": 0.0, "staleness_max": 0}
    assert async_stats.__dict__ == expected
    assert sync_stats.groups_trained == 6 and sync_stats.staleness_mean is None


def test_run_grpo_block_with_max_staleness_0_is_the_synchronous_block(monkeypatch):
    calls = []
    monkeypatch.setattr(gr, "grpo_block", lambda *a, **k: calls.append("sync"))
    monkeypatch.setattr(ab, "async_grpo_block", lambda *a, **k: calls.append("async"))
    for s in (0, 1):
        ab.run_grpo_block(None, None, None, None, gr.GRPOBlockConfig(staleness=StalenessConfig(max_staleness=s)),
                          None, 0)
    assert calls == ["sync", "async"]


def test_max_staleness_1_starts_the_next_batch_one_version_early(monkeypatch):
    """s = 1, three batches of two rows: the learner's step j waits until the groups of batch j + 1 have begun, so
    they begin on step j's weights and are trained one version later. Versions: the engine syncs to 1, 2, 3 before
    steps 0, 1, 2; batch 0 begins on 1 (lag 0), batch 1 on 1 (trained at 2: lag 1), batch 2 on 2 (trained at 3)."""
    started = threading.Condition()
    loop = Loop()

    def gate(n):
        with started:
            started.notify_all()

    loop.gate = gate
    learner = FakeLearner()
    step = learner.step

    def waiting_step(state, host):  # step j trains once 2 (j + 2) groups have begun
        with started:
            assert started.wait_for(lambda: len(loop.began) >= min(6, 2 * (state.params + 2)), timeout=10)
        return step(state, host)

    monkeypatch.setattr(learner, "step", waiting_step)
    patch_rollout_scoring(monkeypatch, lambda rows: [REWARDS[row.name][i % 4] for i, row in enumerate(rows)])
    item = lambda name: types.SimpleNamespace(round_state_id=name, pool="target",  # noqa: E731
                                              row=types.SimpleNamespace(state=None, name=name,
                                                                        provenance=types.SimpleNamespace(track="t")))
    view = types.SimpleNamespace(batches=[[item(n) for n in b] for b in BATCHES], spares={"target": []})
    c = gr.GRPOBlockConfig(grpo=grpo.GRPOConfig(kl_coef=0.0, tis_cap=2.0), micro_batches=1, max_response_tokens=48,
                           staleness=StalenessConfig(max_staleness=1))
    stats = ab.async_grpo_block(learner, loop, types.SimpleNamespace(load_state=lambda s: None), view, c,
                                benchmark=None, seed=3)
    began = dict(loop.began[:6])
    assert began == {"s0": 1, "s1": 1, "s2": 1, "s3": 1, "s4": 2, "s5": 2}
    assert stats.groups_trained == 6 and stats.groups_dropped_stale == 0
    assert stats.staleness_mean == pytest.approx(4 / 6) and stats.staleness_max == 1
    assert loop.began[6:] == [("s0", 4)]  # the after-block probe (one call over batch 0), on the final weights


def test_a_stale_group_is_dropped_and_refilled_from_the_same_pool(monkeypatch):
    """s0 reports beginning 3 versions back: dropped at step 0 and its slot refilled by the spare r0 (its group,
    not s0's, is trained, in s0's place); the round counts 1 stale, 1 refill, 5 groups drawn and 4 trained."""
    learner, stats = block(monkeypatch, Loop(lag={"s0": 3}), batches=BATCHES[:2], spares=("r0", "r1"),
                           staleness=StalenessConfig(max_staleness=1))
    assert stats.groups_dropped_stale == 1 and stats.groups_refilled == 1
    assert stats.groups_drawn == 5 and stats.groups_trained == 4 and stats.rollouts == 20
    first = learner.seen[0]
    expected, _ = grpo.group_advantages(REWARDS["r0"] + REWARDS["s1"], ["r0"] * 4 + ["s1"] * 4, learner.config)
    np.testing.assert_allclose(first["advantages"][:8], expected, rtol=1e-6)  # r0 in slot 0, then s1


def test_failed_groups_are_evicted_and_refilled_never_trained_and_an_empty_pool_leaves_the_slot_empty(monkeypatch):
    learner, stats = block(monkeypatch, Loop(infra={"s1", "s2"}), batches=BATCHES[:2], spares=("r0",),
                           staleness=StalenessConfig(max_staleness=1))
    # s1 evicted → r0; s2 evicted, no spare left → its slot stays empty: 3 groups trained
    assert stats.groups_evicted == 2 and stats.groups_refilled == 1 and stats.groups_trained == 3
    assert stats.unscored == 0 and stats.rollouts == 20  # the double scores every rollout; all 5 groups drawn
    assert [len(h["input_ids"]) for h in learner.seen] == [8, 4]


def test_on_sync_abort_requeues_the_same_row_and_continue_trains_it(monkeypatch):
    _, aborted = block(monkeypatch, Loop(crossed={"s1": 1}), batches=BATCHES[:2],
                       staleness=StalenessConfig(max_staleness=1, on_sync="abort"))
    assert aborted.groups_aborted == 1 and aborted.groups_refilled == 1 and aborted.groups_trained == 4
    _, kept = block(monkeypatch, Loop(crossed={"s1": 1}), batches=BATCHES[:2],
                    staleness=StalenessConfig(max_staleness=1, on_sync="continue"))
    assert kept.groups_aborted == 0 and kept.groups_refilled == 0 and kept.groups_trained == 4
    assert kept.staleness_max == 1  # s1 began one version before its first turn's own


def test_the_staleness_counts_reach_the_ledger_and_the_report(monkeypatch, tmp_path):
    from bat_jax import ledger, report

    _, stats = block(monkeypatch, Loop(lag={"s0": 3}, infra={"s3"}), batches=BATCHES[:2], spares=("r0", "r1"),
                     staleness=StalenessConfig(max_staleness=1))
    back = ledger.GRPOStats.from_dict(stats.__dict__)
    assert (back.groups_dropped_stale, back.groups_evicted, back.groups_refilled) == (1, 1, 2)
    table = report.staleness_table([types.SimpleNamespace(round=1, grpo=back)])
    assert table.splitlines()[2].split() == ["round", "1", "1", "1", "0", "2", f"{back.staleness_mean:.2f}",
                                             str(back.staleness_max)]
