"""The weight sync's layout (bat_jax/rollout/sync_staging.py) and the gather compiled once per bucket signature
(bat_jax/rollout/weight_sync.py). No vLLM, no GPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bat_jax.models import mesh as mesh_lib
from bat_jax.rollout import weight_sync
from bat_jax.rollout.sync_staging import ALIGN, plan_sync


def test_plan_keeps_layers_whole_and_chunks_what_exceeds_the_bound():
    specs = [("model.embed_tokens.weight", (100, 8), "float32"),  # 3200 B > 1024: row chunks of 32 rows
             ("model.layers.0.a.weight", (10, 10), "bfloat16"),  # 200 B
             ("model.layers.0.b.weight", (10, 10), "float32"),  # 400 B
             ("model.layers.1.a.weight", (10, 20), "bfloat16"),  # 400 B: layer 1 = 800 B, cannot join layer 0
             ("model.layers.1.b.weight", (10, 10), "float32"),
             ("model.norm.weight", (10,), "float32")]
    plan = plan_sync(specs, 1024)
    assert [[p.name.rsplit(".", 2)[0] for p in b] for b in plan.buckets[:3]] == [
        ["model.layers.0", "model.layers.0"], ["model.layers.1", "model.layers.1"], ["model"]]
    assert [[p.offset for p in b] for b in plan.buckets[:2]] == [[0, 256], [0, 512]]
    assert plan.buckets[2] == [plan.buckets[2][0]] and plan.buckets[2][0].name == "model.norm.weight"
    chunks = plan.buckets[3:]
    assert [(p.row0, p.shape) for (p,) in chunks] == [(0, (32, 8)), (32, (32, 8)), (64, (32, 8)), (96, (4, 8))]
    assert plan.chunked == ("model.embed_tokens.weight",) and plan.tensors == 6
    assert plan.staging_bytes == 1024 and plan.largest_layer_bytes == 800
    assert all(p.offset % ALIGN == 0 and p.offset + p.nbytes <= 1024 for b in plan.buckets for p in b)
    with pytest.raises(ValueError, match=r"one row of tensor 'w' \(2, 1000\) is 4000 bytes"):
        plan_sync([("w", (2, 1000), "float32")], 1024)


def test_gather_compiles_once_per_bucket_signature_across_syncs():
    """Two syncs of the same fsdp-sharded tensors: the first compiles one gather per bucket signature (three layer
    buckets of the same shapes share one), the second compiles nothing."""
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, _secs, **_: compiles.append(event) if event == "/jax/core/compile/backend_compile_duration"
        else None)
    mesh = mesh_lib.build_mesh(mesh_lib.MeshConfig(fsdp=8))
    sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
    named = [(f"model.layers.{i}.mlp.up_proj.weight", jax.device_put(jnp.full((16, 8), i, jnp.float32), sh))
             for i in range(3)] + [("model.embed_tokens.weight", jax.device_put(jnp.ones((64, 8), jnp.float32), sh))]
    weight_sync._GATHERS.clear()  # earlier tests may have built a gather of the same signature
    plan = weight_sync.sync_plan(named, "bfloat16", 256)  # a layer a bucket (256 B each); embedding in 4 chunks
    assert len(plan.buckets) == 3 + 4
    builds = weight_sync.GATHER_BUILDS[0]
    counts = []
    for _ in range(2):
        before = len(compiles)
        for pieces, values in weight_sync.stream_pieces(dict(named), plan):
            for p, v in zip(pieces, values):
                rows = slice(None) if p.row0 is None else slice(p.row0, p.row0 + p.shape[0])
                np.testing.assert_array_equal(np.asarray(v, np.float32), np.asarray(dict(named)[p.name])[rows])
                assert v.dtype == jnp.bfloat16 and v.sharding.is_fully_replicated
        counts.append(len(compiles) - before)
    assert counts == [5, 0]  # the layers share one signature; each embedding chunk (its rows) is one
    assert weight_sync.GATHER_BUILDS[0] - builds == 5
