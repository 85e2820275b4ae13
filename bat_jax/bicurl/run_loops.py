"""The rollout side of one run: its agent loops and what they hold.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import time

from bat_jax.benchmark.scoring import Summary
from bat_jax.bicurl import evaluation as ev
from bat_jax.bicurl.evaluation import EvalConfig
from bat_jax.bicurl.ray_workers import RayRollouts, RayRolloutConfig, WorkerSpec
from bat_jax.policy import Policy, make_agent_loop
from bat_jax.prompts import PromptFormat
from bat_jax.rollout.agent_loop import AgentLoop, AgentLoopConfig
from bat_jax.rollout.engine import RolloutEngine
from bat_jax.sandbox.backends import BackendUnavailable, SandboxBackend, open_backend
from bat_jax.staged_benchmark.contract import StagedBenchmark
from bat_jax.verify.judge import RubricJudge


def eval_cells(evaluation: EvalConfig, benchmark: StagedBenchmark) -> int:
    """Cells of the larger held-out evaluation, controller or final: tracks × repeats.

    It equals `len(evaluation.suite_jobs(...))`."""
    return len(evaluation.tracks or benchmark.tracks) * max(evaluation.repeats, evaluation.final_repeats or 0)


def warm_pool_size(batch_episodes: int, cells: int) -> int:
    """Sandboxes one run holds at once (≥ 1).

    The larger of a GRPO batch's episodes in this process (rows × K; 0 when the rollouts run on Ray workers) and the
    held-out evaluation's cells."""
    return max(1, batch_episodes, cells)


@dataclasses.dataclass
class RunLoops:
    """The run's loops: GRPO rollouts, the held-out evaluation and their sandbox backend.

    Fields: rollouts: the GRPO loop (`AgentLoop`, or `ray_workers.RayRollouts`; both `run` / `engine.update_weights`);
    evaluation: the held-out loop (one episode per cell, `EvalConfig.max_turns`); sandboxes: their backend."""

    rollouts: AgentLoop | RayRollouts
    evaluation: AgentLoop
    sandboxes: SandboxBackend

    def evaluate(self, config: EvalConfig, benchmark: StagedBenchmark, judge: RubricJudge | None,
                 prompt: PromptFormat) -> tuple[Summary, int]:
        """One held-out evaluation of the engine's current weights through the evaluation loop.

        Returns: the aggregates (`evaluation.evaluate`, `config.purpose`'s runs) and the scored cells that were
        agent-caused sandbox failures.
        """
        cells = ev.EngineCells(self.evaluation, benchmark, judge, prompt=prompt)
        return ev.evaluate(cells, config, benchmark), cells.agent_failed

    def close(self) -> None:
        """Ends the Ray workers (if any) and removes the pool's containers (idempotent)."""
        try:
            if isinstance(self.rollouts, RayRollouts):
                self.rollouts.close()
        finally:
            self.sandboxes.close()


def open_run_loops(policy: Policy, engine: RolloutEngine, agent: AgentLoopConfig, evaluation: EvalConfig,
                   benchmark: StagedBenchmark, batch_rows: int, backend: str, warm_pool: bool = True,
                   ray: RayRolloutConfig | None = None, worker: WorkerSpec | None = None) -> RunLoops:
    """The rollout and evaluation loops of a run over `engine`.

    GRPO batches hold `batch_rows` RL rows × K (`agent.sampling.group_size`) episodes, held-out evaluations
    `evaluation`'s cells of `benchmark`; sandboxes come from `backend` ('docker' or 'local'). With `warm_pool`,
    Docker sandboxes come from one warm pool of `warm_pool_size` containers; else each episode starts a fresh
    container. With `ray`, the GRPO rollouts run on Ray workers that each build `worker` (its policy, engine and
    backend; its warm pool is set here to its share of a batch).

    Raises:
      sandbox.backends.BackendUnavailable: Docker asked for and not usable (engine, image, pool start-up).
      ValueError: an unknown backend, or `ray` without `worker`.
    """
    if ray is not None and worker is None:
        raise ValueError("open_run_loops: Ray rollouts need the WorkerSpec each worker builds")
    batch_episodes = batch_rows * agent.sampling.group_size
    concurrent = warm_pool_size(0 if ray is not None else batch_episodes, eval_cells(evaluation, benchmark))
    image = ensure_sandbox_image(benchmark) if backend == "docker" else None  # 'local' runs no image
    sandboxes = open_backend(backend, agent.workers(concurrent), warm=concurrent if warm_pool else 0, image=image)
    try:
        if ray is not None:  # GRPO rollouts on Ray workers (same `run` / `engine.update_weights` interface)
            share = -(-batch_episodes // ray.num_workers) if warm_pool else 0  # each worker's share
            rollouts = RayRollouts.start(dataclasses.replace(worker, sandbox_backend=backend, warm_pool=share,
                                                             sandbox_image=image), ray)
        else:
            rollouts = make_agent_loop(policy, engine, sandboxes.make, agent, sandboxes.release)
        one_each = dataclasses.replace(agent, sampling=dataclasses.replace(agent.sampling, group_size=1),
                                       max_assistant_turns=evaluation.max_turns)  # one episode per held-out cell
        loop = make_agent_loop(policy, engine, sandboxes.make, one_each, sandboxes.release)
    except BaseException:
        sandboxes.close()
        raise
    return RunLoops(rollouts, loop, sandboxes)


def ensure_sandbox_image(benchmark: StagedBenchmark) -> str | None:
    """Builds `benchmark`'s own Docker image when it is missing (debootstrap: minutes, once); returns its tag.

    None for a benchmark on the shared image (`launch/setup.sh` builds that one). Raises `BackendUnavailable`
    naming the benchmark, its packages, the cause and the command that builds it."""
    if benchmark.sandbox_packages is None:
        return None
    from bat_jax.sandbox import images

    packages = ",".join(benchmark.sandbox_packages)
    tag, t0 = benchmark.sandbox_image(), time.perf_counter()
    try:
        import docker

        client = docker.from_env(timeout=600)
        if images.image_exists(client, tag):
            return tag
        print(f"[bat_jax] building the sandbox image of benchmark {benchmark.name!r} ({packages}): a few minutes, "
              "once", flush=True)
        images.ensure_images(client, pkgs=tuple(benchmark.sandbox_packages))
    except Exception as exc:  # noqa: BLE001 - no engine, no root or debootstrap, a package Debian does not have
        raise BackendUnavailable(
            f"benchmark {benchmark.name!r}: its sandbox image {tag} (sandbox_packages {packages}) could not be built: "
            f"{type(exc).__name__}: {str(exc)[-300:]}; build it as root with `python -m bat_jax.sandbox.images "
            f"--packages {packages}` (debootstrap and Docker: launch/setup.sh)") from None
    print(f"[bat_jax] sandbox image {tag} built in {time.perf_counter() - t0:.0f} s", flush=True)
    return tag
