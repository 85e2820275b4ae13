"""The agent's prompts in one of two styles, and the agent-loop requests built from them.

The prompts are the system prompt, the first user turn (task brief + stage skill κ) and the tools block.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from bat_jax.models.chat import tool_schemas
from bat_jax.rollout.agent_loop import RolloutRequest
from bat_jax.sandbox.types import SandboxState
from bat_jax.stage_bank.row import RLRow
from bat_jax.staged_benchmark.contract import StagedBenchmark

PROMPT_STYLES = ("full", "compact")


def _unchanged(text: str) -> str:
    return text


@dataclasses.dataclass(frozen=True)
class PromptFormat:
    """How one run's prompts look.

    Attributes:
      style: 'full' or 'compact' (`PROMPT_STYLES`).
      system_prompt: the 'full' style's system prompt (the chat template's tools block carries the tool schemas).
      compact_system_prompt: the 'compact' style's system prompt (it names the two tools and their parameters).
      compact: rewrites a full first user turn into the compact style's (the benchmark's `compact_user_message`).
    Raises:
      ValueError: an unknown style.
    """

    style: str = "full"
    system_prompt: str = StagedBenchmark.system_prompt
    compact_system_prompt: str = StagedBenchmark.compact_system_prompt
    compact: Callable[[str], str] = _unchanged

    def __post_init__(self):
        if self.style not in PROMPT_STYLES:
            raise ValueError(f"prompt style must be one of {PROMPT_STYLES}, got {self.style!r}")

    @classmethod
    def of(cls, benchmark: StagedBenchmark, style: str = "full") -> "PromptFormat":
        """The prompts of `benchmark` in `style`."""
        return cls(style, benchmark.system_prompt, benchmark.compact_system_prompt, benchmark.compact_user_message)

    def head(self) -> tuple[str, tuple[dict, ...]]:
        """The system prompt and the tool schemas for the template's tools block.

        Returns (system prompt, tool schemas). The compact style names the tools in its system prompt and leaves the
        tools block out."""
        return (self.system_prompt, tuple(tool_schemas())) if self.style == "full" else (self.compact_system_prompt, ())

    def styled(self, text: str) -> str:
        """A full first user turn `text` in this style."""
        return text if self.style == "full" else self.compact(text)

    def user_message(self, brief: str, skill: str) -> str:
        """The first user turn: the task brief and the stage skill κ (the layout the teacher saw), styled."""
        return self.styled(f"{brief}\n\n## Stage skill\n{skill}")

    def first_messages(self, brief: str, skill: str) -> tuple[list[dict], list[dict]]:
        """(system + first user message, tools) of a prompt: what `EpisodeBuilder.start` takes."""
        system, tools = self.head()
        return ([{"role": "system", "content": system}, {"role": "user", "content": self.user_message(brief, skill)}],
                [dict(t) for t in tools])


def request(state_id: str, state: SandboxState, brief: str, skill: str, stage: str,
            prompt: PromptFormat = PromptFormat()) -> RolloutRequest:
    """The agent-loop request of one episode: start state, brief and skill κ rendered in `prompt`'s format."""
    system, tools = prompt.head()
    return RolloutRequest(state_id=state_id, state=state, system_prompt=system,
                          user_message=prompt.user_message(brief, skill), tools=tools, stage=stage)


def rl_request(row: RLRow, state: SandboxState, round_state_id: str | None = None,
               prompt: PromptFormat = PromptFormat()) -> RolloutRequest:
    """The agent-loop request of one Stage Bank RL row in `prompt`'s format.

    It carries the row's state p, prompt, skill κ and its teacher's turns (`RLRow.teacher_turns`)."""
    return dataclasses.replace(request(round_state_id or row.state_id, state, row.prompt, row.skill, row.focus, prompt),
                               teacher_turns=row.teacher_turns)
