"""Tiny random models for the sampler, cache, export and vLLM tests."""

import dataclasses
import functools

# --- tiny models (test_jax_sampler, test_continuous_batching, test_prefix_cache, test_mesh_sampler, ...) -------

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16)


def tiny_model(family: str, seed: int = 0):
    """A random tiny Qwen3 (dense) or Qwen3.5 (layers: Gated DeltaNet, attention) model."""
    from flax import nnx

    from bat_jax.models.configs import Qwen3_5Config, Qwen3Config
    from bat_jax.models.qwen3 import Qwen3ForCausalLM
    from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM

    if family == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(**TINY), rngs=nnx.Rngs(seed))
    cfg = Qwen3_5Config(**TINY, full_attention_interval=2, linear_key_head_dim=16, linear_value_head_dim=16,
                        linear_num_key_heads=2, linear_num_value_heads=4)  # layers: [DeltaNet, attention]
    return Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(seed))


# Compiles are the cost of these tests: every sampler here pads batches to >= 2 rows, prompts to 4 or 8
# tokens and completions to 8, so each model family compiles two sampling programs.
SAMPLER_KW = dict(min_prompt_bucket=4, min_batch_bucket=2)


#: The vLLM engine tests' tiny Qwen3 (hidden 128, 2 layers, 2 heads of dim 64, vocab 512).
VLLM_TINY = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=64, max_position_embeddings=1024)


def vllm_reference_model(seed: int, tied: bool = True, vocab_size: int | None = None):
    """Random tiny Qwen3; the output head is scaled x10 so next-token distributions are peaked (logit std ~2-3)
    and temperature / top-p visibly change the logprobs. With a tied head the scaled embedding would dominate the
    residual stream (every model would just repeat its input token), so the attention outputs are scaled x100."""
    from flax import nnx

    from bat_jax.models.configs import Qwen3Config
    from bat_jax.models.qwen3 import Qwen3ForCausalLM

    config = Qwen3Config(**VLLM_TINY, tie_word_embeddings=tied)
    model = Qwen3ForCausalLM(dataclasses.replace(config, vocab_size=vocab_size or config.vocab_size),
                             rngs=nnx.Rngs(seed))
    head = model.model.embed_tokens.weight if tied else model.lm_head.weight
    head.set_value(head.get_value() * 10.0)
    if tied:
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.set_value(layer.self_attn.o_proj.weight.get_value() * 100.0)
    return model


# --- reference logprobs of the vLLM reference model, and its LoRA adapter (test_vllm_engine, test_vllm_replicas) ---

#: Left-padded length of `reference_logits`'s batch (one compile).
REFERENCE_PAD_LEN = 64


def lora_reference_models():
    """(the untied vLLM reference model with a rank-4 adapter on q/v/o/gate/down, random A and B; the same model
    without it): the LoRA engine tests' policy and its base."""
    from bat_jax.models import lora

    model, base = vllm_reference_model(1, tied=False), vllm_reference_model(1, tied=False)
    lora.add_lora(model, lora.LoRAConfig(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "o_proj",
                                                                           "gate_proj", "down_proj")), seed=0)
    set_random_adapter(model, 1)
    return model, base


def set_random_adapter(model, seed: int, scale: float = 0.5) -> None:
    """Random non-zero A and B in every adapted projection of `model` (B = 0 at init would leave the base)."""
    import jax.numpy as jnp
    import numpy as np

    from bat_jax.models import lora

    rng = np.random.default_rng(seed)
    for _, m in lora.adapted_linears(model):
        m.lora_a[...] = jnp.asarray(rng.normal(size=m.lora_a.shape) / np.sqrt(m.lora_a.shape[1]), jnp.float32)
        m.lora_b[...] = jnp.asarray(scale * rng.normal(size=m.lora_b.shape), jnp.float32)


@functools.cache
def _forward():
    from flax import nnx

    return nnx.jit(lambda model, ids, mask: model(ids, mask))


def reference_logits(model, prompts, completions) -> list:
    """Logits `[len(completion), vocab]` under `model` that predicted each completion token, per row."""
    import jax.numpy as jnp
    import numpy as np

    n = len(prompts)
    ids, mask = np.zeros((n, REFERENCE_PAD_LEN), np.int32), np.zeros((n, REFERENCE_PAD_LEN), np.int32)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        seq = list(p) + list(c)
        ids[i, REFERENCE_PAD_LEN - len(seq):], mask[i, REFERENCE_PAD_LEN - len(seq):] = seq, 1
    logits = np.asarray(_forward()(model, jnp.asarray(ids), jnp.asarray(mask)))
    return [logits[i, REFERENCE_PAD_LEN - len(c) - 1:REFERENCE_PAD_LEN - 1] for i, c in enumerate(completions)]


def reference_logprobs(model, prompts, completions, temperature: float = 1.0, top_p: float = 1.0) -> list:
    """Logprobs of each completion token under `model` (its adapter included) after the rollout transform
    (`engine.token_logprobs` at `temperature`, `top_p`)."""
    import jax.numpy as jnp
    import numpy as np

    from bat_jax.rollout.engine import token_logprobs

    return [np.asarray(token_logprobs(jnp.asarray(lg), jnp.asarray(c), temperature, top_p))
            for lg, c in zip(reference_logits(model, prompts, completions), completions)]
