"""Qwen3.5 hybrid model: logits parity with transformers 5.19 (torch CPU, fp32) on a random tiny
config with a left-padded batch, and cached token-by-token decode == full forward."""

import numpy as np
import pytest
import torch
from flax import nnx
from transformers import Qwen3_5ForCausalLM as TorchQwen3_5
from transformers import Qwen3_5TextConfig

from bat_jax.models.configs import Qwen3_5Config
from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM

import hf_parity

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=16,
            linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
            rms_norm_eps=1e-6)


def _torch_model(tie: bool, seed: int = 0):
    torch.manual_seed(seed)
    cfg = Qwen3_5TextConfig(**TINY, tie_word_embeddings=tie,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                             "partial_rotary_factor": 0.25})
    # HF zero-inits the (1 + w) norms; randomise so they are tested
    return hf_parity.randomise_norms(TorchQwen3_5(cfg).eval())


def _batch(seq=11, pads=(0, 4), seed=1):
    return hf_parity.batch(TINY["vocab_size"], seq, pads, seed)


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def pair(request, tmp_path_factory):
    tm = _torch_model(request.param)
    d = tmp_path_factory.mktemp("qwen3_5")
    return tm, hf_parity.save_and_load(tm, d), d


def test_logits_match_transformers_left_padded(pair):
    tm, jm, _ = pair
    ids, mask = _batch()
    ids[1, 4:] = ids[0, :7]  # row 1 = left padding + a prefix of row 0
    ref = hf_parity.torch_logits(tm, ids, mask)
    out = hf_parity.forward(jm, ids, mask)
    real = mask.astype(bool)
    assert out.shape == ref.shape == (2, 11, TINY["vocab_size"])
    assert np.abs(out - ref)[real].max() <= 1e-4
    # padding does not change a row's logits: padded row 1 equals the unpadded prefix in row 0
    np.testing.assert_allclose(out[1, 4:], out[0, :7], atol=1e-5)


def test_decode_steps_equal_full_forward(tmp_path):
    """Prefill + token-by-token decode (recurrent DeltaNet, KV cache) == one full forward (chunked
    DeltaNet with chunk 4, so several chunks and a padded last chunk are exercised)."""
    jm = hf_parity.save_and_load(_torch_model(tie=True), tmp_path, chunk_size=4)
    ids, mask = _batch(seq=14, pads=(0, 3), seed=2)
    full = hf_parity.forward(jm, ids, mask, deltanet_mode="chunk")
    got, cache = hf_parity.decode(jm, ids, mask, prompt=6, max_len=16)
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
