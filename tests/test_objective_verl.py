"""The smallest cases where bat_jax's GRPO objective and verl's differed, with verl's formulas as hand values.

Each case checks the loss value and its gradient with respect to the learner's logprobs, on the whole batch and as
the sum over one-row micro-batches (whole-batch normalizers, as the train step splits): the ratio's old logprobs
(recomputed by the learner, verl's default, vs the engine's, verl's bypass mode), Dr.GRPO's constant C (the
response budget), sequence means over every rollout (empty ones included), ``seq_ratio_range`` in verl's
``seq_mean_k1`` convention, the advantage of a group of one and the dynamic-sampling filter. verl = the June 2026
head (9f18abe, ``core_algos.agg_loss`` / ``compute_policy_loss_vanilla`` / ``compute_grpo_outcome_advantage``,
``rollout_corr_helper.compute_rollout_rejection_mask``, ``main_ppo_sync._compute_old_log_prob``)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bat_jax.bicurl.grpo_round import GRPOBlockConfig, behaviour_logprobs
from bat_jax.learn import grpo, objective, rollout_correction
from bat_jax.learn.dynamic_sampling import DynamicSamplingConfig
from bat_jax.learn.grpo import GRPOConfig


def loss_and_grad(lp, batch, cfg):
    """(loss, d loss / d lp) of the GRPO loss given the learner's logprobs ``lp`` [B, T], whole batch and summed
    over one-row micro-batches; asserts the two agree."""
    norms = grpo.grpo_normalizers(batch)

    def loss(x, rows):
        sub = {k: v[rows] for k, v in batch.items()}
        t = grpo.grpo_token_terms(x[rows], sub, cfg)
        return objective.aggregate_loss(t["total"], t["mask"], cfg.loss_agg, norms, cfg.loss_scale_factor,
                                   cfg.seq_mean_rows)

    rows = np.arange(lp.shape[0])
    whole, g_whole = jax.value_and_grad(loss)(lp, rows)
    parts = [jax.value_and_grad(loss)(lp, np.array([r])) for r in rows]
    np.testing.assert_allclose(sum(v for v, _ in parts), whole, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(sum(g for _, g in parts), g_whole, rtol=1e-6, atol=1e-7)
    return float(whole), np.asarray(g_whole)


def host(engine_lp, learner_lp, loss_mask, advantages):
    """A host batch as the GRPO block holds it before the behaviour logprobs: the engine's as ``old_logprobs``, the
    round-start learner pass as ``ref_logprobs``."""
    loss_mask = np.asarray(loss_mask, np.int32)
    return {"input_ids": np.zeros(loss_mask.shape, np.int32), "attention_mask": np.ones_like(loss_mask),
            "loss_mask": loss_mask, "old_logprobs": np.asarray(engine_lp, np.float32),
            "ref_logprobs": np.asarray(learner_lp, np.float32), "advantages": np.asarray(advantages, np.float32)}


def device(batch, cfg):
    return {k: jnp.asarray(batch[k]) for k in grpo.batch_fields(cfg)}


# ------------------------------------------------------------------------------------------- old logprobs


@pytest.mark.parametrize("mode, ratio", [("recompute", 1.0), ("bypass", math.exp(0.5))])
def test_one_token_learner_half_a_nat_above_the_engine(mode, ratio):
    """One sampled token, A = −1, the learner's logprob 0.5 nats above the engine's (bf16 vLLM vs the learner).
    verl (recompute): old = the learner's, ratio 1, loss −A·1 = 1, gradient −A·w = 1. Bypass: ratio e^0.5 = 1.65
    is past 1 + ε and A < 0, so the unclipped −A·w = 1.65 is the larger branch (dual clip 3 does not cap it); the
    gradient is −A·w = 1.65."""
    cfg = GRPOConfig(kl_coef=0.0, old_logprobs=mode)
    b = host([[0.0, -1.5]], [[0.0, -1.0]], [[0, 1]], [-1.0])
    metrics = behaviour_logprobs(None, b, cfg, None, at_round_start=True)  # round start: the reference pass
    assert metrics[0]["mismatch_mean_abs"] == pytest.approx(0.5)  # reported in both modes
    lp = jnp.asarray([[0.0, -1.0]])  # the learner at the rollout's parameters
    for dual_clip in (None, 3.0):
        c = GRPOConfig(kl_coef=0.0, old_logprobs=mode, dual_clip=dual_clip)
        loss, g = loss_and_grad(lp, device(b, c), c)
        assert loss == pytest.approx(ratio, rel=1e-6)  # 1 (verl) or 1.6487 (bypass)
        np.testing.assert_allclose(g, [[0.0, ratio]], rtol=1e-6)


def test_bypass_after_the_first_step_reads_no_learner_pass_and_recompute_one():
    calls = []

    class Learner:
        def logprobs(self, params, batch, config):
            calls.append(params)
            return np.where(batch["loss_mask"] > 0, -0.8, 0.0).astype(np.float32)

    b = host([[0.0, -1.5]], [[0.0, -1.0]], [[0, 1]], [1.0])
    assert behaviour_logprobs(Learner(), dict(b), GRPOConfig(old_logprobs="bypass"), "p1", False) == []
    out = dict(b)
    (m,) = behaviour_logprobs(Learner(), out, GRPOConfig(), "p1", at_round_start=False)
    assert calls == ["p1"] and out["old_logprobs"].tolist() == [[0.0, pytest.approx(-0.8)]]
    assert m["mismatch_mean_abs"] == pytest.approx(0.7) and "is_weights" not in out
    with pytest.raises(ValueError, match="bypass"):
        GRPOConfig(old_logprobs="bypass", tis_cap=2.0)
    with pytest.raises(ValueError, match="old_logprobs"):
        GRPOConfig(old_logprobs="engine")


# ------------------------------------------------------------------------------------------- Dr.GRPO's C


def test_dr_grpo_constant_is_the_response_budget():
    """One row: a prompt token then 2 response tokens, A = 1, ratio 1. verl: Σ_t −A / (rows · C) with C the
    response width (2) → −1, gradient −1/2 per token; the padded full length T = 3 (the old default) gave
    −0.667."""
    block = GRPOBlockConfig(grpo=GRPOConfig(kl_coef=0.0, loss_agg="seq-mean-token-sum-norm"), max_response_tokens=2)
    cfg = block.objective
    assert cfg.loss_scale_factor == 2.0
    b = host([[0.0, -1.0, -1.0]], [[0.0, -1.0, -1.0]], [[0, 1, 1]], [1.0])
    behaviour_logprobs(None, b, cfg, None, at_round_start=True)
    loss, g = loss_and_grad(jnp.asarray(b["ref_logprobs"]), device(b, cfg), cfg)
    assert loss == pytest.approx(-1.0, rel=1e-6)
    np.testing.assert_allclose(g, [[0.0, -0.5, -0.5]], rtol=1e-6)
    old, _ = loss_and_grad(jnp.asarray(b["ref_logprobs"]), device(b, cfg),
                           GRPOConfig(kl_coef=0.0, loss_agg="seq-mean-token-sum-norm", loss_scale_factor=3.0))
    assert old == pytest.approx(-2 / 3, rel=1e-6)
    explicit = GRPOBlockConfig(grpo=GRPOConfig(loss_agg="seq-mean-token-sum-norm", loss_scale_factor=7.0))
    assert explicit.objective.loss_scale_factor == 7.0 and GRPOBlockConfig().objective == GRPOBlockConfig().grpo
    with pytest.raises(ValueError, match="loss_scale_factor"):
        grpo.make_grpo_loss(lambda p, i, m: None, GRPOConfig(loss_agg="seq-mean-token-sum-norm"))


# ------------------------------------------------------------------------------------------- sequence means


@pytest.mark.parametrize("rows, want", [("all", -0.5), ("nonempty", -1.0)])
@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum"])
def test_an_empty_row_counts_in_verl_sequence_means(mode, rows, want):
    """Two rollouts, the second unscored (no loss tokens), A = 1, ratio 1, one loss token in the first. verl's
    ``agg_loss`` divides by ``global_batch_size``, every row of the mini-batch: −1 / 2 = −0.5 (gradient −0.5); the
    rows with loss tokens alone give −1."""
    cfg = GRPOConfig(kl_coef=0.0, loss_agg=mode, seq_mean_rows=rows)
    b = grpo.with_advantages(host([[0.0, -1.0]] * 2, [[0.0, -1.0]] * 2, [[0, 1]] * 2, [0.0, 0.0]), [1.0, None],
                             ["g", "g"], GRPOConfig(singleton_advantage="reward", adv_std_normalize=False))
    assert b["loss_mask"].tolist() == [[0, 1], [0, 0]] and b["advantages"].tolist() == [1.0, 0.0]
    loss, g = loss_and_grad(jnp.asarray(b["ref_logprobs"]), device(b, cfg), cfg)
    assert loss == pytest.approx(want, rel=1e-6)
    np.testing.assert_allclose(g, [[0.0, want], [0.0, 0.0]], rtol=1e-6)


def test_a_rollout_masked_by_the_bounds_still_counts_in_the_mean():
    """Rollout correction masks row 1 (mean log w = log 1.8 out of (0.5, 1.5) in the geometric convention); verl
    sets its response mask to 0 and keeps dividing by 2 rows: loss −A·w / 2 with w = 1 for row 0."""
    cfg = GRPOConfig(kl_coef=0.0, seq_ratio_range=(0.5, 1.5))
    b = host([[0.0, -1.0], [0.0, -1.0 - math.log(1.8)]], [[0.0, -1.0], [0.0, -1.0]], [[0, 1], [0, 1]], [1.0, 1.0])
    (m,) = behaviour_logprobs(None, b, cfg, None, at_round_start=True)
    assert b["loss_mask"].tolist() == [[0, 1], [0, 0]] and m["seq_masked"] == 1.0
    loss, g = loss_and_grad(jnp.asarray(b["ref_logprobs"]), device(b, cfg), cfg)
    assert loss == pytest.approx(-0.5, rel=1e-6)
    np.testing.assert_allclose(g, [[0.0, -0.5], [0.0, 0.0]], rtol=1e-6)


# ------------------------------------------------------------------------------------------- seq_mean_k1 bounds


def verl_seq_mean_k1_keeps(log_w, mask, lo, hi):
    """verl ``compute_rollout_rejection_mask(.., 'seq_mean_k1', 'lo_hi')``: k1 = −clamp(log w, ±20) per token, its
    masked mean per sequence (the +1e-8 of ``masked_mean`` in the denominator), kept when log lo ≤ mean ≤ log hi."""
    k1 = -np.clip(log_w, -20, 20)
    mean = (k1 * mask).sum(1) / (mask.sum(1) + 1e-8)
    return (mean >= math.log(lo)) & (mean <= math.log(hi))


def test_seq_mean_k1_bounds_apply_to_the_reciprocal_ratio():
    """w = 1.8 with (0.5, 1.5): verl's seq_mean_k1 bounds exp(mean log 1/w) = 0.556 → kept; the geometric convention
    bounds 1.8 → masked. A token past ±20 is clamped per token before the mean, as verl's current code does: log w
    (30, −10) has mean 5 (kept by (e^−7, 1) on 1/w), where a clamp of the mean alone (verl ≤ 0.7's 'geometric')
    would give 10."""
    mask = np.array([[0, 1], [0, 1], [0, 1]])
    log_w = np.array([[0.0, math.log(1.8)], [0.0, math.log(1.4)], [0.0, math.log(0.6)]])
    learner, engine = log_w - 1.0, np.full_like(log_w, -1.0)
    _, keep_k1, _ = rollout_correction.correct(learner, engine, mask, tis_cap=None, seq_ratio_range=(0.5, 1.5),
                                               convention="seq_mean_k1")
    _, keep_geo, _ = rollout_correction.correct(learner, engine, mask, tis_cap=None, seq_ratio_range=(0.5, 1.5))
    assert keep_k1.tolist() == verl_seq_mean_k1_keeps(log_w, mask, 0.5, 1.5).tolist() == [True, True, False]
    assert keep_geo.tolist() == [False, True, True]
    far = np.array([[0.0, 30.0, -10.0]])
    m2 = np.array([[0, 1, 1]])
    _, keep, _ = rollout_correction.correct(far - 1.0, np.full_like(far, -1.0), m2, tis_cap=None,
                                            seq_ratio_range=(math.exp(-7), 1.0), convention="seq_mean_k1")
    assert keep.tolist() == verl_seq_mean_k1_keeps(far, m2, math.exp(-7), 1.0).tolist() == [True]
    with pytest.raises(ValueError, match="seq_ratio_convention"):
        GRPOConfig(seq_ratio_range=(0.5, 1.5), seq_ratio_convention="seq_mean_k3")


# ------------------------------------------------------------------------------------------- groups


@pytest.mark.parametrize("std, want", [(True, 0.7 / (1 + 1e-6)), (False, 0.7)])
def test_a_group_of_one_gets_its_reward_as_verl_does(std, want):
    """verl's ``compute_grpo_outcome_advantage``: a group of one has mean 0 and std 1, so A = r / (1 + ε) (or r
    without std normalisation); the paper's r − mean gives 0, the default."""
    rewards, groups = [0.7, None, None, None, 1.0, 0.0], ["a"] * 4 + ["b"] * 2
    cfg = GRPOConfig(singleton_advantage="reward", adv_std_normalize=std)
    adv, keep = grpo.group_advantages(rewards, groups, cfg)
    assert keep.tolist() == [True, False, False, False, True, True]
    np.testing.assert_allclose(adv[:4], [want, 0, 0, 0], rtol=1e-7)
    paper, _ = grpo.group_advantages(rewards, groups, GRPOConfig(adv_std_normalize=std))
    assert paper[0] == 0.0 and paper[4] == adv[4] != 0.0
    with pytest.raises(ValueError, match="singleton_advantage"):
        GRPOConfig(singleton_advantage="mean")


def test_dynamic_sampling_filter_as_verl_one_binding_away():
    """verl's DAPO filter keeps a group whose ``np.std`` > 0 or that has one member: [0.1 + 0.2, 0.3, 0.3, 0.3]
    (std 4.8e-17) and [0.1] * 3 (std 2⁻⁵⁶) are kept there and by the default; a lone scored rollout is kept with
    ``keep_singletons``."""
    roundoff, lone = [0.1 + 0.2, 0.3, 0.3, 0.3], [0.3, None, None, None]
    assert np.std(roundoff) > 0 and np.std([0.1] * 3) > 0
    default, verl = DynamicSamplingConfig(), DynamicSamplingConfig(signal_tol=0.0, keep_singletons=True)
    assert default.keeps(roundoff) and verl.keeps(roundoff) and default.keeps([0.1] * 3)
    assert not default.keeps(lone) and verl.keeps(lone)
    assert not verl.keeps([0.3] * 4) and not verl.keeps([None] * 4)
    with pytest.raises(ValueError, match="signal_tol"):
        DynamicSamplingConfig(signal_tol=-1.0)
