"""Qwen3.5 hybrid text decoder (Flax NNX), matching transformers 5.19 ``Qwen3_5ForCausalLM``.

Details: docs/design.md."""

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
