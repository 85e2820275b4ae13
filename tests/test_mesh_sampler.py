"""The JAX sampler on a mesh (bat_jax/rollout/mesh_sampler.py) on the 8 fake CPU devices of conftest: the same
trajectories as on one device, and a weight sync from the learner's fsdp-sharded parameters that stays on device.

Tiny hybrid Qwen3.5 (test_jax_sampler.tiny_model: a Gated DeltaNet layer and an attention layer, 4 heads, 2 KV
heads), so both cache kinds are split over the mesh."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bat_jax.learn.learner import Learner
from bat_jax.models.mesh import MeshConfig
from bat_jax.rollout.continuous_batching import ContinuousBatchingSampler
from bat_jax.rollout.engine import SamplingParams
from bat_jax.rollout.jax_sampler import JaxSampler
from bat_jax.rollout.mesh_sampler import SamplerMeshConfig

from doubles import tiny_model

KW = dict(min_prompt_bucket=16, min_batch_bucket=8)
PARAMS = SamplingParams(temperature=0.7, max_new_tokens=16, stop_token_ids=(46,))


def _prompts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 256, int(rng.integers(3, 15))).tolist() for _ in range(n)]


PROMPTS = _prompts(8)
BUDGETS = [16, 5, 12, 16, 9, 16, 3, 14]
SEEDS = [11, 12, 13, 14, 15, 16, 17, 18]


def _assert_same(want, got):
    for i, (a, b) in enumerate(zip(want, got)):
        np.testing.assert_array_equal(a.token_ids, b.token_ids, err_msg=f"row {i}")
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0, err_msg=f"row {i}")
        assert a.finish_reason == b.finish_reason, i


@pytest.fixture(scope="module")
def model():
    return tiny_model("qwen3_5")


@pytest.fixture(scope="module")
def reference(model):
    """One device: the unsharded sampler's trajectories."""
    return JaxSampler(model, **KW).generate(PROMPTS, PARAMS, max_new_tokens=BUDGETS, seeds=SEEDS)


@pytest.mark.parametrize("tensor", [1, 2])
def test_sharded_sampler_gives_the_one_device_trajectories(model, reference, tensor):
    """Rows split over 8 devices (tensor 1: weights replicated) or over 4 data groups of 2 (tensor 2: heads, MLP and
    vocabulary split): same ids and finish reasons as one device, logprobs within 1e-5."""
    sampler = JaxSampler(model, **KW, mesh=SamplerMeshConfig(tensor=tensor))
    assert sampler.placement.data == 8 // tensor
    specs = {leaf.sharding.spec for leaf in jax.tree.leaves(sampler._state)}
    if tensor == 1:
        assert all(a is None for s in specs for a in s)  # every weight replicated
    else:
        assert any("tensor" in s for s in specs)  # some weights are split
    got = sampler.generate(PROMPTS, PARAMS, max_new_tokens=BUDGETS, seeds=SEEDS)
    _assert_same(reference, got)
    assert sum(len(c.token_ids) for c in got) > 40 and {c.finish_reason for c in got} == {"stop", "length"}


def test_continuous_batching_on_the_mesh(model, reference):
    """The continuous batcher's 8 slots split over the 8 devices (one row each): the rows of two concurrent calls
    join the running batch and sample what one device's `generate` samples."""
    import threading

    seen = []

    class Recording(ContinuousBatchingSampler):
        def _step(self):  # the running cache's placement after every decode chunk
            super()._step()
            if self._cache is not None:
                seen.extend([self._cache.layers[0].state, self._cache.layers[1].k])

    engine = Recording(JaxSampler(model, **KW, mesh=SamplerMeshConfig()), slots=8, chunk_steps=4, admit_rows=8,
                       slot_step=64, min_prompt=16)
    out = {}

    def call(lo, hi):
        out[lo] = engine.generate(PROMPTS[lo:hi], PARAMS, max_new_tokens=BUDGETS[lo:hi], seeds=SEEDS[lo:hi])

    threads = [threading.Thread(target=call, args=(lo, lo + 4)) for lo in (0, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    _assert_same(reference, out[0] + out[4])
    # each device holds one slot of the DeltaNet state and of the attention K cache
    assert seen and all(x.sharding.shard_shape(x.shape)[0] == 1 and len(x.sharding.device_set) == 8 for x in seen)
    assert engine.chunks >= 4  # rows ran over several chunks
    with pytest.raises(ValueError, match="slots = 6 is not a multiple"):
        ContinuousBatchingSampler(engine.sampler, slots=6)


def test_sync_from_the_learner_stays_on_device(model):
    """The learner's parameters (fsdp = 8) change; the mesh sampler takes them with one jitted cast + reshard under
    a transfer guard that refuses every host transfer (the guard is live: a host array placed under it raises),
    its compiled program has no host transfer, and it then samples what a one-device sampler given the same
    parameters samples. bf16 rollout weights keep the DeltaNet float32 tensors in float32."""
    learner = Learner(model, MeshConfig(fsdp=8))
    assert any("fsdp" in leaf.sharding.spec for leaf in jax.tree.leaves(learner.params))
    sampler = JaxSampler(model, **KW, mesh=SamplerMeshConfig(tensor=2))
    learner.params = jax.jit(lambda p: jax.tree.map(lambda x: x * 1.25, p))(learner.params)  # a new policy
    synced = learner.sync_model()
    with jax.transfer_guard("disallow_explicit"):
        with pytest.raises(Exception, match="Disallowed host-to-device"):
            jax.device_put(np.ones(8, np.float32), learner.param_shardings["model"]["norm"]["weight"])
        version = sampler.update_weights(synced)
    assert version == 1
    leaves = jax.tree.leaves(nnx.state(synced))
    hlo = sampler.placement._reshard.lower(leaves).compile().as_text().lower()
    for op in ("infeed", "outfeed", " send(", " recv(", "host"):
        assert op not in hlo, op
    plain = JaxSampler(tiny_model("qwen3_5"), **KW)
    plain.update_weights(nnx.state(synced))
    _assert_same(plain.generate(PROMPTS, PARAMS, max_new_tokens=BUDGETS, seeds=SEEDS),
                 sampler.generate(PROMPTS, PARAMS, max_new_tokens=BUDGETS, seeds=SEEDS))
    bf16 = JaxSampler(model, **KW, mesh=SamplerMeshConfig(param_dtype="bfloat16"))
    dtypes = {".".join(map(str, p)): v.get_value().dtype for p, v in nnx.to_flat_state(bf16._state)}
    assert dtypes["model.layers.0.linear_attn.A_log"] == jnp.float32
    assert dtypes["model.layers.0.linear_attn.norm.weight"] == jnp.float32
    assert dtypes["model.embed_tokens.weight"] == jnp.bfloat16
    assert dtypes["model.layers.1.self_attn.q_proj.weight"] == jnp.bfloat16


def test_bad_mesh_config_is_refused(model):
    with pytest.raises(ValueError, match="tensor = 3 does not divide 8"):
        JaxSampler(model, mesh=SamplerMeshConfig(tensor=3))
    with pytest.raises(ValueError, match="devices = 16 but only 8"):
        JaxSampler(model, mesh=SamplerMeshConfig(devices=16))
    with pytest.raises(ValueError, match="param_dtype"):
        SamplerMeshConfig(param_dtype="int8")


def test_tpu_rollout_include_binds_the_mesh_sampler():
    """bicurl_9b.gin + an 8-chip mesh + rollout/mesh_sampler.gin: the JAX sampler on every device, bf16 weights
    replicated, the GRPO step's 32 rollouts in one running batch; the GPU files keep vLLM, one replica per GPU."""
    import gin

    from bat_jax import launch
    from bat_jax.bicurl import experiment

    launch.parse_gin(["bicurl_9b.gin", "mesh/tpu_v5e_8.gin", "rollout/mesh_sampler.gin"], [])
    c = gin.get_configurable(experiment.Components)()
    assert (c.engine.kind, c.engine.sampler_mesh, c.engine.slots) == ("jax", SamplerMeshConfig(param_dtype="bfloat16"), 32)
    for name in ("bicurl_9b.gin", "bicurl_4b.gin"):
        launch.parse_gin([name], [])
        c = gin.get_configurable(experiment.Components)()
        assert (c.engine.kind, c.engine.vllm_replicas, c.engine.sampler_mesh) == ("vllm", 0, None)
