"""The one object that owns the mesh, the parameter shardings and the jitted train steps (t5x style).

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from bat_jax.learn import distributed, grpo, sft
from bat_jax.models import mesh as mesh_lib
from bat_jax.learn import train_state as ts
from bat_jax.learn.optim import OptimizerConfig, make_optimizer
from bat_jax.models import lora
from bat_jax.models.causal_lm import REMAT_POLICIES, ForwardOptions

BATCH_FIELDS_SFT = ("input_ids", "attention_mask", "loss_mask")


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
    """How the learner spends accelerator memory; none of it changes the computed values beyond round-off.

    Attributes:
      remat: per-decoder-layer rematerialisation policy, one of ``causal_lm.REMAT_POLICIES``
        (``'none'``, ``'full'``, ``'dots'``, ``'dots_no_batch'``). ``'full'`` keeps one ``[b, t, embed]``
        input per layer for the backward pass and recomputes the rest.
      attention_block: attention queries per block (float32 scores ``[b, heads, block, t]``); 0 = dense.
      logit_chunk: sequence positions per output-head chunk for log-probs, entropy and KL (``[b, chunk, vocab]``
        float32 at a time); 0 = whole sequence.
      shard_activations: constrain the residual stream's batch axis to the mesh's batch axes (data, fsdp).
      logprob_rows_per_device: rows per device in one reference-logprob call.
    Raises:
      ValueError: an unknown remat policy or a negative size.
    """

    remat: str = "none"
    attention_block: int = 1024
    logit_chunk: int = 1024
    shard_activations: bool = True
    logprob_rows_per_device: int = 1

    def __post_init__(self):
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"MemoryConfig.remat must be one of {tuple(REMAT_POLICIES)}, got {self.remat!r}")
        if min(self.attention_block, self.logit_chunk) < 0 or self.logprob_rows_per_device < 1:
            raise ValueError(f"MemoryConfig: sizes must be >= 0 (rows >= 1), got {self}")

    def forward_options(self, mesh: jax.sharding.Mesh) -> ForwardOptions:
        """The model's ``ForwardOptions`` on ``mesh``."""
        sharding = mesh_lib.batch_sharding(mesh, 3) if self.shard_activations else None
        return ForwardOptions(remat=self.remat, attention_block=self.attention_block, activation_sharding=sharding)


def batch_shardings(mesh: jax.sharding.Mesh, fields) -> dict[str, jax.sharding.NamedSharding]:
    """Batch-axis sharding per batch field (``advantages`` is ``[B]``, the rest ``[B, T]``)."""
    return {k: mesh_lib.batch_sharding(mesh, 2 if k != "advantages" else 1) for k in fields}


def make_block_step(loss_fn, normalizer_fn, optimizer: OptimizerConfig, total_steps: int, fields,
                    num_micro_batches: int, params: Any, param_shardings: Any, mesh: jax.sharding.Mesh,
                    frozen_shardings: Any = None) -> tuple[Callable, ts.TrainState, Any]:
    """The jitted, donated train step of one block and its state shardings.

    ``params`` may be arrays or ``jax.ShapeDtypeStruct`` (only shapes are read). With ``frozen_shardings`` (a LoRA
    adapter's base) the step takes the frozen parameters as a third argument (``train_state.make_train_step``).
    Returns ``(step_fn, state_shardings, tx)``.
    """
    tx = make_optimizer(optimizer, total_steps)
    shardings = ts.train_state_shardings(params, param_shardings, tx, mesh)
    step = ts.make_train_step(loss_fn, normalizer_fn, tx, shardings, batch_shardings(mesh, fields),
                              num_micro_batches, frozen_shardings)
    return step, shardings, tx


def make_ref_logprob_fn(apply_fn, config: grpo.GRPOConfig, mesh: jax.sharding.Mesh) -> Callable:
    """A jitted function of the shifted logprobs under the rollout transform.

    Its signature is ``(params, input_ids [B, T] int32, attention_mask [B, T]) -> [B, T] float32`` with rows sharded
    over the mesh's batch axes (B a multiple of their size)."""
    return grpo.make_logprob_fn(apply_fn, config, out_shardings=mesh_lib.batch_sharding(mesh, 2))


def mesh_devices(mesh_config: mesh_lib.MeshConfig, devices: Sequence[jax.Device]) -> list[jax.Device] | None:
    """The first `data·fsdp·tensor` of `devices`; None (every device, laid out by the topology) when an axis is -1."""
    sizes = (mesh_config.data, mesh_config.fsdp, mesh_config.tensor)
    return None if -1 in sizes else list(devices)[: int(np.prod(sizes))]


def learner_mesh(mesh_config: mesh_lib.MeshConfig) -> jax.sharding.Mesh:
    """The learner's mesh over `mesh_devices` of `jax.devices()`."""
    return mesh_lib.build_mesh(mesh_config, mesh_devices(mesh_config, jax.devices()))


def checkpoint_sharding(mesh_config: mesh_lib.MeshConfig) -> Callable[[tuple, tuple], jax.sharding.Sharding]:
    """The `hf_io.load_pretrained` ``sharding_fn`` that loads a checkpoint straight into the learner's shardings."""
    return mesh_lib.sharding_fn(learner_mesh(mesh_config), mesh_config.logical_axis_rules)


class Learner:
    """Owns the mesh, the parameters (pure dict, placed on the mesh) and the jitted steps.

    The model object holds the learner's parameters (the same arrays, set with `params`), never a copy of its own, so
    a model loaded onto one device is released once its parameters are placed on the mesh.

    A model with a LoRA adapter (`models.lora.add_lora`) trains the adapter only: `params` (and every copy, step and
    optimizer state made of them) is the adapter (``nnx.LoRAParam``), `frozen` the base model's weights, placed once;
    `apply_fn` takes `full(params)`.

    Args:
      model: the NNX policy (its parameters are read now and written back by `sync_model`).
      mesh_config: mesh shape; the mesh takes the first `data·fsdp·tensor` devices (all when one axis is -1).
      memory: remat / attention block / logit chunk / activation sharding (`MemoryConfig`).
    """

    def __init__(self, model: nnx.Module, mesh_config: mesh_lib.MeshConfig, memory: MemoryConfig = MemoryConfig()):
        self.model = model
        self.memory = memory
        self.mesh = learner_mesh(mesh_config)
        self.trainable = nnx.LoRAParam if lora.has_lora(model) else nnx.Param
        self.apply_fn, params, self.logical_specs = ts.split_model(
            model, memory.forward_options(self.mesh), memory.logit_chunk, self.trainable)
        rules = mesh_config.logical_axis_rules
        self.param_shardings = mesh_lib.param_shardings(params, self.logical_specs, self.mesh, rules)
        frozen, frozen_specs = ts.frozen_params(model, self.trainable)
        self.frozen_shardings = mesh_lib.param_shardings(frozen, frozen_specs, self.mesh, rules) if frozen else None
        self.frozen = jax.device_put(frozen, self.frozen_shardings) if frozen else {}
        if frozen:  # the model holds the placed base, not a copy of its own
            _write(self.model, lora.BASE, self.frozen)
        self.params = jax.device_put(params, self.param_shardings)
        self._logprob_fns: dict[tuple, Callable] = {}
        self._steps: dict[tuple, tuple[Callable, ts.TrainState, Any]] = {}

    @property
    def params(self) -> Any:
        """The learner's parameters (pure dict); setting them writes the same arrays into the model object."""
        return self._params

    @params.setter
    def params(self, value: Any) -> None:
        self._params = value
        _write(self.model, self.trainable, value)

    def full(self, params: Any) -> Any:
        """``params`` with the frozen base joined in, what `apply_fn` takes (``params`` itself without LoRA)."""
        return ts.join(params, self.frozen)

    @property
    def batch_devices(self) -> int:
        """Devices along the batch axes (rows of a sharded batch come in multiples of this)."""
        return int(np.prod([self.mesh.shape[a] for a in mesh_lib.BATCH_AXES]))

    # ----------------------------------------------------------------------------------------------------
    def _step(self, objective: tuple, loss_fn, normalizer_fn, optimizer: OptimizerConfig, total_steps: int, fields,
              num_micro_batches: int) -> tuple[Callable, ts.TrainState]:
        # one jitted step per (objective, configs, sizes): every round's GRPO block reuses the first one's
        # compiled programs instead of compiling its own (~22 s a round for the tiny default on 2 cores)
        key = (objective, optimizer, total_steps, tuple(fields), num_micro_batches)
        if key not in self._steps:
            step, shardings, tx = make_block_step(loss_fn, normalizer_fn, optimizer, total_steps, fields,
                                                  num_micro_batches, self.params, self.param_shardings, self.mesh,
                                                  self.frozen_shardings)
            self._steps[key] = (_with_frozen(step, self.frozen) if self.frozen else step), shardings, tx
        step, shardings, tx = self._steps[key]
        # a fresh optimizer state for every block (paper: optimizer reset between rounds)
        params = jax.tree.map(lambda x: x.copy(), self.params)
        state = ts.create_train_state(params, tx, shardings)
        if jax.process_count() == 1:
            return step, state
        placed = batch_shardings(self.mesh, fields)

        def multi_process_step(state, batch):
            # jit refuses host arrays for shardings that span processes: every process holds the whole batch
            # and places it (a global batch from per-process rows, `distributed.global_batch`, passes as is)
            return step(state, {k: v if isinstance(v, jax.Array) else jax.device_put(np.asarray(v), placed[k])
                                for k, v in batch.items()})

        return multi_process_step, state

    def sft_block(self, config: sft.SFTConfig, total_steps: int) -> tuple[Callable, ts.TrainState]:
        """(jitted step, fresh TrainState) for the SFT cold start (loss on the target response only)."""
        return self._step(("sft",), sft.make_sft_loss(self.apply_fn), sft.sft_normalizers, config.optimizer,
                          total_steps, BATCH_FIELDS_SFT, config.num_micro_batches)

    def grpo_block(self, config: grpo.GRPOConfig, optimizer: OptimizerConfig, total_steps: int,
                   num_micro_batches: int = 1) -> tuple[Callable, ts.TrainState]:
        """(jitted step, fresh TrainState) for one round's GRPO block.

        Blocks with the same configs and sizes share one jitted step (a fresh optimizer state each)."""
        return self._step(("grpo", config), grpo.make_grpo_loss(self.apply_fn, config), grpo.grpo_normalizers,
                          optimizer, total_steps, grpo.batch_fields(config), num_micro_batches)

    def adopt(self, state: ts.TrainState) -> None:
        """Takes a block's final parameters as the learner's parameters."""
        self.params = state.params

    def logprobs(self, params: Any, batch: Mapping[str, np.ndarray], config: grpo.GRPOConfig,
                 rows_per_call: int | None = None) -> np.ndarray:
        """`[B, T] float32` shifted logprobs of `batch['input_ids']` under `params` (the rollout transform).

        Rows go `rows_per_call` at a time (default `MemoryConfig.logprob_rows_per_device` per batch device;
        rounded up to a multiple of the batch devices), sharded over the mesh's batch axes; the last call is
        padded with empty rows, which are dropped. With several processes (`learn/distributed.py`) every process
        passes the same batch and gets every row back."""
        key = config.sampling.transform
        if key not in self._logprob_fns:
            self._logprob_fns[key] = make_ref_logprob_fn(self.apply_fn, config, self.mesh)
        fn = self._logprob_fns[key]
        n = self.batch_devices
        per = rows_per_call or n * self.memory.logprob_rows_per_device
        per = -(-per // n) * n
        ids, mask = np.asarray(batch["input_ids"]), np.asarray(batch["attention_mask"])
        rows = len(ids)
        pad = (-rows) % per
        if pad:
            ids = np.concatenate([ids, np.zeros((pad,) + ids.shape[1:], ids.dtype)])
            mask = np.concatenate([mask, np.zeros((pad,) + mask.shape[1:], mask.dtype)])
        sh = mesh_lib.batch_sharding(self.mesh, 2)
        full = self.full(params)
        out = [distributed.host_gather(fn(full, jax.device_put(ids[lo:lo + per], sh),
                                          jax.device_put(mask[lo:lo + per], sh)))
               for lo in range(0, len(ids), per)]
        return np.concatenate(out, axis=0)[:rows]

    def host_copy(self, params: Any) -> Any:
        """A host (numpy) copy of a parameter tree.

        The untrained / SFT / best copies a run keeps need no device memory (`on_mesh` puts one back, sharded, when it
        is used). With several processes every process gets the whole tree (a collective: all of them call it)."""
        return distributed.host_gather(params)

    def on_mesh(self, params: Any) -> Any:
        """``params`` (host or device arrays) placed with the learner's parameter shardings (no-op where they are)."""
        return jax.device_put(params, self.param_shardings)

    def sync_model(self, params: Any | None = None) -> nnx.Module:
        """Writes `params` into the model object and returns it (for weight sync).

        `params` default to the learner's; a host copy is placed on the mesh, sharded, never on one device."""
        _write(self.model, self.trainable, self.on_mesh(self.params if params is None else params))
        return self.model


def _write(model: nnx.Module, which: Any, values: Any) -> None:
    """Sets the model's variables selected by the nnx filter ``which`` to the arrays of the pure dict ``values``."""
    state = nnx.state(model, which)
    nnx.replace_by_pure_dict(state, values)
    nnx.update(model, state)


def _with_frozen(step: Callable, frozen: Any) -> Callable:
    """``step(state, batch, frozen)`` as ``(state, batch)``, the learner's placed base passed at every call."""
    return lambda state, batch: step(state, batch, frozen)
