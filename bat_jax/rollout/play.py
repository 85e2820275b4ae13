"""Play one task of a benchmark with one action-level policy in one sandbox and score it (E2E or one stage).

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses

from bat_jax.benchmark.stages import E2E
from bat_jax.rollout.action_loop import run_action_episode
from bat_jax.sandbox.backends import SandboxFactory, local_sandbox
from bat_jax.sandbox.readers import DecodeLimits
from bat_jax.sandbox.types import SandboxState, fault_of
from bat_jax.staged_benchmark.contract import StagedBenchmark, Task
from bat_jax.staged_benchmark.episode import ActionPolicy, RecordedEpisode, collect_evidence, snapshot_state
from bat_jax.verify.rubric import EpisodeScore, Evidence


def stage_start_state(make_sandbox: SandboxFactory, benchmark: StagedBenchmark, task: Task, expert: ActionPolicy,
                      stage: str, max_turns: int = 24, initial: SandboxState | None = None) -> SandboxState:
    """State at the boundary before `stage`: the expert's E2E prefix replayed in a sandbox.

    The prefix holds the stages before `stage`; the sandbox is made from `initial` (default the task's initial state),
    its workspace snapshotted (env kept).

    Raises:
      RuntimeError: the expert's prefix was rejected or ended before reaching the boundary.
      ValueError: a stage the benchmark does not have.
    """
    stages = benchmark.stages
    stage = stages.parse(stage)
    initial = task.state() if initial is None else initial
    if stage == stages.ids[0]:
        return initial
    box = make_sandbox(initial)
    try:
        ep = run_action_episode(expert, box, task.brief, task.task_id, stages, benchmark.row_skill(E2E), E2E,
                                max_turns, stop_before=stage)
        if ep.end_reason != f"boundary {stage}":
            raise RuntimeError(f"expert prefix for {task.task_id} ended with {ep.end_reason!r} before {stage}")
        return snapshot_state(box, dict(initial.env))
    finally:
        box.close()


@dataclasses.dataclass
class PlayResult:
    """One episode's result: the recorded episode, the verifier's evidence and score, and the start state.

    Fields: episode: the recorded episode (None when no sandbox started); evidence and score: what the verifier saw and
    its verdict; start_state: the state the episode started from."""

    episode: RecordedEpisode | None
    evidence: Evidence
    score: EpisodeScore
    start_state: SandboxState


def play(benchmark: StagedBenchmark, task: Task, policy: ActionPolicy, focus: str = E2E,
         make_sandbox: SandboxFactory = local_sandbox, max_turns: int = 24,
         start_state: SandboxState | None = None, decode: DecodeLimits = DecodeLimits()) -> PlayResult:
    """Runs and scores one episode of `task`.

    `start_state` overrides the boundary state of a stage focus (else the benchmark's scripted teacher's prefix);
    `decode` caps decoding the agent's artefacts. Never raises for anything the agent did (module docstring); raises
    ValueError for an unknown focus."""
    focus = benchmark.stages.parse_focus(focus)
    inst = task
    if start_state is None:
        start_state = task.state()
        if focus not in (E2E, benchmark.stages.ids[0]):
            start_state = stage_start_state(make_sandbox, benchmark, task, benchmark.teacher("scripted"), focus,
                                            max_turns)
    episode = None
    try:
        box = make_sandbox(start_state)
    except Exception as exc:  # noqa: BLE001 — no sandbox, no agent action: infrastructure, unscored
        evidence = Evidence((), {}, None, infra_error=f"sandbox creation failed: {type(exc).__name__}: {exc}",
                            limits=decode)
        return PlayResult(None, evidence, benchmark.score_episode(task, evidence, focus), start_state)
    try:
        episode = run_action_episode(policy, box, inst.brief, inst.task_id, benchmark.stages,
                                     benchmark.row_skill(focus), focus, max_turns)
        infra = f"policy rejected: {episode.rejected}" if episode.rejected else ""
        evidence = collect_evidence(box, infra_error=infra, start=start_state, decode=decode)
    except Exception as exc:  # noqa: BLE001 — reading the workspace back failed
        fault, text = fault_of(box)
        if fault == "infra":  # the engine or the sandbox failed on its own: unscored, never 0
            evidence = Evidence((), {}, None, infra_error=f"sandbox failure: {type(exc).__name__}: {exc}",
                                limits=decode)
        else:  # the agent's code brought the sandbox down, or its workspace cannot be read: its failure
            evidence = Evidence(tuple(box.receipts()), dict(start_state.files), box.submitted(),
                                agent_error=text or f"reading the workspace failed: {type(exc).__name__}: {exc}",
                                start_files=dict(start_state.files), limits=decode)
    finally:
        box.close()
    return PlayResult(episode, evidence, benchmark.score_episode(task, evidence, focus), start_state)
