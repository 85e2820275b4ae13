"""Weight sync to vLLM streams bf16 buckets of at most 1 GB; needs torch, not vLLM."""

import jax
import jax.numpy as jnp
import numpy as np
import torch

from bat_jax.models import mesh as mesh_lib
from bat_jax.rollout import weight_sync as ve


def test_plan_buckets_respects_the_byte_limit_in_the_transfer_dtype():
    items = [(f"t{i}", np.zeros((n,), np.float32), "bfloat16") for i, n in enumerate([10, 20, 30, 100, 5])]
    # 2 bytes per element: 20 + 40 + 60 | 200 (alone, larger than the limit) | 10
    assert ve.plan_buckets(items, max_bytes=120) == [[0, 1, 2], [3], [4]]
    assert ve.sync_dtype("model.layers.0.linear_attn.A_log", "bfloat16") == "float32"
    assert ve.sync_dtype("model.layers.0.linear_attn.norm.weight", "bfloat16") == "float32"
    assert ve.sync_dtype("model.layers.0.input_layernorm.weight", "bfloat16") == "bfloat16"


def test_stream_casts_on_the_mesh_then_gathers_one_bucket_at_a_time():
    mesh = mesh_lib.build_mesh(mesh_lib.MeshConfig(fsdp=8))
    sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
    w = jax.device_put(jnp.arange(128, dtype=jnp.float32).reshape(32, 4) / 7.0, sh)
    a_log = jax.device_put(jnp.linspace(-3.0, 3.0, 8, dtype=jnp.float32), sh)
    named = [("model.layers.0.mlp.up_proj.weight", w), ("model.layers.0.linear_attn.A_log", a_log),
             ("model.norm.weight", np.full(3, 0.5, np.float32))]
    stream = ve.stream_torch_weights(named, "bfloat16", max_bytes=256)  # bucket 1: w (256 B); bucket 2: the rest
    name, t = next(stream)  # lazily produced: only the first bucket is gathered so far
    assert name == "model.layers.0.mlp.up_proj.weight" and t.dtype == torch.bfloat16 and tuple(t.shape) == (32, 4)
    np.testing.assert_array_equal(t.float().numpy(), np.asarray(w.astype(jnp.bfloat16).astype(jnp.float32)))
    rest = dict(stream)
    assert rest["model.layers.0.linear_attn.A_log"].dtype == torch.float32  # kept float32, bit-exact
    np.testing.assert_array_equal(rest["model.layers.0.linear_attn.A_log"].numpy(), np.asarray(a_log))
    assert rest["model.norm.weight"].dtype == torch.bfloat16


def test_host_weights_cast_on_the_mesh_before_the_host_sees_them(monkeypatch):
    """A multi-host engine's weights (`host_weights`): each fsdp-sharded float32 tensor is cast to bf16 on its devices
    (sharding kept), so what reaches the host is bf16 (2 bytes a value, not 4); the DeltaNet float32 tensors stay
    float32. On the host the bf16 array becomes a torch tensor by its bits: no cast, no copy, however many replicas
    read it."""
    mesh = mesh_lib.build_mesh(mesh_lib.MeshConfig(fsdp=8))
    sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
    w = jax.device_put(jnp.arange(128, dtype=jnp.float32).reshape(32, 4) / 7.0, sh)
    a_log = jax.device_put(jnp.linspace(-3.0, 3.0, 8, dtype=jnp.float32), sh)
    fetched = []
    real_get = jax.device_get
    monkeypatch.setattr(jax, "device_get", lambda x: fetched.append((x.dtype.name, x.sharding)) or real_get(x))
    out = ve.host_weights({"model.layers.0.mlp.up_proj.weight": w, "model.layers.0.linear_attn.A_log": a_log,
                           "model.norm.weight": np.full(3, 0.5, np.float32)}, "bfloat16")
    assert [d for d, _ in fetched] == ["bfloat16", "float32"]  # the numpy norm is cast on the host, once
    assert fetched[0][1] == sh  # cast where the shards are
    up = out["model.layers.0.mlp.up_proj.weight"]
    assert up.dtype.name == "bfloat16" and up.nbytes == 128 * 2
    np.testing.assert_array_equal(up.astype(np.float32), np.asarray(w.astype(jnp.bfloat16), np.float32))
    assert out["model.layers.0.linear_attn.A_log"].dtype == np.float32
    assert out["model.norm.weight"].dtype.name == "bfloat16"
    t = ve.to_torch(up, "bfloat16")
    assert t.dtype == torch.bfloat16 and t.data_ptr() == up.ctypes.data  # the host array's bytes, as they are
    np.testing.assert_array_equal(t.float().numpy(), up.astype(np.float32))
