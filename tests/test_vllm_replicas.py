"""vLLM data-parallel replicas (bat_jax/rollout/vllm_replicas.py): two engine processes give what one engine gives,
take a weight sync from the JAX learner through shared memory, serve a LoRA adapter and load each new one in place,
and a replica killed mid-sync fails the sync with its index named.

The model is test_vllm_engine's tiny fp32 Qwen3 (tied head, peaked logits; untied under the LoRA adapter); the
one-replica reference is an in-process `VLLMEngine` on the same checkpoint. The routing rules themselves are tested
without vLLM in tests/test_replica_router.py.
"""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

pytest.importorskip("vllm")

from bat_jax.learn import grpo  # noqa: E402
from bat_jax.learn.learner import Learner, MemoryConfig  # noqa: E402
from bat_jax.models.mesh import MeshConfig  # noqa: E402
from bat_jax.learn.optim import OptimizerConfig  # noqa: E402
from bat_jax.models import hf_io  # noqa: E402
from bat_jax.rollout.engine import SamplingParams  # noqa: E402
from bat_jax.rollout.sampling import SamplingConfig  # noqa: E402
from bat_jax.rollout.vllm_engine import VLLMEngine, VLLMEngineConfig  # noqa: E402
from bat_jax.rollout.vllm_replicas import VLLMReplicaPool  # noqa: E402

from doubles import (lora_reference_models, reference_logprobs, set_random_adapter,  # noqa: E402
                     vllm_reference_model)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SCORE = grpo.GRPOConfig(kl_coef=0.0, sampling=SamplingConfig(temperature=1.0))  # raw logprobs, as VLLMEngine.score


def _prompts(n, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 512, int(rng.integers(3, 20))).tolist() for _ in range(n)]


PROMPTS = _prompts(8, seed=5)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(2-replica pool, 1 in-process engine, model) on one checkpoint of `vllm_reference_model(1)`; the pool starts
    first (its processes start while this one loads its engine)."""
    model = vllm_reference_model(1)
    ckpt = hf_io.save_pretrained(model, tmp_path_factory.mktemp("replicas") / "ckpt")
    config = VLLMEngineConfig(model_dir=str(ckpt), dtype="float32", max_model_len=128,
                              kv_cache_memory_bytes=16 << 20, max_num_seqs=16, block_size=32)
    pool = VLLMReplicaPool(config, 2, start_timeout_s=600)
    single = VLLMEngine(config)
    yield pool, single, model
    pool.close()
    single.close()


def test_two_replicas_sample_what_one_engine_samples(setup):
    """Greedy and seeded (T = 1) rows over 2 replica processes: same tokens as one engine, logprobs within 1e-5;
    the 8 new episodes are spread 4 / 4 (fewest live tokens), and a turn continuing an episode goes back to the
    replica that served it."""
    pool, single, _ = setup
    assert len(set(pool.pids())) == 2 and os.getpid() not in pool.pids()
    assert [s["jax_imported"] for s in pool.started] == [False, False]  # replicas never import JAX
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    seeded = SamplingParams(temperature=1.0, max_new_tokens=12)
    before = list(pool.router.rows_per_replica)
    for params, seeds in ((greedy, None), (seeded, list(range(100, 108)))):
        want = single.generate(PROMPTS, params, seeds=seeds)
        got = pool.generate(PROMPTS, params, seeds=seeds)
        for i, (a, b) in enumerate(zip(want, got)):
            np.testing.assert_array_equal(a.token_ids, b.token_ids, err_msg=f"row {i}")
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, err_msg=f"row {i}")
    assert [a - b for a, b in zip(pool.router.rows_per_replica, before)] == [8, 8]
    assert any(c.logprobs.min() < -0.1 for c in got)  # seeded rows drew non-argmax tokens
    # episode continuation: the next turn of row 3 extends its prompt + completion
    first = pool.generate(PROMPTS[:4], seeded, seeds=[1, 2, 3, 4])
    starts = pool.router.started
    nxt = [list(p) + c.token_ids.tolist() + [7, 8] for p, c in zip(PROMPTS[:4], first)]
    pool.generate(nxt, seeded, seeds=[5, 6, 7, 8])
    assert pool.router.started == starts and pool.router.continued >= 4


def test_update_weights_refuses_while_calls_are_in_flight(setup):
    pool, _, _ = setup
    params = SamplingParams(temperature=1.0, max_new_tokens=100)
    worker = threading.Thread(target=pool.generate, args=([[1] * 20] * 8, params))
    worker.start()
    try:
        while pool._in_flight == 0 and worker.is_alive():
            pass
        with pytest.raises(RuntimeError, match="calls are in flight"):
            pool.update_weights(vllm_reference_model(1))
    finally:
        worker.join(120)


def test_grpo_step_then_sync_reaches_both_replicas(setup):
    """A JAX GRPO step (parameters fsdp-sharded over 2 devices) moves the learner's logprobs of a fixed completion;
    after one sync through shared memory both replicas score it within 1e-3 of the learner."""
    pool, single, model = setup
    prompt = PROMPTS[0]
    completion = single.generate([prompt], SamplingParams(temperature=1.0, max_new_tokens=16, seed=3))[0].token_ids
    seq = list(prompt) + completion.tolist()
    batch = {"input_ids": np.asarray([seq, seq], np.int32), "attention_mask": np.ones((2, len(seq)), np.int32),
             "loss_mask": np.asarray([[0] * len(prompt) + [1] * len(completion)] * 2, np.int32),
             "advantages": np.asarray([1.0, -0.5], np.float32)}
    learner = Learner(vllm_reference_model(1), MeshConfig(data=1, fsdp=2, tensor=1),
                      MemoryConfig(attention_block=0, logit_chunk=0))
    before = np.asarray(learner.logprobs(learner.params, batch, SCORE))[0, len(prompt):len(seq)]
    batch.update(old_logprobs=np.asarray(learner.logprobs(learner.params, batch, SCORE)))
    batch["ref_logprobs"] = batch["old_logprobs"]
    step, state = learner.grpo_block(SCORE, OptimizerConfig(learning_rate=1e-3, schedule="constant",
                                                            warmup_ratio=0.0), total_steps=1)
    state, _ = step(state, batch)
    learner.adopt(state)
    after = np.asarray(learner.logprobs(learner.params, batch, SCORE))[0, len(prompt):len(seq)]
    assert np.abs(after - before).max() > 0.05  # the step moved the policy
    version = pool.update_weights(learner.sync_model())
    assert version == pool.weight_version >= 1
    for replica in (0, 1):
        scored = pool.score([prompt], [completion], replica=replica)[0]
        np.testing.assert_allclose(scored, after, atol=1e-3, err_msg=f"replica {replica}")
    got = pool.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=4))[0]
    assert got.weight_version == version


@pytest.fixture(scope="module")
def lora_pool(tmp_path_factory):
    """(2-replica pool serving a rank-4 adapter over the frozen base, the JAX LoRA model, the base model, work dir)."""
    model, base = lora_reference_models()
    work = tmp_path_factory.mktemp("replicas_lora")
    pool = VLLMReplicaPool.from_model(model, work, 2, dtype="float32", max_model_len=128,
                                      kv_cache_memory_bytes=32 << 20, max_num_seqs=16, block_size=32)
    yield pool, model, base, work
    pool.close()


def test_two_replicas_serve_the_adapter_and_load_each_new_one_in_place(lora_pool):
    """Both replicas start on the model's adapter (version 0) and, after each of two syncs that change every A and B,
    sample with the new one: logprobs within 1e-3 of the JAX LoRA model's (1e-3: test_vllm_engine's tolerance), the
    adapter written once per version and only the newest directory left. Without the adapter the logprobs differ by
    more than 0.1, so a replica left on an older adapter fails the check."""
    pool, model, base, work = lora_pool
    assert pool.config.max_lora_rank == 8 and pool.weight_version == 0  # rank 4 fits vLLM's rank 8
    prompts = _prompts(6, seed=9)
    for version, seed in ((0, None), (1, 2), (2, 3)):
        if seed is not None:
            set_random_adapter(model, seed)
            assert pool.update_weights(model) == version == pool.weight_version
        before = list(pool.router.rows_per_replica)
        sampled = pool.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=8), seeds=list(range(6)))
        assert all(a > b for a, b in zip(pool.router.rows_per_replica, before))  # both replicas sampled rows
        completions = [c.token_ids for c in sampled]
        for i, (c, want) in enumerate(zip(sampled, reference_logprobs(model, prompts, completions))):
            np.testing.assert_allclose(c.logprobs, want, atol=1e-3, err_msg=f"version {version}, row {i}")
        plain = reference_logprobs(base, prompts, completions)
        assert max(float(np.abs(c.logprobs - p).max()) for c, p in zip(sampled, plain)) > 0.1
        assert {c.weight_version for c in sampled} == {version}
        assert sorted(p.name for p in (work / "adapters").iterdir()) == [f"v{version}"]
    with pytest.raises(ValueError, match="without an adapter"):
        pool.update_weights(vllm_reference_model(1, tied=False))
    assert pool.weight_version == 2


def test_replica_killed_mid_sync_fails_the_step_naming_it(setup):
    """Replica 1 is killed while the sync is streaming (when the tensor after the first buckets is read): the sync
    fails naming replica 1, and the pool then refuses rollouts instead of serving mixed weights."""
    pool, _, model = setup
    pool.sync_bucket_bytes = 64 << 10  # many buckets: the kill lands mid-stream
    from flax import nnx

    named = {".".join(map(str, k)): np.asarray(v.get_value()) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    victim = pool.pids()[1]
    names = list(named)  # the sync's order
    late = names[len(names) // 2]

    class KillsOnRead:
        """The array of one late tensor: reading it kills replica 1 (the sync has sent earlier buckets by then)."""

        def __init__(self, x):
            self.x, self.shape, self.dtype = x, x.shape, x.dtype

        def __array__(self, dtype=None, copy=None):
            os.kill(victim, signal.SIGKILL)
            return self.x

    named[late] = KillsOnRead(named[late])
    buckets = pool.sync_buckets
    with pytest.raises(RuntimeError, match=f"replica 1 \\(pid {victim}\\)"):
        pool.update_weights(named)
    assert pool.sync_buckets > buckets  # earlier buckets had reached both replicas: the kill came mid-sync
    assert pool._replicas[1].dead is not None and pool._replicas[0].dead is None
    with pytest.raises(RuntimeError, match="replica 1|different weights"):
        pool.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_new_tokens=2))
