"""Action-level episodes.

The conversation a policy sees, the policy protocol, the recorded episode, and the host-side evidence of a finished
episode.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Protocol

from bat_jax.benchmark.stages import E2E, StageSet
from bat_jax.sandbox.evidence import EvidenceLimits, gather_files
from bat_jax.sandbox.readers import DecodeLimits
from bat_jax.sandbox.tools import Action
from bat_jax.sandbox.types import Observation, Sandbox, SandboxState, fault_of
from bat_jax.verify.rubric import Evidence


class PolicyError(RuntimeError):
    """A policy could not produce an action (e.g. the teacher endpoint failed); the episode is rejected."""


@dataclasses.dataclass(frozen=True)
class Turn:
    """One recorded turn: the stage (id) it belongs to, the action and the observation text it produced."""

    index: int
    stage: str
    action: Action
    observation: Observation

    def to_dict(self) -> dict:
        return {"index": self.index, "stage": self.stage, "action": self.action.to_dict(),
                "observation": self.observation.render(), "exit_code": self.observation.exit_code}


@dataclasses.dataclass
class Conversation:
    """What a policy sees: the brief, the focus, its stage skill text, the stages and the turns so far.

    The focus is E2E or one stage id; its stage skill text is κ, the benchmark's `row_skill`."""

    brief: str
    focus: str
    skill: str
    stage_set: StageSet
    turns: list[Turn] = dataclasses.field(default_factory=list)

    @property
    def stages(self) -> tuple[str, ...]:
        """The stage ids this conversation works on: every stage for 'E2E', else the focus."""
        return self.stage_set.ids if self.focus == E2E else (self.stage_set.parse(self.focus),)

    def skills(self) -> str:
        return self.skill

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
        """Stage id → index of the first turn of that stage (stages without turns are absent)."""
        out: dict[str, int] = {}
        for t in self.turns:
            out.setdefault(t.stage, t.index)
        return out

    def to_dict(self) -> dict:
        return {"task_id": self.task_id, "focus": self.focus, "end_reason": self.end_reason,
                "rejected": self.rejected, "boundaries": self.boundaries(),
                "turns": [t.to_dict() for t in self.turns]}


def collect_evidence(sandbox: Sandbox, infra_error: str = "", limits: EvidenceLimits = EvidenceLimits(),
                     start: SandboxState | None = None, decode: DecodeLimits = DecodeLimits()) -> Evidence:
    """Host-side evidence of a finished episode (call before `close`).

    It is read within `limits` and later decoded within `decode`; `start` (the state the episode started from) becomes
    `Evidence.start_files`.

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
