"""The GRPO block's behaviour logprobs (bat_jax/bicurl/grpo_round.py): recomputed by the learner before each update
(the round-start reference pass reused only while no step has been taken) or the engine's in bypass mode; the
learner-vs-engine mismatch reported per round without rollout correction; and, on a real learner, the first
update's ratios at 1."""

import types

import numpy as np
import pytest

from bat_jax.bicurl import grpo_round as gr
from bat_jax.learn import grpo
from bat_jax.learn.dynamic_sampling import DynamicSamplingConfig

from test_experiment import _patch_rollout_scoring

ENGINE = np.array([0, 0, -0.2, -0.5, -2.0, 0], np.float32)  # the engine's logprobs of one rollout's tokens


class FakeLearner:
    """Logprobs of the sampled tokens: −0.5 − 0.1 · params (params = optimizer steps taken); records each pass."""
    mesh = types.SimpleNamespace(devices=np.zeros((1,)))
    params = 0

    def __init__(self):
        self.calls, self.seen, self.config = [], [], None

    def grpo_block(self, config, optimizer, total_steps, num_micro_batches):
        self.config = config
        return self.step, types.SimpleNamespace(params=0)

    def step(self, state, host):
        self.seen.append({k: np.asarray(v).copy() for k, v in host.items()})
        return types.SimpleNamespace(params=state.params + 1), {}

    def sync_model(self, params):
        return params

    def logprobs(self, params, host, config):
        self.calls.append(params)
        return np.where(np.asarray(host["loss_mask"]) > 0, -0.5 - 0.1 * params, 0.0).astype(np.float32)

    def adopt(self, state):
        self.params = state.params


def run_block(monkeypatch, cfg, rewards, batches=(("s0", "s1"), ("s2", "s3")), dynamic=DynamicSamplingConfig()):
    def run(requests, seed, on_trajectory):
        out = [types.SimpleNamespace(state_id=r, ids=np.arange(6, dtype=np.int32), agent_error=None,
                                     loss_mask=np.array([0, 0, 1, 1, 1, 0], np.int32), logprobs=ENGINE.copy())
               for r in requests for _ in range(4)]
        for position, t in enumerate(out):
            on_trajectory(position, t)
        return out

    _patch_rollout_scoring(monkeypatch, lambda rows: [rewards[row.name][i % 4] for i, row in enumerate(rows)])
    loop = types.SimpleNamespace(run=run, engine=types.SimpleNamespace(update_weights=lambda model: None))
    item = lambda name: types.SimpleNamespace(round_state_id=name, pool="target",  # noqa: E731
                                              row=types.SimpleNamespace(state=None, name=name))
    view = types.SimpleNamespace(batches=[[item(n) for n in b] for b in batches], spares={"target": ()})
    learner = FakeLearner()
    block = gr.GRPOBlockConfig(grpo=cfg, micro_batches=1, dynamic_sampling=dynamic, max_response_tokens=48)
    stats = gr.grpo_block(learner, loop, types.SimpleNamespace(load_state=lambda s: None), view, block,
                          benchmark=None, seed=3)  # the scorer double scores without a benchmark
    return learner, stats


REWARDS = {"s0": [1.0, 0.0, 0.0, 0.0], "s1": [0.0, 1.0, 1.0, 0.0], "s2": [0.0, 1.0, 0.0, 1.0],
           "s3": [1.0, 0.0, 1.0, 1.0]}


def test_old_logprobs_are_recomputed_before_each_update_and_the_mismatch_is_reported(monkeypatch):
    """Two batches, two epochs each. Batch 0: the reference pass at the round start is the behaviour pass; batch 1
    (after 2 steps): one more learner pass at params 2. The engine's logprobs never reach the step; the round's
    mismatch is |learner − engine| over both batches' sampled tokens, without rollout correction."""
    learner, stats = run_block(monkeypatch, grpo.GRPOConfig(epochs=2, kl_coef=0.0), REWARDS)
    assert learner.calls == [0, 0, 2, 4]  # ref (b0); ref and behaviour (b1, after 2 steps); the after-block pass
    b0, _, b1, _ = learner.seen
    assert set(b0) == set(grpo.batch_fields(learner.config))
    np.testing.assert_allclose(b0["old_logprobs"][0, :6], [0, 0, -0.5, -0.5, -0.5, 0])
    np.testing.assert_allclose(b1["old_logprobs"][0, :6], [0, 0, -0.7, -0.7, -0.7, 0], rtol=1e-6)
    np.testing.assert_allclose(b0["ref_logprobs"], b1["ref_logprobs"])  # KL reference: the round start
    per_token_b0, per_token_b1 = [0.3, 0.0, 1.5], [0.5, 0.2, 1.3]
    assert stats.rollout_mismatch["mismatch_mean_abs"] == pytest.approx(np.mean(per_token_b0 + per_token_b1))
    assert stats.rollout_mismatch["mismatch_max_abs"] == pytest.approx(1.5)
    assert stats.rollout_mismatch["tis_truncated_frac"] == 0.0 and stats.rollout_mismatch["seq_masked"] == 0.0
    assert stats.rollout_mismatch["tokens"] == 2 * 8 * 3


def test_bypass_divides_by_the_engine_logprobs_and_reports_the_round_start_mismatch(monkeypatch):
    learner, stats = run_block(monkeypatch, grpo.GRPOConfig(old_logprobs="bypass", kl_coef=0.0), REWARDS)
    assert learner.calls == [0, 0, 2]  # the reference passes and the after-block pass: no behaviour pass
    for host in learner.seen:
        np.testing.assert_allclose(host["old_logprobs"][:8, :6], np.tile(ENGINE, (8, 1)))
    assert stats.rollout_mismatch["mismatch_mean_abs"] == pytest.approx(np.mean([0.3, 0.0, 1.5]))  # b0, round start
    assert stats.rollout_mismatch["tokens"] == 8 * 3


def test_the_reference_pass_is_reused_only_while_no_step_was_taken(monkeypatch):
    """Batch 0 has no group with reward variance and no spare row: dynamic sampling drops it, no step is taken, so
    batch 1 (the first trained) still reuses the round-start reference pass as its behaviour logprobs."""
    rewards = dict(REWARDS, s0=[0.5] * 4, s1=[0.0] * 4)
    learner, stats = run_block(monkeypatch, grpo.GRPOConfig(kl_coef=0.0), rewards,
                                 dynamic=DynamicSamplingConfig(enabled=True, max_extra_rows=0))
    assert stats.groups_trained == 2 and len(learner.seen) == 1
    assert learner.calls == [0, 1]  # batch 1: the reference pass only; then the after-block pass (params 1)
    np.testing.assert_allclose(learner.seen[0]["old_logprobs"][0, :6], [0, 0, -0.5, -0.5, -0.5, 0])


def test_the_block_hands_dr_grpo_the_response_budget(monkeypatch):
    learner, _ = run_block(monkeypatch, grpo.GRPOConfig(loss_agg="seq-mean-token-sum-norm"), REWARDS)
    assert learner.config.loss_scale_factor == 48.0  # GRPOBlockConfig.max_response_tokens


def test_first_update_ratios_start_at_one_on_a_real_learner():
    """A tiny Qwen3 learner: the behaviour pass (`Learner.logprobs`, rows in chunks) and the train step's own logprobs
    (one micro-batch of 2 rows) agree to float round-off, so the first step has no clipped token and its policy loss
    is −mean A; against engine logprobs 0.5 nats below, bypass clips every A < 0 token (dual clip off)."""
    import jax
    from flax import nnx

    from bat_jax.learn import train_state
    from bat_jax.learn.learner import Learner, MemoryConfig
    from bat_jax.models.configs import Qwen3Config
    from bat_jax.models.mesh import MeshConfig
    from bat_jax.models.qwen3 import Qwen3ForCausalLM

    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16),
                             rngs=nnx.Rngs(0))
    learner = Learner(model, MeshConfig(data=1, fsdp=1, tensor=1), MemoryConfig(logit_chunk=4))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 64, (4, 12)).astype(np.int32)
    loss_mask = np.zeros((4, 12), np.int32)
    loss_mask[:, 4:11] = 1
    host = {"input_ids": ids, "attention_mask": np.ones_like(ids), "loss_mask": loss_mask,
            "advantages": np.array([1.0, -1.0, 0.5, -0.25], np.float32)}
    cfg = grpo.GRPOConfig(temperature=0.7, kl_coef=0.0)
    lp = learner.logprobs(learner.params, host, cfg, rows_per_call=1)
    host.update(ref_logprobs=lp, old_logprobs=lp - 0.5 * loss_mask)  # the engine 0.5 nats below the learner
    loss_fn = grpo.make_grpo_loss(learner.apply_fn, cfg)
    acc = jax.jit(train_state.accumulate_gradients, static_argnums=(0, 4))
    for mode, clip_frac, pg in (("recompute", 0.0, -0.0625), ("bypass", 0.5, None)):
        b = dict(host)
        gr.behaviour_logprobs(learner, b, grpo.GRPOConfig(old_logprobs=mode), learner.params, at_round_start=True)
        b = {k: jax.numpy.asarray(b[k]) for k in grpo.batch_fields(cfg)}
        _, metrics, _ = acc(loss_fn, learner.params, b, grpo.grpo_normalizers(b), 2)
        assert float(metrics["clip_frac"]) == pytest.approx(clip_frac, abs=1e-6), mode
        if pg is not None:  # ratio 1: −(1 − 1 + 0.5 − 0.25) / 4
            assert float(metrics["pg_loss"]) == pytest.approx(pg, abs=1e-6)
    step_lp = grpo.sequence_logprobs(learner.apply_fn, learner.params, jax.numpy.asarray(ids),
                                     jax.numpy.asarray(host["attention_mask"]), *cfg.sampling)
    assert float(np.abs(np.asarray(step_lp) - lp)[loss_mask > 0].max()) < 1e-5


def test_the_batch_refuses_a_rollout_longer_than_the_compiled_context_and_names_it():
    c = gr.GRPOBlockConfig(max_context_tokens=8)

    def traj(state_id, n, episode=0):
        return types.SimpleNamespace(state_id=state_id, episode=episode, ids=np.arange(n, dtype=np.int32),
                                     loss_mask=np.ones(n, np.int32), logprobs=np.zeros(n, np.float32),
                                     finish_reason="max_context")

    batch = gr._batch(FakeLearner(), [traj("st-a", 8), traj("st-b", 5)], c)
    assert batch["input_ids"].shape[1] == 8  # the longest allowed: padded to the bound, no further
    with pytest.raises(AssertionError, match=r"rollout st-b episode 3 has 9 tokens, more than max_context_tokens=8 "
                                             r"\(finish 'max_context'\)"):
        gr._batch(FakeLearner(), [traj("st-a", 8), traj("st-b", 9, episode=3)], c)
