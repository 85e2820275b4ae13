"""The one object that owns the mesh, the parameter shardings and the jitted train steps (t5x style).

`Learner` wraps an NNX policy: it splits it into a functional `apply_fn` + pure parameter dict, builds the
mesh from a `MeshConfig`, places parameters by their logical axis names, and builds one jitted, sharded,
donated step per objective (SFT cold start, GRPO block). It hands parameters back to the model object so a
rollout engine can take them (`engine.update_weights(learner.sync_model())`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx

from bat_jax.learn import grpo, sft
from bat_jax.learn import mesh as mesh_lib
from bat_jax.learn import train_state as ts
from bat_jax.learn.optim import OptimizerConfig, make_optimizer

BATCH_FIELDS_SFT = ("input_ids", "attention_mask", "loss_mask")
BATCH_FIELDS_GRPO = ("input_ids", "attention_mask", "loss_mask", "old_logprobs", "ref_logprobs", "advantages")


class Learner:
    """Owns the mesh, the parameters (pure dict, placed on the mesh) and the jitted steps.

    Args:
      model: the NNX policy (its parameters are read now and written back by `sync_model`).
      mesh_config: mesh shape; the mesh takes the first `data·fsdp·tensor` devices (all when one axis is -1).
    """

    def __init__(self, model: nnx.Module, mesh_config: mesh_lib.MeshConfig):
        self.model = model
        self.apply_fn, params, self.logical_specs = ts.split_model(model)
        sizes = [s for s in (mesh_config.data, mesh_config.fsdp, mesh_config.tensor)]
        devices = None if -1 in sizes else jax.devices()[: int(np.prod(sizes))]
        self.mesh = mesh_lib.build_mesh(mesh_config, devices)
        self.param_shardings = mesh_lib.param_shardings(params, self.logical_specs, self.mesh,
                                                        mesh_config.logical_axis_rules)
        self.params = jax.device_put(params, self.param_shardings)
        self._logprob_fns: dict[tuple, Callable] = {}

    # ----------------------------------------------------------------------------------------------------
    def _step(self, loss_fn, normalizer_fn, optimizer: OptimizerConfig, total_steps: int, fields,
              num_micro_batches: int) -> tuple[Callable, ts.TrainState]:
        tx = make_optimizer(optimizer, total_steps)
        shardings = ts.train_state_shardings(self.params, self.param_shardings, tx, self.mesh)
        batch_sh = {k: mesh_lib.batch_sharding(self.mesh, 2 if k != "advantages" else 1) for k in fields}
        step = ts.make_train_step(loss_fn, normalizer_fn, tx, shardings, batch_sh, num_micro_batches)
        # a fresh optimizer state for every block (paper: optimizer reset between rounds)
        params = jax.tree.map(lambda x: x.copy(), self.params)
        return step, ts.create_train_state(params, tx, shardings)

    def sft_block(self, config: sft.SFTConfig, total_steps: int) -> tuple[Callable, ts.TrainState]:
        """(jitted step, fresh TrainState) for the SFT cold start (loss on the target response only)."""
        return self._step(sft.make_sft_loss(self.apply_fn), sft.sft_normalizers, config.optimizer, total_steps,
                          BATCH_FIELDS_SFT, config.num_micro_batches)

    def grpo_block(self, config: grpo.GRPOConfig, optimizer: OptimizerConfig, total_steps: int,
                   num_micro_batches: int = 1) -> tuple[Callable, ts.TrainState]:
        """(jitted step, fresh TrainState) for one round's GRPO block."""
        return self._step(grpo.make_grpo_loss(self.apply_fn, config), grpo.grpo_normalizers, optimizer,
                          total_steps, BATCH_FIELDS_GRPO, num_micro_batches)

    def adopt(self, state: ts.TrainState) -> None:
        """Takes a block's final parameters as the learner's parameters."""
        self.params = state.params

    def logprobs(self, params: Any, batch: Mapping[str, np.ndarray], config: grpo.GRPOConfig,
                 rows_per_call: int = 4) -> np.ndarray:
        """`[B, T] float32` shifted logprobs of `batch['input_ids']` under `params` (the rollout transform),
        computed `rows_per_call` rows at a time (peak memory of a forward grows as rows × T²)."""
        key = config.sampling
        if key not in self._logprob_fns:
            self._logprob_fns[key] = grpo.make_logprob_fn(self.apply_fn, config)
        fn = self._logprob_fns[key]
        ids, mask = np.asarray(batch["input_ids"]), np.asarray(batch["attention_mask"])
        return np.concatenate([np.asarray(fn(params, ids[lo:lo + rows_per_call], mask[lo:lo + rows_per_call]))
                               for lo in range(0, len(ids), rows_per_call)], axis=0)

    def sync_model(self, params: Any | None = None) -> nnx.Module:
        """Writes `params` (default: the learner's) into the model object and returns it (for weight sync)."""
        param_state = nnx.state(self.model, nnx.Param)
        nnx.replace_by_pure_dict(param_state, jax.tree.map(jax.numpy.asarray, self.params if params is None else params))
        nnx.update(self.model, param_state)
        return self.model


def pad_batch(rows: list[Mapping[str, np.ndarray]], multiple: int, pad_to: int | None = None) -> dict[str, np.ndarray]:
    """Right-pads `[T_i]` per-row arrays to one `[B, T]` batch; B padded to a multiple of `multiple` with
    all-zero rows (no attention, no loss), T to `pad_to` or the longest row rounded up to a power of two."""
    if not rows:
        raise ValueError("pad_batch: no rows")
    longest = max(len(r["input_ids"]) for r in rows)
    t = pad_to or int(2 ** int(np.ceil(np.log2(max(longest, 2)))))
    if longest > t:
        raise ValueError(f"pad_batch: a row of {longest} tokens exceeds pad_to={t}")
    b = -(-len(rows) // multiple) * multiple
    out: dict[str, np.ndarray] = {}
    for key in rows[0]:
        sample = np.asarray(rows[0][key])
        if sample.ndim == 0:
            arr = np.zeros((b,), sample.dtype)
            for i, r in enumerate(rows):
                arr[i] = r[key]
        else:
            arr = np.zeros((b, t), sample.dtype)
            for i, r in enumerate(rows):
                arr[i, : len(r[key])] = r[key]
        out[key] = arr
    return out


