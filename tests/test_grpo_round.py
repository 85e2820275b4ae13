"""One round's GRPO block (bat_jax/bicurl/grpo_round.py): rollout and group counts, epochs of optimizer steps per
pool batch and the round's signal diagnostics, dynamic sampling with rollout correction, the behaviour logprobs
(recomputed by the learner before each update, the round-start reference pass reused only while no step has been
taken, or the engine's in bypass mode), the learner-vs-engine mismatch and, on a real learner, the first update's
ratios at 1."""

import types

import numpy as np
import pytest

from bat_jax.bicurl import grpo_round as gr
from bat_jax.learn import grpo
from bat_jax.learn.dynamic_sampling import DynamicSamplingConfig
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from doubles import FakeLearner, failed_trajectory, patch_rollout_scoring

IMAGING = ImagingBenchmark()
ENGINE = np.array([0, 0, -0.2, -0.5, -2.0, 0], np.float32)  # the engine's logprobs of one rollout's tokens


def run_block(monkeypatch, cfg, rewards, batches=(("s0", "s1"), ("s2", "s3")), dynamic=DynamicSamplingConfig(),
              infra=None):
    """`infra`: state id → the infrastructure error of its rollouts whose reward is None."""
    def run(requests, seed, on_trajectory):
        out = [types.SimpleNamespace(state_id=r, ids=np.arange(6, dtype=np.int32), agent_error=None,
                                     loss_mask=np.array([0, 0, 1, 1, 1, 0], np.int32), logprobs=ENGINE.copy(),
                                     infra_error=(infra or {}).get(r, "") if rewards[r][i] is None else "")
               for r in requests for i in range(4)]
        for position, t in enumerate(out):
            on_trajectory(position, t)
        return out

    patch_rollout_scoring(monkeypatch, lambda rows: [rewards[row.name][i % 4] for i, row in enumerate(rows)])
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


def test_the_run_sets_the_blocks_budgets_and_prompts_and_refuses_them_bound():
    """`for_run` takes the agent loop's context / response budgets and the run's prompts, keeping every other field;
    a budget bound on the block itself is one error naming the binding to use instead."""
    from bat_jax.errors import ConfigValueError
    from bat_jax.prompts import PromptFormat
    from bat_jax.rollout.agent_loop import AgentLoopConfig

    agent = AgentLoopConfig(max_context_tokens=2048, max_response_tokens=512)
    prompt = PromptFormat(style="compact")
    dr_grpo = grpo.GRPOConfig(loss_agg="seq-mean-token-sum-norm")
    block = gr.GRPOBlockConfig(grpo=dr_grpo, micro_batches=2).for_run(agent, prompt)
    assert (block.max_context_tokens, block.max_response_tokens, block.prompt, block.micro_batches) == (
        2048, 512, prompt, 2)
    assert block.objective.loss_scale_factor == 512.0  # Dr.GRPO's C: the agent loop's response budget
    with pytest.raises(ConfigValueError, match="GRPOBlockConfig.max_context_tokens is set by the run .* bind "
                                               "agent_loop.AgentLoopConfig instead"):
        gr.GRPOBlockConfig(max_context_tokens=99).for_run(agent, prompt)


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
    cfg = grpo.GRPOConfig(kl_coef=0.0)
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
                                     jax.numpy.asarray(host["attention_mask"]), *cfg.sampling.transform)
    assert float(np.abs(np.asarray(step_lp) - lp)[loss_mask > 0].max()) < 1e-5


def test_the_batch_refuses_a_rollout_longer_than_the_compiled_context_and_names_it():
    c = gr.GRPOBlockConfig(max_context_tokens=8)

    def traj(state_id, n, episode=0):
        return types.SimpleNamespace(state_id=state_id, episode=episode, ids=np.arange(n, dtype=np.int32),
                                     loss_mask=np.ones(n, np.int32), logprobs=np.zeros(n, np.float32),
                                     finish_reason="max_context")

    batch = gr.batch_rows(FakeLearner(), [traj("st-a", 8), traj("st-b", 5)], c)
    assert batch["input_ids"].shape[1] == 8  # the longest allowed: padded to the bound, no further
    with pytest.raises(AssertionError, match=r"rollout st-b episode 3 has 9 tokens, more than max_context_tokens=8 "
                                             r"\(finish 'max_context'\)"):
        gr.batch_rows(FakeLearner(), [traj("st-a", 8), traj("st-b", 9, episode=3)], c)


# --- agent-caused failures (scored) apart from infrastructure failures (unscored) -------------------

def test_rollout_counts_keep_agent_failures_apart_from_unscored():
    died = "sandbox died after agent code"
    trajectories = [failed_trajectory("a"), failed_trajectory("b", agent_error=died),
                    failed_trajectory("c", agent_error="executor hung"),
                    failed_trajectory("d", infra_error="engine down"), failed_trajectory("e", agent_error=died)]
    # e: agent-failed but unscored for another reason (judge down) → counted as unscored only
    assert gr.rollout_counts(trajectories, [0.5, 0.0, 0.25, None, None]) == (2, 2)
    assert gr.rollout_counts([], []) == (0, 0)
    with pytest.raises(ValueError):
        gr.rollout_counts(trajectories, [0.5])


def test_rollouts_left_unscored_by_the_infrastructure_are_one_log_line_naming_the_commonest_reason(
        monkeypatch, capsys):
    down = "generation failed: RuntimeError: vllm: engine step failed"
    rewards = {**REWARDS, "s1": [None, None, 1.0, 0.0], "s3": [None, 1.0, 0.0, 1.0]}
    _, stats = run_block(monkeypatch, grpo.GRPOConfig(), rewards, infra={"s1": down, "s3": "sandbox start failed"})
    assert stats.unscored == 3
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[bat_jax]")]
    assert lines == [f"[bat_jax] warning: 3 GRPO rollouts unscored by infrastructure failures (left out of the "
                     f"loss); 2 of them: {down}"]
    _, stats = run_block(monkeypatch, grpo.GRPOConfig(), REWARDS)
    assert stats.unscored == 0 and "warning" not in capsys.readouterr().out


def test_group_variance_counts_groups_whose_scored_rewards_differ():
    rewards = [0.0, 0.0, 0.5, 0.0, None, 0.25, 1.0, None, None, 0.3]
    groups = ["a", "a", "b", "b", "c", "c", "d", "d", "e", "e"]
    # a: equal; b: varies; c and e: one scored reward each (no group); d: one scored
    assert gr.group_variance(rewards, groups) == (1, 2)
    assert gr.group_variance([], []) == (0, 0)
    with pytest.raises(ValueError):
        gr.group_variance([0.1], ["a", "b"])


def test_a_block_with_bounded_staleness_trains_with_tis_by_default():
    """GRPOBlockConfig with max_staleness 1 and no tis_cap bound trains with TIS at 2.0 (`is_weights` in the batch);
    with max_staleness 0 the objective is the one given."""
    from bat_jax.learn.staleness import StalenessConfig
    stale = gr.GRPOBlockConfig(staleness=StalenessConfig(max_staleness=1))
    assert stale.grpo.tis_cap == 2.0 and "is_weights" in grpo.batch_fields(stale.objective)
    assert gr.GRPOBlockConfig().grpo == grpo.GRPOConfig()
    assert gr.GRPOBlockConfig(grpo=grpo.GRPOConfig(tis_cap=3.0),
                              staleness=StalenessConfig(max_staleness=2)).grpo.tis_cap == 3.0


def test_round_off_groups_count_as_varied_as_verl_keeps_them():
    """[0.1] * 3 (np.std 2⁻⁵⁶) counts as a group with variance, as verl's DAPO filter keeps it; [0.2] * 2 does not."""
    assert gr.group_variance([0.1, 0.1, 0.1, 0.2, 0.2], ["a", "a", "a", "b", "b"]) == (1, 2)


def test_grpo_block_takes_epochs_optimizer_steps_on_each_batch_and_reports_the_signal(monkeypatch):
    """`GRPOConfig.epochs` optimizer steps per pool batch, each on the same host batch (same advantages);
    the signal diagnostics come from the first batch before and the re-rollout after."""
    import types

    import numpy as np

    from bat_jax.learn import grpo

    class FakeLearner:
        mesh = types.SimpleNamespace(devices=np.zeros((1,)))
        params = "p0"

        def grpo_block(self, config, optimizer, total_steps, num_micro_batches):
            self.total_steps = total_steps
            return self.step, types.SimpleNamespace(params=0)

        def step(self, state, host):
            seen.append((state.params, host["advantages"].tolist()))
            return types.SimpleNamespace(params=state.params + 1), {}

        def sync_model(self, params):
            return params

        def logprobs(self, params, host, config):  # after the block the sampled tokens of s0's rollout 0 gain
            out = np.zeros(host["input_ids"].shape, np.float32)
            out[0, 2:5] = 0.3 if params == 6 else 0.0
            return out

        def adopt(self, state):
            self.params = state.params

    rewards = iter([1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5,  # batch 0: one group with variance, one without
                    0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0,  # batch 1
                    1.0, 1.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5])  # batch 0 again, after the block

    def run(requests, seed, on_trajectory):
        out = [types.SimpleNamespace(state_id=r, ids=np.arange(6, dtype=np.int32), agent_error=None,
                                     loss_mask=np.array([0, 0, 1, 1, 1, 0], np.int32),
                                     logprobs=np.zeros(6, np.float32)) for r in requests for _ in range(4)]
        for position in reversed(range(len(out))):  # handed over out of order, as episodes end
            on_trajectory(position, out[position])
        return out

    benchmarks = patch_rollout_scoring(monkeypatch, lambda rows: [next(rewards) for _ in rows],
                                        lambda row, r: {"S3": {"validate.smoke_run": r == 1.0}, "S4": None})
    loop = types.SimpleNamespace(run=run, engine=types.SimpleNamespace(update_weights=lambda model: None))
    track = lambda i: types.SimpleNamespace(track="vqa" if i < 2 else "segmentation")  # noqa: E731
    item = lambda i: types.SimpleNamespace(round_state_id=f"s{i}", pool="target",  # noqa: E731
                                           row=types.SimpleNamespace(state=None, provenance=track(i)))
    view = types.SimpleNamespace(batches=[[item(0), item(1)], [item(2), item(3)]], spares={})
    bank = types.SimpleNamespace(load_state=lambda state: None)
    comps = gr.GRPOBlockConfig(grpo=grpo.GRPOConfig(epochs=3), micro_batches=1)
    learner, seen = FakeLearner(), []
    stats = gr.grpo_block(learner, loop, bank, view, comps, IMAGING, seed=7)

    assert learner.total_steps == 6 and learner.params == 6  # 2 batches x 3 epochs, state threaded through
    assert benchmarks == [IMAGING] * 3  # batches 0 and 1, then batch 0 again after the block
    assert [s for s, _ in seen] == [0, 1, 2, 3, 4, 5]
    first = seen[0][1]  # group s0 = (1, 0, 0, 0): mean 0.25, sample std 0.5 -> (1.5, -0.5, -0.5, -0.5); s1 all 0
    np.testing.assert_allclose(first[:8], [1.5, -0.5, -0.5, -0.5, 0, 0, 0, 0], atol=1e-5)
    assert seen[1][1] == seen[2][1] == first  # the same host batch every epoch
    assert stats.pool_reward_before == 0.375 and stats.pool_reward_after == 0.5
    assert (stats.groups_with_variance, stats.groups_scored) == (2, 4)
    # update check on batch 0: rollout 0 (A = 1.5) +0.3 per token, the three A = -0.5 rollouts unchanged
    assert stats.update_logp_shift_pos == pytest.approx(0.3) and stats.update_logp_shift_neg == 0.0
    assert stats.update_token_kl == pytest.approx((np.expm1(0.3) - 0.3) * 3 / 24)
    # the learner's behaviour logprobs (recomputed, the default) equal the engine's (0) on both trained batches:
    # 2 batches x 2 rows x K=4 rollouts of 3 sampled tokens, no mismatch, nothing truncated or masked
    assert stats.rollout_mismatch == {"mismatch_mean_abs": 0.0, "tis_truncated_frac": 0.0, "mismatch_max_abs": 0.0,
                                      "seq_masked": 0.0, "rollouts": 16.0, "tokens": 48.0}
    assert stats.judge is None
    # rubric items over the 16 drawn rollouts (the probe after the block not counted): reward 1.0 passes the item;
    # vqa rows s0, s1 (batch 0) 1 of 8, segmentation rows s2, s3 (batch 1) 2 of 8; S4 not verified, not counted
    assert stats.items == {"S3": {"validate.smoke_run": {"vqa": [1, 8], "segmentation": [2, 8]}}}
    assert stats.scalars()["items/S3/validate.smoke_run"] == pytest.approx(100 * 3 / 16)
    with pytest.raises(ValueError, match="epochs"):
        grpo.GRPOConfig(epochs=0)


def test_grpo_block_with_dynamic_sampling_and_rollout_correction(monkeypatch):
    """Dynamic sampling replaces batch 0's group without reward variance (s1, pool 'mix') by the mix pool's spare
    (x1) and trains on groups with signal only; rollout correction gives the step the learner's behaviour
    logprobs (the round-start reference pass for batch 0) and importance weights min(exp(learner - engine), C)."""
    import types

    import numpy as np

    from bat_jax.learn import grpo
    from bat_jax.learn.dynamic_sampling import DynamicSamplingConfig

    class FakeLearner:
        mesh = types.SimpleNamespace(devices=np.zeros((1,)))
        params = 0
        calls = []

        def grpo_block(self, config, optimizer, total_steps, num_micro_batches):
            return self.step, types.SimpleNamespace(params=0)

        def step(self, state, host):
            seen.append({k: np.asarray(v).copy() for k, v in host.items()})
            return types.SimpleNamespace(params=state.params + 1), {}

        def sync_model(self, params):
            return params

        def logprobs(self, params, host, config):  # the learner's numerics: sampled tokens at -0.5
            self.calls.append(params)
            out = np.zeros(host["input_ids"].shape, np.float32)
            out[:, 2:5] = -0.5
            return out

        def adopt(self, state):
            self.params = state.params

    rewards = {"s0": [1.0, 0.0, 0.0, 0.0], "s1": [0.5] * 4, "x1": [0.0, 1.0, 1.0, 1.0],
               "s2": [0.0, 1.0, 0.0, 1.0], "s3": [1.0, 0.0, 1.0, 1.0]}
    order, seeds = [], []

    def run(requests, seed, on_trajectory):
        order.append(list(requests))
        seeds.append(seed)
        out = [types.SimpleNamespace(state_id=r, ids=np.arange(6, dtype=np.int32), agent_error=None,
                                     loss_mask=np.array([0, 0, 1, 1, 1, 0], np.int32),
                                     logprobs=np.array([0, 0, -0.2, -0.5, -2.0, 0], np.float32))  # the engine's
               for r in requests for _ in range(4)]
        for position, t in enumerate(out):
            on_trajectory(position, t)
        return out

    benchmarks = patch_rollout_scoring(monkeypatch,
                                        lambda rows: [rewards[row.name][i % 4] for i, row in enumerate(rows)])
    loop = types.SimpleNamespace(run=run, engine=types.SimpleNamespace(update_weights=lambda model: None))
    item = lambda name, pool: types.SimpleNamespace(round_state_id=name, pool=pool,  # noqa: E731
                                                    row=types.SimpleNamespace(state=None, name=name))
    view = types.SimpleNamespace(batches=[[item("s0", "target"), item("s1", "mix")],
                                          [item("s2", "target"), item("s3", "mix")]],
                                 spares={"mix": (item("x1", "mix"),), "target": ()})
    comps = gr.GRPOBlockConfig(grpo=grpo.GRPOConfig(tis_cap=1.5, kl_coef=0.0), micro_batches=1,
                               dynamic_sampling=DynamicSamplingConfig(enabled=True, max_extra_rows=2))
    learner, seen = FakeLearner(), []
    stats = gr.grpo_block(learner, loop, types.SimpleNamespace(load_state=lambda s: None), view, comps, IMAGING,
                          seed=7)

    assert order[:3] == [["s0", "s1"], ["x1"], ["s2", "s3"]]  # s1 (no variance) replaced by x1 from 'mix'
    assert benchmarks and set(map(id, benchmarks)) == {id(IMAGING)}
    assert (stats.groups_drawn, stats.groups_dropped, stats.groups_trained) == (5, 1, 4)
    assert stats.trained_pool_counts == {"target": 2, "mix": 2}
    assert stats.rollouts == 20  # every drawn group's rollouts, the dropped s1 included
    assert stats.reward_mean == pytest.approx(np.mean(sum(rewards.values(), [])))
    # batch seeds as without dynamic sampling; the replacement wave's seed is no other batch's or run's
    assert seeds[0] == 700 and seeds[2] == 701 and seeds[1] == gr.wave_seed(7, 0, 1)
    assert gr.wave_seed(7, 0, 1) not in {gr.wave_seed(s, b, 0) for s in range(10_000) for b in range(100)}
    assert (stats.groups_with_variance, stats.groups_scored) == (4, 4)  # every trained group varies
    batch0 = seen[0]
    np.testing.assert_allclose(batch0["advantages"][:8], [1.5, -0.5, -0.5, -0.5, -1.5, 0.5, 0.5, 0.5], atol=1e-5)
    np.testing.assert_allclose(batch0["old_logprobs"][0, :6], [0, 0, -0.5, -0.5, -0.5, 0])  # the learner's
    # weights: exp(-0.5 - -0.2) = 0.741, exp(0) = 1, exp(-0.5 + 2.0) = 4.48 -> C = 1.5
    np.testing.assert_allclose(batch0["is_weights"][0, :6], [0, 0, np.exp(-0.3), 1.0, 1.5, 0], rtol=1e-6)
    assert learner.calls[:2] == [0, 0]  # batch 0: the reference pass (round start) is the behaviour pass
    mismatch = stats.rollout_mismatch
    assert mismatch["mismatch_mean_abs"] == pytest.approx((0.3 + 0.0 + 1.5) / 3)
    assert mismatch["mismatch_max_abs"] == pytest.approx(1.5)
    assert mismatch["tis_truncated_frac"] == pytest.approx(1 / 3) and mismatch["seq_masked"] == 0.0
    assert stats.scalars()["rc_mismatch_max_abs"] == pytest.approx(1.5) and stats.scalars()["groups_trained"] == 4
