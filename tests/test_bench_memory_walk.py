"""launch/bench/memory_walk.py on the micro configuration (tests/micro_config.py) with its learner on 8 fake CPU
devices (fsdp 8): every phase's live bytes per device against the plan it prints. In a subprocess, so that
``jax.live_arrays()`` holds only the walk's arrays."""

import json
import os
import subprocess
import sys
from pathlib import Path

import micro_config
import pytest

REPO = Path(__file__).resolve().parents[1]

SCRIPT = r'''
import dataclasses, json, sys
from bat_jax.models.mesh import MeshConfig
from launch.bench import memory_walk
import micro_config

components = dataclasses.replace(micro_config.components(sys.argv[1]), mesh=MeshConfig(fsdp=8))
phases, planned = memory_walk.walk(components, rows=8, seq=32)
print(memory_walk.describe(phases, planned))
print("RESULT " + json.dumps({"phases": phases, "plan": planned}))
'''


def test_memory_walk_of_the_micro_run_stays_within_its_plan(tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(micro_config.seeded(tmp_path / "bank"))],
                          capture_output=True, text=True, timeout=900, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert "max / share" in proc.stdout and "dev 7" in proc.stdout
    phases, share, bucket = dict(out["phases"]), out["plan"]["share"], out["plan"]["bucket"]
    assert list(phases) == ["load", "sft step", "after sft", "grpo step", "after grpo", "evaluation sync"]
    assert all(len(per) == 8 for per in phases.values())
    # shares alive: the learner's parameters (1); during a step also the train state's parameters and AdamW's two
    # moments (4); after an evaluation's sync also the model object's copy placed from the host (2; on CPU a few
    # replicated tensors of that copy alias the host's numpy, which aliases device 0's buffer: 0.1 share of slack)
    for name, shares in (("load", 1), ("sft step", 4), ("after sft", 1), ("grpo step", 4), ("after grpo", 1),
                         ("evaluation sync", 2)):
        assert (shares - 0.1) * share <= min(phases[name]) and max(phases[name]) <= shares * share + bucket, (
            name, phases[name], share, bucket)


def test_scaled_config_divides_every_width_and_keeps_layers_and_heads():
    from launch.bench.compile_probe import MODELS
    from launch.bench.memory_walk import scaled_config

    c = scaled_config(MODELS["9b"], 16)
    assert (c.hidden_size, c.intermediate_size, c.vocab_size, c.head_dim, c.linear_key_head_dim,
            c.linear_value_head_dim) == (256, 768, 15_520, 16, 8, 8)
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.linear_num_value_heads,
            c.layer_types) == (32, 16, 4, 32, MODELS["9b"].layer_types)
    with pytest.raises(ValueError, match="head_dim=256"):
        scaled_config(MODELS["9b"], 512)


def test_abstract_share_of_the_scaled_9b_on_one_device_is_its_hand_counted_parameters():
    """Qwen3.5-9B / 16 (h 256, I 768, V 15,520; 24 Gated DeltaNet + 8 attention layers), counted by hand:
    embed + untied head 2·15,520·256 = 7,946,240; per layer 2 norms 512 + MLP 3·768·256 = 590,336; DeltaNet
    A_log 32 + dt_bias 32 + conv 512·4 + in_proj_a/b 2·32·256 + qkv 512·256 + z 256·256 + norm 8 + out 256·256
    = 280,648; attention q 512·256 + k/v 2·64·256 + o 256·256 + q/k norms 2·16 = 229,408; final norm 256.
    7,946,240 + 32·590,336 + 24·280,648 + 8·229,408 + 256 = 35,408,064 parameters, fp32."""
    from types import SimpleNamespace

    from bat_jax.learn.learner import MemoryConfig
    from bat_jax.models.mesh import MeshConfig
    from launch.bench.compile_probe import MODELS
    from launch.bench.memory_walk import abstract_share, scaled_config

    one = SimpleNamespace(mesh=MeshConfig(fsdp=1), memory=MemoryConfig())
    assert abstract_share(scaled_config(MODELS["9b"], 16), one) == 35_408_064 * 4


def test_describe_scales_each_phase_to_full_size_by_the_share_ratio():
    from launch.bench.memory_walk import describe

    mib = 1 << 20
    out = describe([("load", [mib, mib]), ("sft step", [4 * mib, 3 * mib])],
                   {"share": mib, "total": 2 * mib, "bucket": mib // 2}, full_share=3_000_000_000)
    assert "full size: share 3.00 GB (x 2861.02)" in out  # 3e9 / 2**20 = 2861.02
    load, step = out.splitlines()[2:]
    assert load.split()[-2:] == ["1.00", "3.00"] and step.split()[-2:] == ["4.00", "12.00"]  # 4 shares · 3 GB
