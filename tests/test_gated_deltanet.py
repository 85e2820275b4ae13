"""Gated DeltaNet kernels: recurrent scan vs chunked form vs the transformers 5.19 torch fallbacks,
padding semantics, and the causal conv with carried state."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

from bat_jax.models.gated_deltanet import (causal_conv, chunk_gated_delta_rule, l2norm,
                                           recurrent_gated_delta_rule, unit_lower_inverse)

B, T, H, DK, DV = 2, 37, 3, 8, 5


def _inputs(seed=0, t=T):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, t, H, DK)).astype(np.float32)
    k = rng.normal(size=(B, t, H, DK)).astype(np.float32)
    v = rng.normal(size=(B, t, H, DV)).astype(np.float32)
    g = -np.exp(rng.normal(size=(B, t, H))).astype(np.float32) * 0.3
    beta = (1 / (1 + np.exp(-rng.normal(size=(B, t, H))))).astype(np.float32)
    s0 = rng.normal(size=(B, H, DK, DV)).astype(np.float32) * 0.1
    return q, k, v, g, beta, s0


def _prep(q, k):
    qn = np.asarray(l2norm(jnp.asarray(q))) * DK ** -0.5
    return qn, np.asarray(l2norm(jnp.asarray(k)))


def _naive(q, k, v, g, beta, s0):
    """Plain numpy loop of the gated delta rule (module docstring equations)."""
    s = s0.astype(np.float64).copy()
    out = np.zeros(v.shape, np.float64)
    for t in range(q.shape[1]):
        s *= np.exp(g[:, t])[..., None, None]
        mem = np.einsum("bhkv,bhk->bhv", s, k[:, t])
        s += np.einsum("bhk,bhv->bhkv", k[:, t], (v[:, t] - mem) * beta[:, t][..., None])
        out[:, t] = np.einsum("bhkv,bhk->bhv", s, q[:, t])
    return out, s


@pytest.mark.parametrize("chunk", [8, 64])
def test_recurrent_and_chunked_match_naive(chunk):
    q, k, v, g, beta, s0 = _inputs()
    qn, kn = _prep(q, k)
    ref_o, ref_s = _naive(qn, kn, v, g, beta, s0)
    args = [jnp.asarray(x) for x in (qn, kn, v, g, beta, s0)]
    o_r, s_r = recurrent_gated_delta_rule(*args)
    o_c, s_c = jax.jit(chunk_gated_delta_rule, static_argnums=6)(*args, chunk)
    for o, s in ((o_r, s_r), (o_c, s_c)):
        np.testing.assert_allclose(np.asarray(o), ref_o, atol=2e-5)
        np.testing.assert_allclose(np.asarray(s), ref_s, atol=2e-5)


def test_matches_transformers_torch_fallbacks():
    q, k, v, g, beta, s0 = _inputs(seed=1)
    tq, tk, tv, tg, tb, ts = (torch.tensor(x) for x in (q, k, v, g, beta, s0))
    ref_c, ref_cs = hf.torch_chunk_gated_delta_rule(tq, tk, tv, g=tg, beta=tb, chunk_size=16, initial_state=ts,
                                                    output_final_state=True, use_qk_l2norm_in_kernel=True)
    ref_r, ref_rs = hf.torch_recurrent_gated_delta_rule(tq, tk, tv, g=tg, beta=tb, initial_state=ts,
                                                        output_final_state=True, use_qk_l2norm_in_kernel=True)
    qn, kn = _prep(q, k)
    args = [jnp.asarray(x) for x in (qn, kn, v, g, beta, s0)]
    o_c, s_c = chunk_gated_delta_rule(*args, 16)
    o_r, s_r = recurrent_gated_delta_rule(*args)
    np.testing.assert_allclose(np.asarray(o_c), ref_c.numpy(), atol=2e-5)
    np.testing.assert_allclose(np.asarray(s_c), ref_cs.numpy(), atol=2e-5)
    np.testing.assert_allclose(np.asarray(o_r), ref_r.numpy(), atol=2e-5)
    np.testing.assert_allclose(np.asarray(s_r), ref_rs.numpy(), atol=2e-5)


def test_masked_steps_leave_state_unchanged():
    q, k, v, g, beta, s0 = _inputs(seed=2, t=6)
    qn, kn = _prep(q, k)
    g[:, 2:4] = 0.0  # what GatedDeltaNet sets at masked positions
    beta[:, 2:4] = 0.0
    keep = [0, 1, 4, 5]
    _, s_all = recurrent_gated_delta_rule(*(jnp.asarray(x) for x in (qn, kn, v, g, beta, s0)))
    _, s_keep = recurrent_gated_delta_rule(*(jnp.asarray(x[:, keep]) for x in (qn, kn, v, g, beta)),
                                           jnp.asarray(s0))
    np.testing.assert_allclose(np.asarray(s_all), np.asarray(s_keep), atol=1e-6)


def test_causal_conv_matches_torch_and_carries_state():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 9, 6)).astype(np.float32)
    w = rng.normal(size=(6, 1, 4)).astype(np.float32)
    ref = hf.causal_conv1d_fn(torch.tensor(x).transpose(1, 2), torch.tensor(w[:, 0]), None,
                              activation="silu").transpose(1, 2).numpy()
    y, state = causal_conv(jnp.asarray(x), jnp.zeros((2, 3, 6)), jnp.asarray(w))
    np.testing.assert_allclose(np.asarray(y), ref, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(state), x[:, -3:])
    # feeding the sequence in two pieces with the carried state gives the same output
    y1, s1 = causal_conv(jnp.asarray(x[:, :5]), jnp.zeros((2, 3, 6)), jnp.asarray(w))
    y2, _ = causal_conv(jnp.asarray(x[:, 5:]), s1, jnp.asarray(w))
    np.testing.assert_allclose(np.concatenate([y1, y2], axis=1), ref, atol=1e-5)


@pytest.mark.parametrize("c", [1, 5, 16, 64])
def test_unit_lower_inverse(c):
    lower = np.tril(np.random.default_rng(c).normal(size=(3, c, c)) * 0.5, -1).astype(np.float32)
    ref = np.linalg.inv(np.eye(c) + lower.astype(np.float64))
    np.testing.assert_allclose(np.asarray(unit_lower_inverse(jnp.asarray(lower))), ref, rtol=1e-4, atol=1e-4)
