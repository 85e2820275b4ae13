"""Mesh construction, logical-axis mapping, and one sharded GRPO step: 1 device == 8 fake devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, PartitionSpec as P

from bat_jax.learn import grpo, optim, train_state
from bat_jax.models import mesh as mesh_lib
from bat_jax.models.mesh import MeshConfig

VOCAB, EMBED, MLP = 32, 16, 32


class TinyLM(nnx.Module):
    """Embedding + one residual MLP + unembedding, with the Qwen3 logical axis names."""

    def __init__(self, rngs):
        part = nnx.with_partitioning
        init = nnx.initializers.normal(0.5)
        self.embed = nnx.Embed(VOCAB, EMBED, embedding_init=part(init, ("vocab", "embed")), rngs=rngs)
        self.up = nnx.Linear(EMBED, MLP, use_bias=False, kernel_init=part(init, ("embed", "mlp")), rngs=rngs)
        self.down = nnx.Linear(MLP, EMBED, use_bias=False, kernel_init=part(init, ("mlp", "embed")), rngs=rngs)
        self.unembed = nnx.Linear(EMBED, VOCAB, use_bias=False, kernel_init=part(init, ("embed", "vocab")), rngs=rngs)

    def __call__(self, input_ids, attention_mask):
        x = self.embed(input_ids) * attention_mask[..., None].astype(jnp.float32)
        x = x + self.down(jax.nn.gelu(self.up(x)))
        return self.unembed(x).astype(jnp.float32)


def make_model():
    with nnx.use_eager_sharding(False):
        return TinyLM(nnx.Rngs(0))


def make_batch(b=8, t=12):
    rng = np.random.default_rng(3)
    ids = rng.integers(0, VOCAB, size=(b, t)).astype(np.int32)
    attn = np.ones((b, t), np.int32)
    attn[1, 9:] = 0
    loss = np.zeros((b, t), np.int32)
    for i in range(b):
        loss[i, 3 + i % 3 : 9] = 1
    loss[2, 5:7] = 0  # a tool response inside the trajectory
    adv, _ = grpo.group_advantages(rng.uniform(size=b), np.arange(b) // 4)
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": loss,
        "old_logprobs": rng.normal(-3.4, 0.2, size=(b, t)).astype(np.float32),
        "ref_logprobs": rng.normal(-3.4, 0.2, size=(b, t)).astype(np.float32),
        "advantages": adv,
    }


def one_grpo_step(config, devices, num_micro_batches=2):
    mesh = mesh_lib.build_mesh(config, devices)
    apply_fn, params, specs = train_state.split_model(make_model())
    shardings = mesh_lib.param_shardings(params, specs, mesh, config.logical_axis_rules)
    tx = optim.make_optimizer(optim.OptimizerConfig(learning_rate=1e-3, schedule="constant", warmup_ratio=0.0), 10)
    state_shardings = train_state.train_state_shardings(params, shardings, tx, mesh)
    state = train_state.create_train_state(params, tx, state_shardings)
    batch = make_batch()
    batch_shardings = {k: mesh_lib.batch_sharding(mesh, v.ndim) for k, v in batch.items()}
    step = train_state.make_train_step(
        grpo.make_grpo_loss(apply_fn, grpo.GRPOConfig(kl_coef=0.05)),
        grpo.grpo_normalizers,
        tx,
        state_shardings,
        batch_shardings,
        num_micro_batches=num_micro_batches,
    )
    old_leaf = state.params["embed"]["embedding"]
    state, metrics = step(state, jax.device_put(batch, batch_shardings))
    assert old_leaf.is_deleted()  # the state was donated
    return state, metrics, params


def test_axis_sizes_fill_and_errors():
    assert MeshConfig(fsdp=-1).axis_sizes(8) == (1, 8, 1)
    assert MeshConfig(fsdp=4, tensor=-1).axis_sizes(8) == (1, 4, 2)
    with pytest.raises(ValueError, match="needs 16 devices"):
        MeshConfig(fsdp=8, tensor=2).axis_sizes(8)
    with pytest.raises(ValueError, match="at most one axis"):
        MeshConfig(data=-1, fsdp=-1).axis_sizes(8)


def test_mesh_axes_are_auto():
    mesh = mesh_lib.build_mesh(MeshConfig(fsdp=8))
    assert mesh.shape == {"data": 1, "fsdp": 8, "tensor": 1}
    assert all(t == AxisType.Auto for t in mesh.axis_types)


def test_logical_to_mesh_spec():
    mesh = mesh_lib.build_mesh(MeshConfig(fsdp=4, tensor=2))
    assert mesh_lib.logical_to_mesh_spec(("vocab", "embed"), (32, 16), mesh) == P("tensor", "fsdp")
    assert mesh_lib.logical_to_mesh_spec(("embed", "head_dim"), (16, 8), mesh) == P("fsdp", None)
    # 6 is not divisible by fsdp=4 → replicated; a mesh axis is used at most once per array
    assert mesh_lib.logical_to_mesh_spec(("embed", "mlp"), (6, 8), mesh) == P(None, "tensor")
    assert mesh_lib.logical_to_mesh_spec(("heads", "mlp"), (4, 8), mesh) == P("tensor", None)
    assert mesh_lib.logical_to_mesh_spec(None, (3, 3), mesh) == P(None, None)
    with pytest.raises(ValueError, match="do not match"):
        mesh_lib.logical_to_mesh_spec(("embed",), (3, 3), mesh)


def test_sharded_grpo_step_same_on_1_and_8_devices():
    ref_state, ref_metrics, init = one_grpo_step(MeshConfig(fsdp=1), jax.devices()[:1])
    ref = jax.device_get(ref_state.params)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(init)))
    assert moved > 1e-4  # the step changed the parameters
    for cfg, emb_spec in [(MeshConfig(fsdp=8), P(None, "fsdp")), (MeshConfig(fsdp=4, tensor=2), P("tensor", "fsdp"))]:
        state, metrics, _ = one_grpo_step(cfg, None)
        assert state.params["embed"]["embedding"].sharding.spec == emb_spec
        assert state.opt_state[1][0].mu["embed"]["embedding"].sharding.spec == emb_spec
        assert int(state.step) == 1
        np.testing.assert_allclose(float(metrics["loss"]), float(ref_metrics["loss"]), rtol=1e-5, atol=1e-7)
        for a, b in zip(jax.tree.leaves(jax.device_get(state.params)), jax.tree.leaves(ref)):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
