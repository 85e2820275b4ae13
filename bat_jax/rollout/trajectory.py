"""The record one multi-turn rollout leaves for the verifier and the learner.

Details: docs/design.md.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from bat_jax.sandbox.types import Receipt

# Why an episode ended.
FINISH_SUBMITTED = "submitted"  # the agent's `submit` call succeeded
FINISH_NO_TOOL_CALL = "no_tool_call"  # a turn without a tool call (only with end_on_no_tool_call)
FINISH_MAX_TURNS = "max_turns"  # assistant-turn limit reached
FINISH_MAX_TOOL_CALLS = "max_tool_calls"  # a tool call beyond the limit was requested (not run)
FINISH_MAX_RESPONSE_TOKENS = "max_response_tokens"  # cumulative sampled-token budget spent; ids cut there
FINISH_MAX_CONTEXT = "max_context"  # the context window is full
FINISH_INVALID_TURN = "invalid_turn"  # the model's turn is unusable: empty, or it could not be processed
FINISH_SANDBOX_ERROR = "sandbox_error"  # infrastructure failure: the rollout is unscored (null, not zero)
FINISH_ENGINE_ERROR = "engine_error"  # the engine call for the turn failed (infrastructure: unscored)

FINISH_REASONS = (FINISH_SUBMITTED, FINISH_NO_TOOL_CALL, FINISH_MAX_TURNS, FINISH_MAX_TOOL_CALLS,
                  FINISH_MAX_RESPONSE_TOKENS, FINISH_MAX_CONTEXT, FINISH_INVALID_TURN, FINISH_SANDBOX_ERROR,
                  FINISH_ENGINE_ERROR)


@dataclasses.dataclass(frozen=True)
class Trajectory:
    """One episode of one RL row.

    Attributes:
      state_id: the request's state id (GRPO groups by it): for GRPO rollouts the round-scoped id of the row's
        draw (`pools.RoundItem.round_state_id`), so a row drawn twice makes two groups; the held-out id in evaluation.
      episode: index k of the rollout within its group, 0..K-1.
      stage: the row's stage name ('S1'..'S5' or 'E2E'), '' if unknown.
      ids: `[T] int32` token ids.
      loss_mask: `[T] int32`, 1 on sampled tokens, else 0.
      logprobs: `[T] float32` logprob as sampled on mask-1 tokens, 0 elsewhere.
      prompt_len: tokens of the initial prompt (system + user + generation prompt).
      finish_reason: one of `FINISH_REASONS`.
      truncated: True when sampled tokens were cut (response budget or per-turn cap); ids, mask and logprobs
        are cut at the same position.
      num_turns: assistant turns sampled.
      num_tool_calls: tool calls executed (execute_code and submit; parse errors are not calls).
      response_tokens: sampled tokens kept (= loss_mask.sum()).
      receipts: the sandbox's execution receipts, in call order.
      artefacts: workspace files created or changed by the episode (path → bytes), up to the configured size.
      skipped_artefacts: changed files left out of `artefacts` for size.
      submitted: workspace-relative path passed to a successful `submit`, or None.
      messages: the episode as chat messages (decoded sampled turns, observations), for a judge / logs.
      infra_error: text of an infrastructure failure ('' when none); when set the rollout is unscored.
        Only what the agent cannot cause counts here (engine down, image missing, a host-side error before the
        agent's first action ran).
      agent_error: text of a failure the agent caused ('' when none): the sandbox died, hung or stopped
        answering after the agent's code ran, the workspace it left could not be read back, or its turn could
        not be processed. The rollout is still scored (from the receipts and files gathered up to then) — a
        failure the agent causes is its own failure, never "unscored".
      sandbox_errors: tool calls that raised inside the sandbox backend (shown to the agent as observations).
      weight_version: policy weight version of the engine at the last turn.
      turn_versions: the weight version each assistant turn was sampled on, in turn order (an engine's
        `Completion.weight_version`; a turn that spanned a weight sync carries the version it began on). Under
        bounded-staleness GRPO (`learn/staleness.py`) the first entry is the version the rollout began on.
      template: identity of the chat template of the glue (`ChatTemplate.to_dict()`), {} if unknown.
    """

    state_id: str
    episode: int
    stage: str
    ids: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    prompt_len: int
    finish_reason: str
    truncated: bool
    num_turns: int
    num_tool_calls: int
    response_tokens: int
    receipts: tuple[Receipt, ...] = ()
    artefacts: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    skipped_artefacts: tuple[str, ...] = ()
    submitted: str | None = None
    messages: tuple[Mapping[str, Any], ...] = ()
    infra_error: str = ""
    agent_error: str = ""
    sandbox_errors: int = 0
    weight_version: int = 0
    turn_versions: tuple[int, ...] = ()
    template: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        n = len(self.ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(f"Trajectory {self.state_id}#{self.episode}: ids {n}, loss_mask "
                             f"{len(self.loss_mask)}, logprobs {len(self.logprobs)} must have equal length")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"Trajectory {self.state_id}#{self.episode}: unknown finish_reason "
                             f"{self.finish_reason!r}; expected one of {FINISH_REASONS}")

    @property
    def began_version(self) -> int:
        """The weight version of the rollout's first turn (`weight_version` when no turn was sampled)."""
        return self.turn_versions[0] if self.turn_versions else self.weight_version

    @property
    def scored(self) -> bool:
        """False for infrastructure failures: such rollouts leave their GRPO group (null is not zero)."""
        return not self.infra_error


def infra_warning(trajectories: Iterable[Any], what: str, consequence: str) -> str | None:
    """One log line on the trajectories infrastructure failures left unscored (`Trajectory.infra_error`).

    It gives their count and the commonest reason (cut to 300 characters); None when there are none. `what` names
    them (e.g. "GRPO rollouts"), `consequence` says what follows (e.g. "left out of the loss")."""
    errors = collections.Counter(t.infra_error for t in trajectories if getattr(t, "infra_error", ""))
    if not errors:
        return None
    message, count = errors.most_common(1)[0]
    message = message if len(message) <= 300 else message[:297] + "..."
    return (f"[bat_jax] warning: {sum(errors.values())} {what} unscored by infrastructure failures ({consequence}); "
            f"{count} of them: {message}")
