"""Chat templates of the Qwen3.5 and Qwen3 families, structured tool actions and the tool-call parser.

Both families use `<|im_start|>ROLE\\n ... <|im_end|>\\n` turns and return tool output to the model as a user
turn wrapped in `<tool_response>\\n ... \\n</tool_response>`:

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import bisect
import json
import pathlib
import re
from collections.abc import Mapping
from typing import Any

from bat_jax.sandbox.tools import STOP, TOOL_NAMES, TOOL_PARAMETERS, Action, action_error
from bat_jax.sandbox.types import LANGUAGES

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"

#: Qwen3 added tokens in id order, starting at `QWEN3_SPECIAL_START_ID` (Qwen3 tokenizer_config.json).
QWEN3_SPECIAL_TOKENS = (
    ENDOFTEXT, IM_START, IM_END, "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
    "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
    "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)  # fmt: skip
QWEN3_SPECIAL_START_ID = 151643
#: Qwen3.5 added tokens in id order, starting at `QWEN3_5_SPECIAL_START_ID` (the Qwen3's, plus audio/tts).
QWEN3_5_SPECIAL_TOKENS = QWEN3_SPECIAL_TOKENS + (
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)  # fmt: skip
QWEN3_5_SPECIAL_START_ID = 248044
#: Added tokens that the published configs mark `special: false` (kept by `skip_special_tokens` decoding).
NON_SPECIAL_ADDED_TOKENS = frozenset(QWEN3_SPECIAL_TOKENS[14:26])

#: The control tokens of a plain ChatML template (family 'chatml'; SmolLM2 ids 0, 1, 2).
CHATML_SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)



@dataclasses.dataclass(frozen=True)
class ChatFamily:
    """What the token-level code needs to know about one template family.

    Attributes:
      name: 'qwen3_5', 'qwen3' or 'chatml'.
      special_tokens: added tokens in published id order.
      published_special_start_id: id of `special_tokens[0]` in the published vocabulary.
      generation_prompt: text the template appends for `add_generation_prompt=True` (thinking on).
      strips_content: whether the template strips whitespace around message contents (Qwen3.5 `|trim`).
      inline_tools: the template has no tools block / tool role: tools and tool results travel in ordinary
        system / user messages (`chatml_tools.inline_tools`), calls as plain JSON text.
    """

    name: str
    special_tokens: tuple[str, ...]
    published_special_start_id: int
    generation_prompt: str
    strips_content: bool
    inline_tools: bool = False

    def published_id(self, token: str) -> int:
        """Published vocabulary id of an added token. Raises KeyError for an unknown token."""
        if token not in self.special_tokens:
            raise KeyError(f"{token!r} is not an added token of family {self.name}")
        return self.published_special_start_id + self.special_tokens.index(token)


CHAT_FAMILIES = {
    "qwen3_5": ChatFamily("qwen3_5", QWEN3_5_SPECIAL_TOKENS, QWEN3_5_SPECIAL_START_ID,
                          f"{IM_START}assistant\n<think>\n", strips_content=True),
    "qwen3": ChatFamily("qwen3", QWEN3_SPECIAL_TOKENS, QWEN3_SPECIAL_START_ID,
                        f"{IM_START}assistant\n", strips_content=False),
    "chatml": ChatFamily("chatml", CHATML_SPECIAL_TOKENS, 0, f"{IM_START}assistant\n", strips_content=False,
                         inline_tools=True),
}  # fmt: skip
#: The chat family of each model family's own template (`configs.*Config.family` -> `CHAT_FAMILIES` key).
MODEL_CHAT_FAMILY = {"qwen3_5": "qwen3_5", "qwen3": "qwen3", "llama": "chatml"}


def get_family(family: str | ChatFamily) -> ChatFamily:
    """The `ChatFamily` named `family`. Raises ValueError naming the known families."""
    if isinstance(family, ChatFamily):
        return family
    if family not in CHAT_FAMILIES:
        raise ValueError(f"unknown chat family {family!r}; known: {sorted(CHAT_FAMILIES)}")
    return CHAT_FAMILIES[family]


class Control(str):
    """One control token of a chat template inside rendered text, encoded as its one id.

    It is an added token such as `<|im_end|>` or `<tool_call>`, never encoded from text. A plain `str` part is ordinary
    text."""


class Rendered(str):
    """Text rendered in a chat template (a `str`), with its control and ordinary-text `parts`.

    `Control` parts are the template's own control tokens, plain `str` parts are ordinary text (a `<|im_end|>` typed in
    a tool output is text). Slicing or concatenating gives a plain `str` (all ordinary text); `"".join(parts) == self`.
    """

    parts: tuple[str, ...]

    def __new__(cls, parts):
        parts = tuple(parts)
        self = super().__new__(cls, "".join(parts))
        self.parts = parts
        return self


def split_controls(text: str, tokens) -> tuple[str, ...]:
    """Splits template-literal `text` (never content) at occurrences of the control `tokens`.

    Tokens are matched longest first; the occurrences become `Control` parts, the rest plain parts. Pure function of its
    arguments."""
    pattern = "|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True))
    parts: list[str] = []
    position = 0
    for match in re.finditer(pattern, text) if pattern else ():
        if match.start() > position:
            parts.append(text[position:match.start()])
        parts.append(Control(match.group(0)))
        position = match.end()
    if position < len(text):
        parts.append(text[position:])
    return tuple(parts)


def _glue(text: str, fam: ChatFamily) -> tuple[str, ...]:
    return split_controls(text, fam.special_tokens)


# Qwen3.5 chat template, text-only (image/video content items are not rendered). Follows the published
# Qwen3.5 template: tools block in the system turn, XML tool calls, thinking kept for turns after the last
# real user query, tool results as `<tool_response>` blocks of one user turn. Kept as an asset file
# (bat_jax/assets/chat_templates/qwen3_5.jinja), read byte for byte.
QWEN3_5_CHAT_TEMPLATE = (pathlib.Path(__file__).resolve().parents[1] / "assets" / "chat_templates" /
                         "qwen3_5.jinja").read_text("utf-8")


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """Identity of a chat template, recorded in every derived (tokenised) view.

    Attributes:
      family: 'qwen3_5' or 'qwen3'.
      name: free-form source name (e.g. the tokenizer directory's basename).
      digest: SHA-256 hex of the Jinja template text.
    """

    family: str
    name: str
    digest: str

    @classmethod
    def from_text(cls, family: str, name: str, template: str) -> ChatTemplate:
        get_family(family)
        return cls(family=family, name=name, digest=hashlib.sha256(template.encode("utf-8")).hexdigest())

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, family: str) -> ChatTemplate:
        """Identity of a `transformers` tokenizer's chat template. Raises ValueError when it has none."""
        template = getattr(tokenizer, "chat_template", None)
        if not isinstance(template, str) or not template:
            raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template")
        name = str(getattr(tokenizer, "name_or_path", "")).rstrip("/").rsplit("/", 1)[-1]
        return cls.from_text(family, name, template)

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def tool_schemas() -> list[dict]:
    """JSON schemas (OpenAI function format) of the agent's two tools, for the system prompt's tools block."""
    return [
        {"type": "function", "function": {
            "name": "execute_code",
            "description": "Run python or bash code in the task workspace and return its stdout, stderr and "
                           "exit code.",
            "parameters": {"type": "object", "properties": {
                "language": {"type": "string", "enum": list(LANGUAGES), "description": "Interpreter to use."},
                "code": {"type": "string", "description": "The code to run."},
            }, "required": ["language", "code"]},
        }},
        {"type": "function", "function": {
            "name": "submit",
            "description": "Submit a workspace file as the final result and end the task.",
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "description": "Workspace-relative path of the result file."},
            }, "required": ["path"]},
        }},
    ]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ParseError:
    """A tool call that could not be parsed; the episode goes on with `observation` as the tool response.

    Attributes:
      kind: 'no_tool_call' | 'malformed' | 'multiple_calls' | 'unknown_tool' | 'bad_arguments'.
      message: what was wrong, for logs.
      observation: the text returned to the agent.
    """

    kind: str
    message: str
    observation: str


def render_action(action: Action | Mapping[str, Any], family: str | ChatFamily) -> Rendered:
    """Assistant text for one action: what the family's template renders after the generation prompt.

    The end-of-turn token is not included. For 'qwen3_5' the text starts inside the thinking block opened by
    the generation prompt (`THOUGHT\\n</think>\\n\\n<tool_call>...`); for 'qwen3' it starts with `<think>\\n`.
    Matches `apply_chat_template` of an assistant message {reasoning_content: thought, content: '',
    tool_calls: [call]} (no tool_calls for 'stop') placed after the last user query. The result is a
    `Rendered` string: only the template's tags (`<think>`, `</think>`, `<tool_call>`, `</tool_call>`) are
    `Control` parts ('chatml': no thinking block, `THOUGHT\\n<tool_call>\\n{JSON}\\n</tool_call>` all text); the
    thought and the argument values are ordinary text whatever they contain, and
    `parse_tool_call` gives the arguments back byte for byte. Raises ValueError for an invalid action.
    """
    fam = get_family(family)
    if not isinstance(action, Action):
        action = Action.from_dict(action)
    if fam.inline_tools:  # plain text: THOUGHT, then the JSON call between text tags
        thought = action.thought.strip()
        if action.tool == STOP:
            return Rendered((thought,))
        call = json.dumps({"name": action.tool, "arguments": dict(action.arguments)}, ensure_ascii=False)
        return Rendered((f"{thought}\n" if thought else "", f"<tool_call>\n{call}\n</tool_call>"))
    head = (action.thought.strip(),) if fam.name == "qwen3_5" else (*_glue("<think>\n", fam),
                                                                    action.thought.strip("\n"))
    if action.tool == STOP:  # thinking block, empty answer
        return Rendered((*head, *_glue("\n</think>\n\n", fam)))
    if fam.name == "qwen3_5":
        params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in action.arguments.items())
        call = f"\n<function={action.tool}>\n{params}</function>\n"
    else:
        call = json.dumps({"name": action.tool, "arguments": dict(action.arguments)}, ensure_ascii=False)
        call = f"\n{call}\n"
    return Rendered((*head, *_glue("\n</think>\n\n<tool_call>", fam), call, *_glue("</tool_call>", fam)))


def tool_response_text(observation: str, family: str | ChatFamily) -> Rendered:
    """Template glue after an assistant turn's end-of-turn token, through the next generation prompt.

    `\\n<|im_start|>user\\n<tool_response>\\nOBS\\n</tool_response><|im_end|>\\n` + generation prompt; OBS is
    stripped for 'qwen3_5' (its template trims contents). A `Rendered` string in which OBS is one ordinary-text
    part (a `<|im_end|>` printed by a tool stays text).
    """
    fam = get_family(family)
    obs = observation.strip() if fam.strips_content else observation
    return Rendered((*_glue(f"\n{IM_START}user\n<tool_response>\n", fam), obs,
                     *_glue(f"\n</tool_response>{IM_END}\n{fam.generation_prompt}", fam)))


_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_FUNCTION_RE = re.compile(r"\s*<function=([^>\n]*)>(.*)</function>\s*", re.DOTALL)
_PARAM_OPEN_RE = re.compile(r"\s*<parameter=([^>\n]*)>")
_NEXT_PARAM_RE = re.compile(r"\s*<parameter=")
#: A parameter whose `</parameter>` is followed by the next `<parameter=` or the end of the function.
_PARAM_RE = re.compile(r"\s*<parameter=([^>\n]*)>(.*?)</parameter>(?=\s*<parameter=|\s*\Z)", re.DOTALL)
_CLOSE_PARAM = "</parameter>"
_BLANK_TO_END_RE = re.compile(r"\s*\Z")
#: Most characters the readings of one XML call may pass over (`_xml_work`): each `</tool_call>` gives a reading
#: per `</parameter>` before it and each costs a pass over the text up to it, so a turn full of closing tags
#: would stall the host (67 kB of them took 78 s); past the bound the turn is a 'malformed' call. A call with
#: thousands of tags inside one value still reads byte for byte (about 0.3 s at the bound).
MAX_XML_WORK = 500_000_000


def _format_help(fam: ChatFamily) -> str:
    example = Action("", "execute_code", {"language": "python", "code": "print('hello')"})
    text = render_action(example, fam)
    return text[text.index("<tool_call>"):]


def _error(kind: str, message: str, fam: ChatFamily) -> ParseError:
    observation = (f"[tool call error] {message}\nCall exactly one tool per turn ({', '.join(TOOL_NAMES)}), "
                   f"in this format:\n{_format_help(fam)}")  # fmt: skip
    return ParseError(kind=kind, message=message, observation=observation)


def _is_call(parsed: Any) -> bool:
    return isinstance(parsed, tuple) and parsed[0] in TOOL_NAMES and not action_error(*parsed)


def _tags(text: str, tag: str, begin: int = 0) -> list[int]:
    """Offsets of `tag` in `text` from `begin`; in a `Rendered` text holding `tag` as a `Control`, only those."""
    if isinstance(text, Rendered) and tag in [p for p in text.parts if isinstance(p, Control)]:
        offsets = [0]
        for part in text.parts:
            offsets.append(offsets[-1] + len(part))
        return [at for at, part in zip(offsets, text.parts) if isinstance(part, Control) and part == tag
                and at >= begin]  # fmt: skip
    return [m.start() for m in re.finditer(re.escape(tag), text) if m.start() >= begin]


def parse_tool_call(text: str, family: str | ChatFamily) -> Action | ParseError:
    """Parses one assistant turn's text into an `Action`; a malformed call gives a `ParseError`.

    `text` is the decoded sampled turn (a trailing `<|im_end|>` is ignored). The thought is the text before the
    first `</think>` ('qwen3': only when the turn opens with `<think>`; 'chatml': the text before the call); the
    call starts at the next
    `<tool_call>`. Values may hold any text, tags included: the call ends at a `</tool_call>` whose block is a
    valid call (JSON delimits itself; an XML `</parameter>` closes a value only where `<parameter=` or the
    function's end follows, and the tool's parameters decide between readings). Of the valid readings the first
    is taken; when it is followed by a `<tool_call>` the turn is 'multiple_calls', and when it is followed by
    other text, a valid reading through the last `</tool_call>` wins. So `render_action` arguments come back
    byte for byte, except an XML value holding a complete call end then `<tool_call>` (read as two calls) and a
    thought holding `</think>`. That is, unless `text` is a `Rendered` string with `Control` tags (`render_action`
    output, `TextCodec.decode` of sampled ids). Then only those tags count (a tag never sampled as a control is
    looked for in the text) and nothing is ambiguous.
    XML values lose the one newline the template puts on each side. Never raises for model output: whatever
    breaks the reading (JSON nested past the recursion limit, a number too long to convert) is a 'malformed'
    `ParseError`, and so is an XML call whose readings would pass over more than `MAX_XML_WORK` characters
    (thousands of closing tags: reading them would take minutes).

    Raises:
      ValueError: an unknown `family` (the caller's error, not the model's).
    """
    fam = get_family(family)
    try:
        return _parse_tool_call(text, fam)
    except Exception as exc:  # noqa: BLE001 - model output is arbitrary; a reading that breaks is malformed
        return _error("malformed", f"the tool call could not be read ({type(exc).__name__})", fam)


def _parse_tool_call(text: str, fam: ChatFamily) -> Action | ParseError:
    source, text = text, str(text).removesuffix(IM_END)
    thought, begin = "", 0
    think = [] if fam.inline_tools else _tags(source, "</think>")
    if think and (fam.name == "qwen3_5" or text.lstrip().startswith("<think>")):
        thought, begin = text[:think[0]].strip().removeprefix("<think>").strip(), think[0] + len("</think>")
    opens = _tags(source, "<tool_call>", begin)
    if not opens:
        return _error("no_tool_call", "no <tool_call> block found in your reply", fam)
    if fam.inline_tools:  # 'chatml': the thought is the text before the call
        thought = text[:opens[0]].strip()
    start = opens[0] + len("<tool_call>")
    ends = [end for end in _tags(source, "</tool_call>", start) if end < len(text)]
    if not ends:
        return _error("malformed", "the <tool_call> block is not closed with </tool_call>", fam)
    if fam.name == "qwen3_5" and _xml_work(text, start, ends) > MAX_XML_WORK:
        return _error("malformed", f"the call has {len(ends)} </tool_call> and {text.count(_CLOSE_PARAM, start)} "
                      "</parameter> tags: too many ways to read it", fam)
    parse = _parse_xml_call if fam.name == "qwen3_5" else _parse_json_call
    readings = [(end, parse(text[start:end])) for end in ends]
    valid = [(end, parsed) for end, parsed in readings if _is_call(parsed)]
    if not valid:
        if len(opens) > 1 and len(ends) > 1 and len(_CALL_RE.findall(text[begin:])) > 1:
            return _error("multiple_calls", "found more than one <tool_call> block; only one is allowed", fam)
        parsed = next((parsed for _, parsed in readings if isinstance(parsed, tuple)), None)
        if parsed is None:
            return _error("malformed", readings[0][1], fam)
        tool = parsed[0]
        if tool not in TOOL_NAMES:  # 'stop' included: it is the absence of a call, not a tool
            return _error("unknown_tool", f"unknown tool {tool!r}; available tools: {', '.join(TOOL_NAMES)}", fam)
        return _error("bad_arguments", action_error(*parsed), fam)
    (end, parsed), (last_end, last) = valid[0], valid[-1]
    if _tags(source, "<tool_call>", end):
        return _error("multiple_calls", "found more than one <tool_call> block; only one is allowed", fam)
    if text[end + len("</tool_call>"):].strip() and not text[last_end + len("</tool_call>"):].strip():
        parsed = last
    return Action(thought=thought, tool=parsed[0], arguments=parsed[1])


def _xml_work(text: str, start: int, ends: list[int]) -> int:
    """Characters the XML readings of a call from `start` to each of `ends` pass over.

    For each end: the `</parameter>` tags before it (one reading each) times the length of its block."""
    closes, at = [], text.find(_CLOSE_PARAM, start)
    while at >= 0:
        closes.append(at)
        at = text.find(_CLOSE_PARAM, at + 1)
    return sum((bisect.bisect_left(closes, end) + 1) * (end - start) for end in ends)


def _xml_value(raw: str) -> str:
    """A parameter value without the one newline the template writes on each side."""
    raw = raw[1:] if raw.startswith("\n") else raw
    return raw[:-1] if raw.endswith("\n") else raw


def _xml_readings(inner: str, expected: tuple[str, ...], position: int = 0, seen: tuple[str, ...] = ()):
    """Yields the argument dicts `inner` reads as with each of `expected` once, shortest values first.

    A `</parameter>` closes a value where the next `<parameter=` (or, for the last parameter, only whitespace) follows,
    so there are at most (closing tags)^(len(expected)-1) readings."""
    if _BLANK_TO_END_RE.match(inner, position):
        yield {}
        return
    opening = _PARAM_OPEN_RE.match(inner, position)
    key = opening.group(1).strip() if opening else None
    if key not in expected or key in seen:
        return
    if len(seen) + 1 == len(expected):  # the last parameter: its value ends at the last closing tag
        close = inner.rfind(_CLOSE_PARAM)
        if close >= opening.end() and _BLANK_TO_END_RE.match(inner, close + len(_CLOSE_PARAM)):
            yield {key: _xml_value(inner[opening.end():close])}
        return
    close = inner.find(_CLOSE_PARAM, opening.end())
    while close >= 0:
        if _NEXT_PARAM_RE.match(inner, close + len(_CLOSE_PARAM)):
            for rest in _xml_readings(inner, expected, close + len(_CLOSE_PARAM), seen + (key,)):
                yield {key: _xml_value(inner[opening.end():close]), **rest}
        close = inner.find(_CLOSE_PARAM, close + 1)


def _parse_xml_call(call: str) -> tuple[str, dict[str, str]] | str:
    """(name, arguments) of one `<function=NAME>...</function>` block, or the reason it cannot be read.

    The arguments are a valid reading when the tool has one, else the plain reading (for the error message)."""
    match = _FUNCTION_RE.fullmatch(call)
    if not match:
        return "expected <function=NAME> ... </function> inside <tool_call>"
    name, inner = match.group(1).strip(), match.group(2)
    for arguments in _xml_readings(inner, TOOL_PARAMETERS.get(name, ())):
        if not action_error(name, arguments):
            return name, arguments
    arguments, position = {}, 0
    while inner[position:].strip():
        param = _PARAM_RE.match(inner, position)
        if not param:
            return f"expected <parameter=NAME>\\nVALUE\\n</parameter>, got {inner[position:].strip()[:80]!r}"
        if param.group(1).strip() in arguments:
            return f"parameter {param.group(1).strip()!r} given twice"
        arguments[param.group(1).strip()] = _xml_value(param.group(2))
        position = param.end()
    return name, arguments


def _parse_json_call(call: str) -> tuple[str, dict[str, Any]] | str:
    try:
        obj = json.loads(call)
    except json.JSONDecodeError as e:
        return f"the tool call is not valid JSON ({e.msg} at char {e.pos})"
    except (ValueError, RecursionError) as e:  # e.g. nested past the recursion limit, a 5,000-digit number
        return f"the tool call is not valid JSON ({type(e).__name__})"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return 'expected a JSON object {"name": ..., "arguments": {...}}'
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return "'arguments' is a string that is not a JSON object"
    if not isinstance(arguments, dict):
        return "'arguments' must be a JSON object"
    return obj["name"], arguments
