"""The agent's two tools — `execute_code` and `submit` — as function schemas, and their dispatch to a sandbox.

`TOOL_SPECS` is the JSON-schema list handed to the chat template (OpenAI/Qwen function-calling format).
`dispatch` turns one parsed tool call into an Observation; malformed calls (unknown tool, missing or
ill-typed arguments) come back as an error Observation, never as an exception, because they are agent
mistakes. Receipts are written by the sandbox itself (see `Sandbox.receipts`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from bat_jax.sandbox.types import LANGUAGES, Observation, Sandbox

TOOL_SPECS: tuple[dict[str, Any], ...] = (
    {"type": "function", "function": {
        "name": "execute_code",
        "description": ("Run Python or bash code in the task workspace (the current directory). Each call is a "
                        "fresh process: Python variables do not persist between calls, files do. Output is "
                        "truncated; calls have a hard time limit."),
        "parameters": {"type": "object", "properties": {
            "language": {"type": "string", "enum": list(LANGUAGES)},
            "code": {"type": "string", "description": "the program text"}},
            "required": ["language", "code"]}}},
    {"type": "function", "function": {
        "name": "submit",
        "description": "Submit the final artefact: a file path relative to the workspace. Ends the episode.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "workspace-relative path of the final artefact"}},
            "required": ["path"]}}},
)
TOOL_NAMES = tuple(spec["function"]["name"] for spec in TOOL_SPECS)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One parsed tool call of a trajectory: `name` in TOOL_NAMES and its JSON arguments."""

    name: str
    arguments: Mapping[str, Any]


def _bad(message: str) -> Observation:
    return Observation(stdout="", stderr="", exit_code=None, duration_s=0.0, error=message)


def dispatch(sandbox: Sandbox, call: ToolCall, timeout_s: float | None = None) -> Observation:
    """Runs `call` on `sandbox`; bad calls return an Observation with `error` set (and leave no receipt)."""
    args = call.arguments if isinstance(call.arguments, Mapping) else {}
    if call.name == "execute_code":
        language, code = args.get("language"), args.get("code")
        if not isinstance(language, str) or not isinstance(code, str):
            return _bad("execute_code needs string arguments 'language' and 'code'")
        return sandbox.execute_code(language, code, timeout_s)
    if call.name == "submit":
        path = args.get("path")
        if not isinstance(path, str) or not path:
            return _bad("submit needs a string argument 'path'")
        return sandbox.submit(path)
    return _bad(f"unknown tool {call.name!r}; available: {', '.join(TOOL_NAMES)}")
