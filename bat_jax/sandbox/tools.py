"""The agent's two tools — `execute_code` and `submit` — as function schemas, the one action type, and dispatch.

`Action` is the one structured agent action of the package: what the action-level policies (scripted experts,
teachers) return, what `bat_jax.models.chat.parse_tool_call` parses sampled text into and `render_action`
renders, and what episodes record.

Details: docs/design.md.
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
#: The action that ends the episode without a tool call (a plain final assistant turn).
STOP = "stop"
#: Tool name → its parameter names, in the order the templates render them.
TOOL_PARAMETERS = {"execute_code": ("language", "code"), "submit": ("path",)}


def action_error(tool: Any, arguments: Any) -> str:
    """'' when (tool, arguments) is a valid call of one of `TOOL_NAMES` or a bare 'stop', else the reason."""
    if tool == STOP:
        return "" if not arguments else "stop takes no arguments"
    if tool not in TOOL_PARAMETERS:
        return f"unknown tool {tool!r}; available tools: {', '.join(TOOL_NAMES)}"
    if not isinstance(arguments, Mapping):
        return f"arguments of {tool} must be an object"
    expected = TOOL_PARAMETERS[tool]
    missing = [k for k in expected if k not in arguments]
    extra = [k for k in arguments if k not in expected]
    if missing or extra:
        return (f"{tool} takes parameters {', '.join(expected)}"
                + (f"; missing: {', '.join(missing)}" if missing else "")
                + (f"; unexpected: {', '.join(map(str, extra))}" if extra else ""))  # fmt: skip
    bad = [k for k in expected if not isinstance(arguments[k], str)]
    if bad:
        return f"parameters of {tool} must be strings: {', '.join(bad)}"
    if tool == "execute_code" and arguments["language"] not in LANGUAGES:
        return f"language must be one of {', '.join(LANGUAGES)}, got {arguments['language']!r}"
    return ""


@dataclasses.dataclass(frozen=True)
class Action:
    """One structured agent action (model-neutral; validated on construction).

    Attributes:
      thought: free reasoning text shown before the call (a chat template's thinking block), may be ''.
      tool: 'execute_code', 'submit', or `STOP` (no tool call; ends the episode).
      arguments: execute_code → {'language': one of LANGUAGES, 'code': str}; submit → {'path': str}; {} for
        'stop'. Exactly these keys, all strings.
      stage: the stage id the action belongs to (a stage of the task's benchmark), as an action-level policy
        names it; None lets the episode loop carry the previous turn's stage. Parsed model text never names one.

    Raises:
      ValueError: invalid (tool, arguments) — the message says which field and why.
    """

    thought: str
    tool: str
    arguments: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    stage: str | None = None

    def __post_init__(self):
        if not isinstance(self.thought, str):
            raise ValueError(f"action field 'thought' must be a string, got {type(self.thought).__name__}")
        error = action_error(self.tool, self.arguments)
        if error:
            field = "arguments" if self.tool in TOOL_NAMES + (STOP,) else "tool"
            raise ValueError(f"invalid action.{field}: {error}")

    def to_dict(self) -> dict[str, Any]:
        """The model-neutral action record {"thought", "tool", "arguments"} (the stage is not part of it)."""
        return {"thought": self.thought, "tool": self.tool, "arguments": dict(self.arguments)}

    @classmethod
    def from_dict(cls, data: Any, stage: str | None = None) -> Action:
        """Parses an action record {"thought"?, "tool", "arguments"?} ('arguments' defaults to {}).

        Raises:
          ValueError: `data` is not an object, or a field is missing or invalid (the message names it).
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"action must be an object, got {type(data).__name__}")
        if "tool" not in data:
            raise ValueError(f"action lacks field 'tool': {dict(data)!r:.200}")
        arguments = data.get("arguments", {})
        if not isinstance(arguments, Mapping):
            raise ValueError("action field 'arguments' must be an object")
        return cls(data.get("thought", ""), data["tool"], dict(arguments), stage)


def _bad(message: str) -> Observation:
    return Observation(stdout="", stderr="", exit_code=None, duration_s=0.0, error=message)


def dispatch(sandbox: Sandbox, action: Action, timeout_s: float | None = None) -> Observation:
    """Runs the tool call `action` on `sandbox`.

    `timeout_s` is the call's time limit in seconds (None: the sandbox's default). A call that cannot run (an empty
    submit path, a 'stop') returns an Observation with `error` set and leaves no receipt; it never raises."""
    args = action.arguments
    if action.tool == "execute_code":
        return sandbox.execute_code(args["language"], args["code"], timeout_s)
    if action.tool == "submit":
        if not args["path"]:
            return _bad("submit needs a non-empty string argument 'path'")
        return sandbox.submit(args["path"])
    return _bad(f"{action.tool!r} is not a tool call; available: {', '.join(TOOL_NAMES)}")
