"""Token-in/token-out assembly of a multi-turn agent episode (DESIGN.md "Token in, token out").

Sampled assistant ids are kept verbatim (loss mask 1, including the end-of-turn token `<|im_end|>` when the
model sampled it); everything else is template glue, tokenised once and masked 0: the prompt, the newline
after each `<|im_end|>`, the tool response turn and the next generation prompt. A transcript is never
re-rendered to rebuild training ids; `EpisodeBuilder.verify` only *checks* the assembled ids against the
tokenizer's chat template.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from bat_jax.models.chat import IM_END, IM_START, ChatTemplate, get_family, tool_response_text


class TemplateMismatchError(ValueError):
    """Assembled ids decode to text that the chat template would not render; cannot be reconciled."""


@dataclasses.dataclass(frozen=True)
class Episode:
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
    """Builds an `Episode` turn by turn from sampled ids and tool responses.

    `tokenizer` is a `transformers` tokenizer whose chat template is of `family` ('qwen3_5' or 'qwen3'):
    `apply_chat_template` renders the prompt, `encode(text, add_special_tokens=False)` tokenises glue and
    `decode` is used by `verify` and `messages`.

    Order: `start` once, then alternately `add_assistant` (or `add_assistant_text`) and `add_tool_response`,
    then `build`. A call out of order raises RuntimeError.
    """

    def __init__(self, tokenizer: Any, family: str):
        self.tokenizer = tokenizer
        self.family = get_family(family)
        self.template = ChatTemplate.from_tokenizer(tokenizer, self.family.name)
        self.eot_id = self._token_id(IM_END)
        self.im_start_id = self._token_id(IM_START)
        self._ids: list[int] = []
        self._mask: list[int] = []
        self._logprobs: list[float] = []
        self._messages: list[dict[str, Any]] = []
        self._tools: list[dict] | None = None
        self._state = "new"  # new -> awaiting_assistant <-> awaiting_tool

    def _token_id(self, token: str) -> int:
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        if not isinstance(token_id, int) or token_id == self.tokenizer.unk_token_id:
            raise ValueError(f"tokenizer {self.template.name!r} has no token {token!r}")
        return token_id

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _append(self, ids: Sequence[int], mask: int, logprobs: Sequence[float] | None = None) -> None:
        self._ids.extend(int(i) for i in ids)
        self._mask.extend([mask] * len(ids))
        self._logprobs.extend([0.0] * len(ids) if logprobs is None else (float(x) for x in logprobs))

    def _expect(self, state: str, call: str) -> None:
        if self._state != state:
            raise RuntimeError(f"EpisodeBuilder.{call}() called in state {self._state!r}, expected {state!r}")

    def start(self, messages: Sequence[dict[str, Any]], tools: list[dict] | None = None) -> list[int]:
        """Renders the prompt (system/user messages + tools) with the generation prompt; returns its ids.

        The prompt ids have loss mask 0. Raises RuntimeError when called twice.
        """
        self._expect("new", "start")
        self._messages = [dict(m) for m in messages]
        self._tools = tools
        text = self.tokenizer.apply_chat_template(
            self._messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
        if not text.endswith(self.family.generation_prompt):
            raise TemplateMismatchError(
                f"chat template {self.template.name!r} does not end its generation prompt with "
                f"{self.family.generation_prompt!r} (family {self.family.name}); wrong family?"
            )
        ids = self._encode(text)
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
        self._messages.append({"role": "assistant", "content": self.tokenizer.decode(body)})
        self._state = "awaiting_tool"

    def add_assistant_text(self, text: str) -> None:
        """Appends assistant text (e.g. `render_action` output for SFT) encoded canonically, plus `<|im_end|>`,
        with loss mask 1 and logprobs 0."""
        self.add_assistant(self._encode(text) + [self.eot_id])

    def add_tool_response(self, observation: str) -> list[int]:
        """Appends the tool response turn and the next generation prompt as glue (mask 0); returns its ids.

        The glue starts with the newline after the previous `<|im_end|>` (see `chat.tool_response_text`).
        """
        self._expect("awaiting_tool", "add_tool_response")
        ids = self._encode(tool_response_text(observation, self.family))
        self._append(ids, 0)
        self._messages.append({"role": "tool", "content": observation})
        self._state = "awaiting_assistant"
        return ids

    def messages(self) -> list[dict[str, Any]]:
        """The episode as chat messages (assistant contents are the decoded sampled turns)."""
        return [dict(m) for m in self._messages]

    def build(self) -> Episode:
        """The episode so far. After an assistant turn the template's closing newline is appended (mask 0),
        so the ids equal the whole rendered episode's; after a tool response the ids end with the open
        generation prompt."""
        if self._state == "new":
            raise RuntimeError("EpisodeBuilder.build() called before start()")
        ids, mask, logprobs = list(self._ids), list(self._mask), list(self._logprobs)
        if self._state == "awaiting_tool":
            tail = self._encode("\n")
            ids += tail
            mask += [0] * len(tail)
            logprobs += [0.0] * len(tail)
        return Episode(
            ids=np.asarray(ids, np.int32),
            loss_mask=np.asarray(mask, np.int32),
            logprobs=np.asarray(logprobs, np.float32),
            template=self.template,
        )

    def verify(self) -> bool:
        """Checks the assembled ids against rendering `messages()` with the chat template in one go.

        Returns True when the ids equal the canonical encoding of the rendered text, False when they decode
        to the same text with a different (sampled, non-canonical) tokenisation — the sampled ids are kept.
        Raises TemplateMismatchError, with the first differing character, when the texts differ.
        """
        episode = self.build()
        add_prompt = self._state == "awaiting_assistant"
        rendered = self.tokenizer.apply_chat_template(
            self._messages, tools=self._tools, add_generation_prompt=add_prompt, tokenize=False
        )
        decoded = self.tokenizer.decode(episode.ids.tolist())
        if decoded != rendered:
            at = next((i for i, (a, b) in enumerate(zip(decoded, rendered)) if a != b),
                      min(len(decoded), len(rendered)))  # fmt: skip
            raise TemplateMismatchError(
                f"assembled episode differs from the {self.template.name!r} template rendering at char {at}: "
                f"assembled {decoded[max(0, at - 40):at + 40]!r} vs rendered {rendered[max(0, at - 40):at + 40]!r}"
            )
        return episode.ids.tolist() == self._encode(rendered)
