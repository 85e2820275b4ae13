"""The agent's prompts: the system prompt, the first user turn (task brief + stage skill κ) and the tools block,
in one of two styles, and the agent-loop requests built from them.

Prompt styles (`policy.PolicyConfig.prompt_style`, one switch for SFT rendering, GRPO rollouts, evaluation and the
KL probe): 'full' (paper scale) prompts with `AGENT_SYSTEM_PROMPT`, the chat template's tools block and the
brief + stage skills as written; 'compact' (small policies) with `COMPACT_SYSTEM_PROMPT` naming the two tools
(no tools block) and the first user turn rewritten by `tasks.brief.compact_user_message`. Either way the turn is
rendered through `models.episode.EpisodeBuilder`: its text never becomes control ids.
"""

from __future__ import annotations

from bat_jax.models.chat import tool_schemas
from bat_jax.rollout.agent_loop import RolloutRequest
from bat_jax.sandbox.types import SandboxState
from bat_jax.stage_bank.row import RLRow
from bat_jax.tasks.brief import compact_user_message

PROMPT_STYLES = ("full", "compact")

#: System prompt of the token-level agent in the 'full' style (the tools block of the chat template carries
#: the tool schemas).
AGENT_SYSTEM_PROMPT = ("You are a medical-imaging research agent. Work through the stages of the task using the "
                       "tools: execute_code runs python or bash in the workspace, submit hands in the final file.")
#: System prompt of the 'compact' style: the two tools and their parameters (no tools block).
COMPACT_SYSTEM_PROMPT = ("Imaging agent. Tools: execute_code(language: python|bash, code) runs code in the "
                         "workspace; submit(path) hands in the result.")


def user_message(brief: str, skill: str, style: str = "full") -> str:
    """The first user turn: the task brief and the stage skill κ (the same layout the teacher saw); in the
    'compact' style rewritten by `tasks.brief.compact_user_message`. Raises ValueError for an unknown style."""
    return style_user_message(f"{brief}\n\n## Stage skill\n{skill}", style)


def style_user_message(text: str, style: str) -> str:
    """A full first user turn `text` in prompt style `style`. Raises ValueError for an unknown style."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style must be one of {PROMPT_STYLES}, got {style!r}")
    if style == "full":
        return text
    return compact_user_message(text)


def prompt_head(style: str) -> tuple[str, tuple[dict, ...]]:
    """(system prompt, tool schemas for the template's tools block) of a prompt style; the compact style names
    the tools in its system prompt and leaves the tools block out. Raises ValueError for an unknown style."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt style must be one of {PROMPT_STYLES}, got {style!r}")
    return (AGENT_SYSTEM_PROMPT, tuple(tool_schemas())) if style == "full" else (COMPACT_SYSTEM_PROMPT, ())


def first_messages(brief: str, skill: str, style: str = "full") -> tuple[list[dict], list[dict]]:
    """(system + first user message, tools) of a prompt: what `EpisodeBuilder.start` takes."""
    system, tools = prompt_head(style)
    return ([{"role": "system", "content": system}, {"role": "user", "content": user_message(brief, skill, style)}],
            [dict(t) for t in tools])


def request(state_id: str, state: SandboxState, brief: str, skill: str, stage: str,
            style: str = "full") -> RolloutRequest:
    """The agent-loop request of one episode: start state, brief and skill κ rendered in `style`."""
    system, tools = prompt_head(style)
    return RolloutRequest(state_id=state_id, state=state, system_prompt=system,
                          user_message=user_message(brief, skill, style), tools=tools, stage=stage)


def rl_request(row: RLRow, state: SandboxState, round_state_id: str | None = None,
               style: str = "full") -> RolloutRequest:
    """The agent-loop request of one Stage Bank RL row (state p, prompt, skill κ) in prompt style `style`."""
    return request(round_state_id or row.state_id, state, row.prompt, row.skill, row.focus, style)
