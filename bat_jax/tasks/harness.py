"""Play one task with one policy in one sandbox backend and score it (E2E or a single-stage focus).

A stage-focus episode starts from the state at that stage's boundary (the scripted expert's replayed
prefix) and is rubric-scored on that stage only; an E2E episode starts from the task's initial state and is
scored on S1–S5 plus the task metric. One rule for blame: a rejected policy call, a sandbox that cannot start
or one whose failure the agent cannot cause (`fault == 'infra'`) makes the episode unscored; anything that
goes wrong with what the agent did or wrote — a sandbox its code brought down, a workspace that cannot be read
back, artefacts that cannot be decoded — is the agent's failure, scored from what is valid.
Backends: `backend_factory` (a fresh sandbox per call) and `open_backend` (the same, or a warm Docker pool).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from bat_jax.benchmark.stages import E2E, STAGES, Stage
from bat_jax.rollout.action_loop import run_action_episode
from bat_jax.sandbox.readers import DecodeLimits
from bat_jax.sandbox.types import Sandbox, SandboxState
from bat_jax.tasks.base import TaskInstance, Track
from bat_jax.tasks.episode import Episode, Policy, collect_evidence, sandbox_fault, snapshot_state
from bat_jax.tasks.rubric_items import build_rubric
from bat_jax.tasks.teacher import ScriptedExpert
from bat_jax.verify.rubric import REWARD_VERSION, EpisodeScore, Evidence, score

SandboxFactory = Callable[[SandboxState], Sandbox]


def local_sandbox(state: SandboxState) -> Sandbox:
    """The non-isolated local backend (tests/development only; see bat_jax.sandbox.local)."""
    from bat_jax.sandbox.local import LocalSandbox

    return LocalSandbox(state, timeout_s=60.0)


def stage_start_state(make_sandbox: SandboxFactory, initial: SandboxState, brief: str, task_id: str,
                      expert: Policy, stage: Stage | str, max_turns: int = 24) -> SandboxState:
    """State at the boundary before `stage`: the expert's prefix (stages < stage) replayed in a sandbox made
    from `initial`, its workspace snapshotted (env kept from `initial`).

    Raises:
      RuntimeError: the expert's prefix was rejected or ended before reaching the boundary.
    """
    stage = Stage.parse(stage)
    if stage == STAGES[0]:
        return initial
    box = make_sandbox(initial)
    try:
        ep = run_action_episode(expert, box, brief, task_id, E2E, max_turns, stop_before=stage)
        if ep.end_reason != f"boundary {stage.value}":
            raise RuntimeError(f"expert prefix for {task_id} ended with {ep.end_reason!r} before {stage.value}")
        return snapshot_state(box, dict(initial.env))
    finally:
        box.close()


@dataclasses.dataclass
class PlayResult:
    episode: Episode | None
    evidence: Evidence
    score: EpisodeScore
    start_state: SandboxState


def play(track: Track, inst: TaskInstance, policy: Policy, focus: str = E2E,
         make_sandbox: SandboxFactory = local_sandbox, max_turns: int = 24,
         start_state: SandboxState | None = None, decode: DecodeLimits = DecodeLimits()) -> PlayResult:
    """Runs and scores one episode. `start_state` overrides the boundary state of a stage focus; `decode` caps
    decoding the agent's artefacts. Never raises for anything the agent did (module docstring)."""
    if focus != E2E:
        focus = Stage.parse(focus).value
    if start_state is None:
        start_state = inst.state()
        if focus not in (E2E, STAGES[0].value):
            start_state = stage_start_state(make_sandbox, start_state, inst.brief, inst.task_id,
                                            ScriptedExpert(), focus, max_turns)
    episode = None
    stages = STAGES if focus == E2E else (Stage.parse(focus),)
    try:
        box = make_sandbox(start_state)
    except Exception as exc:  # noqa: BLE001 — no sandbox, no agent action: infrastructure, unscored
        evidence = Evidence((), {}, None, infra_error=f"sandbox creation failed: {type(exc).__name__}: {exc}",
                            limits=decode)
        return PlayResult(None, evidence, score(build_rubric(track, inst), evidence, None, stages), start_state)
    try:
        episode = run_action_episode(policy, box, inst.brief, inst.task_id, focus, max_turns)
        infra = f"policy rejected: {episode.rejected}" if episode.rejected else ""
        evidence = collect_evidence(box, infra_error=infra, start=start_state, decode=decode)
    except Exception as exc:  # noqa: BLE001 — reading the workspace back failed
        fault, text = sandbox_fault(box)
        if fault == "infra":  # the engine or the sandbox failed on its own: unscored, never 0
            evidence = Evidence((), {}, None, infra_error=f"sandbox failure: {type(exc).__name__}: {exc}",
                                limits=decode)
        else:  # the agent's code brought the sandbox down, or its workspace cannot be read: its failure
            evidence = Evidence(tuple(box.receipts()), dict(start_state.files), box.submitted(),
                                agent_error=text or f"reading the workspace failed: {type(exc).__name__}: {exc}",
                                start_files=dict(start_state.files), limits=decode)
    finally:
        box.close()
    task = None if evidence.infra_error else track.score_task(inst, evidence.files, evidence.submitted, decode)
    return PlayResult(episode, evidence, score(build_rubric(track, inst), evidence, task, stages), start_state)


@dataclasses.dataclass
class TeacherTrajectory:
    """One teacher E2E trajectory, ready for the Data Factory to slice.

    Attributes:
      episode: turns with structured actions, observations and stages (`episode.boundaries()`).
      score: rubric verdicts per stage, task metric and E2E reward (with the reward version).
      boundary_states: stage → sandbox state just before that stage's first action (RL stage-start states).
      provenance: task id, track, seed, variant, method version, reward version, rubric contract (public).
    """

    episode: Episode
    score: EpisodeScore
    boundary_states: dict[Stage, SandboxState]
    provenance: dict


def record_teacher_trajectory(track: Track, inst: TaskInstance, teacher: Policy,
                              make_sandbox: SandboxFactory = local_sandbox,
                              max_turns: int = 24) -> TeacherTrajectory:
    """Runs a teacher E2E once, snapshotting the workspace at every stage boundary on the way.

    Raises:
      RuntimeError: the sandbox failed (the trajectory cannot be used; callers count a rejection).
    """
    states: dict[Stage, SandboxState] = {}
    box = make_sandbox(inst.state())
    try:
        episode = run_action_episode(teacher, box, inst.brief, inst.task_id, E2E, max_turns,
                                     on_stage_start=lambda st, sb: states.setdefault(st, snapshot_state(sb)))
        evidence = collect_evidence(box, f"policy rejected: {episode.rejected}" if episode.rejected else "")
    finally:
        box.close()
    task = None if evidence.infra_error else track.score_task(inst, evidence.files, evidence.submitted)
    rubric = build_rubric(track, inst)
    provenance = {"task_id": inst.task_id, "track": inst.track, "seed": inst.seed, "variant": inst.variant,
                  "method_version": inst.method_version, "reward_version": REWARD_VERSION,
                  "fault_kind": inst.fault.kind if inst.fault else None, "rubric": rubric.public()}
    return TeacherTrajectory(episode, score(rubric, evidence, task), states, provenance)


class BackendUnavailable(RuntimeError):
    """The requested sandbox backend cannot be used here (module, engine or image missing)."""


def backend_factory(name: str, concurrency: int = 16) -> SandboxFactory:
    """A sandbox factory by backend name: 'local' (non-isolated, tests only) or 'docker'. `concurrency`: most
    threads using sandboxes at once (the agent loop's `max_workers`); the Docker client's connection pool is
    sized to it plus a margin, so no 'connection pool is full' warnings.

    Raises:
      BackendUnavailable: Docker backend module, engine or task image missing (the message says which).
      ValueError: unknown name.
    """
    if name == "local":
        return local_sandbox
    if name != "docker":
        raise ValueError(f"unknown sandbox backend {name!r}; expected 'local' or 'docker'")
    try:
        from bat_jax.sandbox import docker as docker_backend

        pool = max(docker_backend.DockerSandboxConfig.max_pool_size, int(concurrency) + 4)
        client = docker_backend.connect(docker_backend.DockerSandboxConfig(max_pool_size=pool))
        probe = docker_backend.DockerSandbox(client, state=SandboxState(files={}))
        probe.close()
    except Exception as exc:  # noqa: BLE001 — any failure here means the backend is not usable
        raise BackendUnavailable(f"docker backend unavailable: {type(exc).__name__}: {exc}") from None
    return lambda state: docker_backend.DockerSandbox(client, state=state)


@dataclasses.dataclass
class SandboxBackend:
    """Where episodes get their sandboxes: `make(state)` gives one restored from `state`, `release(sandbox)`
    hands it back when the episode ends (None = `sandbox.close()`), `close()` ends whatever the backend keeps
    (idempotent). With a warm Docker pool (`pool`, a `bat_jax.sandbox.pool.SandboxPool`) `make` is the pool's
    `acquire` and `release` its `release`: the same containers serve every episode, reset to a fresh state
    in between. A context manager (closes on exit, also on exceptions and Ctrl-C)."""

    name: str
    make: SandboxFactory
    release: Callable[[Sandbox], None] | None = None
    pool: Any = None

    def close(self) -> None:
        """Removes the pool's containers, if any (never raises)."""
        if self.pool is not None:
            self.pool.close()

    def __enter__(self) -> SandboxBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_backend(name: str, concurrency: int = 16, warm: int = 0, acquire_timeout_s: float = 60.0
                 ) -> SandboxBackend:
    """A sandbox backend by name, fresh per episode (`backend_factory`) or, for 'docker' with `warm` > 0, a warm
    pool of `warm` started containers reset between episodes. 'local' sandboxes are host directories and are
    always made fresh (`warm` is ignored). `concurrency`: threads calling sandboxes at once (sizes the Docker
    client's connection pool). `acquire_timeout_s`: longest wait, seconds, for an idle pooled sandbox (an
    episode that gets none is unscored, as for a container that cannot start).

    Raises:
      BackendUnavailable: Docker backend module, engine or task image missing, or the pool failed to start.
      ValueError: unknown name, or `warm` < 0.
    """
    if warm < 0:
        raise ValueError(f"open_backend: warm (pool size) must be >= 0, got {warm}")
    if name != "docker" or warm == 0:
        return SandboxBackend(name, backend_factory(name, concurrency))
    try:
        from bat_jax.sandbox import docker as docker_backend
        from bat_jax.sandbox.pool import SandboxPool

        config = docker_backend.DockerSandboxConfig(
            max_pool_size=max(docker_backend.DockerSandboxConfig.max_pool_size, int(concurrency) + 4))
        pool = SandboxPool(warm, config)
    except Exception as exc:  # noqa: BLE001 — any failure here means the backend is not usable
        raise BackendUnavailable(f"docker backend unavailable: {type(exc).__name__}: {exc}") from None
    return SandboxBackend(name, lambda state: pool.acquire(state, acquire_timeout_s), pool.release, pool)
