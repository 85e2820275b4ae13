"""Rollouts on Ray workers: the K episodes of a batch's RL rows spread over actor processes.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bat_jax.bicurl.engines import EngineConfig, build_engine
from bat_jax.learn.distributed import host_gather
from bat_jax.policy import Policy, PolicyConfig, build_policy, make_agent_loop
from bat_jax.rollout import trajectory as tj
from bat_jax.rollout.agent_loop import AgentLoop, AgentLoopConfig, RolloutRequest
from bat_jax.rollout.engine import RolloutEngine
from bat_jax.sandbox.backends import SandboxBackend, backend_factory, open_backend


@dataclasses.dataclass(frozen=True)
class RayRolloutConfig:
    """Where and how many rollout workers run (bound in gin as `experiment.Components.ray`).

    Attributes:
      num_workers: rollout worker actors (>= 1).
      cpus_per_worker, gpus_per_worker: Ray resources each actor reserves.
      address: Ray cluster address for `ray.init` ('auto' = a running cluster); None = start a local one when
        none is running in this process.
      worker_env: environment variables of the worker processes, set by Ray before they start (e.g.
        `JAX_PLATFORMS`, `XLA_FLAGS`).
      start_timeout_s: seconds to wait for every worker to build its policy and engine.
    Raises:
      ValueError: fewer than one worker or negative resources.
    """

    num_workers: int = 2
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    address: str | None = None
    worker_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    start_timeout_s: float = 600.0

    def __post_init__(self):
        if self.num_workers < 1 or self.cpus_per_worker < 0 or self.gpus_per_worker < 0:
            raise ValueError(f"RayRolloutConfig: need num_workers >= 1 and resources >= 0, got {self}")


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What a worker builds (pickled to each actor).

    The policy, its rollout engine, the agent loop and its sandbox backend.

    Attributes:
      policy: the tiny default or a local checkpoint every worker can read.
      agent: the agent loop's limits and sampling.
      sandbox_backend: 'local' (tests only) or 'docker' (`bat_jax.sandbox.backends.backend_factory`).
      engine: the worker's rollout engine (the JAX sampler: kind 'jax'; `engines.EngineConfig`).
      warm_pool: Docker containers the worker keeps started and resets between its episodes (its share of a
        GRPO batch, `bicurl/run_loops.py`); 0 = a fresh container per episode. Ignored for 'local'.
      sandbox_image: the benchmark's own Docker image (`StagedBenchmark.sandbox_image`); None: the shared one.
    Raises:
      ValueError: an engine other than the JAX sampler.
    """

    policy: PolicyConfig
    agent: AgentLoopConfig = AgentLoopConfig()
    sandbox_backend: str = "local"
    engine: EngineConfig = EngineConfig()
    warm_pool: int = 0
    sandbox_image: str | None = None

    def __post_init__(self):
        if self.engine.kind != "jax":
            raise ValueError(f"WorkerSpec.engine: Ray workers run the JAX sampler, got kind {self.engine.kind!r}")

    def build_policy(self) -> Policy:
        """The worker's policy (its weights are replaced by the first weight push)."""
        return build_policy(self.policy)

    def open_sandboxes(self) -> SandboxBackend:
        """This worker's sandbox backend (a warm Docker pool of `warm_pool` containers, or fresh sandboxes).

        The caller closes it. Raises `BackendUnavailable`."""
        return open_backend(self.sandbox_backend, self.agent.workers(self.warm_pool), warm=self.warm_pool,
                            image=self.sandbox_image)

    def build_loop(self, policy: Policy, sandboxes: SandboxBackend | None = None) -> AgentLoop:
        """An `AgentLoop` over the JAX sampler of `policy` and `sandboxes`.

        `sandboxes` default to fresh sandboxes of this spec's backend. It is the same loop an in-process reference
        builds."""
        if sandboxes is None:
            sandboxes = SandboxBackend(self.sandbox_backend,
                                       backend_factory(self.sandbox_backend, image=self.sandbox_image))
        engine = build_engine(policy, self.engine, self.agent.max_context_tokens)
        return make_agent_loop(policy, engine, sandboxes.make, self.agent, sandboxes.release)


def host_params(params: Any) -> dict:
    """A numpy pure dict (`nnx.to_pure_dict` layout) of a model's parameters.

    `params` is an nnx module, an `nnx.State` of parameters or already a pure dict, with arrays of any sharding
    (gathered to the host, across processes too: with several JAX processes every process must call it)."""
    from flax import nnx

    if isinstance(params, nnx.Module):
        params = nnx.state(params, nnx.Param)
    if isinstance(params, nnx.State):
        params = nnx.to_pure_dict(params)
    return host_gather(params)


def install_params(policy: Policy, engine: RolloutEngine, params: Mapping) -> int:
    """Writes a pure dict of parameters into `policy.model` and installs the model in `engine`.

    Returns the engine's new weight version. Raises ValueError (from nnx) when the structure does not match the model's.
    """
    import jax
    import jax.numpy as jnp
    from flax import nnx

    state = nnx.state(policy.model, nnx.Param)
    current = nnx.to_pure_dict(state)
    # device arrays in the model's own dtype and placement (the engine's state may share the model's variables)
    nnx.replace_by_pure_dict(state, jax.tree.map(lambda old, new: jax.device_put(jnp.asarray(new, old.dtype),
                                                                                 old.sharding), current, dict(params)))
    nnx.update(policy.model, state)
    return int(engine.update_weights(policy.model))


class RolloutWorker:
    """One rollout worker (a Ray actor via `RayRollouts.start`; a plain object in-process).

    Args:
      spec: what to build (policy, engine, sandbox backend, agent-loop config).
    """

    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.policy = spec.build_policy()
        self.sandboxes = spec.open_sandboxes()
        try:
            self.loop = spec.build_loop(self.policy, self.sandboxes)
        except BaseException:
            self.sandboxes.close()
            raise

    def close(self) -> int:
        """Removes this worker's warm containers (idempotent); returns how many the pool held."""
        pool = self.sandboxes.pool
        held = pool.size if pool is not None else 0
        self.sandboxes.close()
        return held

    def ready(self) -> int:
        """The engine's weight version (0 before the first push): a start-up probe."""
        return int(self.loop.engine.weight_version)

    def set_weights(self, params: Mapping) -> int:
        """Installs a numpy pure dict of parameters (`host_params`); returns the new weight version."""
        return install_params(self.policy, self.loop.engine, params)

    def run(self, episodes: Sequence[tuple[RolloutRequest, int, int]], seed: int) -> list[tj.Trajectory]:
        """`AgentLoop.run_episodes(episodes, seed=seed)` in this worker."""
        return self.loop.run_episodes(episodes, seed=seed)


def assign_episodes(num_requests: int, episodes_per_state: int, num_workers: int) -> list[list[tuple[int, int]]]:
    """Per worker, the (request index i, rollout k) pairs it runs.

    Episode (i, k) goes to worker `(i·K + k) mod num_workers` (the K rollouts of a state spread over the workers, loads
    differ by <= 1)."""
    out: list[list[tuple[int, int]]] = [[] for _ in range(num_workers)]
    for i in range(num_requests):
        for k in range(episodes_per_state):
            out[(i * episodes_per_state + k) % num_workers].append((i, k))
    return out


class _WeightPush:
    """The `engine` face of `RayRollouts`: what the experiment calls to sync weights."""

    def __init__(self, rollouts: "RayRollouts"):
        self._rollouts = rollouts

    @property
    def weight_version(self) -> int:
        return self._rollouts.weight_version

    def update_weights(self, params: Any) -> int:
        return self._rollouts.push_weights(params)


class RayRollouts:
    """The dispatcher: `run` and `engine.update_weights` as on an `AgentLoop`, executed by Ray actors.

    Args:
      workers: `RolloutWorker` actor handles.
      config: the agent loop's config (K, `sampling.group_size`, is read here).
    Use `RayRollouts.start` to create the actors; `close` ends them.
    """

    def __init__(self, workers: Sequence[Any], config: AgentLoopConfig):
        if not workers:
            raise ValueError("RayRollouts needs at least one worker")
        self.workers = list(workers)
        self.config = config
        self.weight_version = 0
        self.engine = _WeightPush(self)

    @classmethod
    def start(cls, spec: WorkerSpec, config: RayRolloutConfig = RayRolloutConfig()) -> "RayRollouts":
        """Starts Ray and `config.num_workers` workers, and waits until each has built its policy and engine.

        Ray is started unless already running in this process.

        Raises:
          ImportError: Ray is not installed (`pip install -e ".[ray]"`).
          ray.exceptions.GetTimeoutError: a worker did not come up within `config.start_timeout_s`.
        """
        import ray

        if not ray.is_initialized():
            ray.init(address=config.address, include_dashboard=False, log_to_driver=True)
        options: dict[str, Any] = {"num_cpus": config.cpus_per_worker, "num_gpus": config.gpus_per_worker}
        if config.worker_env:
            options["runtime_env"] = {"env_vars": dict(config.worker_env)}
        actor = ray.remote(RolloutWorker).options(**options)
        workers = [actor.remote(spec) for _ in range(config.num_workers)]
        ray.get([w.ready.remote() for w in workers], timeout=config.start_timeout_s)
        return cls(workers, spec.agent)

    def push_weights(self, params: Any) -> int:
        """Sends `params` to every worker through one object-store copy; returns the new weight version.

        `params` is a module, parameter state or pure dict, of any sharding.

        Raises:
          RuntimeError: the workers report different weight versions.
        """
        import ray

        ref = ray.put(host_params(params))
        versions = ray.get([w.set_weights.remote(ref) for w in self.workers])
        if len(set(versions)) != 1:
            raise RuntimeError(f"rollout workers disagree on the weight version after a push: {versions}")
        self.weight_version = int(versions[0])
        return self.weight_version

    def run(self, requests: Sequence[RolloutRequest], *, seed: int = 42,
            on_trajectory: Callable[[int, tj.Trajectory], None] | None = None) -> list[tj.Trajectory]:
        """K episodes per request over the workers (module docstring).

        Trajectories ordered by request, then k, as `AgentLoop.run(requests, seed=seed)` returns them.
        `on_trajectory(position, trajectory)` as in `AgentLoop.run`, called in this thread for each episode of a
        worker's share as soon as that share is back (so the first shares are scored while other workers still roll
        out)."""
        k_per = self.config.sampling.group_size
        return self.run_episodes([(r, i, k) for i, r in enumerate(requests) for k in range(k_per)], seed=seed,
                                 on_trajectory=on_trajectory)

    def run_episodes(self, episodes: Sequence[tuple[RolloutRequest, int, int]], *, seed: int = 42,
                     on_trajectory: Callable[[int, tj.Trajectory], None] | None = None) -> list[tj.Trajectory]:
        """`AgentLoop.run_episodes` over the workers.

        The episode at position p of `episodes` ((request, i, k): sampled with the seed of (seed, i, k)) goes to
        worker p mod W; trajectories come back in the order of `episodes`, `on_trajectory(p, trajectory)` called as
        each worker's share is back (what `multihost.scored_rollouts` hands a host's own workers).
        """
        import ray

        shares = [list(range(w, len(episodes), len(self.workers))) for w in range(len(self.workers))]
        pending = {w.run.remote([episodes[p] for p in share], seed): share
                   for w, share in zip(self.workers, shares) if share}
        by_position: dict[int, tj.Trajectory] = {}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            share = pending.pop(ready[0])
            for p, trajectory in zip(share, ray.get(ready[0])):
                by_position[p] = trajectory
                if on_trajectory is not None:
                    on_trajectory(p, trajectory)
        return [by_position[p] for p in range(len(episodes))]

    def close(self, timeout_s: float = 60.0) -> None:
        """Removes the workers' warm containers, then ends the worker actors; Ray itself keeps running.

        A worker that does not answer within `timeout_s` seconds is killed all the same (its containers' executors see
        the connection close and the engine removes them)."""
        import ray

        try:
            ray.get([w.close.remote() for w in self.workers], timeout=timeout_s)
        except Exception:  # noqa: BLE001 — best effort: the actors are killed below either way
            pass
        for w in self.workers:
            ray.kill(w)
        self.workers = []
