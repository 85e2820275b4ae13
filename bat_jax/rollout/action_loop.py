"""Action-level policies (scripted experts, teachers) through the agent loop's schedules.

Details: docs/design.md.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Sequence

from bat_jax.benchmark.stages import E2E, StageSet
from bat_jax.staged_benchmark.episode import ActionPolicy, Conversation, PolicyError, RecordedEpisode, Turn
from bat_jax.rollout.schedule import EPISODE_SCHEDULES, EpisodeSteps, run_continuous, run_lockstep
from bat_jax.sandbox.tools import STOP, Action
from bat_jax.sandbox.types import Observation, Sandbox


#: How a rejected episode's reason starts when its policy tagged an action with a stage its benchmark lacks (the
#: Data Factory turns it into a `BenchmarkError`: a broken benchmark definition, not a teacher's bad day).
STAGE_TAG_REJECTION = "the policy tagged an action with stage"


@dataclasses.dataclass(frozen=True)
class ActionEpisodeRequest:
    """One action-level episode: the arguments of `run_action_episode`.

    Attributes:
      policy: the action-level policy (one per episode: scripted experts keep per-episode state).
      sandbox: an open sandbox restored to the start state; the caller closes it (evidence is read after).
      brief: the task brief (`task.md` text) the conversation starts with.
      task_id: recorded on the episode.
      stages: the task's benchmark stages.
      skill: the stage skill text κ of the focus (the benchmark's `row_skill`).
      focus: 'E2E' or a stage id.
      max_turns: most policy calls / turns (>= 0).
      stop_before: end the episode at the first action of this stage or a later one (before it runs).
      on_stage_start: `(stage id, sandbox) -> None`, called before the first action of each stage runs.
    """

    policy: ActionPolicy
    sandbox: Sandbox
    brief: str
    task_id: str
    stages: StageSet
    skill: str
    focus: str = E2E
    max_turns: int = 24
    stop_before: str | None = None
    on_stage_start: Callable[[str, Sandbox], None] | None = None

    def __post_init__(self):
        if self.max_turns < 0:
            raise ValueError(f"ActionEpisodeRequest.max_turns must be >= 0, got {self.max_turns}")
        object.__setattr__(self, "focus", self.stages.parse_focus(self.focus))
        if self.stop_before is not None:
            object.__setattr__(self, "stop_before", self.stages.parse(self.stop_before))


class _ActionEpisode:
    """Bookkeeping of one live action-level episode (the schedules read `finish` and `pending`)."""

    def __init__(self, request: ActionEpisodeRequest):
        self.request = request
        self.sandbox = request.sandbox
        self.conv = Conversation(request.brief, request.focus, request.skill, request.stages)
        self.current: str = self.conv.stages[0]
        self.finish: str | None = None  # the end reason once ended
        self.rejected = ""
        self.pending: Action | None = None
        self.pending_stage: str | None = None
        self.error = ""

    def episode(self) -> RecordedEpisode:
        r = self.request
        return RecordedEpisode(r.task_id, r.focus, self.conv.turns, self.finish or "max_turns",
                               rejected=self.rejected, error=self.error)

    def fail(self, exc: BaseException) -> None:
        """Ends the episode on a sandbox (or `on_stage_start`) exception."""
        self.pending = self.pending_stage = None
        self.finish, self.error = "sandbox_error", f"{type(exc).__name__}: {exc}"


@dataclasses.dataclass
class _PolicyJob:
    """One "generation": the episodes whose policies are asked for their next action."""

    episodes: list[_ActionEpisode]


def _prepare(batch: list[_ActionEpisode]) -> _PolicyJob | None:
    """The episodes of `batch` that ask for an action; those at `max_turns` end here."""
    asking = []
    for ep in batch:
        if len(ep.conv.turns) >= ep.request.max_turns:
            ep.finish = "max_turns"
        else:
            asking.append(ep)
    return _PolicyJob(asking) if asking else None


def _generate(job: _PolicyJob) -> list[Action | None | PolicyError]:
    """Each episode's policy call; a `PolicyError` is returned, not raised.

    Any exception of the policy becomes a `PolicyError`, returned so one rejection ends one episode."""
    out: list[Action | None | PolicyError] = []
    for ep in job.episodes:
        try:
            out.append(ep.request.policy(ep.conv))
        except PolicyError as exc:
            out.append(exc)
        except Exception as exc:  # noqa: BLE001 - a broken policy rejects its own episode only
            out.append(PolicyError(f"policy error: {type(exc).__name__}: {exc}"))
    return out


def _absorb(job: _PolicyJob, results: list[Action | None | PolicyError]) -> None:
    """Ends, or gives a pending action (its stage attributed) to, each episode; calls `on_stage_start`."""
    for ep, action in zip(job.episodes, results):
        r = ep.request
        if isinstance(action, PolicyError):
            ep.finish, ep.rejected = "rejected", str(action)
            continue
        if action is None or action.tool == STOP:
            ep.finish = "stop"
            continue
        stage = ep.conv.stages[0] if r.focus != E2E else _stage_of(action, r.stages, ep.current)
        if stage is None:  # the policy named a stage its benchmark does not have: its episode is rejected
            ep.finish, ep.rejected = "rejected", (f"{STAGE_TAG_REJECTION} {action.stage!r}, which benchmark "
                                                  f"{r.stages.benchmark!r} does not have")
            continue
        if r.stop_before is not None and r.stages.index(stage) >= r.stages.index(r.stop_before):
            ep.finish = f"boundary {r.stop_before}"
            continue
        if r.on_stage_start is not None and (not ep.conv.turns or stage != ep.current):
            try:
                r.on_stage_start(stage, ep.sandbox)
            except Exception as exc:  # noqa: BLE001 - e.g. the snapshot of a dead sandbox: this episode ends
                ep.fail(exc)
                continue
        ep.current, ep.pending, ep.pending_stage = stage, action, stage


def _stage_of(action: Action, stages: StageSet, current: str) -> str | None:
    """The stage id an E2E episode's action belongs to.

    It is the one it names (None when `stages` lacks it), else the previous turn's."""
    if action.stage is None:
        return current
    try:
        return stages.parse(action.stage)
    except ValueError:
        return None


def _act(ep: _ActionEpisode) -> Observation | Exception:
    """Runs the pending action in the episode's sandbox (worker thread); a backend exception is returned."""
    args = ep.pending.arguments
    try:
        if ep.pending.tool == "execute_code":
            return ep.sandbox.execute_code(args["language"], args["code"])
        return ep.sandbox.submit(args["path"])
    except Exception as exc:  # noqa: BLE001 - ends this episode only (`_observe`)
        return exc


def _observe(ep: _ActionEpisode, observation: Observation | Exception) -> None:
    if isinstance(observation, Exception):
        ep.fail(observation)
        return
    ep.conv.turns.append(Turn(len(ep.conv.turns), ep.pending_stage, ep.pending, observation))
    ep.pending = ep.pending_stage = None


def _nothing(ep: _ActionEpisode) -> None:
    """Opening and collecting are the caller's: the sandbox is given open and read after the episode."""


STEPS = EpisodeSteps(prepare=_prepare, generate=_generate, absorb=_absorb, open=_nothing, act=_act,
                     observe=_observe, collect=_nothing, done=_nothing)


def run_action_episodes(requests: Sequence[ActionEpisodeRequest], *, schedule: str = "continuous",
                        max_workers: int = 4) -> list[RecordedEpisode]:
    """Runs the action-level episodes of `requests` concurrently under `schedule` (`schedule.EPISODE_SCHEDULES`).

    Args:
      requests: one per episode; each with its own policy and open sandbox.
      schedule: 'continuous' or 'lockstep' (same episodes: a policy sees only its own conversation).
      max_workers: threads running tool calls (>= 1).
    Returns: the episodes, in the order of `requests`.
    Raises: ValueError for an unknown schedule or `max_workers` < 1 (an episode's own exceptions end it; see
      the module docstring).
    """
    if schedule not in EPISODE_SCHEDULES:
        raise ValueError(f"run_action_episodes: schedule must be one of {EPISODE_SCHEDULES}, got {schedule!r}")
    if max_workers < 1:
        raise ValueError(f"run_action_episodes: max_workers must be >= 1, got {max_workers}")
    episodes = [_ActionEpisode(r) for r in requests]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max_workers) as pool:
        if schedule == "lockstep":
            run_lockstep(STEPS, episodes, pool, lambda n: None)
        else:
            run_continuous(STEPS, episodes, pool, lambda n: None, max_generate_batch=len(episodes) or 1)
    return [ep.episode() for ep in episodes]


def run_action_episode(policy: ActionPolicy, sandbox: Sandbox, brief: str, task_id: str, stages: StageSet,
                       skill: str, focus: str = E2E, max_turns: int = 24, stop_before: str | None = None,
                       on_stage_start: Callable[[str, Sandbox], None] | None = None) -> RecordedEpisode:
    """One episode through `run_action_episodes`, in the calling thread's schedule with one tool worker.

    The arguments are those of `ActionEpisodeRequest`. Returns the `RecordedEpisode`; raises as `run_action_episodes`
    does."""
    request = ActionEpisodeRequest(policy, sandbox, brief, task_id, stages, skill, focus, max_turns, stop_before,
                                   on_stage_start)
    return run_action_episodes([request], schedule="lockstep", max_workers=1)[0]
