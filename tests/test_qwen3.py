"""Qwen3 dense model: logits parity with transformers 5.19 (torch CPU, fp32) on a random tiny
config with a left-padded batch, tied and untied heads; cached decode == full forward."""

import numpy as np
import pytest
import torch
from transformers import Qwen3Config as TorchQwen3Config
from transformers import Qwen3ForCausalLM as TorchQwen3

from bat_jax.models.configs import Qwen3Config
from bat_jax.models.qwen3 import Qwen3ForCausalLM

import hf_parity

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6)


def _torch_model(tie: bool):
    torch.manual_seed(0)
    cfg = TorchQwen3Config(**TINY, tie_word_embeddings=tie,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    return hf_parity.randomise_norms(TorchQwen3(cfg).eval())


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def pair(request, tmp_path_factory):
    tm = _torch_model(request.param)
    return tm, hf_parity.save_and_load(tm, tmp_path_factory.mktemp("qwen3"))


def test_logits_match_transformers_left_padded(pair):
    tm, jm = pair
    assert isinstance(jm, Qwen3ForCausalLM)
    assert (jm.lm_head is None) == tm.config.tie_word_embeddings
    ids, mask = hf_parity.batch(TINY["vocab_size"], 10, (0, 3), seed=1)
    ref = hf_parity.torch_logits(tm, ids, mask)
    out = hf_parity.forward(jm, ids, mask)
    real = mask.astype(bool)
    assert np.abs(out - ref)[real].max() <= 1e-4


def test_decode_steps_equal_full_forward(pair):
    _, jm = pair
    ids, mask = hf_parity.batch(TINY["vocab_size"], 9, (2, 0, 5), seed=2)
    full = hf_parity.forward(jm, ids, mask)
    got, _ = hf_parity.decode(jm, ids, mask, prompt=6, max_len=12)
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
