"""LoRA checkpoints (bat_jax/checkpoint.py): the record of the frozen base beside the adapter-only steps (a resume over
another base is refused in one line), and a learner killed with SIGKILL mid-run resumes its adapter and Adam state to
the uninterrupted values."""

import hashlib
import json
import os
import signal
import subprocess
import sys

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


# ------------------------------------------------------------------------------ kill -9 and resume, LoRA on

STEPS, SAVE_EVERY = 4, 2
OPT = dict(learning_rate=1e-2, warmup_ratio=0.0)


def _batches():
    """STEPS SFT batches of 4 random rows (prompt, response, end of turn) padded to 12 tokens."""
    from bat_jax.learn import sft
    from bat_jax.learn.batching import pad_batch

    rng = np.random.default_rng(7)
    return [pad_batch([sft.build_sft_example(rng.integers(8, 64, 3).tolist(), rng.integers(8, 64, 5).tolist(),
                                             end_of_turn_id=6, max_seq_len=12) for _ in range(4)],
                      multiple=1, pad_to=12) for _ in range(STEPS)]


def _block(learner):
    from bat_jax.learn import sft
    from bat_jax.learn.optim import OptimizerConfig

    config = sft.SFTConfig(optimizer=OptimizerConfig(**OPT), global_batch_size=4, total_steps=STEPS)
    return learner.sft_block(config, STEPS)


def killed_run(directory: str) -> None:
    """The child process: records the base, saves adapter + Adam state at step 2, takes step 3, then SIGKILLs itself
    while it waits for batch 4."""
    from bat_jax.learn import train_state as ts

    learner = _lora_learner()
    ckpt = Checkpointer(CheckpointConfig(directory=directory))
    ckpt.check_base(BaseRecord("tiny", base_digest(learner.frozen)))
    step, state = _block(learner)

    def batches():
        for i, batch in enumerate(_batches()):
            if i == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            yield batch

    ts.run_steps(step, state, batches(), num_steps=STEPS, checkpointer=ckpt, checkpoint_every=SAVE_EVERY)


def test_a_lora_learner_killed_mid_run_resumes_to_the_uninterrupted_adapter_and_adam_state(tmp_path):
    from bat_jax.learn import train_state as ts

    directory = str(tmp_path / "ck")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), directory], capture_output=True, text=True,
                          timeout=600, cwd=repo, env=dict(os.environ, PYTHONPATH=repo))  # this checkout's bat_jax
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]

    learner = _lora_learner()
    step, fresh = _block(learner)
    uninterrupted, _ = ts.run_steps(step, fresh, _batches(), num_steps=STEPS)

    resumed_learner = _lora_learner()  # a new learner, as a relaunched process builds it
    ckpt = Checkpointer(CheckpointConfig(directory=directory))
    assert ckpt.all_steps() == [2]  # step 3 was taken but never saved
    ckpt.check_base(BaseRecord("tiny", base_digest(resumed_learner.frozen)))
    step, fresh = _block(resumed_learner)
    shardings = jax.tree.map(lambda x: x.sharding, fresh)
    restored = ckpt.restore(ts.abstract_train_state(fresh, shardings))
    assert restored.step == 2 and restored.extra == {"data_cursor": 2}
    resumed, cursor = ts.run_steps(step, restored.state, _batches()[2:], num_steps=STEPS - 2, data_cursor=2)
    assert cursor == STEPS and int(resumed.step) == STEPS
    ckpt.close()
    moments = [x for x in jax.tree.leaves(resumed.opt_state) if x.ndim > 0]
    assert sum(x.size for x in moments) == 2 * sum(x.size for x in jax.tree.leaves(resumed.params))  # adapter only
    for got, want in zip(jax.tree.leaves(jax.device_get(resumed)), jax.tree.leaves(jax.device_get(uninterrupted)),
                         strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert any(np.abs(np.asarray(a) - np.asarray(b)).max() > 1e-3  # the adapter did move from its start
               for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(learner.params)))


if __name__ == "__main__":  # the killed child of the test above
    killed_run(sys.argv[1])
