"""HF safetensors I/O: bit-exact save/load round trip (also readable by transformers), sharded
save, Qwen3_5ForConditionalGeneration layout, bf16 checkpoints, fsdp loading on 8 fake CPU devices."""

import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file, save_file
from transformers import AutoModelForCausalLM
from transformers import Qwen3_5ForCausalLM as TorchQwen3_5
from transformers import Qwen3_5TextConfig

from bat_jax.models import hf_io

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=16,
            linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4)
IDS = np.array([[0, 0, 5, 17, 99, 3], [7, 8, 9, 10, 11, 12]], np.int32)
MASK = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], np.int32)


def _forward(model):
    graphdef, state = nnx.split(model)
    f = jax.jit(lambda s, i, a: nnx.merge(graphdef, s)(i, a))
    return np.asarray(f(state, jnp.asarray(IDS), jnp.asarray(MASK)))


def _params(model):
    return {".".join(map(str, p)): np.asarray(v.get_value())
            for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = Qwen3_5TextConfig(**TINY, tie_word_embeddings=False)
    d = tmp_path_factory.mktemp("hf")
    TorchQwen3_5(cfg).eval().save_pretrained(d)
    (d / "tokenizer.json").write_text('{"fake": true}')
    (d / "tokenizer_config.json").write_text('{"model_max_length": 64}')
    return d


@pytest.fixture(scope="module")
def loaded(hf_dir):
    return hf_io.load_pretrained(hf_dir)


def test_save_load_round_trip_bit_exact(hf_dir, loaded, tmp_path):
    out = hf_io.save_pretrained(loaded, tmp_path / "ckpt", tokenizer_dir=hf_dir)
    assert (out / "tokenizer.json").read_text() == '{"fake": true}'
    assert (out / "tokenizer_config.json").is_file()
    original = load_file(hf_dir / "model.safetensors")
    written = load_file(out / "model.safetensors")
    assert set(written) == set(original)
    for k in original:
        assert written[k].dtype == original[k].dtype
        np.testing.assert_array_equal(written[k], original[k])
    again = hf_io.load_pretrained(out)
    a, b = _params(loaded), _params(again)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert again.config == loaded.config
    # transformers reads the saved config and weights and computes the same logits
    tm = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        ref = tm(input_ids=torch.tensor(IDS, dtype=torch.long), attention_mask=torch.tensor(MASK),
                 position_ids=torch.tensor(np.maximum(np.cumsum(MASK, 1) - 1, 0))).logits.numpy()
    assert np.abs(_forward(again) - ref)[MASK.astype(bool)].max() <= 1e-4
    with pytest.raises(FileExistsError):
        hf_io.save_pretrained(loaded, out)


def test_multi_shard_save(loaded, tmp_path):
    out = hf_io.save_pretrained(loaded, tmp_path / "sharded", max_shard_bytes=64 * 1024)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert set(index["weight_map"]) == set(_params(loaded))
    again = hf_io.load_pretrained(out)
    for k, v in _params(loaded).items():
        np.testing.assert_array_equal(v, _params(again)[k])


def test_a_non_zero_process_writes_its_own_local_copy(loaded, tmp_path, monkeypatch):
    """Process 1 of 2 (faked) writes parameters local to it (a host's own engine copy) to its own directory.

    The same tensors as process 0 would (with parameters spanning the processes only process 0 writes).
    """
    reference = hf_io.save_pretrained(loaded, tmp_path / "p0")
    monkeypatch.setattr(hf_io.jax, "process_index", lambda: 1)
    out = hf_io.save_pretrained(loaded, tmp_path / "p1")
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in reference.iterdir())
    a, b = load_file(reference / "model.safetensors"), load_file(out / "model.safetensors")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_conditional_generation_layout(hf_dir, loaded, tmp_path, caplog):
    """Released Qwen3.5 checkpoints: nested text_config, model.language_model.* prefix, vision/MTP."""
    tensors = load_file(hf_dir / "model.safetensors")
    renamed = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
               for k, v in tensors.items()}
    renamed["model.visual.patch_embed.proj.weight"] = np.ones((4, 3), np.float32)
    renamed["mtp.fc.weight"] = np.ones((2, 2), np.float32)
    d = tmp_path / "vl"
    d.mkdir()
    save_file(renamed, str(d / "model.safetensors"), metadata={"format": "pt"})
    text = json.loads((hf_dir / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({
        "model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
        "text_config": {**text, "tie_word_embeddings": True}, "vision_config": {"depth": 1},
        "tie_word_embeddings": False}))
    with caplog.at_level(logging.INFO, logger="bat_jax.models.hf_io"):
        vl = hf_io.load_pretrained(d)
    assert "skipped 2 vision-tower/MTP tensors" in caplog.text
    assert not vl.config.tie_word_embeddings
    np.testing.assert_array_equal(_forward(vl), _forward(loaded))


def test_bf16_checkpoint_loads_exactly(tmp_path):
    torch.manual_seed(1)
    tm = TorchQwen3_5(Qwen3_5TextConfig(**TINY, tie_word_embeddings=True)).to(torch.bfloat16)
    tm.save_pretrained(tmp_path)
    jm = hf_io.load_pretrained(tmp_path, param_dtype="bfloat16", dtype="bfloat16")
    assert jm.lm_head is None
    p = _params(jm)
    for name, t in tm.state_dict().items():
        if name == "lm_head.weight":
            continue
        if name.endswith(FLOAT32_TAILS):  # kept float32: the bf16 values upcast exactly
            assert p[name].dtype == np.float32, name
            np.testing.assert_array_equal(p[name], t.float().numpy())
            continue
        assert p[name].dtype == jnp.bfloat16
        np.testing.assert_array_equal(p[name].view(np.uint16), t.view(torch.int16).numpy().view(np.uint16))
    # bf16 compute stays close to the float32 forward of the same (exactly upcast) weights
    ref = _forward(hf_io.load_pretrained(tmp_path))
    out = _forward(jm)
    real = MASK.astype(bool)
    err = np.abs(out - ref)[real].max() / ref[real].std()
    assert err < 0.05, err


FLOAT32_TAILS = ("linear_attn.A_log", "linear_attn.norm.weight")


def test_bf16_load_keeps_deltanet_a_log_and_norm_float32(tmp_path):
    """A released Qwen3.5 checkpoint stores A_log and the DeltaNet output norm in float32, the rest in
    bf16; loading with param_dtype='bfloat16' keeps those two float32 bit for bit (a bf16 cast moves
    A_log by up to ~8e-3) and save_pretrained writes them back as float32."""
    torch.manual_seed(2)
    tm = TorchQwen3_5(Qwen3_5TextConfig(**TINY, tie_word_embeddings=False)).to(torch.bfloat16)
    with torch.no_grad():
        for name, mod in tm.named_modules():
            if name.endswith("linear_attn"):
                mod.A_log = torch.nn.Parameter(torch.empty(TINY["linear_num_value_heads"]).uniform_(0.01, 16).log_())
                mod.norm.weight = torch.nn.Parameter(1.0 + 0.1 * torch.randn(TINY["linear_value_head_dim"]))
    sd = tm.state_dict()
    f32 = [k for k in sd if k.endswith(FLOAT32_TAILS)]
    assert len(f32) == 6 and all(sd[k].dtype == torch.float32 for k in f32)
    tm.save_pretrained(tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    assert stored["model.layers.0.linear_attn.A_log"].dtype == np.float32
    jm = hf_io.load_pretrained(tmp_path, param_dtype="bfloat16", dtype="bfloat16")
    p = _params(jm)
    for k in f32:
        assert p[k].dtype == np.float32, k
        np.testing.assert_array_equal(p[k], stored[k])
    # a bf16 round trip would have moved A_log: the test's values are not bf16-representable
    a = stored["model.layers.0.linear_attn.A_log"]
    assert np.abs(a.astype(jnp.bfloat16).astype(np.float32) - a).max() > 1e-4
    assert p["model.layers.0.mlp.up_proj.weight"].dtype == jnp.bfloat16
    assert p["model.layers.3.self_attn.q_norm.weight"].dtype == jnp.bfloat16
    out = hf_io.save_pretrained(jm, tmp_path / "again")
    again = load_file(out / "model.safetensors")
    for k in f32:
        assert again[k].dtype == np.float32
        np.testing.assert_array_equal(again[k], stored[k])
    # freshly built bf16 models follow the same rule
    from bat_jax.models.configs import Qwen3_5Config
    from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM
    fresh = Qwen3_5ForCausalLM(Qwen3_5Config(param_dtype="bfloat16", dtype="bfloat16"), rngs=nnx.Rngs(0))
    assert fresh.model.layers[0].linear_attn.A_log.get_value().dtype == jnp.float32
    assert fresh.model.layers[0].linear_attn.norm.weight.get_value().dtype == jnp.float32
    assert fresh.model.layers[0].linear_attn.dt_bias.get_value().dtype == jnp.bfloat16


def test_fsdp_load_on_8_devices_matches_one_device(hf_dir, loaded):
    assert jax.device_count() == 8
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("fsdp",))
    sharded = hf_io.load_pretrained(hf_dir, sharding_fn=hf_io.logical_sharding(mesh, {"embed": "fsdp"}))
    w = sharded.model.layers[0].linear_attn.in_proj_qkv.weight.get_value()
    assert w.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp")
    assert len({s.device for s in w.addressable_shards}) == 8
    assert w.addressable_shards[0].data.shape == (w.shape[0], w.shape[1] // 8)
    for k, v in _params(loaded).items():
        np.testing.assert_array_equal(v, _params(sharded)[k])
    np.testing.assert_allclose(_forward(sharded), _forward(loaded), atol=1e-5)


def test_missing_and_mismatched_tensors_are_named(hf_dir, tmp_path):
    tensors = load_file(hf_dir / "model.safetensors")
    cfg = (hf_dir / "config.json").read_text()
    broken = tmp_path / "missing"
    broken.mkdir()
    (broken / "config.json").write_text(cfg)
    save_file({k: v for k, v in tensors.items() if k != "model.norm.weight"}, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match="model.norm.weight"):
        hf_io.load_pretrained(broken)
    bad = tmp_path / "shape"
    bad.mkdir()
    (bad / "config.json").write_text(cfg)
    save_file({**tensors, "model.norm.weight": np.zeros(3, np.float32)}, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match=r"model.norm.weight.*\(3,\)"):
        hf_io.load_pretrained(bad)


def test_export_with_tokenizer_reloads_in_transformers(loaded, tmp_path):
    """A run's export (tiny Qwen3.5 + the shipped tiny tokenizer): weights, config, tokenizer and chat template
    load in transformers as they are; logits equal the JAX model's."""
    from transformers import AutoTokenizer

    from bat_jax.models.tokenizer import load_tiny_tokenizer

    tiny = load_tiny_tokenizer()
    out = hf_io.save_pretrained(loaded, tmp_path / "export", tokenizer=tiny)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == tiny.chat_template and len(tok) == len(tiny)
    messages = [{"role": "user", "content": "Segment the liver."}]
    assert (tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
            == tiny.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])
    tm = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        ref = tm(input_ids=torch.tensor(IDS, dtype=torch.long), attention_mask=torch.tensor(MASK),
                 position_ids=torch.tensor(np.maximum(np.cumsum(MASK, 1) - 1, 0))).logits.numpy()
    assert np.abs(_forward(loaded) - ref)[MASK.astype(bool)].max() <= 1e-4
