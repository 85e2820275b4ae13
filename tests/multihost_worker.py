"""One process of the multi-host GRPO test (tests/test_distributed.py); also the single-process reference.

    python tests/multihost_worker.py OUT_PREFIX MESH[,MESH]   (MESH: 'fsdp' = MeshConfig(fsdp=-1),
                                                               'fsdp_tensor' = MeshConfig(fsdp=-1, tensor=2))

Reads JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID (bat_jax.learn.distributed), builds a
Learner on the global mesh, runs two GRPO steps (2 micro-batches each) on the global batch of `make_batch`
(step 1 fed as per-process rows, step 2 as the whole host batch on every process) and writes the initial and
updated parameters (whole), the loss, the logprobs and the rows it fed to OUT_PREFIX<MESH>.npz, one per mesh.
"""

import sys

import numpy as np

from bat_jax.learn import distributed

distributed.initialize(distributed.DistributedConfig.from_env(initialization_timeout_s=120))

import jax  # noqa: E402
from flax import nnx  # noqa: E402

from bat_jax.learn import grpo  # noqa: E402
from bat_jax.learn.grpo import BATCH_FIELDS  # noqa: E402
from bat_jax.learn.learner import Learner  # noqa: E402
from bat_jax.models.mesh import MeshConfig, batch_sharding  # noqa: E402
from bat_jax.learn.optim import OptimizerConfig  # noqa: E402
from bat_jax.models.configs import Qwen3Config  # noqa: E402
from bat_jax.models.qwen3 import Qwen3ForCausalLM  # noqa: E402

MESHES = {"fsdp": MeshConfig(fsdp=-1), "fsdp_tensor": MeshConfig(fsdp=-1, tensor=2)}
VOCAB = 64


def make_batch(b: int = 8, t: int = 16) -> dict[str, np.ndarray]:
    """A fixed GRPO batch: two groups of 4, one padded row, a masked tool span."""
    rng = np.random.default_rng(3)
    ids = rng.integers(0, VOCAB, size=(b, t)).astype(np.int32)
    attn = np.ones((b, t), np.int32)
    attn[1, 11:] = 0
    loss = np.zeros((b, t), np.int32)
    for i in range(b):
        loss[i, 3 + i % 3: 11] = 1
    loss[2, 5:7] = 0
    adv, _ = grpo.group_advantages(rng.uniform(size=b), np.arange(b) // 4)
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss,
            "old_logprobs": rng.normal(-4.1, 0.2, size=(b, t)).astype(np.float32),
            "ref_logprobs": rng.normal(-4.1, 0.2, size=(b, t)).astype(np.float32),
            "advantages": np.asarray(adv, np.float32)}


def run(out: str, mesh_name: str) -> None:
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    learner = Learner(Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0)), MESHES[mesh_name])
    step, state = learner.grpo_block(grpo.GRPOConfig(kl_coef=0.05),
                                     OptimizerConfig(learning_rate=1e-2, schedule="constant", warmup_ratio=0.0),
                                     total_steps=10, num_micro_batches=2)
    init = learner.host_copy(learner.params)  # sharded over both processes: a collective gather
    batch = make_batch()
    mine = distributed.local_rows(batch, learner.mesh)  # this process's rows only
    rows = distributed.process_rows(batch_sharding(learner.mesh, 2), len(batch["input_ids"]))
    gbatch = distributed.global_batch({k: mine[k] for k in BATCH_FIELDS}, learner.mesh, len(batch["input_ids"]))
    state, _ = step(state, gbatch)  # step 1: each process feeds its own rows
    state, metrics = step(state, {k: batch[k] for k in BATCH_FIELDS})  # step 2: every process, the host batch
    params = distributed.host_gather(state.params)
    learner.adopt(state)
    logprobs = learner.logprobs(learner.params, batch, grpo.GRPOConfig())
    flat = {f"{kind}/" + "/".join(str(getattr(k, "key", k)) for k in path): v
            for kind, tree in (("param", params), ("init", init))
            for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]}
    np.savez(out, loss=np.asarray(distributed.host_gather(metrics["loss"])), rows=rows, logprobs=logprobs,
             addressable=np.asarray(gbatch["input_ids"].is_fully_addressable),
             summary=np.asarray(list(distributed.process_summary().values())),
             **flat)


if __name__ == "__main__":
    for name in sys.argv[2].split(","):
        run(f"{sys.argv[1]}{name}.npz", name)
