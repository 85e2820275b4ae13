"""Decode state of the Qwen3 / Qwen3.5 decoders (a jax pytree, safe to pass through ``jax.jit``).

Layout (``b`` = batch, ``L`` = max_len slots, one slot per token fed, padding included):

Details: docs/design.md.
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
