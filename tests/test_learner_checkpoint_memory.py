"""A checkpoint loaded for training (bat_jax/learn/learner.py `checkpoint_sharding`, bat_jax/policy.py
`build_policy`) lands on the learner's mesh, shard by shard: no device ever holds more than its share.

Runs in a subprocess on 8 fake CPU devices (``--xla_force_host_platform_device_count=8``) so that
``jax.live_arrays()`` sees only this process's arrays. Live bytes per device = the bytes of every device buffer of a
live array there (`launch/bench/memory_walk.live_bytes`). The bound per device is its planned share (the parameter shards `Learner.param_shardings` puts there,
params / fsdp plus the replicated norms) plus one bucket (the largest tensor). The old load (the whole checkpoint on
device 0, kept by the model object) is measured in the same process and passes that bound almost three times over.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCRIPT = r'''
import gc, json, sys
import jax, numpy as np
from flax import nnx
from bat_jax.learn.learner import Learner, checkpoint_sharding
from bat_jax.models import hf_io
from bat_jax.models.configs import Qwen3Config
from bat_jax.models.mesh import MeshConfig
from bat_jax.models.qwen3 import Qwen3ForCausalLM
from bat_jax.models.tokenizer import TINY_TOKENIZER_DIR
from bat_jax.policy import PolicyConfig, build_policy
from launch.bench.memory_walk import live_bytes as live

ckpt = sys.argv[1]
config = Qwen3Config(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False)
hf_io.save_pretrained(Qwen3ForCausalLM(config, rngs=nnx.Rngs(0)), ckpt, tokenizer_dir=TINY_TOKENIZER_DIR)
gc.collect()


mesh = MeshConfig(fsdp=8)
policy = build_policy(PolicyConfig(checkpoint_dir=ckpt), checkpoint_sharding(mesh))
learner = Learner(policy.model, mesh)
out = {"new": live()}
leaves = jax.tree.leaves(learner.params)
shardings = jax.tree.leaves(learner.param_shardings)
out["placed_as_planned"] = all(x.sharding == s for x, s in zip(leaves, shardings))
share = sum(int(np.prod(s.shard_shape(x.shape))) * x.dtype.itemsize for x, s in zip(leaves, shardings))
out["share"], out["bucket"], out["total"] = share, max(x.nbytes for x in leaves), sum(x.nbytes for x in leaves)
model_leaves = [v.get_value() for _, v in nnx.to_flat_state(nnx.state(policy.model, nnx.Param))]
out["model_holds_the_learners_arrays"] = all(a is b for a, b in zip(model_leaves, leaves))
del leaves, model_leaves
learner.params = jax.tree.map(lambda x: x * 1, learner.params)  # what SFT's adopt does: new parameters
gc.collect()
out["after_update"] = live()
del policy, learner
gc.collect()
out["empty"] = live()
old = build_policy(PolicyConfig(checkpoint_dir=ckpt))  # the old load: the whole checkpoint on device 0
out["old"] = live()
Learner(old.model, mesh)  # placed on the mesh; the model object then holds the placed arrays, not its own
gc.collect()
out["old_after_learner"] = live()
print("RESULT " + json.dumps(out))
'''


def test_checkpoint_loads_shard_by_shard_within_each_devices_share(tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "ckpt")], capture_output=True, text=True,
                          timeout=600, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    share, bucket, total = out["share"], out["bucket"], out["total"]
    # hand check of the plan: 2 layers x (q 128x128, k 128x64, v 128x64, o 128x128, 3 MLP 128x256, two 128 norms,
    # q / k norms of 32) + embed + lm_head 1024x128 + final norm, fp32; everything with an 'embed' axis is split 8
    # ways on it, the q / k norms (head_dim) are replicated
    split = 2 * (2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 256 + 2 * 128) + 2 * 1024 * 128 + 128
    replicated = 2 * 2 * 32
    assert total == 4 * (split + replicated) == 2_231_296 and share == 4 * (split // 8 + replicated) == 279_360
    assert bucket == 4 * 1024 * 128
    bound = share + bucket
    assert out["placed_as_planned"] and out["model_holds_the_learners_arrays"]
    assert out["empty"] == [0] * 8
    for phase in ("new", "after_update", "old_after_learner"):
        assert max(out[phase]) <= bound, (phase, out[phase], bound)
        assert min(out[phase]) >= share, (phase, out[phase], share)  # every device holds its share
    assert out["old"][0] == total and out["old"][0] > 2 * bound  # the old load breaks the bound on device 0
