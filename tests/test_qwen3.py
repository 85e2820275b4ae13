"""Qwen3 dense model: logits parity with transformers 5.19 (torch CPU, fp32) on a random tiny
config with a left-padded batch, tied and untied heads; cached decode == full forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import Qwen3Config as TorchQwen3Config
from transformers import Qwen3ForCausalLM as TorchQwen3

from bat_jax.models import hf_io
from bat_jax.models.configs import Qwen3Config
from bat_jax.models.qwen3 import Qwen3ForCausalLM

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6)


def _jit(fn):
    return jax.jit(lambda graphdef, state, *args: fn(nnx.merge(graphdef, state), *args), static_argnums=0)


def _torch_model(tie: bool):
    torch.manual_seed(0)
    cfg = TorchQwen3Config(**TINY, tie_word_embeddings=tie,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    model = TorchQwen3(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def _batch(seq, pads, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, TINY["vocab_size"], size=(len(pads), seq)).astype(np.int32)
    mask = np.ones_like(ids)
    for row, p in enumerate(pads):
        mask[row, :p] = 0
        ids[row, :p] = 0
    return ids, mask


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def pair(request, tmp_path_factory):
    tm = _torch_model(request.param)
    d = tmp_path_factory.mktemp("qwen3")
    tm.save_pretrained(d)
    return tm, hf_io.load_pretrained(d)


def test_logits_match_transformers_left_padded(pair):
    tm, jm = pair
    assert isinstance(jm, Qwen3ForCausalLM)
    assert (jm.lm_head is None) == tm.config.tie_word_embeddings
    ids, mask = _batch(10, (0, 3), seed=1)
    positions = np.maximum(np.cumsum(mask, 1) - 1, 0)
    with torch.no_grad():
        ref = tm(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                 position_ids=torch.tensor(positions, dtype=torch.long)).logits.numpy()
    out = np.asarray(_jit(lambda m, i, a: m(i, a))(*nnx.split(jm), jnp.asarray(ids), jnp.asarray(mask)))
    real = mask.astype(bool)
    assert np.abs(out - ref)[real].max() <= 1e-4


def test_decode_steps_equal_full_forward(pair):
    _, jm = pair
    ids, mask = _batch(9, (2, 0, 5), seed=2)
    graphdef, state = nnx.split(jm)
    full = np.asarray(_jit(lambda m, i, a: m(i, a))(graphdef, state, jnp.asarray(ids), jnp.asarray(mask)))
    cache = jm.init_cache(batch=3, max_len=12)
    logits, cache = _jit(lambda m, i, a, c: m.prefill(i, a, c))(
        graphdef, state, jnp.asarray(ids[:, :6]), jnp.asarray(mask[:, :6]), cache)
    got = [np.asarray(logits)]
    step = _jit(lambda m, tok, c: m.decode_step(tok, c))
    for t in range(6, 9):
        logits, cache = step(graphdef, state, jnp.asarray(ids[:, t]), cache)
        got.append(np.asarray(logits)[:, None])
    got = np.concatenate(got, axis=1)
    assert np.abs(got - full)[mask.astype(bool)].max() <= 1e-4


def test_config_round_trip_and_errors():
    cfg = Qwen3Config(**TINY, tie_word_embeddings=False)
    assert Qwen3Config.from_hf_config(cfg.to_hf_config()) == cfg
    hf = TorchQwen3Config(**{k: v for k, v in cfg.to_hf_config().items() if k not in ("architectures", "model_type")})
    assert hf.num_key_value_heads == 2 and hf.rope_parameters["rope_theta"] == cfg.rope_theta
    with pytest.raises(ValueError, match="hidden_act"):
        Qwen3Config.from_hf_config({**cfg.to_hf_config(), "hidden_act": "gelu"})
    with pytest.raises(ValueError, match="missing required fields"):
        Qwen3Config.from_hf_config({"vocab_size": 3})
