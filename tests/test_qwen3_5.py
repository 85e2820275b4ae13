"""Qwen3.5 hybrid model: logits parity with transformers 5.19 (torch CPU, fp32) on a random tiny
config with a left-padded batch, and cached token-by-token decode == full forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import Qwen3_5ForCausalLM as TorchQwen3_5
from transformers import Qwen3_5TextConfig

from bat_jax.models import hf_io
from bat_jax.models.configs import Qwen3_5Config
from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=16,
            linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
            rms_norm_eps=1e-6)


def _torch_model(tie: bool, seed: int = 0):
    torch.manual_seed(seed)
    cfg = Qwen3_5TextConfig(**TINY, tie_word_embeddings=tie,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                             "partial_rotary_factor": 0.25})
    model = TorchQwen3_5(cfg).eval()
    with torch.no_grad():  # HF zero-inits the (1 + w) norms; randomise so they are tested
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def _batch(seq=11, pads=(0, 4), seed=1):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, TINY["vocab_size"], size=(len(pads), seq)).astype(np.int32)
    mask = np.ones_like(ids)
    for row, p in enumerate(pads):
        mask[row, :p] = 0
        ids[row, :p] = 0
    return ids, mask


def _positions(mask):
    return np.maximum(np.cumsum(mask, axis=1) - 1, 0)


def _jit(fn):
    """jax.jit over the split model state (cheap per call, one compile per shape)."""
    return jax.jit(lambda graphdef, state, *args: fn(nnx.merge(graphdef, state), *args), static_argnums=0)


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def pair(request, tmp_path_factory):
    tm = _torch_model(request.param)
    d = tmp_path_factory.mktemp("qwen3_5")
    tm.save_pretrained(d)
    return tm, hf_io.load_pretrained(d), d


def test_logits_match_transformers_left_padded(pair):
    tm, jm, _ = pair
    ids, mask = _batch()
    ids[1, 4:] = ids[0, :7]  # row 1 = left padding + a prefix of row 0
    with torch.no_grad():
        ref = tm(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                 position_ids=torch.tensor(_positions(mask), dtype=torch.long)).logits.numpy()
    out = np.asarray(_jit(lambda m, i, a: m(i, a))(*nnx.split(jm), jnp.asarray(ids), jnp.asarray(mask)))
    real = mask.astype(bool)
    assert out.shape == ref.shape == (2, 11, TINY["vocab_size"])
    assert np.abs(out - ref)[real].max() <= 1e-4
    # padding does not change a row's logits: padded row 1 equals the unpadded prefix in row 0
    np.testing.assert_allclose(out[1, 4:], out[0, :7], atol=1e-5)


def test_decode_steps_equal_full_forward(tmp_path):
    """Prefill + token-by-token decode (recurrent DeltaNet, KV cache) == one full forward (chunked
    DeltaNet with chunk 4, so several chunks and a padded last chunk are exercised)."""
    _torch_model(tie=True).save_pretrained(tmp_path)
    jm = hf_io.load_pretrained(tmp_path, chunk_size=4)
    ids, mask = _batch(seq=14, pads=(0, 3), seed=2)
    graphdef, state = nnx.split(jm)
    full = np.asarray(_jit(lambda m, i, a: m(i, a, deltanet_mode="chunk"))(
        graphdef, state, jnp.asarray(ids), jnp.asarray(mask)))
    prompt = 6
    cache = jm.init_cache(batch=2, max_len=16)
    logits, cache = _jit(lambda m, i, a, c: m.prefill(i, a, c))(
        graphdef, state, jnp.asarray(ids[:, :prompt]), jnp.asarray(mask[:, :prompt]), cache)
    got = [np.asarray(logits)]
    step = _jit(lambda m, tok, c: m.decode_step(tok, c))
    for t in range(prompt, ids.shape[1]):
        logits, cache = step(graphdef, state, jnp.asarray(ids[:, t]), cache)
        got.append(np.asarray(logits)[:, None])
    got = np.concatenate(got, axis=1)
    real = mask.astype(bool)
    assert np.abs(got - full)[real].max() <= 1e-4
    assert int(cache.length) == ids.shape[1]
    np.testing.assert_array_equal(np.asarray(cache.next_position), mask.sum(1))


def test_config_round_trip(pair):
    tm, jm, _ = pair
    cfg = jm.config
    assert isinstance(cfg, Qwen3_5Config)
    assert cfg.layer_types == tuple(tm.config.layer_types)
    assert cfg.layer_types[3] == "full_attention" and cfg.layer_types[0] == "linear_attention"
    assert cfg.rotary_dim == 4
    again = Qwen3_5Config.from_hf_config(cfg.to_hf_config())
    assert again == cfg
    hf_cfg = Qwen3_5TextConfig(**{k: v for k, v in cfg.to_hf_config().items()
                                  if k not in ("architectures", "model_type")})
    assert hf_cfg.layer_types == list(cfg.layer_types)


def test_model_rejects_wrong_config():
    from bat_jax.models.configs import Qwen3Config
    with pytest.raises(TypeError, match="Qwen3_5Config"):
        Qwen3_5ForCausalLM(Qwen3Config(), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="layer_types"):
        Qwen3_5Config(num_hidden_layers=2, layer_types=("linear_attention", "bogus"))
