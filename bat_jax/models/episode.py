"""Token-in/token-out assembly of a multi-turn agent episode.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bat_jax.models.chat import (IM_END, IM_START, ChatTemplate, Control, Rendered, get_family, split_controls,
                                 tool_response_text)
from bat_jax.models.chatml_tools import inline_tools

#: Unicode normalisers a byte-level BPE can do without: skipped so that decoding gives the exact characters.
_UNICODE_NORMALIZERS = ("NFC", "NFD", "NFKC", "NFKD")


class TextCodec:
    """Text ⇄ ids of one tokenizer with text and the chat template's control tokens kept apart.

    `controls` are the tokenizer's added tokens (`get_added_vocab`) plus the family's published added tokens it
    knows. `encode` turns a plain `str` into ordinary-text ids only (every added token typed as text is
    spelled with ordinary tokens; decoding gives the same characters back) and a `chat.Rendered` string into
    the ids of its parts (a `Control` part is its one id). For a `transformers` fast tokenizer the text path is
    the backend's pre-tokenizer and BPE model without the added vocabulary (and without a Unicode normaliser,
    so that an 'e' + U+0301 stays two code points); any other tokenizer must accept
    `encode(text, add_special_tokens=False, split_special_tokens=True)` and never return a control id.
    """

    def __init__(self, tokenizer: Any, family: str):
        self.tokenizer = tokenizer
        self.family = get_family(family)
        controls = dict(tokenizer.get_added_vocab()) if hasattr(tokenizer, "get_added_vocab") else {}
        for token in self.family.special_tokens:
            token_id = tokenizer.convert_tokens_to_ids(token)
            if token not in controls and isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
                controls[token] = token_id
        self.controls: dict[str, int] = controls
        self._tokens = {i: t for t, i in controls.items()}
        self._control_re = re.compile("|".join(re.escape(t) for t in sorted(controls, key=len, reverse=True)))
        self._plain = None
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:
            from tokenizers import Tokenizer

            self._plain = Tokenizer(backend.model)  # the learned vocabulary only: no added tokens
            self._plain.pre_tokenizer = backend.pre_tokenizer
            if backend.normalizer is not None and type(backend.normalizer).__name__ not in _UNICODE_NORMALIZERS:
                self._plain.normalizer = backend.normalizer

    def control_id(self, token: str) -> int:
        """The id of control token `token`. Raises ValueError when the tokenizer has no such added token."""
        if token not in self.controls:
            raise ValueError(f"tokenizer {getattr(self.tokenizer, 'name_or_path', '?')!r} has no token {token!r}")
        return self.controls[token]

    def encode_text(self, text: str) -> list[int]:
        """[n] ordinary-text ids of `text` (no control id whatever it contains).

        Raises ValueError when the tokenizer gave a control id anyway (a tokenizer that cannot encode added tokens as
        text)."""
        if not text:
            return []
        if self._plain is not None:
            ids = self._plain.encode(text, add_special_tokens=False).ids
        else:
            ids = list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
        forged = [self._tokens[i] for i in ids if i in self._tokens]
        if forged:
            raise ValueError(f"encoding text gave control tokens {forged[:3]}; the tokenizer cannot encode its "
                             f"added tokens as ordinary text")
        return [int(i) for i in ids]

    def encode(self, text: str | Sequence[str]) -> list[int]:
        """Ids of `text`, a `Rendered` string encoded by its parts.

        A `Rendered` string (or a sequence of parts) by parts, `Control` parts as their one id and the text between two
        controls encoded in one piece (as a tokenizer splits at added tokens); a plain `str` is ordinary text
        throughout. Raises ValueError for an unknown control token."""
        parts = text.parts if isinstance(text, Rendered) else (text,) if isinstance(text, str) else tuple(text)
        ids: list[int] = []
        run: list[str] = []
        for part in parts:
            if isinstance(part, Control):
                ids += self.encode_text("".join(run)) + [self.control_id(part)]
                run = []
            else:
                run.append(part)
        return ids + self.encode_text("".join(run))

    def decode(self, ids: Sequence[int]) -> Rendered:
        """`ids` as a `Rendered` string: each control id a `Control` part, each run of other ids decoded text."""
        parts: list[str] = []
        run: list[int] = []
        for i in [int(x) for x in ids] + [None]:
            if i is None or i in self._tokens:
                if run:
                    parts.append(self.tokenizer.decode(run))
                run = []
                if i is not None:
                    parts.append(Control(self._tokens[i]))
            else:
                run.append(i)
        return Rendered(parts)

    def render_chat(self, messages: Sequence[Mapping[str, Any]], tools: list[dict] | None = None,
                    add_generation_prompt: bool = False) -> Rendered:
        """The tokenizer's `apply_chat_template` text of `messages` / `tools`, as a `Rendered` string.

        Its `Control` parts are exactly the control tokens the template wrote itself.

        Every control token typed in a string of `messages` or `tools` (contents, tool-call arguments, tool
        schemas) is rendered through a private-use stand-in character and restored as ordinary text, so the
        template neither sees it (e.g. a brief starting with `<tool_response>`) nor lets it become an id. The
        `Control` parts of a `Rendered` content (a decoded sampled turn) stay controls. Raises ValueError when
        no stand-ins are free (inputs using the whole private-use plane), and whatever the template raises.
        """
        messages, tools = inline_tools(messages, tools, self.family)  # 'chatml': tools in the messages
        strings: list[str] = []
        _collect((messages, tools), strings)
        used = set("".join(strings)) | set(str(getattr(self.tokenizer, "chat_template", "") or ""))
        tokens = sorted(self.controls)
        base = next((b for b in range(0x100000, 0x10FFFE - len(tokens), len(tokens))
                     if not any(chr(b + k) in used for k in range(len(tokens)))), None)
        if base is None:
            raise ValueError("no free private-use characters to stand in for control tokens")
        stand_in = {t: chr(base + k) for k, t in enumerate(tokens)}

        def protect(obj: Any) -> Any:
            if isinstance(obj, Rendered):
                return "".join(p if isinstance(p, Control) else protect(p) for p in obj.parts)
            if isinstance(obj, str):
                return self._control_re.sub(lambda m: stand_in[m.group(0)], obj) if self.controls else obj
            if isinstance(obj, Mapping):
                return {protect(k): protect(v) for k, v in obj.items()}
            if isinstance(obj, (list, tuple)):
                return [protect(v) for v in obj]
            return obj

        text = self.tokenizer.apply_chat_template(
            protect(list(messages)), tools=protect(tools) if tools is not None else None,
            add_generation_prompt=add_generation_prompt, tokenize=False)  # fmt: skip
        restore = str.maketrans({c: t for t, c in stand_in.items()})
        return Rendered(p if isinstance(p, Control) else p.translate(restore)
                        for p in split_controls(text, self.controls))


def _collect(obj: Any, out: list[str]) -> None:
    """Appends every string (keys included) inside `obj` to `out`."""
    if isinstance(obj, str):
        out.append(obj)
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            _collect(k, out)
            _collect(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _collect(v, out)


class TemplateMismatchError(ValueError):
    """Assembled ids decode to text that the chat template would not render; cannot be reconciled."""


@dataclasses.dataclass(frozen=True)
class TokenEpisode:
    """A tokenised episode.

    Attributes:
      ids: [T] int32 token ids.
      loss_mask: [T] int32, 1 on sampled assistant tokens (incl. sampled `<|im_end|>`), else 0.
      logprobs: [T] float32 sampling log-probabilities (natural log), 0 where loss_mask is 0.
      template: identity of the chat template the glue follows.
    """

    ids: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    template: ChatTemplate


class EpisodeBuilder:
    """Builds a `TokenEpisode` turn by turn from sampled ids and tool responses.

    `tokenizer` is a `transformers` tokenizer whose chat template is of `family` ('qwen3_5', 'qwen3' or 'chatml'):
    `apply_chat_template` renders the prompt and `decode` is used by `verify` and `messages`; all text goes
    through `codec` (a `TextCodec`), so only the template's own control tokens become control ids.

    Order: `start` once, then alternately `add_assistant` (or `add_assistant_text`) and `add_tool_response`,
    then `build`. A call out of order raises RuntimeError.
    """

    def __init__(self, tokenizer: Any, family: str):
        self.tokenizer = tokenizer
        self.family = get_family(family)
        self.template = ChatTemplate.from_tokenizer(tokenizer, self.family.name)
        self.codec = TextCodec(tokenizer, self.family.name)
        self.eot_id = self.codec.control_id(IM_END)
        self.im_start_id = self.codec.control_id(IM_START)
        self._ids: list[int] = []
        self._mask: list[int] = []
        self._logprobs: list[float] = []
        self._messages: list[dict[str, Any]] = []
        self._tools: list[dict] | None = None
        self._state = "new"  # new -> awaiting_assistant <-> awaiting_tool

    def encode(self, text: str | Sequence[str]) -> list[int]:
        """[n] ids of `text` (`TextCodec.encode`).

        A `chat.Rendered` string (e.g. `render_action` output) by its parts, a plain `str` as ordinary text only."""
        return self.codec.encode(text)

    def _append(self, ids: Sequence[int], mask: int, logprobs: Sequence[float] | None = None) -> None:
        self._ids.extend(int(i) for i in ids)
        self._mask.extend([mask] * len(ids))
        self._logprobs.extend([0.0] * len(ids) if logprobs is None else (float(x) for x in logprobs))

    def _expect(self, state: str, call: str) -> None:
        if self._state != state:
            raise RuntimeError(f"EpisodeBuilder.{call}() called in state {self._state!r}, expected {state!r}")

    def start(self, messages: Sequence[dict[str, Any]], tools: list[dict] | None = None) -> list[int]:
        """Renders the prompt (system/user messages + tools) with the generation prompt; returns its ids.

        The prompt ids have loss mask 0; contents and tool schemas are ordinary text (`TextCodec.render_chat`).
        Raises RuntimeError when called twice.
        """
        self._expect("new", "start")
        self._messages = [dict(m) for m in messages]
        self._tools = tools
        text = self.codec.render_chat(self._messages, tools, add_generation_prompt=True)
        if not text.endswith(self.family.generation_prompt):
            raise TemplateMismatchError(
                f"chat template {self.template.name!r} does not end its generation prompt with "
                f"{self.family.generation_prompt!r} (family {self.family.name}); wrong family?"
            )
        ids = self.encode(text)
        self._append(ids, 0)
        self._state = "awaiting_assistant"
        return ids

    def add_assistant(
        self, sampled_ids: Sequence[int], logprobs: Sequence[float] | None = None, *, truncated: bool = False
    ) -> None:
        """Appends one sampled assistant turn verbatim with loss mask 1.

        Args:
          sampled_ids: [n] the sampled ids, ending with `<|im_end|>` unless `truncated`.
          logprobs: [n] their sampling logprobs (0 when None, e.g. SFT).
          truncated: the turn hit the token limit; a `<|im_end|>` is appended as glue (mask 0). Ignored when
            the last sampled id is `<|im_end|>` (the turn is closed already).
        Raises:
          ValueError: empty turn, wrong logprobs length, `<|im_start|>` or an `<|im_end|>` before the last
            token (such ids cannot be one assistant turn of the template), or a missing final `<|im_end|>`
            without `truncated`.
        """
        self._expect("awaiting_assistant", "add_assistant")
        ids = [int(i) for i in sampled_ids]
        if not ids:
            raise ValueError("empty assistant turn")
        if logprobs is not None and len(logprobs) != len(ids):
            raise ValueError(f"logprobs has {len(logprobs)} entries for {len(ids)} sampled ids")
        if self.im_start_id in ids:
            raise ValueError(f"sampled turn contains {IM_START} at position {ids.index(self.im_start_id)}")
        if truncated and ids[-1] == self.eot_id:
            truncated = False  # the cut fell right after a sampled end-of-turn: an ordinary closed turn
        body = ids if truncated else ids[:-1]
        if self.eot_id in body:
            raise ValueError(f"sampled turn contains {IM_END} at position {body.index(self.eot_id)} before its end")
        if not truncated and ids[-1] != self.eot_id:
            raise ValueError(f"sampled turn does not end with {IM_END}; pass truncated=True for a cut-off turn")
        self._append(ids, 1, logprobs)
        if truncated:
            self._append([self.eot_id], 0)
        self._messages.append({"role": "assistant", "content": self.codec.decode(body)})
        self._state = "awaiting_tool"

    def add_assistant_text(self, text: str | Sequence[str]) -> None:
        """Appends assistant text plus `<|im_end|>`, with loss mask 1 and logprobs 0.

        `text` is encoded by `encode`: `render_action` output (a `chat.Rendered`) has the template's tags as control ids
        and its thought and arguments as ordinary text; a plain `str` is ordinary text throughout."""
        self.add_assistant(self.encode(text) + [self.eot_id])

    def add_tool_response(self, observation: str) -> list[int]:
        """Appends the tool response turn and the next generation prompt as glue (mask 0); returns its ids.

        The glue starts with the newline after the previous `<|im_end|>` (see `chat.tool_response_text`);
        `observation` is ordinary text (a printed `<|im_end|>` does not end the turn).
        """
        self._expect("awaiting_tool", "add_tool_response")
        ids = self.encode(tool_response_text(observation, self.family))
        self._append(ids, 0)
        self._messages.append({"role": "tool", "content": observation})
        self._state = "awaiting_assistant"
        return ids

    def messages(self) -> list[dict[str, Any]]:
        """The episode as chat messages (plain `str` contents; assistant contents are the decoded sampled turns)."""
        return [{k: str(v) if isinstance(v, Rendered) else v for k, v in m.items()} for m in self._messages]

    def build(self) -> TokenEpisode:
        """The episode so far.

        After an assistant turn the template's closing newline is appended (mask 0), so the ids equal the whole rendered
        episode's; after a tool response the ids end with the open generation prompt."""
        if self._state == "new":
            raise RuntimeError("EpisodeBuilder.build() called before start()")
        ids, mask, logprobs = list(self._ids), list(self._mask), list(self._logprobs)
        if self._state == "awaiting_tool":
            tail = self.codec.encode_text("\n")
            ids += tail
            mask += [0] * len(tail)
            logprobs += [0.0] * len(tail)
        return TokenEpisode(
            ids=np.asarray(ids, np.int32),
            loss_mask=np.asarray(mask, np.int32),
            logprobs=np.asarray(logprobs, np.float32),
            template=self.template,
        )

    def verify(self) -> bool:
        """Checks the assembled ids against rendering `messages()` with the chat template in one go.

        Returns True when the ids equal the canonical encoding of the rendered text (`TextCodec`: template
        controls as ids, text as ordinary text), False when they decode to the same text with a different
        (sampled, non-canonical) tokenisation — the sampled ids are kept. A sampled turn that spelled a tag
        such as `</think>` with text tokens counts as such when the plain-text rendering matches. Raises
        TemplateMismatchError, with the first differing character, when the texts differ.
        """
        episode = self.build()
        add_prompt = self._state == "awaiting_assistant"
        rendered = self.codec.render_chat(self._messages, self._tools, add_generation_prompt=add_prompt)
        decoded = self.tokenizer.decode(episode.ids.tolist())
        if decoded != rendered:
            from jinja2 import TemplateError  # here only: rendering a template needs jinja2, importing this does not

            try:  # a tag the model spelled with text tokens: the template reads the plain text alike
                messages, tools = inline_tools(self.messages(), self._tools, self.family)
                if decoded == self.tokenizer.apply_chat_template(
                        messages, tools=tools, add_generation_prompt=add_prompt, tokenize=False):
                    return False
            except TemplateError:
                pass
            at = next((i for i, (a, b) in enumerate(zip(decoded, rendered)) if a != b),
                      min(len(decoded), len(rendered)))  # fmt: skip
            raise TemplateMismatchError(
                f"assembled episode differs from the {self.template.name!r} template rendering at char {at}: "
                f"assembled {decoded[max(0, at - 40):at + 40]!r} vs rendered {rendered[max(0, at - 40):at + 40]!r}"
            )
        return episode.ids.tolist() == self.encode(rendered)
