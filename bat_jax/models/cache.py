"""Decode state of the Qwen3 / Qwen3.5 decoders (a jax pytree, safe to pass through ``jax.jit``).

Layout (``b`` = batch, ``L`` = max_len slots, one slot per token fed, padding included):

* ``AttentionCache`` (full-attention layers): ``k``, ``v`` ``[b, kv_heads, L, head_dim]`` in the
  cache dtype; slot ``i`` holds the i-th token fed to the model (post-RoPE keys).
* ``DeltaNetCache`` (Gated DeltaNet layers): ``conv [b, kernel-1, conv_dim]`` (the last kernel-1
  inputs of the causal depthwise conv, zeros for padding/empty history) and ``state
  [b, value_heads, key_head_dim, value_head_dim]`` float32 (the delta-rule memory).
* ``DecodeCache``: ``layers`` (one entry per decoder layer), ``length`` int32 scalar (slots used,
  equal for all rows), ``slot_mask [b, L]`` bool (which used slots are real tokens), and
  ``next_position [b]`` int32 (RoPE position of each row's next real token).

Writing past ``L`` is not detected inside jit (``dynamic_update_slice`` clamps): callers size
``max_len`` >= prompt length + new tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class AttentionCache:
    k: jax.Array
    v: jax.Array


@struct.dataclass
class DeltaNetCache:
    conv: jax.Array
    state: jax.Array


@struct.dataclass
class DecodeCache:
    layers: tuple
    length: jax.Array
    slot_mask: jax.Array
    next_position: jax.Array

    @property
    def max_len(self) -> int:
        return self.slot_mask.shape[1]


def empty_cache(layers: tuple, batch: int, max_len: int) -> DecodeCache:
    """A cache with no tokens written, holding the given per-layer entries."""
    return DecodeCache(layers=tuple(layers), length=jnp.zeros((), jnp.int32),
                       slot_mask=jnp.zeros((batch, max_len), bool),
                       next_position=jnp.zeros((batch,), jnp.int32))
