"""Llama dense decoder (Flax NNX), matching transformers 5.19 ``LlamaForCausalLM``.

GQA attention without q/k norm, full RoPE (default or scaled: ``linear``, ``dynamic``, ``llama3``;
``configs.RopeScaling``), SwiGLU MLP, RMSNorm ``w * x``; tied or untied output head. Parameter paths equal the HF
keys. Interface: see ``bat_jax.models.causal_lm``."""

from __future__ import annotations

from flax import nnx

from bat_jax.models.causal_lm import CausalLM
from bat_jax.models.configs import LlamaConfig


class LlamaForCausalLM(CausalLM):
    """``LlamaForCausalLM(config: LlamaConfig, rngs=nnx.Rngs(0))``."""

    zero_centered_norm = False
    output_gate = False
    qk_norm = False

    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs):
        if not isinstance(config, LlamaConfig):
            raise TypeError(f"LlamaForCausalLM needs a LlamaConfig, got {type(config).__name__}")
        super().__init__(config, rngs=rngs)
