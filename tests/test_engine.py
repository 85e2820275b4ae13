"""The one definition of "logprob as sampled" (bat_jax/rollout/engine.py): processed logprobs against a plain numpy
restatement and hand-computed values, traced and static parameters alike, finite gradients, sampling parameters
checked."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bat_jax.rollout.engine import MASKED_LOGPROB, SamplingParams, processed_logprobs, token_logprobs


def _reference_logprobs(z, temperature, top_p, top_k):
    """Plain numpy restatement of engine.py's module docstring, for one logits row."""
    z = np.asarray(z, np.float64) / temperature
    order = np.argsort(-z, kind="stable")
    keep = np.zeros(z.shape, bool)
    cand = order[:top_k] if top_k else order
    p = np.exp(z[cand] - z[cand].max())
    p /= p.sum()
    mass = 0.0
    for idx, pi in zip(cand, p):
        if mass >= top_p:
            break
        keep[idx] = True
        mass += pi
    out = np.full(z.shape, -np.inf)
    out[keep] = z[keep] - np.log(np.exp(z[keep]).sum())
    return out


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, 0), (0.6, 0.8, 0), (1.0, 0.8, 0),
                                                     (0.7, 1.0, 3), (0.5, 0.9, 4)])
def test_processed_logprobs_match_reference(temperature, top_p, top_k):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 11)).astype(np.float32) * 2
    got = np.asarray(processed_logprobs(jnp.asarray(logits), temperature, top_p, top_k))
    for row, g in zip(logits, got):
        ref = _reference_logprobs(row, temperature, top_p, top_k)
        np.testing.assert_array_equal(np.isfinite(ref), g > MASKED_LOGPROB / 2)
        np.testing.assert_allclose(g[np.isfinite(ref)], ref[np.isfinite(ref)], atol=1e-5)


def test_traced_parameters_give_the_static_result():
    """The sampler traces temperature/top-p/top-k; the learner passes Python numbers: same numbers out."""
    logits = jnp.asarray(np.random.default_rng(2).normal(size=(2, 64)) * 3, jnp.float32)
    traced = jax.jit(processed_logprobs)
    for t, p, k in [(0.6, 0.8, 0), (0.7, 1.0, 0), (1.0, 1.0, 5), (0.0, 1.0, 0), (0.5, 0.9, 7)]:
        got = traced(logits, jnp.float32(t), jnp.float32(p), jnp.int32(k))
        np.testing.assert_allclose(np.asarray(got), np.asarray(processed_logprobs(logits, t, p, k)), atol=1e-6)


def test_token_logprobs_hand_computed():
    # softmax([3, 2, 1, 0, -1]) = [.6364, .2341, .0861, .0317, .0117]; top_p 0.8 keeps tokens 0 and 1 (mass
    # before token 1 is .636 < .8, before token 2 it is .870 >= .8); renormalised p(1) = .2341 / .8705.
    logits = jnp.asarray([[3.0, 2.0, 1.0, 0.0, -1.0]])
    lp = token_logprobs(logits, jnp.asarray([1]), 1.0, 0.8, 0)
    assert float(lp[0]) == pytest.approx(np.log(0.2341 / 0.8705), abs=1e-3)
    # top_k 3 at T = 0.5: logits / T = [6, 4, 2]; p(2) = e^2 / (e^6 + e^4 + e^2).
    lp = token_logprobs(logits, jnp.asarray([2]), 0.5, 1.0, 3)
    assert float(lp[0]) == pytest.approx(2 - np.log(np.exp(6) + np.exp(4) + np.exp(2)), abs=1e-5)
    assert float(token_logprobs(logits, jnp.asarray([3]), 0.5, 1.0, 3)[0]) == pytest.approx(MASKED_LOGPROB)
    # greedy: the argmax has logprob 0
    assert float(token_logprobs(logits, jnp.asarray([0]), 0.0)[0]) == 0.0


def test_token_logprobs_gradient_is_finite():
    logits = jnp.asarray(np.random.default_rng(1).normal(size=(4, 32)), jnp.float32)
    ids = jnp.asarray([0, 5, 9, 31])
    grad = jax.grad(lambda z: token_logprobs(z, ids, 0.6, 0.8, 0).sum())(logits)
    assert np.all(np.isfinite(np.asarray(grad)))


def test_sampling_params_validation():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
