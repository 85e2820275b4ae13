"""The rollout side of one run: its engine (`build_engine`: the JAX sampler or vLLM, and `jax_memory_fraction`
beside vLLM) and its agent loops with what they hold (issue 17): the sandbox backend — by default a warm Docker
pool whose containers are reset to a fresh state between episodes — the GRPO rollout loop (in this process, or
on Ray workers with `Components.ray`) and the held-out evaluation loop. `RunLoops.close()` ends the Ray workers and
removes the pool's containers; `experiment.run` calls it when it returns or raises (also on Ctrl-C).

The pool holds the most sandboxes a run uses at once: `AgentLoop.run` opens every episode's sandbox before its first
engine call (both schedules; the continuous one gives each back as its episode ends), so a GRPO batch holds rows × K
(`PoolConfig.batch_size` × `AgentLoopConfig.episodes_per_state`; none in this process when the rollouts run on Ray
workers: each worker keeps its own warm pool of its share, rows × K / workers rounded up) and an evaluation one
per held-out cell (its cells are one batch).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from bat_jax.rollout.agent_loop import AgentLoop
from bat_jax.tasks.harness import SandboxBackend, open_backend
from bat_jax.tasks.registry import TRACKS


def build_engine(policy: Any, components: Any, run_dir: pathlib.Path) -> Any:
    """The rollout engine of a run (`components`: an `experiment.Components`; `policy`: a `bat_jax.policy.Policy`):
    the embedded JAX sampler (continuously batched with `sampler_slots` > 0), or vLLM (weights pushed from the learner at every sync). vLLM starts on the policy
    model written to `run_dir/vllm/checkpoint` (`VLLMEngine.from_model`) — also for a Hugging Face checkpoint
    policy, whose published files carry tensors the learner does not train (Qwen3.5's vision tower and MTP head,
    `model.language_model.*` names), so that every sync names exactly the checkpoint's tensors. `vllm_options`
    are `VLLMEngineConfig` fields (dtype, gpu_memory_utilization, enforce_eager, ...).

    Raises:
      ImportError: engine 'vllm' without vLLM installed (`bash launch/setup.sh --with-vllm` on CPU, `bash launch/install_gpu.sh` on GPUs).
      ValueError: `vllm_options` names a field `VLLMEngineConfig` does not have, or `model_dir`.
    """
    c = components
    if c.engine == "jax":
        from bat_jax.rollout.continuous_batching import jax_engine
        from bat_jax.rollout.mesh_sampler import check_memory

        engine = jax_engine(policy.model, max_context=c.agent.max_context_tokens, max_batch=c.sampler_max_batch,
                            prefix_cache_rows=c.sampler_prefix_cache_rows, slots=c.sampler_slots,
                            mesh=c.sampler_mesh)
        if c.sampler_mesh is not None:  # per device: weights + rows x one full-length rollout, refused if none fits
            sampler = getattr(engine, "sampler", engine)
            plan = check_memory(sampler.memory_plan(c.sampler_slots or max(c.sampler_max_batch, batch_episodes(c))))
            print(f"[bat_jax] sampler memory: {plan.describe()}", flush=True)
        return engine
    from bat_jax.rollout import vllm_memory
    from bat_jax.rollout.vllm_engine import VLLMEngine
    from bat_jax.rollout.vllm_replicas import VLLMReplicaPool, replica_count

    options = {"max_model_len": c.agent.max_context_tokens, **dict(c.vllm_options)}
    replicas = replica_count(c.vllm_replicas)
    plans = check_vllm_memory(policy.model.config, options, replicas)
    print("[bat_jax] vLLM memory:\n" + vllm_memory.describe_replicas(plans, batch_episodes(c)), flush=True)
    if replicas == 1:  # one engine in this process
        return VLLMEngine.from_model(policy.model, pathlib.Path(run_dir) / "vllm", tokenizer=policy.tokenizer,
                                     **options)
    return VLLMReplicaPool.from_model(policy.model, pathlib.Path(run_dir) / "vllm", replicas,
                                      tokenizer=policy.tokenizer, **options)


def check_vllm_memory(model_config: Any, options: dict[str, Any], replicas: int = 1):
    """Before vLLM starts beside JAX: each replica's device split and how many full-length rollouts its cache holds
    (`rollout/vllm_memory.py`; replica i on device i), from `options` (`VLLMEngineConfig` fields;
    ``max_model_len`` required) and JAX's ``XLA_PYTHON_CLIENT_MEM_FRACTION`` (JAX's default 0.75 when unset).
    Returns one `VLLMMemoryPlan` per replica.

    Raises: ValueError naming the replica, both fractions and the numbers when one cannot hold a rollout or start.
    """
    import os

    from bat_jax.rollout import vllm_memory
    from bat_jax.rollout.vllm_engine import VLLMEngineConfig, kv_cache_bytes

    config = VLLMEngineConfig(model_dir="", **options)
    return vllm_memory.check_replicas(
        vllm_memory.rollout_cache(model_config, config.dtype), num_replicas=replicas,
        max_model_len=config.max_model_len, devices=[vllm_memory.device_memory(i) for i in range(replicas)],
        jax_fraction=float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75")),
        vllm_fraction=config.gpu_memory_utilization, kv_cache_memory_bytes=kv_cache_bytes(config))


def jax_memory_fraction(vllm_share: float) -> float:
    """Fraction of each accelerator's memory JAX may preallocate (`XLA_PYTHON_CLIENT_MEM_FRACTION`) beside a vLLM
    engine holding `vllm_share` of it (its `gpu_memory_utilization`, 0–1): 0.9 − share (0.1 stays free for the
    CUDA contexts and NCCL), at least 0.1. With vLLM at 0.3 of an 80 GB A100, JAX gets 0.6 · 80 = 48 GB."""
    return max(0.1, 0.9 - vllm_share)


def batch_episodes(components: Any) -> int:
    """Episodes of one GRPO batch: rows × K (`PoolConfig.batch_size` × `AgentLoopConfig.episodes_per_state`)."""
    return components.pools.batch_size * components.agent.episodes_per_state


def warm_pool_size(components: Any) -> int:
    """Sandboxes one run holds at once (≥ 1): the larger of a GRPO batch's episodes (rows × K, 0 with
    `components.ray`) and the held-out evaluation's cells. `components`: an `experiment.Components`."""
    c = components
    rollouts = 0 if c.ray is not None else batch_episodes(c)
    cells = len(c.evaluation.tracks or TRACKS) * c.evaluation.repeats  # = len(evaluator.suite_jobs(...))
    return max(1, rollouts, cells)


@dataclasses.dataclass
class RunLoops:
    """rollouts: the GRPO loop (`AgentLoop`, or `ray_workers.RayRollouts`; both `run` / `engine.update_weights`);
    evaluation: the held-out loop (one episode per cell, `EvalConfig.max_turns`); sandboxes: their backend."""

    rollouts: Any
    evaluation: AgentLoop
    sandboxes: SandboxBackend

    def close(self) -> None:
        """Ends the Ray workers (if any) and removes the pool's containers (idempotent)."""
        try:
            if hasattr(self.rollouts, "close"):
                self.rollouts.close()
        finally:
            self.sandboxes.close()


def open_run_loops(policy: Any, engine: Any, components: Any, backend: str, warm_pool: bool = True) -> RunLoops:
    """The rollout and evaluation loops of a run over `engine` (`policy`: a `bat_jax.policy.Policy`;
    `components`: an `experiment.Components`), their sandboxes from `backend` ('docker' or 'local'): with
    `warm_pool`, Docker sandboxes come from one warm pool of `warm_pool_size(components)` containers (and each Ray
    worker keeps one of its share of a GRPO batch); else each episode starts a fresh container.

    Raises:
      tasks.harness.BackendUnavailable: Docker asked for and not usable (engine, image, pool start-up).
      ValueError: an unknown backend.
    """
    from bat_jax.policy import make_agent_loop

    c = components
    concurrent = warm_pool_size(c)  # episodes this process runs at once (rollouts here, or evaluation cells)
    sandboxes = open_backend(backend, c.agent.workers(concurrent), warm=concurrent if warm_pool else 0)
    try:
        if c.ray is not None:  # GRPO rollouts on Ray workers (same `run` / `engine.update_weights` interface)
            from bat_jax.rollout.ray_workers import RayRollouts, WorkerSpec

            share = -(-batch_episodes(c) // c.ray.num_workers) if warm_pool else 0  # each worker's share
            rollouts = RayRollouts.start(WorkerSpec(c.policy, c.agent, backend, c.sampler_max_batch, share,
                                                    c.sampler_prefix_cache_rows, c.sampler_slots), c.ray)
        else:
            rollouts = make_agent_loop(policy, engine, sandboxes.make, c.agent, sandboxes.release)
        evaluation = make_agent_loop(policy, engine, sandboxes.make, dataclasses.replace(
            c.agent, episodes_per_state=1, max_assistant_turns=c.evaluation.max_turns), sandboxes.release)
    except BaseException:
        sandboxes.close()
        raise
    return RunLoops(rollouts, evaluation, sandboxes)
