"""launch/bench/memory_walk.py on the micro configuration (tests/micro_config.py) with its learner on 8 fake CPU
devices (fsdp 8): every phase's live bytes per device against the plan it prints. In a subprocess, so that
``jax.live_arrays()`` holds only the walk's arrays."""

import json
import os
import subprocess
import sys
from pathlib import Path

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
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "bank")], capture_output=True, text=True,
                          timeout=900, env=env, cwd=REPO)
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
