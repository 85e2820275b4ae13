"""Model configs (bat_jax/models/configs.py): HF config.json ⇄ Qwen3 / Qwen3.5 / Llama configs, with defaults,
derived sizes and the refusals, against hand-written values."""

import pytest

from bat_jax.models.configs import (LlamaConfig, Qwen3_5Config, Qwen3Config, RopeScaling, config_from_hf)

HF_QWEN3 = {"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 2560, "intermediate_size": 9728,
            "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "rope_theta": 1000000, "eos_token_id": [151645, 151643], "tie_word_embeddings": True}


def test_qwen3_from_hf_and_back():
    cfg = config_from_hf(HF_QWEN3)
    assert isinstance(cfg, Qwen3Config) and cfg.family == "qwen3"
    assert (cfg.hidden_size, cfg.num_key_value_heads, cfg.head_dim, cfg.rotary_dim) == (2560, 8, 128, 128)
    assert cfg.eos_token_id == (151645, 151643) and cfg.rope_theta == 1e6 and cfg.rms_norm_eps == 1e-6
    assert cfg.layer_types == ("full_attention",) * 36
    hf = cfg.to_hf_config()
    assert hf["architectures"] == ["Qwen3ForCausalLM"] and hf["eos_token_id"] == [151645, 151643]
    assert hf["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e6}
    assert Qwen3Config.from_hf_config(hf) == cfg
    assert Qwen3Config.from_hf_config(HF_QWEN3, dtype="bfloat16").compute_dtype == "bfloat16"


def test_qwen3_5_layers_default_to_every_fourth_full_attention():
    cfg = Qwen3_5Config(num_hidden_layers=8)
    assert cfg.layer_types == ("linear_attention",) * 3 + ("full_attention",) + ("linear_attention",) * 3 + (
        "full_attention",)
    assert cfg.rotary_dim == 8  # head_dim 32 · partial_rotary_factor 0.25
    wrapped = {"model_type": "qwen3_5", "tie_word_embeddings": False,
               "text_config": {**Qwen3_5Config().to_hf_config(), "tie_word_embeddings": True}}
    assert config_from_hf(wrapped).tie_word_embeddings is False  # the top-level value wins
    with pytest.raises(ValueError, match="linear_num_value_heads must be a multiple of linear_num_key_heads"):
        Qwen3_5Config(linear_num_key_heads=3)
    with pytest.raises(ValueError, match="layer_types"):
        Qwen3_5Config(num_hidden_layers=2, layer_types=("full_attention",))


def test_llama_defaults_and_rope_scaling():
    hf = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
          "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192}, "rope_theta": 500000.0}
    cfg = config_from_hf(hf)
    assert isinstance(cfg, LlamaConfig) and cfg.head_dim == 4096 // 32 == 128
    assert (cfg.rms_norm_eps, cfg.max_position_embeddings, cfg.rope_theta) == (1e-6, 2048, 500000.0)
    assert cfg.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    assert cfg.to_hf_config()["rope_parameters"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
    assert LlamaConfig().rms_norm_eps == 1e-5 and LlamaConfig().max_position_embeddings == 8192


@pytest.mark.parametrize("hf, message", [
    ({**HF_QWEN3, "hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({**HF_QWEN3, "use_sliding_window": True}, "use_sliding_window=true is not supported"),
    ({k: v for k, v in HF_QWEN3.items() if k != "vocab_size"}, r"missing required fields \['vocab_size'\]"),
    ({**HF_QWEN3, "rope_parameters": {"rope_type": "yarn"}}, "rope_type 'yarn' is not supported"),
])
def test_unsupported_configs_are_refused_naming_the_field(hf, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf(hf)


def test_llama3_scaling_needs_its_parameters():
    with pytest.raises(ValueError, match=r"llama3 rope scaling lacks \['low_freq_factor'"):
        RopeScaling("llama3", 8.0)
    with pytest.raises(ValueError, match="high_freq_factor > low_freq_factor"):
        RopeScaling("llama3", 8.0, 4.0, 1.0, 8192)
