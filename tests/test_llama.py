"""Llama dense model: logits parity with transformers 5.19 (torch CPU, fp32) on random tiny configs, with and
without rotary scaling (linear, dynamic NTK, Llama 3), left-padded batches, tied and untied heads; cached decode
equals the full forward; config round trip and errors."""

import numpy as np
import pytest
import torch
from flax import nnx
from transformers import LlamaConfig as TorchLlamaConfig
from transformers import LlamaForCausalLM as TorchLlama

from bat_jax.models.configs import LlamaConfig, RopeScaling, config_from_hf
from bat_jax.models.layers import rope_inv_freq
from bat_jax.models.llama import LlamaForCausalLM

import hf_parity

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5,
            max_position_embeddings=16)
ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8, "rope_theta": 500.0},
}


def _torch_model(tie: bool, rope: dict):
    torch.manual_seed(0)
    model = TorchLlama(TorchLlamaConfig(**TINY, tie_word_embeddings=tie, rope_parameters=dict(rope))).eval()
    hf_parity.randomise_norms(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(8.0)  # peaked attention: the rotary frequencies matter well above the tolerance
    return model


def _batch(seq, pads, seed):
    return hf_parity.batch(TINY["vocab_size"], seq, pads, seed)


@pytest.fixture(scope="module", params=[(True, "default"), (False, "default"), (True, "linear"),
                                        (True, "dynamic"), (False, "llama3")],
                ids=["tied", "untied", "linear", "dynamic", "llama3"])
def pair(request, tmp_path_factory):
    tie, rope = request.param
    tm = _torch_model(tie, ROPES[rope])
    d = tmp_path_factory.mktemp("llama")
    return tm, hf_parity.save_and_load(tm, d), rope


def test_logits_match_transformers_left_padded(pair):
    """24 tokens: beyond max_position_embeddings (16), so dynamic NTK really rescales (and llama3's
    wavelength bands all occur at head_dim 16, theta 500)."""
    tm, jm, rope = pair
    assert isinstance(jm, LlamaForCausalLM)
    assert (jm.lm_head is None) == tm.config.tie_word_embeddings
    assert (jm.config.rope_scaling is None) == (rope == "default")
    ids, mask = _batch(24, (0, 3), seed=1)
    ref = hf_parity.torch_logits(tm, ids, mask)
    out = hf_parity.forward(jm, ids, mask)
    assert np.abs(out - ref)[mask.astype(bool)].max() <= 1e-4


def test_scaled_rope_changes_logits(pair):
    """The parity above is not vacuous: the same weights with default RoPE give other logits."""
    tm, jm, rope = pair
    if rope == "default":
        pytest.skip("no scaling")
    ids, mask = _batch(24, (0,), seed=3)
    plain = _torch_model(tm.config.tie_word_embeddings, ROPES["default"])
    assert np.abs(hf_parity.torch_logits(plain, ids, mask) - hf_parity.torch_logits(tm, ids, mask)).max() > 1e-2


def test_decode_steps_equal_full_forward(pair):
    _, jm, rope = pair
    if rope == "dynamic":
        pytest.skip("dynamic NTK rescales with the call's length: cached keys keep older frequencies")
    ids, mask = _batch(9, (2, 0, 5), seed=2)
    full = hf_parity.forward(jm, ids, mask)
    got, _ = hf_parity.decode(jm, ids, mask, prompt=6, max_len=12)
    assert np.abs(got - full)[mask.astype(bool)].max() <= 1e-4


@pytest.mark.parametrize("rope", sorted(ROPES))
def test_inv_freq_matches_transformers(rope):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = TorchLlamaConfig(**TINY, rope_parameters=dict(ROPES[rope]))
    ours = config_from_hf(cfg.to_dict())
    fn = ROPE_INIT_FUNCTIONS.get(rope) or TorchLlama(cfg).model.rotary_emb.compute_default_rope_parameters
    for seq_len in (None, 40):
        ref = (fn(cfg, None, seq_len=seq_len) if rope == "dynamic" else fn(cfg))[0].numpy()
        got = rope_inv_freq(ours.head_dim, ours.rope_theta, ours.rope_scaling, ours.max_position_embeddings,
                            seq_len or ours.max_position_embeddings)
        np.testing.assert_allclose(np.asarray(got), ref, rtol=2e-6)


def test_config_round_trip_and_errors():
    scaled = RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    for cfg in (LlamaConfig(**TINY, tie_word_embeddings=False), LlamaConfig(**TINY, rope_scaling=scaled)):
        hf = cfg.to_hf_config()
        assert LlamaConfig.from_hf_config(hf) == cfg
        torch_cfg = TorchLlamaConfig(**{k: v for k, v in hf.items() if k not in ("architectures", "model_type")})
        assert torch_cfg.rope_parameters["rope_theta"] == cfg.rope_theta
        assert torch_cfg.rope_parameters["rope_type"] == ("default" if cfg.rope_scaling is None else "llama3")
    legacy = {**LlamaConfig(**TINY).to_hf_config(), "rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 2}}
    del legacy["rope_parameters"]
    assert LlamaConfig.from_hf_config(legacy).rope_scaling == RopeScaling("linear", 2.0)
    assert LlamaConfig.from_hf_config(legacy).rope_theta == 5e5
    base = LlamaConfig(**TINY).to_hf_config()
    with pytest.raises(ValueError, match="'yarn' is not supported"):
        LlamaConfig.from_hf_config({**base, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="lacks"):
        LlamaConfig.from_hf_config({**base, "rope_parameters": {"rope_type": "llama3", "factor": 4.0}})
    with pytest.raises(ValueError, match="mlp_bias"):
        LlamaConfig.from_hf_config({**base, "mlp_bias": True})
    with pytest.raises(ValueError, match="hidden_act"):
        LlamaConfig.from_hf_config({**base, "hidden_act": "gelu"})
    with pytest.raises(TypeError, match="LlamaConfig"):
        from bat_jax.models.configs import Qwen3Config
        LlamaForCausalLM(Qwen3Config(), rngs=nnx.Rngs(0))
