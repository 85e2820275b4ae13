"""Decode state (bat_jax/models/cache.py): the cache of the tiny Qwen3.5 has the documented layout and shapes, holds
no token when empty, and passes through `jax.jit` as a pytree."""

import jax
import jax.numpy as jnp
import numpy as np

from bat_jax.models.cache import AttentionCache, DecodeCache, DeltaNetCache, empty_cache
from doubles import tiny_model


def test_the_tiny_hybrid_models_cache_has_the_documented_shapes():
    # tiny_model('qwen3_5') (tests/doubles): layers [DeltaNet, attention], 2 KV heads of 16, DeltaNet 2 key heads and 4
    # value heads of 16, conv kernel 4: conv_dim = 2 · (2 · 16) + 4 · 16 = 128
    cache = tiny_model("qwen3_5").init_cache(3, 10)
    delta, attention = cache.layers
    assert isinstance(delta, DeltaNetCache) and isinstance(attention, AttentionCache)
    assert delta.conv.shape == (3, 3, 128) and delta.state.shape == (3, 4, 16, 16) and delta.state.dtype == jnp.float32
    assert attention.k.shape == attention.v.shape == (3, 2, 10, 16)
    assert cache.max_len == 10 and int(cache.length) == 0
    assert not np.asarray(cache.slot_mask).any() and np.asarray(cache.next_position).tolist() == [0, 0, 0]


def test_an_empty_cache_is_a_pytree_that_jit_passes_through():
    layer = AttentionCache(jnp.ones((2, 1, 4, 8)), jnp.zeros((2, 1, 4, 8)))
    cache = empty_cache((layer,), batch=2, max_len=4)
    out = jax.jit(lambda c: c.replace(length=c.length + 1))(cache)
    assert isinstance(out, DecodeCache) and int(out.length) == 1 and out.max_len == 4
    assert len(jax.tree_util.tree_leaves(cache)) == 5  # k, v, length, slot_mask, next_position
    np.testing.assert_array_equal(np.asarray(out.layers[0].k), np.ones((2, 1, 4, 8)))
