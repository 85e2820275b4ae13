"""The run's rollout engine (bat_jax/bicurl/engines.py): its config's checks, the JAX engine it builds, the vLLM
options it refuses before anything starts, and JAX's memory share beside vLLM."""

import types

import pytest

from bat_jax.bicurl.engines import EngineConfig, build_engine, check_vllm_memory, jax_memory_fraction, vllm_config
from bat_jax.models.configs import Qwen3Config
from bat_jax.rollout.continuous_batching import ContinuousBatchingSampler
from bat_jax.rollout.jax_sampler import JaxSampler

from doubles import tiny_model


def test_engine_config_names_what_it_refuses():
    with pytest.raises(ValueError, match=r"EngineConfig.kind must be one of \('jax', 'vllm'\), got 'sglang'"):
        EngineConfig(kind="sglang")
    with pytest.raises(ValueError, match="got 0, 0, 0, 0"):
        EngineConfig(max_batch=0)
    with pytest.raises(ValueError, match="got 8, 0, -1, 0"):
        EngineConfig(slots=-1)


def test_the_jax_engine_is_the_sampler_or_its_continuous_batcher():
    policy = types.SimpleNamespace(model=tiny_model("qwen3"), tokenizer=None)
    plain = build_engine(policy, EngineConfig(max_batch=4), max_context=64)
    assert isinstance(plain, JaxSampler) and plain.max_batch == 4
    batched = build_engine(policy, EngineConfig(slots=6), max_context=64)
    assert isinstance(batched, ContinuousBatchingSampler)


def test_the_vllm_engine_needs_a_run_dir():
    policy = types.SimpleNamespace(model=tiny_model("qwen3"), tokenizer=None)
    with pytest.raises(ValueError, match="the vLLM engine needs a run_dir"):
        build_engine(policy, EngineConfig(kind="vllm"), max_context=64)


def test_jax_memory_share_beside_vllm():
    assert jax_memory_fraction(0.3) == pytest.approx(0.6)  # 0.9 − 0.3
    assert jax_memory_fraction(0.0) == pytest.approx(0.9)
    assert jax_memory_fraction(0.85) == 0.1  # never below 0.1


def test_unknown_vllm_options_are_named_before_anything_starts():
    """`EngineConfig.vllm_options` keys go to `VLLMEngineConfig`; a mistyped one (or `model_dir`, the run's own) is a
    ValueError naming it, not a TypeError from the dataclass."""
    model = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    with pytest.raises(ValueError, match=r"unknown VLLMEngineConfig field\(s\) \['gpu_mem_util'\]"):
        check_vllm_memory(model, {"max_model_len": 128, "gpu_mem_util": 0.3})
    with pytest.raises(ValueError, match="model_dir"):
        vllm_config({"model_dir": "/x"})
    assert vllm_config({"max_model_len": 128, "dtype": "bfloat16"}).dtype == "bfloat16"
