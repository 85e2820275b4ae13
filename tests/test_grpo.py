"""GRPO math: advantages, clipped loss, KL estimators, masking and aggregation (hand-computed values)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bat_jax.learn import grpo, objective, optim, train_state
from bat_jax.learn.grpo import GRPOConfig
from bat_jax.rollout.sampling import SamplingConfig

# ------------------------------------------------------------------------------------------- advantages


def test_near_equal_groups_get_equal_opposite_advantages_from_std_plus_eps_alone():
    cfg = GRPOConfig()  # eps 1e-6, sample std (ddof 1)
    adv, keep = grpo.group_advantages([1.0, 1.00001, 2.0, 2.00001], ["a", "a", "b", "b"], cfg)
    assert keep.all()
    for lo, hi in [(1.0, 1.00001), (2.0, 2.00001)]:
        d = hi - lo
        # mean is the midpoint; sample std of two values = d / sqrt(2); no floor other than eps
        expected = (d / 2) / (d / math.sqrt(2) + 1e-6)
        assert abs(expected - 0.61950) < 1e-5  # 5e-6 / (7.0711e-6 + 1e-6) = 5 / 8.0711
    np.testing.assert_allclose(adv[[0, 2]], -0.61950, atol=1e-4)
    np.testing.assert_allclose(adv[[1, 3]], 0.61950, atol=1e-4)
    np.testing.assert_allclose(adv[0], -adv[1], rtol=1e-6)
    np.testing.assert_allclose(adv[0], adv[2], rtol=1e-4)


def test_population_std_option():
    cfg = GRPOConfig(adv_std_ddof=0)
    adv, _ = grpo.group_advantages([1.0, 1.00001], [0, 0], cfg)
    # population std = d/2 = 5e-6 → 5e-6 / 6e-6
    np.testing.assert_allclose(adv, [-5 / 6, 5 / 6], rtol=1e-4)


def test_identical_rewards_give_zeros_without_nan():
    adv, keep = grpo.group_advantages([0.5] * 4, [7] * 4)
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert keep.all() and not np.isnan(adv).any()


def test_groups_equal_up_to_round_off_get_no_large_advantages():
    """[0.1] * 3 (float mean 0.1 + 2⁻⁵⁶) gets exactly 0; [0.3, 0.1 + 0.2] (one ulp, 2⁻⁵⁴, apart; the float mean rounds
    to 0.1 + 0.2, sample std 2⁻⁵⁴) gets −2⁻⁵⁴ / (2⁻⁵⁴ + 1e-6) = −5.55e-11 and 0; ε = 0 (which would make that −1) is
    refused."""
    adv, _ = grpo.group_advantages([0.1] * 3, [0] * 3)
    assert np.mean([0.1] * 3) == 0.1 + 2 ** -56 and adv.tolist() == [0.0, 0.0, 0.0]
    adv, _ = grpo.group_advantages([0.3, 0.1 + 0.2], [0, 0])
    assert 0.1 + 0.2 - 0.3 == 2 ** -54
    np.testing.assert_allclose(adv, [-(2 ** -54) / (2 ** -54 + 1e-6), 0.0], rtol=1e-6)
    assert abs(adv[0] + 5.551115e-11) < 1e-16
    with pytest.raises(ValueError, match="adv_eps"):
        GRPOConfig(adv_eps=0.0)


def test_negative_advantage_weight_scales_only_the_negative_advantages():
    """Rewards [1, 0, 0, 0]: mean 0.25, sample std sqrt(0.25) = 0.5, advantages [1.5, −0.5, −0.5, −0.5] (ε 1e-6 aside);
    λ = 0 keeps 1.5 and zeroes the rest (PSR), λ = 0.2 gives −0.1; a group of equal rewards stays 0."""
    rewards, ids = [1.0, 0.0, 0.0, 0.0, 0.3, 0.3], ["a"] * 4 + ["b"] * 2
    full, _ = grpo.group_advantages(rewards, ids)
    np.testing.assert_allclose(full, [1.5, -0.5, -0.5, -0.5, 0.0, 0.0], rtol=1e-5)
    psr, _ = grpo.group_advantages(rewards, ids, GRPOConfig(negative_advantage_weight=0.0))
    np.testing.assert_allclose(psr, [1.5, 0.0, 0.0, 0.0, 0.0, 0.0], rtol=1e-5)
    assert psr[0] == full[0]
    part, _ = grpo.group_advantages(rewards, ids, GRPOConfig(negative_advantage_weight=0.2))
    np.testing.assert_allclose(part, [1.5, -0.1, -0.1, -0.1, 0.0, 0.0], rtol=1e-5)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="negative_advantage_weight"):
            GRPOConfig(negative_advantage_weight=bad)


def test_bounded_staleness_turns_tis_on_unless_bound():
    """s > 0 with 'recompute': a None tis_cap becomes 2.0, a bound one stays; s = 0 or 'bypass': unchanged."""
    stale = grpo.for_staleness(GRPOConfig(), 1)
    assert stale.tis_cap == grpo.STALENESS_TIS_CAP == 2.0 and grpo.batch_fields(stale)[-1] == "is_weights"
    assert grpo.for_staleness(GRPOConfig(), 0).tis_cap is None
    assert grpo.for_staleness(GRPOConfig(tis_cap=1.5), 3).tis_cap == 1.5
    ranged = grpo.for_staleness(GRPOConfig(seq_ratio_range=(0.5, 2.0)), 2)
    assert ranged.tis_cap == 2.0 and ranged.seq_ratio_range == (0.5, 2.0)
    assert grpo.for_staleness(GRPOConfig(old_logprobs="bypass"), 1).tis_cap is None


def test_hand_computed_group_of_four_and_no_std_option():
    r = [0.0, 0.25, 0.5, 1.0]  # mean 0.4375
    mean = 0.4375
    sample_std = math.sqrt(sum((x - mean) ** 2 for x in r) / 3)
    adv, _ = grpo.group_advantages(r, ["s"] * 4)
    np.testing.assert_allclose(adv, [(x - mean) / (sample_std + 1e-6) for x in r], rtol=1e-6)
    adv_nostd, _ = grpo.group_advantages(r, ["s"] * 4, GRPOConfig(adv_std_normalize=False))
    np.testing.assert_allclose(adv_nostd, [-0.4375, -0.1875, 0.0625, 0.5625], rtol=1e-6)


def test_unscored_rollouts_leave_their_group():
    # group x: one unscored (None) → statistics over the remaining three
    adv, keep = grpo.group_advantages([1.0, None, 0.0, None, 1.0, 0.0], ["x", "x", "x", "y", "x", "y"])
    assert keep.tolist() == [True, False, True, False, True, True]
    # x scored: [1, 0, 1]: mean 2/3, sample std sqrt(1/3)
    s = math.sqrt(1 / 3) + 1e-6
    np.testing.assert_allclose(adv[[0, 2, 4]], [(1 / 3) / s, (-2 / 3) / s, (1 / 3) / s], rtol=1e-6)
    # unscored get 0; group y has a single scored rollout → 0
    assert adv[1] == 0.0 and adv[3] == 0.0 and adv[5] == 0.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_reward_is_a_scorer_error_not_unscored(bad):
    # a rollout whose reward became NaN must not leave its group as if unscored (its weak result unseen)
    with pytest.raises(ValueError, match=r"non-finite rewards at \[1\]"):
        grpo.group_advantages([1.0, bad, 0.0, 0.5], ["x"] * 4)


def test_unscored_rows_keep_shape_but_leave_the_loss():
    batch = {"loss_mask": np.ones((3, 4), np.int32)}
    out = grpo.with_advantages(batch, [1.0, None, 0.0], ["g", "g", "g"])
    assert out["loss_mask"].tolist() == [[1] * 4, [0] * 4, [1] * 4]
    s = math.sqrt(0.5) + 1e-6
    np.testing.assert_allclose(out["advantages"], [0.5 / s, 0.0, -0.5 / s], rtol=1e-6)
    norms = objective.loss_normalizers(jnp.asarray(out["loss_mask"]))
    assert float(norms["num_tokens"]) == 6.0 and float(norms["num_seqs"]) == 2.0
    with pytest.raises(ValueError, match="2 rewards for a batch of 3 rows"):
        grpo.with_advantages(batch, [1.0, 0.0], [0, 0])


def test_advantage_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="3 rewards but 2 group ids"):
        grpo.group_advantages([1.0, 2.0, 3.0], [0, 0])


# ------------------------------------------------------------------------------------------- aggregation


def test_token_mean_exact_under_micro_batching():
    # micro-batch A: 2 loss tokens with loss 1; micro-batch B: 8 loss tokens with loss 0
    mask = np.zeros((2, 9), np.float32)
    mask[0, 1:3] = 1
    mask[1, 1:9] = 1
    values = np.zeros((2, 9), np.float32)
    values[0, 1:3] = 1.0
    norms = objective.loss_normalizers(jnp.asarray(mask))
    assert float(norms["num_tokens"]) == 10.0
    whole = objective.aggregate_loss(jnp.asarray(values), jnp.asarray(mask), "token-mean", norms)
    part_a = objective.aggregate_loss(jnp.asarray(values[:1]), jnp.asarray(mask[:1]), "token-mean", norms)
    part_b = objective.aggregate_loss(jnp.asarray(values[1:]), jnp.asarray(mask[1:]), "token-mean", norms)
    assert float(whole) == pytest.approx(0.2, abs=1e-7)
    assert float(part_a + part_b) == pytest.approx(0.2, abs=1e-7)
    # seq-mean-token-mean: (1 + 0) / 2 sequences, also exact when split
    whole_s = objective.aggregate_loss(jnp.asarray(values), jnp.asarray(mask), "seq-mean-token-mean", norms)
    a = objective.aggregate_loss(jnp.asarray(values[:1]), jnp.asarray(mask[:1]), "seq-mean-token-mean", norms)
    b = objective.aggregate_loss(jnp.asarray(values[1:]), jnp.asarray(mask[1:]), "seq-mean-token-mean", norms)
    assert float(whole_s) == pytest.approx(0.5) and float(a + b) == pytest.approx(0.5)


# per-token loss 1 on 2 + 4 tokens: means 1; token sums 2 and 4 -> 3 per rollout; Dr.GRPO over C = 5 -> 3 / 5
PADDED_VALUE = {"token-mean": 1.0, "seq-mean-token-mean": 1.0, "seq-mean-token-sum": 3.0,
                "seq-mean-token-sum-norm": 0.6}


@pytest.mark.parametrize("mode", objective.LOSS_AGGREGATIONS)
def test_padding_garbage_does_not_leak(mode):
    # lengths 2 and 4 padded to 4 (plus the unpredicted position 0); per-token loss 1 everywhere
    mask = np.array([[0, 1, 1, 0, 0], [0, 1, 1, 1, 1]], np.float32)
    values = np.ones((2, 5), np.float32)
    values[0, 3:] = np.nan  # garbage on padding must not leak
    norms = objective.loss_normalizers(jnp.asarray(mask))
    got = float(objective.aggregate_loss(jnp.asarray(values), jnp.asarray(mask), mode, norms, 5.0))
    assert got == pytest.approx(PADDED_VALUE[mode], rel=1e-6)


def test_position_zero_never_carries_loss():
    m = objective.effective_loss_mask(jnp.ones((1, 3), jnp.int32))
    assert m.tolist() == [[0.0, 1.0, 1.0]]


# ------------------------------------------------------------------------------------------- KL


def test_kl_estimators_hand_values():
    lp = jnp.array([-1.0, -2.0])
    ref = jnp.array([-1.5, -1.0])  # d = logp - ref = [0.5, -1.0]
    np.testing.assert_allclose(objective.kl_penalty(lp, ref, "k1", 20.0), [0.5, -1.0], rtol=1e-6)
    np.testing.assert_allclose(objective.kl_penalty(lp, ref, "k2", 20.0), [0.125, 0.5], rtol=1e-6)
    np.testing.assert_allclose(
        objective.kl_penalty(lp, ref, "k3", 20.0),
        [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0],
        rtol=1e-6,
    )


@pytest.mark.parametrize("d", [100.0, -100.0])
def test_k3_at_log_ratio_100_is_finite_with_finite_gradient(d):
    f = lambda lp: objective.kl_penalty(lp, jnp.float32(0.0), "k3", 20.0, value_clamp=None)  # noqa: E731
    val = f(jnp.float32(d))
    grad = jax.grad(f)(jnp.float32(d))
    assert val.dtype == jnp.float32 and np.isfinite(val) and np.isfinite(grad)
    c = math.copysign(20.0, d)  # clamped before exp
    assert float(val) == pytest.approx(math.expm1(-c) + c, rel=1e-6)
    # with verl's value clamp (the default) both ends give 10 and no gradient
    g = lambda lp: objective.kl_penalty(lp, jnp.float32(0.0), "k3")  # noqa: E731
    assert float(g(jnp.float32(d))) == 10.0 and float(jax.grad(g)(jnp.float32(d))) == 0.0
    # inside the clamp the gradient is 1 - exp(-d)
    assert float(jax.grad(f)(jnp.float32(1.0))) == pytest.approx(1 - math.exp(-1.0), rel=1e-6)


# ------------------------------------------------------------------------------------------- policy loss


def test_clipped_policy_loss_hand_values():
    cfg = GRPOConfig(clip_eps=0.2)
    old = jnp.zeros((2, 3))
    lp = jnp.log(jnp.array([[1.0, 1.5, 0.5], [1.0, 1.5, 0.5]]))  # ratios 1, 1.5, 0.5
    adv = jnp.array([1.0, -1.0])
    loss, clipped = objective.clipped_policy_loss(lp, old, adv, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
                                                  dual_clip=cfg.dual_clip)
    # A=+1: max(-w, -clip(w)) = [-1, -1.2, -0.5]; A=-1: max(w, clip(w)) = [1, 1.5, 0.8]
    np.testing.assert_allclose(loss, [[-1.0, -1.2, -0.5], [1.0, 1.5, 0.8]], rtol=1e-6)
    assert clipped.tolist() == [[0, 1, 0], [0, 0, 1]]
    dual, _ = objective.clipped_policy_loss(lp + jnp.log(3.0), old, adv, eps_low=0.2, eps_high=0.2, dual_clip=3.0)
    # ratios 3, 4.5, 1.5 with A=-1: max(w, clip) = [3, 4.5, 1.5], dual cap at 3 → [3, 3, 1.5]
    np.testing.assert_allclose(dual[1], [3.0, 3.0, 1.5], rtol=1e-6)


def test_tool_positions_contribute_exactly_zero():
    # response [act, tool, tool, act] after one prompt token; mask [1, 0, 0, 1] on the response
    cfg = GRPOConfig(kl_coef=0.5)
    batch = {
        "loss_mask": jnp.array([[0, 1, 0, 0, 1]]),
        "old_logprobs": jnp.array([[0.0, -1.0, -1.0, -1.0, -1.0]]),
        "ref_logprobs": jnp.array([[0.0, -2.0, -2.0, -2.0, -2.0]]),
        "advantages": jnp.array([1.0]),
    }
    lp = jnp.array([[0.0, -0.9, -50.0, 30.0, -1.1]])  # wild values at tool positions
    terms = grpo.grpo_token_terms(lp, batch, cfg)
    for key in ("pg", "kl", "total"):
        assert float(terms[key][0, 2]) == 0.0 and float(terms[key][0, 3]) == 0.0
        assert float(terms[key][0, 1]) != 0.0 and float(terms[key][0, 4]) != 0.0

    def loss(lp):
        t = grpo.grpo_token_terms(lp, batch, cfg)
        return objective.aggregate_loss(t["total"], t["mask"], "seq-mean-token-mean",
                                   objective.loss_normalizers(batch["loss_mask"]))

    g = jax.jit(jax.grad(loss))(lp)
    assert g[0, 2] == 0.0 and g[0, 3] == 0.0 and g[0, 0] == 0.0
    # changing the tool-position logprobs changes nothing
    assert float(loss(lp)) == float(loss(lp.at[0, 2:4].set(0.0)))


def test_token_logprobs_shift():
    # logits at position t-1 predict token t
    logits = jnp.log(jnp.array([[[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [1 / 3, 1 / 3, 1 / 3]]]))
    ids = jnp.array([[2, 1, 2]])
    lp = grpo.shifted_token_logprobs(logits, ids)
    np.testing.assert_allclose(lp, [[0.0, math.log(0.2), math.log(0.8)]], rtol=1e-5)


# ------------------------------------------------------------------------------------------- optimizer


def test_zero_gradient_through_global_norm_clip_stays_zero():
    tx = optim.make_optimizer(optim.GRPO_OPTIMIZER, total_steps=10)
    params = {"w": jnp.ones((3, 2)), "b": jnp.ones((2,))}
    state = tx.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    clipped, _ = optax.clip_by_global_norm(1.0).update(zeros, optax.EmptyState())
    for leaf in jax.tree.leaves(clipped):
        assert not np.isnan(leaf).any() and (leaf == 0).all()
    updates, _ = tx.update(zeros, state, params)
    for leaf in jax.tree.leaves(updates):
        assert not np.isnan(leaf).any() and (leaf == 0).all()


# ------------------------------------------------------------------------------------------- full step


def _linear_lm(params, input_ids, attention_mask):
    del attention_mask
    return jnp.take(params["emb"], input_ids, axis=0) @ params["out"]


def _grpo_batch(rng, b=4, t=6, v=5):
    ids = rng.integers(0, v, size=(b, t)).astype(np.int32)
    lm = np.zeros((b, t), np.int32)
    lm[0, 2:4] = 1
    lm[1, 1:6] = 1
    lm[2, 3:5] = 1
    lm[3, 1:2] = 1
    return {
        "input_ids": jnp.asarray(ids),
        "attention_mask": jnp.ones((b, t), jnp.int32),
        "loss_mask": jnp.asarray(lm),
        "old_logprobs": jnp.asarray(rng.normal(-1.6, 0.1, size=(b, t)).astype(np.float32)),
        "ref_logprobs": jnp.asarray(rng.normal(-1.6, 0.1, size=(b, t)).astype(np.float32)),
        "advantages": jnp.asarray([1.0, -0.5, 0.25, -1.0], jnp.float32),
    }


@pytest.mark.parametrize("mode", objective.LOSS_AGGREGATIONS)
def test_micro_batched_gradient_equals_full_batch(mode):
    rng = np.random.default_rng(0)
    params = {"emb": jnp.asarray(rng.normal(size=(5, 3)), jnp.float32), "out": jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)}
    batch = _grpo_batch(rng)
    loss_fn = grpo.make_grpo_loss(_linear_lm, GRPOConfig(loss_agg=mode, kl_coef=0.1, entropy_coef=0.05,
                                                         clip_eps_high=0.28, dual_clip=3.0, loss_scale_factor=6.0))
    norms = grpo.grpo_normalizers(batch)
    acc = jax.jit(train_state.accumulate_gradients, static_argnums=(0, 4))
    l1, m1, g1 = acc(loss_fn, params, batch, norms, 1)
    l2, m2, g2 = acc(loss_fn, params, batch, norms, 2)
    l4, _, g4 = acc(loss_fn, params, batch, norms, 4)
    np.testing.assert_allclose(l2, l1, rtol=1e-6)
    np.testing.assert_allclose(l4, l1, rtol=1e-6)
    np.testing.assert_allclose(m2["kl"], m1["kl"], rtol=1e-5)
    np.testing.assert_allclose(m2["entropy"], m1["entropy"], rtol=1e-5)
    assert 0.0 < float(m1["entropy"]) and set(m1) == {"pg_loss", "kl", "clip_frac", "entropy"}
    for a, b_, c in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), jax.tree.leaves(g4)):
        np.testing.assert_allclose(b_, a, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(c, a, rtol=1e-5, atol=1e-7)


def test_on_policy_loss_at_ratio_one_equals_minus_mean_advantage():
    # old = current logprobs and ref = current → ratio 1, KL 0: loss = -(seq-mean of A over sequences)
    rng = np.random.default_rng(1)
    params = {"emb": jnp.asarray(rng.normal(size=(5, 3)), jnp.float32), "out": jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)}
    batch = _grpo_batch(rng)
    lp = grpo.make_logprob_fn(_linear_lm)(params, batch["input_ids"], batch["attention_mask"])
    batch = dict(batch, old_logprobs=lp, ref_logprobs=lp)
    loss_fn = grpo.make_grpo_loss(_linear_lm, GRPOConfig())
    loss, metrics = loss_fn(params, batch, grpo.grpo_normalizers(batch))
    assert float(loss) == pytest.approx(-np.mean([1.0, -0.5, 0.25, -1.0]), abs=1e-6)
    assert float(metrics["kl"]) == pytest.approx(0.0, abs=1e-7)
    # token-mean weights by token counts 2, 5, 2, 1
    loss_tm, _ = grpo.make_grpo_loss(_linear_lm, GRPOConfig(loss_agg="token-mean"))(
        params, batch, grpo.grpo_normalizers(batch)
    )
    assert float(loss_tm) == pytest.approx(-(2 * 1.0 + 5 * -0.5 + 2 * 0.25 + 1 * -1.0) / 10, abs=1e-6)


def test_learner_logprobs_use_the_rollout_sampling_transform():
    """The ratio's denominator is the rollout's logprob *as sampled*; the learner must use the same transform."""
    from bat_jax.rollout import engine

    rng = np.random.default_rng(3)
    logits = jnp.asarray(rng.normal(size=(2, 5, 11)), jnp.float32)
    ids = jnp.asarray(rng.integers(0, 11, size=(2, 5)), jnp.int32)
    plain = grpo.shifted_token_logprobs(logits, ids)
    expected_plain = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), ids[:, 1:, None], axis=-1)[..., 0]
    np.testing.assert_allclose(plain[:, 1:], expected_plain, atol=1e-6)
    assert np.all(np.asarray(plain[:, 0]) == 0.0)
    tempered = grpo.shifted_token_logprobs(logits, ids, 0.7)
    expected_t = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1] / 0.7), ids[:, 1:, None], axis=-1)[..., 0]
    np.testing.assert_allclose(tempered[:, 1:], expected_t, atol=1e-5)
    cfg = grpo.GRPOConfig(sampling=SamplingConfig(temperature=0.6, top_p=0.8))
    nucleus = grpo.shifted_token_logprobs(logits, ids, *cfg.sampling.transform)
    np.testing.assert_array_equal(nucleus[:, 1:], engine.token_logprobs(logits[:, :-1], ids[:, 1:], 0.6, 0.8, 0))


def test_update_shift_hand_values():
    # row 0 (A = +1): tokens 1, 2 move +0.2 and +0.4 -> +0.3; row 1 (A = -1): one token moves -0.1;
    # row 2 (A = 0) and the prompt position (mask 0) are ignored except in the KL.
    old = np.zeros((3, 3))
    new = np.array([[9.0, 0.2, 0.4], [0.0, -0.1, 5.0], [0.0, 0.3, 0.0]])
    mask = np.array([[0, 1, 1], [0, 1, 0], [0, 1, 0]])
    out = grpo.update_shift(old, new, mask, np.array([1.0, -1.0, 0.0]))
    assert out["logp_shift_pos"] == pytest.approx(0.3) and out["logp_shift_neg"] == pytest.approx(-0.1)
    k3 = [np.exp(x) - 1 - x for x in (0.2, 0.4, -0.1, 0.3)]  # r - 1 - log r, r = exp(new - old)
    assert out["token_kl"] == pytest.approx(sum(k3) / 4)
    none = grpo.update_shift(old, new, mask, np.zeros(3))
    assert np.isnan(none["logp_shift_pos"]) and np.isnan(none["logp_shift_neg"])
    with pytest.raises(ValueError, match="update_shift"):
        grpo.update_shift(old, new, mask, np.zeros(2))
