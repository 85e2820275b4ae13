"""Qwen3 dense decoder (Flax NNX), matching transformers 5.19 ``Qwen3ForCausalLM``.

GQA attention with per-head q/k RMSNorm (``w * x``), full RoPE, SwiGLU MLP; tied or untied output head.
Interface: see ``bat_jax.models.causal_lm``."""

from __future__ import annotations

from flax import nnx

from bat_jax.models.causal_lm import CausalLM
from bat_jax.models.configs import Qwen3Config


class Qwen3ForCausalLM(CausalLM):
    """``Qwen3ForCausalLM(config: Qwen3Config, rngs=nnx.Rngs(0))``."""

    zero_centered_norm = False
    output_gate = False

    def __init__(self, config: Qwen3Config, *, rngs: nnx.Rngs):
        if not isinstance(config, Qwen3Config):
            raise TypeError(f"Qwen3ForCausalLM needs a Qwen3Config, got {type(config).__name__}")
        super().__init__(config, rngs=rngs)
