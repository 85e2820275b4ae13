"""The GRPO objective's options against hand-computed values and verl's formulas: the KL guards, clip-higher, dual
clip, the four loss aggregations and their row counts, the entropy bonus, and exact gradients under micro-batching
(w.r.t. logprobs and logits) for every aggregation. The issue-sized verl cases (old logprobs, Dr.GRPO's C, empty
rows, seq_mean_k1 bounds, singleton groups) are in tests/test_objective_verl.py."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bat_jax.learn import grpo, objective
from bat_jax.learn.grpo import GRPOConfig

# ------------------------------------------------------------------------------------------- KL guards


def verl_k3(logp, ref):
    """verl ``kl_penalty_forward(.., 'low_var_kl')`` in numpy float64: kl = ref − logp clamped to ±20,
    exp(kl) − kl − 1 clamped to [−10, 10]."""
    kl = np.clip(np.asarray(ref, np.float64) - np.asarray(logp, np.float64), -20, 20)
    return np.clip(np.exp(kl) - kl - 1, -10, 10)


@pytest.mark.parametrize("d, value, grad", [
    (-3.0, 10.0, 0.0),    # e^3 - 4 = 16.09 unclamped (gradient 1 - e^3 = -19.1): clamped to 10, no gradient
    (-4.0, 10.0, 0.0),    # e^4 - 5 = 49.6
    (-20.0, 10.0, 0.0),   # e^20 - 21 = 4.85e8
    (-2.0, math.exp(2) - 3, 1 - math.exp(2)),  # 4.389 < 10: untouched, gradient 1 - e^2
    (0.5, math.exp(-0.5) - 0.5, 1 - math.exp(-0.5)),
    (12.0, 10.0, 0.0),    # e^-12 + 11 = 11.000006
    (30.0, 10.0, 0.0),    # log ratio clamped to 20 first: 19.000000002, then 10
])
def test_k3_value_is_clamped_to_ten_as_verl_does(d, value, grad):
    f = lambda lp: objective.kl_penalty(lp, jnp.float32(0.0), "k3")  # noqa: E731
    assert float(f(jnp.float32(d))) == pytest.approx(value, rel=1e-6)
    assert float(f(jnp.float32(d))) == pytest.approx(float(verl_k3(d, 0.0)), rel=1e-6)
    assert float(jax.grad(f)(jnp.float32(d))) == pytest.approx(grad, rel=1e-5, abs=1e-7)


def test_k3_matches_verl_on_random_and_extreme_log_ratios():
    rng = np.random.default_rng(0)
    logp = rng.normal(-2.0, 3.0, size=(16, 64)).astype(np.float32)
    ref = rng.normal(-2.0, 3.0, size=(16, 64)).astype(np.float32)
    ref[0, :8] = logp[0, :8] + np.array([-40, -20, -10.5, -3, 3, 10.5, 20, 40], np.float32)
    got = np.asarray(objective.kl_penalty(jnp.asarray(logp), jnp.asarray(ref), "k3"))
    np.testing.assert_allclose(got, verl_k3(logp, ref), rtol=2e-6, atol=1e-6)
    assert got.max() == 10.0 and (got == 10.0).sum() > 8


def test_every_kl_estimator_is_guarded_and_none_gives_verl_k1_k2():
    d = jnp.array([-20.0, -4.0, -1.0, 3.0, 11.0])
    k1 = lambda x: objective.kl_penalty(x, jnp.zeros(5), "k1")  # noqa: E731
    k2 = lambda x: objective.kl_penalty(x, jnp.zeros(5), "k2")  # noqa: E731
    np.testing.assert_allclose(k1(d), [-10.0, -4.0, -1.0, 3.0, 10.0])
    np.testing.assert_allclose(k2(d), [10.0, 8.0, 0.5, 4.5, 10.0])  # 1/2 d^2 = 200, 8, .5, 4.5, 60.5
    np.testing.assert_allclose(jax.grad(lambda x: k1(x).sum())(d), [0, 1, 1, 1, 0])
    np.testing.assert_allclose(jax.grad(lambda x: k2(x).sum())(d), [0, -4, -1, 3, 0])
    # verl leaves k1 / k2 unclamped: value_clamp=None reproduces it
    np.testing.assert_allclose(objective.kl_penalty(d, jnp.zeros(5), "k2", value_clamp=None), [200, 8, .5, 4.5, 60.5])
    np.testing.assert_allclose(objective.kl_penalty(d, jnp.zeros(5), "k1", value_clamp=None), d)
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        objective.kl_penalty(d, d, "k4")


def test_clamp_has_torch_gradient_bounds_included():
    g = jax.vmap(jax.grad(lambda x: objective.clamp(x, -1.0, 2.0)))(jnp.array([-1.5, -1.0, 0.0, 2.0, 2.5]))
    assert g.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]


def test_default_config_clamps_one_outlier_token_out_of_the_loss_gradient():
    # two loss tokens: d = -0.1 and the outlier d = -20 (k3 4.85e8 without the value clamp)
    batch = {"loss_mask": jnp.array([[0, 1, 1]]), "old_logprobs": jnp.array([[0.0, -1.0, -1.0]]),
             "ref_logprobs": jnp.array([[0.0, -0.9, 19.0]]), "advantages": jnp.array([0.0])}
    lp = jnp.array([[0.0, -1.0, -1.0]])
    cfg = GRPOConfig(kl_coef=1.0)

    def loss(lp):
        t = grpo.grpo_token_terms(lp, batch, cfg)
        return objective.aggregate_loss(t["total"], t["mask"], cfg.loss_agg,
                                        objective.loss_normalizers(batch["loss_mask"]))

    k = math.exp(0.1) - 1 - 0.1
    assert float(loss(lp)) == pytest.approx((k + 10.0) / 2, rel=1e-5)
    g = jax.grad(loss)(lp)
    assert float(g[0, 2]) == 0.0 and float(g[0, 1]) == pytest.approx((1 - math.exp(0.1)) / 2, rel=1e-5)


# ------------------------------------------------------------------------------------------- clip


def verl_vanilla(logp, old, adv, eps_low, eps_high, c):
    """verl ``compute_policy_loss_vanilla``'s per-token loss matrix in numpy float64 (dual clip at c)."""
    neg_kl = np.clip(logp - old, -20, 20)
    ratio = np.exp(neg_kl)
    a = adv[:, None]
    l1 = np.maximum(-a * ratio, -a * np.clip(ratio, 1 - eps_low, 1 + eps_high))
    return np.where(a < 0, np.minimum(-a * c, l1), l1)


def test_clip_higher_hand_values_and_gradients():
    lp = jnp.log(jnp.array([[0.7, 0.9, 1.25, 1.35], [0.7, 0.9, 1.25, 1.35]]))
    adv = jnp.array([1.0, -1.0])
    f = lambda lp, hi: objective.clipped_policy_loss(lp, jnp.zeros((2, 4)), adv, eps_low=0.2, eps_high=hi,  # noqa
                                                     dual_clip=None)
    loss, clipped = f(lp, 0.28)
    # A>0: max(-w, -clip(w, .8, 1.28)); A<0: max(w, clip(w, .8, 1.28))
    np.testing.assert_allclose(loss, [[-0.7, -0.9, -1.25, -1.28], [0.8, 0.9, 1.25, 1.35]], rtol=1e-6)
    assert clipped.tolist() == [[0, 0, 0, 1], [1, 0, 0, 0]]
    sym, _ = f(lp, 0.2)  # symmetric 0.2 clips 1.25 too
    np.testing.assert_allclose(sym[0], [-0.7, -0.9, -1.2, -1.2], rtol=1e-6)
    # d loss / d logp = -w A where unclipped, 0 where clipped
    g = jax.grad(lambda x: f(x, 0.28)[0].sum())(lp)
    np.testing.assert_allclose(g, [[-0.7, -0.9, -1.25, 0.0], [0.0, 0.9, 1.25, 1.35]], rtol=1e-5)
    cfg = GRPOConfig(clip_eps_high=0.28)
    assert (cfg.eps_low, cfg.eps_high) == (0.2, 0.28)
    assert (GRPOConfig().eps_low, GRPOConfig().eps_high) == (0.2, 0.2)


def test_policy_loss_matches_verl_vanilla_with_dual_clip_on_extreme_ratios():
    rng = np.random.default_rng(1)
    logp = rng.normal(-1.5, 1.0, size=(8, 32)).astype(np.float32)
    old = (logp + rng.normal(0.0, 0.5, size=(8, 32))).astype(np.float32)
    old[:, :6] = logp[:, :6] - np.array([-30, -5, -1.2, 1.2, 5, 30], np.float32)  # extreme ratios
    adv = rng.normal(size=8).astype(np.float32)
    for lo, hi in ((0.2, 0.2), (0.2, 0.28)):
        got, _ = objective.clipped_policy_loss(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), eps_low=lo,
                                               eps_high=hi, dual_clip=3.0)
        np.testing.assert_allclose(got, verl_vanilla(logp, old, adv, lo, hi, 3.0), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------- aggregation


def _agg_case():
    # row 0: 2 loss tokens [1, 3]; row 1: 4 loss tokens [1, 1, 1, 1]; row 2: none; T = 6
    mask = np.zeros((3, 6), np.float32)
    mask[0, 1:3] = 1
    mask[1, 1:5] = 1
    values = np.full((3, 6), 7.0, np.float32)
    values[0, 1:3] = [1.0, 3.0]
    values[1, 1:5] = 1.0
    return jnp.asarray(values), jnp.asarray(mask)


@pytest.mark.parametrize("mode, scale, rows, expected", [
    ("token-mean", None, "all", 8 / 6),               # (1 + 3 + 4) / 6 tokens
    ("seq-mean-token-mean", None, "all", 1.0),         # (2 + 1 + 0) / 3 rollouts, the empty one included
    ("seq-mean-token-mean", None, "nonempty", 1.5),    # (2 + 1) / 2 rollouts with loss tokens
    ("seq-mean-token-sum", None, "all", 8 / 3),        # (4 + 4 + 0) / 3
    ("seq-mean-token-sum", None, "nonempty", 4.0),     # (4 + 4) / 2
    ("seq-mean-token-sum-norm", 4.0, "all", 8 / 12),   # (4 + 4) / (3 rollouts x C = 4)
    ("seq-mean-token-sum-norm", 4.0, "nonempty", 1.0),  # (4 + 4) / (2 x 4)
])
def test_aggregations_hand_values_and_micro_batch_sums(mode, scale, rows, expected):
    values, mask = _agg_case()
    norms = objective.loss_normalizers(mask, jnp.ones_like(mask))
    whole = objective.aggregate_loss(values, mask, mode, norms, scale, rows)
    assert float(whole) == pytest.approx(expected, rel=1e-6)
    parts = sum(objective.aggregate_loss(values[i:i + 1], mask[i:i + 1], mode, norms, scale, rows) for i in range(3))
    assert float(parts) == pytest.approx(expected, rel=1e-6)


def test_rows_count_every_rollout_but_not_device_padding():
    """``num_rows`` counts rows holding a sequence (attention on), loss tokens or not; a row added to pad the batch
    to a device multiple (attention off) is no rollout. Dr.GRPO needs its constant C."""
    values, mask = _agg_case()
    attention = jnp.ones_like(mask).at[2].set(0.0)  # row 2: device padding
    norms = objective.loss_normalizers(mask, attention)
    assert (float(norms["num_rows"]), float(norms["num_seqs"]), float(norms["num_tokens"])) == (2.0, 2.0, 6.0)
    assert float(objective.loss_normalizers(mask)["num_rows"]) == 3.0  # no attention mask: every row
    with pytest.raises(ValueError, match="loss_scale_factor"):
        objective.aggregate_loss(values, mask, "seq-mean-token-sum-norm", norms)
    with pytest.raises(ValueError, match="seq_mean_rows"):
        objective.aggregate_loss(values, mask, "seq-mean-token-mean", norms, None, "scored")


def test_aggregations_equal_verl_agg_loss():
    """verl ``agg_loss`` (June 2026 head; one batch, dp 1, ``global_batch_size`` = the rows, C given): every mode
    equals the default ``seq_mean_rows='all'``; verl's fallback without ``global_batch_size`` (rows with loss tokens)
    is ``'nonempty'``."""
    values, mask = _agg_case()
    v, m = np.asarray(values, np.float64), np.asarray(mask, np.float64)
    seq_sum, seq_n = (v * m).sum(1), m.sum(1)
    nonempty = (seq_n > 0).astype(np.float64)
    for denominator, rows in ((3.0, "all"), (nonempty.sum(), "nonempty")):
        verl = {"token-mean": (v * m).sum() / m.sum(),
                "seq-mean-token-mean": (seq_sum / (seq_n + 1e-8) * nonempty).sum() / denominator,
                "seq-mean-token-sum": (seq_sum * nonempty).sum() / denominator,
                "seq-mean-token-sum-norm": (seq_sum * nonempty).sum() / denominator / 4.0}
        norms = objective.loss_normalizers(mask, jnp.ones_like(mask))
        for mode, ref in verl.items():
            got = float(objective.aggregate_loss(values, mask, mode, norms, 4.0, rows))
            assert got == pytest.approx(ref, rel=1e-6), (mode, rows)


# ------------------------------------------------------------------------------------------- entropy


def test_entropy_hand_values_under_the_sampling_transform():
    logits = jnp.log(jnp.array([[[0.5, 0.25, 0.25]]]))
    ids = jnp.array([[0, 0]])
    two = jnp.concatenate([logits, logits], axis=1)  # [1, 2, 3]: position 0 predicts id 1
    _, ent = grpo.shifted_token_logprobs_and_entropy(two, ids)
    assert float(ent[0, 0]) == 0.0 and float(ent[0, 1]) == pytest.approx(1.5 * math.log(2), rel=1e-6)
    # T = 0.5: p ∝ p^2 = (2/3, 1/6, 1/6)
    _, ent_t = grpo.shifted_token_logprobs_and_entropy(two, ids, 0.5)
    h = -(2 / 3 * math.log(2 / 3) + 2 / 6 * math.log(1 / 6))
    assert float(ent_t[0, 1]) == pytest.approx(h, rel=1e-5)
    # top-k 1: one token left, entropy 0; top-p 0.6 over (.5, .3, .2) keeps (.625, .375)
    assert float(grpo.shifted_token_logprobs_and_entropy(two, ids, 1.0, 1.0, 1)[1][0, 1]) == 0.0
    nuc = jnp.log(jnp.array([[[0.5, 0.3, 0.2]] * 2]))
    h_p = -(0.625 * math.log(0.625) + 0.375 * math.log(0.375))
    assert float(grpo.shifted_token_logprobs_and_entropy(nuc, ids, 1.0, 0.6)[1][0, 1]) == pytest.approx(h_p, rel=1e-5)


def test_entropy_gradient_is_minus_p_times_logp_plus_h():
    z = jnp.array([0.3, -1.2, 2.0, 0.0])
    g = jax.grad(lambda z: objective.entropy_from_logprobs(jax.nn.log_softmax(z)))(z)
    p = np.exp(np.asarray(jax.nn.log_softmax(z), np.float64))
    h = -(p * np.log(p)).sum()
    np.testing.assert_allclose(g, -p * (np.log(p) + h), rtol=1e-5, atol=1e-7)


def test_entropy_bonus_enters_the_loss_with_its_coefficient():
    batch = {"loss_mask": jnp.array([[0, 1, 1]]), "old_logprobs": jnp.zeros((1, 3)),
             "ref_logprobs": jnp.zeros((1, 3)), "advantages": jnp.array([0.5])}
    lp, ent = jnp.zeros((1, 3)), jnp.array([[9.0, 1.0, 2.0]])
    t = grpo.grpo_token_terms(lp, batch, GRPOConfig(entropy_coef=0.01), ent)
    # ratio 1, KL 0: total = -A - 0.01 H per token; position 0 carries nothing
    np.testing.assert_allclose(t["total"], [[0.0, -0.5 - 0.01, -0.5 - 0.02]], rtol=1e-6)
    with pytest.raises(ValueError, match="entropy_coef"):
        grpo.grpo_token_terms(lp, batch, GRPOConfig(entropy_coef=0.01))


# ------------------------------------------------------------------------------------------- micro-batching


def _batch(rng, b=4, t=7, v=6):
    lm = np.zeros((b, t), np.int32)
    lm[0, 2:4] = 1
    lm[1, 1:7] = 1
    lm[2, 3:6] = 1
    lm[3, 1:2] = 1
    return {
        "input_ids": jnp.asarray(rng.integers(0, v, size=(b, t)), jnp.int32),
        "attention_mask": jnp.ones((b, t), jnp.int32),
        "loss_mask": jnp.asarray(lm),
        "old_logprobs": jnp.asarray(rng.normal(-1.8, 0.6, size=(b, t)), jnp.float32),
        "ref_logprobs": jnp.asarray(rng.normal(-1.8, 2.0, size=(b, t)), jnp.float32),  # some k3 tokens clamp
        "advantages": jnp.asarray([1.0, -0.5, 0.25, -1.0], jnp.float32),
    }


OPTIONS = dict(kl_coef=0.1, clip_eps_high=0.28, dual_clip=3.0, entropy_coef=0.05)


@pytest.mark.parametrize("mode", objective.LOSS_AGGREGATIONS)
def test_gradients_wrt_logprobs_and_logits_are_exact_under_micro_batching(mode):
    rng = np.random.default_rng(2)
    batch = _batch(rng)
    logits = jnp.asarray(rng.normal(size=(4, 7, 6)), jnp.float32)
    cfg = GRPOConfig(loss_agg=mode, loss_scale_factor=5.0 if mode.endswith("norm") else None, **OPTIONS)
    norms = grpo.grpo_normalizers(batch)

    def loss_from_logits(logits, rows):
        sub = {k: v[rows] for k, v in batch.items()}
        lp, ent = grpo.shifted_token_logprobs_and_entropy(logits, sub["input_ids"])
        t = grpo.grpo_token_terms(lp, sub, cfg, ent)
        return objective.aggregate_loss(t["total"], t["mask"], mode, norms, cfg.loss_scale_factor, cfg.seq_mean_rows)

    def loss_from_logprobs(lp, rows):
        sub = {k: v[rows] for k, v in batch.items()}
        t = grpo.grpo_token_terms(lp, sub, cfg, jnp.ones_like(lp))
        return objective.aggregate_loss(t["total"], t["mask"], mode, norms, cfg.loss_scale_factor, cfg.seq_mean_rows)

    every = np.arange(4)
    splits = [np.array([0, 2]), np.array([1, 3])]  # the train step's interleaved micro-batches of 2
    lp = jnp.asarray(rng.normal(-1.8, 0.6, size=(4, 7)), jnp.float32)
    for fn, x in ((loss_from_logits, logits), (loss_from_logprobs, lp)):
        whole, g_whole = jax.value_and_grad(fn)(x, every)
        parts, g_parts = 0.0, jnp.zeros_like(x)
        for rows in splits:
            v, g = jax.value_and_grad(lambda y: fn(y[rows], rows))(x)  # noqa: B023
            parts, g_parts = parts + v, g_parts + g
        assert float(parts) == pytest.approx(float(whole), rel=1e-6)
        assert float(jnp.abs(g_whole).max()) > 0
        np.testing.assert_allclose(g_parts, g_whole, rtol=1e-5, atol=1e-7)


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="loss_agg"):
        GRPOConfig(loss_agg="seq-sum")
    with pytest.raises(ValueError, match="clip_eps_high"):
        GRPOConfig(clip_eps_high=0.0)
    with pytest.raises(ValueError, match="clip_eps_low"):
        GRPOConfig(clip_eps_low=1.0)
    with pytest.raises(ValueError, match="kl_value_clamp"):
        GRPOConfig(kl_value_clamp=-1.0)
    with pytest.raises(ValueError, match="loss_scale_factor"):
        GRPOConfig(loss_scale_factor=0.0)
    with pytest.raises(ValueError, match="dual_clip"):
        GRPOConfig(dual_clip=1.0)
