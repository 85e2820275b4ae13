"""LoRA checkpoints (bat_jax/checkpoint.py): the record of the frozen base beside the adapter-only steps (a resume over
another base is refused in one line), and a learner killed with SIGKILL mid-run resumes its adapter and Adam state to
the uninterrupted values."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from flax import nnx

from bat_jax.checkpoint import BASE_RECORD, BaseRecord, CheckpointConfig, Checkpointer, base_digest
from bat_jax.errors import ConfigValueError
from bat_jax.learn.learner import Learner
from bat_jax.models import lora
from bat_jax.models.configs import Qwen3Config
from bat_jax.models.mesh import MeshConfig
from bat_jax.models.qwen3 import Qwen3ForCausalLM

DENSE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16)
ONE = MeshConfig(data=1, fsdp=1, tensor=1)


def _lora_learner(change_one_weight=False):
    model = Qwen3ForCausalLM(Qwen3Config(**DENSE), rngs=nnx.Rngs(0))
    if change_one_weight:
        up = model.model.layers[1].mlp.up_proj.weight
        up[...] = up[...].at[3, 5].add(1e-3)
    lora.add_lora(model, lora.LoRAConfig(rank=4, alpha=8.0))
    return Learner(model, ONE)


def test_base_digest_is_sha256_over_sorted_paths_dtypes_shapes_and_bytes():
    tree = {"b": np.array([1, 2], np.int32), "a": {"w": np.array([1.5], np.float32)}}
    expected = hashlib.sha256(b"a.w float32 (1,)\n" + b"\x00\x00\xc0\x3f"
                              + b"b int32 (2,)\n" + b"\x01\x00\x00\x00\x02\x00\x00\x00").hexdigest()
    assert base_digest(tree) == "sha256:" + expected


def test_a_lora_run_resumes_over_its_base_and_is_refused_over_another(tmp_path):
    learner = _lora_learner()
    record = BaseRecord("/models/base", base_digest(learner.frozen))
    ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path / "ck")))
    ckpt.check_base(record)  # no step yet: recorded
    assert json.loads((tmp_path / "ck" / BASE_RECORD).read_text()) == {"path": "/models/base",
                                                                      "digest": record.digest}
    params = jax.tree.map(lambda x: x + 0.25, learner.params)  # a trained adapter
    ckpt.save(1, {"params": params})
    ckpt.close()

    # the same base (built again) resumes: its digest matches and the adapter comes back
    again = _lora_learner()
    ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path / "ck")))
    same = BaseRecord("/models/base", base_digest(again.frozen))
    assert same == record
    ckpt.check_base(same)
    abstract = {"params": jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                                       again.params)}
    restored = ckpt.restore(abstract, step=1).state["params"]
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), jax.device_get(params))

    # one base weight changed by 1e-3: refused, one line naming both paths and digests
    other = BaseRecord("/models/other", base_digest(_lora_learner(change_one_weight=True).frozen))
    assert other.digest != record.digest
    with pytest.raises(ConfigValueError) as e:
        ckpt.check_base(other)
    assert str(e.value) == (
        f"checkpoints under {tmp_path / 'ck'} hold a LoRA adapter trained over base '/models/base' ({record.digest}), "
        f"but this run's base '/models/other' is {other.digest}: bind policy.PolicyConfig.checkpoint_dir to that "
        "base or use another run directory")
    with pytest.raises(ConfigValueError, match="this run trains every weight"):
        ckpt.check_base(None)  # a full-weight run over the adapter's steps
    assert json.loads((tmp_path / "ck" / BASE_RECORD).read_text())["digest"] == record.digest  # unchanged
    ckpt.close()
