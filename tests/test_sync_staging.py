"""The weight sync's layout (bat_jax/rollout/sync_staging.py), GPUs by UUID (bat_jax/rollout/gpus.py), the replica
entry point without JAX (bat_jax/rollout/vllm_replica_worker.py) and the gather compiled once per bucket signature
(bat_jax/rollout/weight_sync.py). No vLLM, no GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bat_jax.models import mesh as mesh_lib
from bat_jax.rollout import gpus as gpus_lib
from bat_jax.rollout import weight_sync
from bat_jax.rollout.sync_staging import ALIGN, plan_sync

REPO = Path(__file__).resolve().parents[1]


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


def test_gpus_by_uuid_honour_a_restricted_cuda_visible_devices():
    smi = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa0000-0000)\n"
           "  MIG 1g.10gb     Device  0: (UUID: MIG-ffff)\n"
           "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb1111-1111)\n"
           "GPU 2: NVIDIA H100 80GB HBM3 (UUID: GPU-cccc2222-2222)\n"
           "GPU 3: NVIDIA H100 80GB HBM3 (UUID: GPU-dddd3333-3333)\n")
    physical = gpus_lib.parse_nvidia_smi(smi)
    assert [p[0] for p in physical] == [0, 1, 2, 3] and physical[2][2] == "GPU-cccc2222-2222"
    none = lambda: None  # noqa: E731 — no torch CUDA: the driver's list is filtered by CUDA_VISIBLE_DEVICES
    seen = gpus_lib.visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, lambda: physical, none)
    assert [(g.ordinal, g.uuid) for g in seen] == [(0, "GPU-cccc2222-2222"), (1, "GPU-dddd3333-3333")]
    mixed = gpus_lib.visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-dddd,1, 7,0"}, lambda: physical, none)
    assert [g.uuid for g in mixed] == ["GPU-dddd3333-3333", "GPU-bbbb1111-1111"]  # 7 names no GPU: the list ends
    assert len(gpus_lib.visible_gpus({}, lambda: physical, none)) == 4
    with pytest.raises(ValueError, match="matches 2 GPUs"):
        gpus_lib.resolve_visible(physical + [(4, "x", "GPU-dddd9999")], "GPU-dddd")
    # torch's own view wins when CUDA is available (its ordinals are the ones JAX and vLLM use)
    assert gpus_lib.visible_gpus({}, lambda: physical, lambda: [("H100", "GPU-eeee")])[0].uuid == "GPU-eeee"
    from bat_jax.rollout.vllm_replicas import pin_gpus, replica_env

    pinned = pin_gpus(2, seen)
    assert [replica_env(i, 2, pinned)["CUDA_VISIBLE_DEVICES"] for i in range(2)] == ["GPU-cccc2222-2222",
                                                                                     "GPU-dddd3333-3333"]
    with pytest.raises(ValueError, match="3 replicas but only GPUs"):
        pin_gpus(3, seen)


def test_replica_entry_point_imports_without_jax():
    """With `jax` blocked (an import of it raises), the replica's entry point and everything it loads import."""
    code = ("import sys; sys.modules['jax'] = None; sys.modules['flax'] = None\n"
            "import bat_jax.rollout.vllm_replica_worker as w, bat_jax.rollout.engine, bat_jax.rollout.sync_staging\n"
            "import bat_jax.rollout.inflight\n"
            "assert callable(w.serve)\n"
            "import importlib.util\n"
            "if importlib.util.find_spec('vllm') is not None:\n"
            "    import bat_jax.rollout.vllm_engine as e; assert e.VLLMEngineConfig(model_dir='x').dtype == 'float32'\n"
            "print('jax-free', sys.modules['jax'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("jax-free None")


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
