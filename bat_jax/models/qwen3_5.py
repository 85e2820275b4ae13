"""Qwen3.5 hybrid text decoder (Flax NNX), matching transformers 5.19 ``Qwen3_5ForCausalLM``.

Gated DeltaNet layers (``gated_deltanet.py``) interleaved with gated full-attention layers (every
``full_attention_interval``-th layer by default): q_proj carries a per-head sigmoid output gate,
zero-centred ``(1 + w)`` RMSNorms everywhere except the DeltaNet output norm, partial RoPE on
``partial_rotary_factor`` (0.25) of each head. Text only (vision tower and MTP head are not built).
Interface: see ``bat_jax.models.causal_lm``."""

from __future__ import annotations

from flax import nnx

from bat_jax.models.causal_lm import CausalLM
from bat_jax.models.configs import Qwen3_5Config


class Qwen3_5ForCausalLM(CausalLM):
    """``Qwen3_5ForCausalLM(config: Qwen3_5Config, rngs=nnx.Rngs(0))``."""

    zero_centered_norm = True
    output_gate = True

    def __init__(self, config: Qwen3_5Config, *, rngs: nnx.Rngs):
        if not isinstance(config, Qwen3_5Config):
            raise TypeError(f"Qwen3_5ForCausalLM needs a Qwen3_5Config, got {type(config).__name__}")
        super().__init__(config, rngs=rngs)
