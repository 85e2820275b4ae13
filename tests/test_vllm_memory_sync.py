"""What a weight sync holds, measured on CPU against `vllm_memory.sync_memory`'s plan (bat_jax/rollout/
vllm_replicas.py, sync_staging.py, vllm_replica_worker.py).

A Qwen3 whose embedding (16 MiB in fp32) is four times the bucket bound (4 MiB) syncs from a JAX learner (fsdp over 2
fake devices) into one replica process. The sync's plan says: a 4 MiB staging buffer (the embedding in four row
chunks), and vLLM's layer-wise reload copy of at most one decoder layer. Measured with the torch profiler's
allocator counts (`sync_staging.TorchAllocationPeak`): what the parent allocates through torch during the sync, and
what the replica allocates through torch while vLLM reloads. Both must stay within the plan, and the replica's peak
below the embedding's size (it never holds the embedding whole). After the sync the replica scores a completion as
the learner does (the row chunks landed in the right rows).
"""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

pytest.importorskip("vllm")

from bat_jax.learn import grpo  # noqa: E402
from bat_jax.learn.learner import Learner, MemoryConfig  # noqa: E402
from bat_jax.models.configs import Qwen3Config  # noqa: E402
from bat_jax.models.mesh import MeshConfig  # noqa: E402
from bat_jax.models.qwen3 import Qwen3ForCausalLM  # noqa: E402
from bat_jax.rollout import vllm_memory  # noqa: E402
from bat_jax.rollout.sampling import SamplingConfig  # noqa: E402
from bat_jax.rollout.vllm_replicas import VLLMReplicaPool  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MiB = 1 << 20
BOUND = 4 * MiB
CFG = Qwen3Config(vocab_size=16_384, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True,
                  max_position_embeddings=256)


def test_sync_holds_what_the_plan_says(tmp_path):
    plan = vllm_memory.sync_memory(CFG, "float32", bucket_bytes=BOUND)
    embed = 16_384 * 256 * 4
    assert plan.largest_tensor == embed == 16 * MiB > BOUND
    assert plan.staging == BOUND  # the embedding's 4 MiB row chunks fill the buffer exactly
    # one decoder layer: q 256x256, k and v 128x256, o 256x256, gate/up/down 512x256, 2 norms of 256, q/k norms of 64
    layer = (256 * 256 * 2 + 128 * 256 * 2 + 512 * 256 * 3 + 256 * 2 + 64 * 2) * 4
    assert plan.reload_copy == layer and plan.peak == BOUND + layer

    pool = VLLMReplicaPool.from_model(Qwen3ForCausalLM(CFG, rngs=nnx.Rngs(0)), tmp_path, 1, dtype="float32",
                                      max_model_len=256, kv_cache_memory_bytes=16 * MiB, max_num_seqs=8,
                                      sync_bucket_bytes=BOUND, measure_sync=True)
    try:
        assert pool.started[0]["jax_imported"] is False
        learner = Learner(Qwen3ForCausalLM(CFG, rngs=nnx.Rngs(1)), MeshConfig(data=1, fsdp=2, tensor=1),
                          MemoryConfig(attention_block=0, logit_chunk=0))
        pool.update_weights(learner.sync_model())
        sync = pool.last_sync
        replica = sync["replicas"][0]
        print(f"\nplan: staging {plan.staging} + reload copy {plan.reload_copy} = {plan.peak} bytes; measured: parent "
              f"torch {sync['parent_torch_peak_bytes']} + staging {sync['staging_bytes']}, replica torch "
              f"{replica['torch_peak_bytes']} (cloned {replica['cloned_bytes']}); {sync['buckets']} buckets")
        assert sync["staging_bytes"] == plan.staging and sync["chunked"] == ("model.embed_tokens.weight",)
        assert sync["buckets"] == 2 + 4  # a layer a bucket (two exceed 4 MiB), the norm with the second; 4 row chunks
        assert sync["parent_torch_peak_bytes"] <= plan.reload_copy  # fp32 to fp32: nothing but small temporaries
        assert replica["cloned_bytes"] == 0  # layer-aligned buckets: vLLM held no staging view past a bucket
        gate_up = 2 * 512 * 256 * 4  # the largest module vLLM materialises: gate_up_proj
        assert gate_up <= replica["torch_peak_bytes"] <= plan.reload_copy < embed

        prompt, completion = [5, 17, 900, 3000], [12, 7000, 15000, 2]
        seq = prompt + completion
        batch = {"input_ids": np.asarray([seq], np.int32), "attention_mask": np.ones((1, len(seq)), np.int32)}
        want = np.asarray(learner.logprobs(learner.params, batch, 
            grpo.GRPOConfig(kl_coef=0.0, sampling=SamplingConfig(temperature=1.0))))[0, len(prompt):]
        got = pool.score([prompt], [completion])[0]
        np.testing.assert_allclose(got, want, atol=1e-3)
    finally:
        pool.close()
