"""LoRA export (bat_jax/models/peft_io.py, hf_io's merged save): transformers + peft load the exported adapter over
the exported base and give the JAX logits to 1e-4; the merged full weights, loaded as a plain model, give the LoRA
model's logits to 1e-5. peft is the oracle."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM

from bat_jax.models import hf_io, lora, peft_io
from bat_jax.models.configs import Qwen3_5Config, Qwen3Config
from bat_jax.models.qwen3 import Qwen3ForCausalLM
from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM

peft = pytest.importorskip("peft")

DENSE = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16, tie_word_embeddings=False)
HYBRID = dict(DENSE, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=1,
              linear_num_value_heads=2, layer_types=("linear_attention", "full_attention"))
IDS = np.array([[0, 0, 5, 17, 90, 3, 44, 61], [7, 8, 9, 10, 11, 12, 13, 14]], np.int32)
MASK = np.array([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8], np.int32)


def _adapted(family):
    """A tiny model (random base) with a rank-4, alpha-8 adapter whose A and B are both random and non-zero."""
    model = (Qwen3ForCausalLM(Qwen3Config(**DENSE), rngs=nnx.Rngs(0)) if family == "qwen3"
             else Qwen3_5ForCausalLM(Qwen3_5Config(**HYBRID), rngs=nnx.Rngs(0)))
    base = jnp.asarray(model(jnp.asarray(IDS), jnp.asarray(MASK)))
    lora.add_lora(model, lora.LoRAConfig(rank=4, alpha=8.0), seed=1)
    rng = np.random.default_rng(2)
    for _, m in lora.adapted_linears(model):
        m.lora_b[...] = jnp.asarray(0.5 * rng.normal(size=m.lora_b.shape), jnp.float32)
    return model, base


def _torch_logits(model):
    with torch.no_grad():
        return model(input_ids=torch.tensor(IDS, dtype=torch.long), attention_mask=torch.tensor(MASK),
                     position_ids=torch.tensor(np.maximum(np.cumsum(MASK, 1) - 1, 0))).logits.numpy()


def _masked_max(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b))[MASK.astype(bool)].max())


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5"])
def test_peft_loads_the_adapter_and_the_merged_weights_give_the_lora_logits(family, tmp_path):
    model, base_logits = _adapted(family)
    ours = np.asarray(model(jnp.asarray(IDS), jnp.asarray(MASK)))
    assert _masked_max(ours, base_logits) > 1e-2  # the adapter moves the logits well above the tolerances
    # the base alone, as the checkpoint the adapter was trained on: a copy of the model without its adapter
    plain = type(model)(model.config, rngs=nnx.Rngs(0))
    hf_io.save_pretrained(plain, tmp_path / "base")
    out = peft_io.save_adapter(model, tmp_path / "adapter", base_model_name_or_path=str(tmp_path / "base"))
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8.0, "LORA")
    expected = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    if family == "qwen3_5":
        expected = sorted(expected + ["in_proj_qkv", "in_proj_z", "out_proj"])
    assert config["target_modules"] == expected
    tensors = load_file(out / "adapter_model.safetensors")
    q = model.model.layers[1].self_attn.q_proj
    np.testing.assert_array_equal(tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"],
                                  np.asarray(q.lora_b[...]))
    assert tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"].shape == (4, 32)

    torch_base = AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32).eval()
    np.testing.assert_array_less(_masked_max(_torch_logits(torch_base), base_logits), 1e-4)
    with_adapter = peft.PeftModel.from_pretrained(torch_base, out).eval()
    assert _masked_max(_torch_logits(with_adapter), ours) <= 1e-4

    merged_dir = hf_io.save_pretrained(model, tmp_path / "merged")
    written = load_file(merged_dir / "model.safetensors")
    assert not any("lora" in k for k in written) and set(written) == set(load_file(tmp_path / "base" /
                                                                                       "model.safetensors"))
    merged = hf_io.load_pretrained(merged_dir)
    assert not lora.has_lora(merged)
    assert _masked_max(merged(jnp.asarray(IDS), jnp.asarray(MASK)), ours) <= 1e-5


def test_target_modules_fall_back_to_paths_when_names_would_select_more():
    model = Qwen3ForCausalLM(Qwen3Config(**DENSE), rngs=nnx.Rngs(0))
    lora.add_lora(model, lora.LoRAConfig(target_modules=("layers.1.self_attn.q_proj", "layers.0.mlp.up_proj")))
    assert peft_io.target_modules(model) == ["model.layers.0.mlp.up_proj", "model.layers.1.self_attn.q_proj"]
    with pytest.raises(ValueError, match="no LoRA adapter"):
        peft_io.adapter_config(Qwen3ForCausalLM(Qwen3Config(**DENSE), rngs=nnx.Rngs(0)))
