"""vLLM beside JAX (bat_jax/rollout/vllm_memory.py): cache bytes per rollout from the model config, the device
split, and the refusals, against hand-computed values for the published Qwen3.5-9B / 4B text configs."""

import pytest

from bat_jax.models.configs import Qwen3Config
from bat_jax.rollout import vllm_memory as vm
from launch.bench import compile_probe as cp

GiB = 1 << 30
MiB = 1 << 20
# Qwen3.5-9B: 32 layers, every 4th full attention (8), 4 KV heads x 256; 24 DeltaNet layers with 16 key heads x 128,
# 32 value heads x 128, conv kernel 4
KV_9B = 8 * 4 * 256 * 2 * 2  # bytes per token in bf16: 32 KiB
STATE_9B = 24 * ((2 * 16 * 128 + 32 * 128) * 3 + 32 * 128 * 128) * 2  # conv + recurrent, bf16: 25.125 MiB


def test_qwen3_5_9b_cache_per_rollout():
    cache = vm.rollout_cache(cp.MODELS["9b"], "bfloat16")
    assert cache.kv_bytes_per_token == KV_9B == 32 * 1024
    assert cache.state_bytes == STATE_9B == int(25.125 * MiB)
    assert cache.per_rollout(12_288) == 12_288 * KV_9B + STATE_9B  # 409.1 MiB
    assert 17.90e9 < cache.weight_bytes < 17.92e9  # 8.95e9 parameters in bf16
    fp32_state = vm.rollout_cache(cp.MODELS["9b"], "bfloat16", state_dtype="float32")
    assert fp32_state.state_bytes == 2 * STATE_9B and fp32_state.kv_bytes_per_token == KV_9B
    assert vm.rollout_cache(cp.MODELS["4b"], "bfloat16").kv_bytes_per_token == KV_9B  # same attention layout


def test_dense_model_has_attention_kv_in_every_layer_and_no_state():
    cfg = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64)
    cache = vm.rollout_cache(cfg, "float32")
    assert cache.kv_bytes_per_token == 3 * 1 * 64 * 2 * 4 and cache.state_bytes == 0
    with pytest.raises(ValueError, match="int8"):
        vm.rollout_cache(cfg, "int8")


def test_plan_9b_on_an_80_gib_device_beside_jax():
    cache = vm.rollout_cache(cp.MODELS["9b"], "bfloat16")
    p = vm.check(cache, max_model_len=12_288, device_total=80 * GiB, device_free=int(0.38 * 80 * GiB),
                 jax_fraction=0.6, vllm_fraction=0.3)
    share = int(0.3 * 80 * GiB)
    assert p.cache == share - cache.weight_bytes - vm.DEFAULT_OVERHEAD_BYTES
    assert p.rollouts_fit == p.cache // (12_288 * KV_9B + STATE_9B) == 13
    assert "JAX 0.60" in p.describe() and "vLLM 0.30" in p.describe() and "13 fit at once" in p.describe()


def test_refusals_name_both_fractions_and_the_numbers():
    cache = vm.rollout_cache(cp.MODELS["9b"], "bfloat16")
    kw = dict(max_model_len=12_288, device_total=40 * GiB, jax_fraction=0.6, vllm_fraction=0.3)
    with pytest.raises(ValueError, match=r"not one full-length rollout fits.*JAX 0\.60.*vLLM 0\.30.*weights 16\.68 GiB"):
        vm.check(cache, device_free=16 * GiB, **kw)  # 12 GiB share < 16.7 GiB of weights
    with pytest.raises(ValueError, match=r"5\.00 GiB free on the device but vLLM needs its 0\.30 = 12\.00 GiB"):
        vm.check(cache, device_free=5 * GiB, **kw)
    with pytest.raises(ValueError, match=r"JAX 0\.75 \+ vLLM 0\.30 of the device leave less than 0\.10"):
        vm.check(cache, **{**kw, "jax_fraction": 0.75, "device_total": 80 * GiB}, device_free=20 * GiB)
    # CPU (free memory unknown): only the cache size counts; 256 MiB cannot hold one 12,288-token rollout
    with pytest.raises(ValueError, match=r"one 12,288-token rollout needs 409\.1 MiB, so 0 fit"):
        vm.check(cache, device_free=None, kv_cache_memory_bytes=256 * MiB, **kw)
    p = vm.check(cache, device_free=None, kv_cache_memory_bytes=1 * GiB, **kw)
    assert p.rollouts_fit == GiB // (12_288 * KV_9B + STATE_9B) == 2


def test_eight_replicas_of_9b_hold_eight_times_one():
    """One replica per 80 GiB GPU (vLLM 0.3 beside JAX 0.6): 13 full-length rollouts each, 104 at once for the pool,
    against the 32 of a GRPO step; a device whose share is not free refuses naming its replica."""
    cache = vm.rollout_cache(cp.MODELS["9b"], "bfloat16")
    devices = [(80 * GiB, int(0.38 * 80 * GiB))] * 8
    kw = dict(max_model_len=12_288, jax_fraction=0.6, vllm_fraction=0.3)
    plans = vm.check_replicas(cache, num_replicas=8, devices=devices, **kw)
    assert [p.rollouts_fit for p in plans] == [13] * 8
    text = vm.describe_replicas(plans, 32)
    assert text.splitlines()[7].startswith("device 7: replica 7:")
    assert text.splitlines()[-1] == ("8 replicas hold 104 full-length rollouts at once; a GRPO step runs 32: "
                                     "all run at once")
    assert vm.describe_replicas(plans[:1], 32).endswith("13 full-length rollouts at once; a GRPO step runs 32: "
                                                        "19 wait for a free slot")
    crowded = devices[:5] + [(80 * GiB, 10 * GiB)] + devices[6:]
    with pytest.raises(ValueError, match=r"vLLM replica 5 \(device 5\): .*10\.00 GiB free"):
        vm.check_replicas(cache, num_replicas=8, devices=crowded, **kw)
    with pytest.raises(ValueError, match="8 replicas but 2 devices"):
        vm.check_replicas(cache, num_replicas=8, devices=devices[:2], **kw)


def test_a_9b_sync_fits_in_the_rest_of_the_device_and_the_old_one_did_not():
    """The 9B sync's transient peak per device: the 1 GiB staging buffer + vLLM's reload copy of at most one decoder
    layer (0.41 GiB), with the 1.89 GiB embedding / head in row chunks; beside 3.5 GiB of contexts and 1 GiB of CUDA
    graphs it fits the 8 GiB left by JAX 0.6 + vLLM 0.3. The same check refuses, with the numbers, a sync that sends
    the embedding whole (bucket + parent copy + replica clone + reload copy, as before)."""
    sync = vm.sync_memory(cp.MODELS["9b"], "bfloat16")
    embed = 248_320 * 4096 * 2
    assert sync.largest_tensor == embed and sync.staging == GiB and sync.buckets == 20
    # largest decoder layer: a Gated DeltaNet layer (in_proj_qkv (2 x 2048 + 4096) x 4096, in_proj_z and out_proj
    # 4096 x 4096, in_proj_a / b 32 x 4096, conv 8192 x 4, dt_bias 32 in bf16; A_log 32 and norm 128 in fp32) + MLP
    linear = (8192 * 4096 + 2 * 4096 * 4096 + 2 * 32 * 4096 + 8192 * 4 + 32) * 2 + (32 + 128) * 4
    mlp = 3 * 4096 * 12_288 * 2
    assert sync.reload_copy == linear + mlp + 2 * 4096 * 2 == 436_814_528
    assert vm.sync_memory(cp.MODELS["9b"], "bfloat16", replicas=False).reload_copy == embed  # in-process engine
    cache = vm.rollout_cache(cp.MODELS["9b"], "bfloat16")
    kw = dict(max_model_len=12_288, device_total=80 * GiB, device_free=int(0.38 * 80 * GiB), jax_fraction=0.6,
              vllm_fraction=0.3, cuda_graph_bytes=vm.DEFAULT_CUDA_GRAPH_BYTES)
    p = vm.check(cache, sync=sync, **kw)
    assert sum(p.outside.values()) == int(3.5 * GiB) + GiB + GiB + 436_814_528  # 5.91 GiB of 8.00
    assert "sync staging 1.00 GiB + sync reload copy 0.41 GiB = 5.91 GiB of the 8.00 GiB left" in p.describe()
    whole = vm.SyncMemory(staging=3 * embed, reload_copy=embed, largest_tensor=embed, buckets=20)
    with pytest.raises(ValueError, match=r"the 8\.00 GiB outside JAX 0\.60 and vLLM 0\.30 cannot hold 12\.08 GiB "
                                         r"\(contexts 3\.50 GiB, CUDA graphs 1\.00 GiB, sync staging 5\.68 GiB"):
        vm.check(cache, sync=whole, **kw)
