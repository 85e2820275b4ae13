"""Shared model blocks (bat_jax/models/layers.py) on hand-computed values: RMSNorm in both forms, RoPE frequencies
(default, linear, dynamic) and rotation, causal masks and grouped-query attention. (Blockwise attention against the
dense form is in tests/test_memory_parity.py; whole models against transformers in the model tests.)"""

import math

import jax.numpy as jnp
import numpy as np
from flax import nnx

from bat_jax.models.configs import RopeScaling
from bat_jax.models.layers import (RMSNorm, apply_rotary, attend, attend_one, causal_valid, rope_inv_freq,
                                   rotary_tables)


def test_rms_norm_plain_and_zero_centred():
    x = jnp.asarray([[3.0, 4.0]])  # rms = sqrt((9 + 16) / 2) = 3.5355
    plain = RMSNorm(2, eps=0.0, zero_centered=False, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(np.asarray(plain(x)), [[3 / math.sqrt(12.5), 4 / math.sqrt(12.5)]], rtol=1e-6)
    centred = RMSNorm(2, eps=0.0, zero_centered=True, rngs=nnx.Rngs(0))
    centred.weight[...] = jnp.asarray([1.0, -0.5])  # scales (1 + w) = (2, 0.5)
    np.testing.assert_allclose(np.asarray(centred(x)), [[6 / math.sqrt(12.5), 2 / math.sqrt(12.5)]], rtol=1e-6)


def test_rope_frequencies():
    # default: 1 / theta ** (2i / d); d = 4, theta = 100: (1, 0.1)
    np.testing.assert_allclose(np.asarray(rope_inv_freq(4, 100.0)), [1.0, 0.1], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(rope_inv_freq(4, 100.0, RopeScaling("linear", 2.0))), [0.5, 0.05], rtol=1e-6)
    dynamic = RopeScaling("dynamic", 2.0)
    np.testing.assert_allclose(np.asarray(rope_inv_freq(4, 100.0, dynamic, 8, seq_len=8)), [1.0, 0.1], rtol=1e-6)
    # past max_pos: base 100 · (2 · 16 / 8 − 1) ** (4 / 2) = 900 → (1, 1 / 30)
    np.testing.assert_allclose(np.asarray(rope_inv_freq(4, 100.0, dynamic, 8, seq_len=16)), [1.0, 1 / 30], rtol=1e-5)


def test_rotation_by_position():
    # position 1, frequency 1 on channel pair (0, 1) of a 2-channel head: (x0, x1) → (x0 cos 1 − x1 sin 1, x1 cos 1
    # + x0 sin 1); the channels past rotary_dim are untouched
    cos, sin = rotary_tables(jnp.asarray([[1]]), 2, 100.0, jnp.float32)
    x = jnp.asarray([[[[1.0, 0.0, 7.0]]]])  # [batch, seq, heads, head_dim]
    np.testing.assert_allclose(np.asarray(apply_rotary(x, cos, sin))[0, 0, 0], [math.cos(1), math.sin(1), 7.0],
                               rtol=1e-6)


def test_causal_masks_and_grouped_query_attention():
    valid = causal_valid(jnp.asarray([[False, True, True]]), 1, 2)  # queries at slots 1 and 2, slot 0 padding
    assert np.asarray(valid).tolist() == [[[False, True, False], [False, True, True]]]
    # one KV head shared by two query heads; zero scores give the mean of the visible values
    q = jnp.zeros((1, 2, 2, 1))
    k = jnp.zeros((1, 3, 1, 1))
    v = jnp.asarray([[[[10.0]], [[2.0]], [[4.0]]]])
    out = np.asarray(attend(q, k, v, valid))
    np.testing.assert_allclose(out[0, :, :, 0], [[2.0, 2.0], [3.0, 3.0]])
    one = attend_one(q[:, 1:], jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2), jnp.asarray([[False, True, True]]), 2)
    np.testing.assert_allclose(np.asarray(one)[0, 0, :, 0], [3.0, 3.0])  # the cache layout gives the same

