"""The tool-call convention of chat families whose template has no tools block or tool role.

Family 'chatml', `chat.ChatFamily.inline_tools`; e.g. SmolLM2-Instruct's plain ChatML template.

Details: docs/design.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from bat_jax.models.chat import ChatFamily, get_family, render_action
from bat_jax.sandbox.tools import STOP, Action


def tool_convention(tools: list[dict]) -> str:
    """The text appended to the system turn of an 'inline_tools' family.

    It holds the tool schemas (one JSON line each) and how to call one (`render_action`'s format)."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("\n\n# Tools\nYou may call one of these functions:\n<tools>\n" + lines + "\n</tools>\n"
            "To call a function, write your reasoning, then one block\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n'
            "and end your turn; the result comes back as <tool_response>\n...\n</tool_response>.")


def inline_tools(messages: Sequence[dict], tools: list[dict] | None,
                 family: str | ChatFamily) -> tuple[list[dict], list | None]:
    """(messages, tools) to hand the family's template.

    For an 'inline_tools' family: the tool convention appended to the system turn (one is inserted, empty, when the
    first message is not a system turn), assistant `reasoning_content` + `tool_calls` turned into `render_action` text,
    `tool` messages into user turns `<tool_response>\\nOBS\\n</tool_response>`, and no tools argument. Other families:
    unchanged."""
    fam = get_family(family)
    if not fam.inline_tools:
        return list(messages), tools
    out = [dict(m) for m in messages]
    if tools:
        if not out or out[0].get("role") != "system":
            out.insert(0, {"role": "system", "content": ""})
        out[0]["content"] = str(out[0]["content"]) + tool_convention(list(tools))
    for i, m in enumerate(out):
        if m.get("role") == "tool":
            out[i] = {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
        elif m.get("role") == "assistant" and ("tool_calls" in m or "reasoning_content" in m):
            calls = m.get("tool_calls") or []
            fn = calls[0]["function"] if calls else {"name": STOP, "arguments": {}}
            action = Action(m.get("reasoning_content") or "", fn["name"], dict(fn["arguments"]))
            out[i] = {"role": "assistant", "content": str(render_action(action, fam)) + str(m.get("content") or "")}
    return out, None
