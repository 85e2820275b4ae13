"""The end of a run (bicurl/export.py): the retained policy written to `run_dir/export/` as a Hugging Face checkpoint
directory (weights, config, tokenizer, chat template) that reloads to the same parameters; a second export
replaces the first; an unwritable run directory raises OSError; a LoRA policy exports merged weights and its adapter."""

import json

import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from bat_jax.bicurl.export import EXPORT_DIR, export_retained
from bat_jax.models import hf_io
from bat_jax.models.tokenizer import load_tiny_tokenizer
from doubles import tiny_model

# tiny_model('qwen3') (tests/doubles): vocab 256, hidden 64, MLP 128, 2 layers, 4 query heads and 2 KV heads of 16.
# Per layer: q 64x64 + k 64x32 + v 64x32 + o 64x64 = 12288, q/k norms 16 + 16, gate / up / down 3 x 64x128 = 24576,
# two RMSNorms 2 x 64: 37024. Two layers 74048, the (tied) embedding 256x64 = 16384, the final norm 64.
PARAMS = 2 * 37024 + 256 * 64 + 64
TENSORS = 2 * 11 + 2  # 11 tensors per layer, the embedding and the final norm (the head is tied)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tiny_tokenizer()


def _flat(model) -> dict[str, np.ndarray]:
    return {".".join(map(str, p)): np.asarray(v.get_value())
            for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def test_the_export_is_a_checkpoint_directory_that_reloads_to_the_same_parameters(tmp_path, tokenizer, capsys):
    model = tiny_model("qwen3", seed=0)
    out = export_retained(model, tmp_path, tokenizer)

    assert out == tmp_path / EXPORT_DIR == tmp_path / "export"
    assert f"retained policy exported to {out}" in capsys.readouterr().out
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    config = json.loads((out / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (64, 2, 256)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (4, 2, 16)
    assert config["tie_word_embeddings"] is True
    weights = load_file(str(out / "model.safetensors"))
    assert len(weights) == TENSORS and sum(w.size for w in weights.values()) == PARAMS == 90496
    assert {w.dtype for w in weights.values()} == {np.dtype(np.float32)}  # the parameter dtype, unchanged

    reloaded, original = _flat(hf_io.load_pretrained(out)), _flat(model)
    assert sorted(reloaded) == sorted(original)
    for name, value in original.items():
        np.testing.assert_array_equal(reloaded[name], value, err_msg=name)


def test_a_second_export_of_the_run_replaces_the_first(tmp_path, tokenizer):
    first, second = tiny_model("qwen3", seed=1), tiny_model("qwen3", seed=2)
    export_retained(first, tmp_path, tokenizer)
    out = export_retained(second, tmp_path, tokenizer)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no staging directory left behind
    reloaded, expected = _flat(hf_io.load_pretrained(out)), _flat(second)
    name = "model.embed_tokens.embedding" if "model.embed_tokens.embedding" in expected else sorted(expected)[0]
    np.testing.assert_array_equal(reloaded[name], expected[name])
    assert not np.array_equal(reloaded[name], _flat(first)[name])


def test_an_unwritable_run_directory_raises_oserror(tmp_path, tokenizer):
    blocker = tmp_path / "run"
    blocker.write_text("a file where the run directory should be")
    with pytest.raises(OSError):
        export_retained(tiny_model("qwen3"), blocker, tokenizer)
    assert blocker.read_text() == "a file where the run directory should be"


def test_a_lora_policy_exports_merged_weights_and_its_adapter(tmp_path, tokenizer, capsys):
    from bat_jax.bicurl.export import ADAPTER_DIR
    from bat_jax.models import lora

    model = tiny_model("qwen3", seed=0)
    lora.add_lora(model, lora.LoRAConfig(rank=2, alpha=4.0, target_modules=("q_proj",)))
    q = model.model.layers[0].self_attn.q_proj
    q.lora_b[...] = q.lora_b[...] + 1.0
    out = export_retained(model, tmp_path, tokenizer)
    assert "LoRA adapter exported" in capsys.readouterr().out
    weights = load_file(str(out / "model.safetensors"))
    assert len(weights) == TENSORS and sum(w.size for w in weights.values()) == PARAMS  # merged: no adapter tensor
    np.testing.assert_allclose(weights["model.layers.0.self_attn.q_proj.weight"],
                               np.asarray(q.weight[...]) + 2.0 * np.ones((64, 2)) @ np.asarray(q.lora_a[...]),
                               rtol=1e-6, atol=1e-6)
    adapter = load_file(str(tmp_path / ADAPTER_DIR / "adapter_model.safetensors"))
    assert sorted(adapter) == [f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_{ab}.weight"
                               for i in (0, 1) for ab in "AB"]
