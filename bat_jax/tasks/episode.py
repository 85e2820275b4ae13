"""Action-level episodes: the conversation a policy sees, the policy protocol, the recorded episode, and the
host-side evidence of a finished episode with its score.

An *action policy* (`ActionPolicy`) maps the conversation so far (task brief + stage skill + previous
actions/observations) to the next structured action (`bat_jax.sandbox.tools.Action`, the one action type:
{"thought", "tool": "execute_code" | "submit" | "stop", "arguments"} and the stage it belongs to) or None. The
scripted experts and the LLM teacher are action policies. They run through the one episode loop
(`bat_jax.rollout.action_loop.run_action_episodes`, the agent loop's schedules), which records every action,
observation and the stage each turn belongs to as a `RecordedEpisode`; stage boundaries give stage-start states
and SFT slices.

`score_episode` is the one rule that scores an episode of a task from its evidence, for every caller: the
harness (`rollout/play.py`), GRPO rewards (`bicurl/reward.py`) and held-out cells (`bicurl/evaluation.py`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Protocol

from bat_jax.benchmark.stages import E2E, STAGES, Stage
from bat_jax.sandbox.evidence import EvidenceLimits, gather_files
from bat_jax.sandbox.readers import DecodeLimits
from bat_jax.sandbox.tools import Action
from bat_jax.sandbox.types import Observation, Sandbox, SandboxState, fault_of
from bat_jax.tasks.base import TaskInstance, Track
from bat_jax.tasks.brief import stage_skill
from bat_jax.tasks.rubric_items import build_rubric
from bat_jax.verify.judge import RubricJudge
from bat_jax.verify.rubric import EpisodeScore, Evidence, score


class PolicyError(RuntimeError):
    """A policy could not produce an action (e.g. the teacher endpoint failed); the episode is rejected."""


@dataclasses.dataclass(frozen=True)
class Turn:
    """One recorded turn: the stage it belongs to, the action and the observation text it produced."""

    index: int
    stage: Stage
    action: Action
    observation: Observation

    def to_dict(self) -> dict:
        return {"index": self.index, "stage": self.stage.value, "action": self.action.to_dict(),
                "observation": self.observation.render(), "exit_code": self.observation.exit_code}


@dataclasses.dataclass
class Conversation:
    """What a policy sees: the brief, the focus (E2E or one stage), stage skills and the turns so far."""

    brief: str
    focus: str
    turns: list[Turn] = dataclasses.field(default_factory=list)

    @property
    def stages(self) -> tuple[Stage, ...]:
        return STAGES if self.focus == E2E else (Stage.parse(self.focus),)

    def skills(self) -> str:
        return "\n\n".join(stage_skill(s) for s in self.stages)

    def messages(self) -> list[dict]:
        """Chat messages (system/user/assistant/tool) for an OpenAI-compatible policy."""
        system = ("You are a tool-using agent. Reply with ONE JSON object per turn: "
                  '{"thought": str, "tool": "execute_code"|"submit"|"stop", "arguments": {...}}. '
                  'execute_code arguments: {"language": "python"|"bash", "code": str}; '
                  'submit arguments: {"path": str}. Use "stop" when done.')
        msgs = [{"role": "system", "content": system},
                {"role": "user", "content": f"{self.brief}\n\n## Stage skill\n{self.skills()}"}]
        for t in self.turns:
            msgs.append({"role": "assistant", "content": json.dumps(t.action.to_dict())})
            msgs.append({"role": "user", "content": f"[tool result]\n{t.observation.render()}"})
        return msgs


class ActionPolicy(Protocol):
    """A policy that acts in structured actions (scripted experts, the LLM teacher, baselines)."""

    def __call__(self, conversation: Conversation) -> Action | None:
        """Next action, or None / a 'stop' action to end. May raise PolicyError."""


@dataclasses.dataclass
class RecordedEpisode:
    """A finished action-level episode: the turns (with stages), boundaries and why it ended.

    `rejected`: why the policy could not act (the episode is unscored); `error`: text of a sandbox exception
    that ended it (end reason 'sandbox_error'; who is to blame is the sandbox's `fault`). Neither is part of
    `to_dict`'s record unless set (`rejected` always is)."""

    task_id: str
    focus: str
    turns: list[Turn]
    end_reason: str
    rejected: str = ""
    error: str = ""

    def boundaries(self) -> dict[str, int]:
        """Stage value → index of the first turn of that stage (stages without turns are absent)."""
        out: dict[str, int] = {}
        for t in self.turns:
            out.setdefault(t.stage.value, t.index)
        return out

    def to_dict(self) -> dict:
        return {"task_id": self.task_id, "focus": self.focus, "end_reason": self.end_reason,
                "rejected": self.rejected, "boundaries": self.boundaries(),
                "turns": [t.to_dict() for t in self.turns]}


def collect_evidence(sandbox: Sandbox, infra_error: str = "", limits: EvidenceLimits = EvidenceLimits(),
                     start: SandboxState | None = None, decode: DecodeLimits = DecodeLimits()) -> Evidence:
    """Host-side evidence of a finished episode (call before `close`), read within `limits` and later decoded
    within `decode`; `start` (the state the episode started from) becomes `Evidence.start_files`.

    A sandbox that died through the agent's own doing is scored from what the host kept: the receipts and, for
    files, the episode's start state (`start`; empty when not given), with `Evidence.agent_error` set. A
    sandbox that failed for infrastructure reasons gives unscored evidence (`infra_error`).
    """
    fault, text = fault_of(sandbox)
    before = dict(start.files) if start is not None else {}
    if fault == "agent":
        return Evidence(tuple(sandbox.receipts()), before, sandbox.submitted(), infra_error, agent_error=text,
                        start_files=before, limits=decode)
    if fault == "infra":
        return Evidence(tuple(sandbox.receipts()), {}, None, infra_error or text, limits=decode)
    files, skipped = gather_files(sandbox, limits)
    return Evidence(tuple(sandbox.receipts()), files, sandbox.submitted(), infra_error, skipped=tuple(skipped),
                    start_files=before, limits=decode)


def snapshot_state(sandbox: Sandbox, env: dict[str, str] | None = None,
                   limits: EvidenceLimits = EvidenceLimits()) -> SandboxState:
    """The sandbox's current workspace as an executable state p (works on any backend), read within `limits`."""
    files, _ = gather_files(sandbox, limits)
    return SandboxState(files=files, env=dict(env or {}))


def score_episode(track: Track, inst: TaskInstance, evidence: Evidence, focus: str = E2E,
                  judge: RubricJudge | None = None) -> EpisodeScore:
    """The score of one episode of `inst` from its evidence (paper Eq. 4; E2E as the released code scores it).

    The task's rubric (`tasks.rubric_items.build_rubric`; the items `judge` is configured for decided by the LLM
    judge) is verified on the stages of `focus`: all five for 'E2E', that stage alone for a stage focus. The task
    metric (`Track.score_task`, the agent's files decoded within `evidence.limits`) is computed for an E2E episode
    only (the E2E reward combines it with the stage rewards); a stage-focus score is its stage's r and carries
    task None. Evidence of an infrastructure failure gives an unscored score (reward None), never 0.

    Raises:
      ValueError: an unknown focus.
      ScorerError: a task metric that is not a finite number in [0, 1] (an error of the scorer).
    """
    stages = STAGES if focus == E2E else (Stage.parse(focus),)
    rubric = build_rubric(track, inst)
    if judge is not None:
        rubric = judge.apply(rubric)
    task = None
    if focus == E2E and not evidence.infra_error:
        task = track.score_task(inst, evidence.files, evidence.submitted, evidence.limits)
    return score(rubric, evidence, task, stages)
