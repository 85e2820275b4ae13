"""The rollout engine contract and the one definition of "logprob as sampled".

A `RolloutEngine` turns a batch of token-id prompts into completions: the sampled ids, the per-token logprobs
*as sampled*, and a finish reason per row. `update_weights` installs new policy parameters and returns the new
weight version (rollouts record it so the learner knows which policy produced them).

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:  # JAX is imported where it is used: the vLLM replica processes import this module without it
    import jax

#: Logprob given to tokens outside the truncated distribution (finite stand-in for -inf).
MASKED_LOGPROB = -1e30

#: Finish reasons of one generated row.
FINISH_STOP = "stop"  # a stop token (end of turn) was sampled; it is the last token of the row
FINISH_LENGTH = "length"  # the row's token budget ran out before a stop token


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch of completions.

    Attributes:
      temperature: T >= 0; 0 is greedy. Default 0.7 (paper App. A.7, Table 8; the released code).
      top_p: nucleus mass in (0, 1]; 1 disables it.
      top_k: keep the k most likely tokens; 0 disables it.
      max_new_tokens: most tokens generated per row (tokens; the paper's response limit is 2,048, App. A.7, Table 8).
      stop_token_ids: ids that end a row (the chat template's end-of-turn tokens); the stop token is kept as
        the row's last token, with its logprob, so the learner trains on it.
      seed: base PRNG seed; rows get independent streams (see `RolloutEngine.generate`).
    """

    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 2048
    stop_token_ids: tuple[int, ...] = ()
    seed: int = 0

    def __post_init__(self):
        if not self.temperature >= 0.0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))


@dataclasses.dataclass(frozen=True)
class Completion:
    """One generated row.

    Attributes:
      token_ids: `[n] int32` sampled ids (stop token included when finish_reason == 'stop').
      logprobs: `[n] float32` logprob as sampled of each id (module docstring).
      finish_reason: 'stop' or 'length'.
      weight_version: version of the weights that produced the row.
    """

    token_ids: np.ndarray
    logprobs: np.ndarray
    finish_reason: str
    weight_version: int = 0


class RolloutEngine(Protocol):
    """What the agent loop needs from a policy server (embedded JAX sampler or vLLM)."""

    @property
    def weight_version(self) -> int:
        """Version of the installed weights (0 at construction, +1 per `update_weights`)."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
                 max_new_tokens: Sequence[int] | None = None,
                 seeds: Sequence[int] | None = None) -> list[Completion]:
        """Samples one completion per prompt.

        Args:
          prompts: token ids per row (any lengths >= 1).
          params: sampling parameters shared by the batch.
          max_new_tokens: optional per-row token budgets (each <= params.max_new_tokens), e.g. what is left of
            an episode's response-token limit.
          seeds: optional per-row seeds; a row's tokens depend only on (its prompt, its seed, the weights),
            not on the other rows. Default: params.seed + row index.
        Returns: one `Completion` per prompt, in order.
        Raises: ValueError on an empty prompt or a prompt longer than the engine's context.
        """

    def update_weights(self, params: Any) -> int:
        """Installs new parameters (an `nnx.State` for the JAX sampler) and returns the new weight version."""


def processed_logprobs(logits: jax.Array, temperature: Any, top_p: Any = 1.0, top_k: Any = 0) -> jax.Array:
    """Log of the tempered, top-k / top-p truncated, renormalised next-token distribution.

    Args:
      logits: `[..., vocab]` raw model logits (any float dtype; computed in float32).
      temperature, top_p, top_k: Python numbers or traced scalars (the sampler traces them so one compiled
        program serves every setting). With Python numbers and top_p == 1, top_k == 0 the sort is skipped;
        the result is the same as the general path's.
    Returns: `[..., vocab] float32` log-probabilities; truncated tokens hold `MASKED_LOGPROB`.
    Source: module docstring (vLLM sampler order, processed logprobs).
    """
    import jax
    import jax.numpy as jnp

    z = logits.astype(jnp.float32)
    static = all(isinstance(x, (int, float)) for x in (temperature, top_p, top_k))
    if static and temperature == 0.0:
        return _greedy(z)
    t = jnp.asarray(temperature, jnp.float32)
    greedy = t <= 0.0
    zt = z / jnp.where(greedy, jnp.float32(1.0), t)
    if static and (top_p < 1.0 or top_k > 0):
        keep = jax.lax.stop_gradient(_keep_mask(jax.lax.stop_gradient(zt), top_p, top_k))
        zt = jnp.where(keep, zt, MASKED_LOGPROB)
    elif not static:  # traced: the sort runs only when truncation is on
        on = (jnp.asarray(top_p) < 1.0) | (jnp.asarray(top_k) > 0)
        zs = jax.lax.stop_gradient(zt)
        keep = jax.lax.cond(on, lambda: _keep_mask(zs, top_p, top_k), lambda: jnp.ones(zs.shape, bool))
        zt = jnp.where(jax.lax.stop_gradient(keep), zt, MASKED_LOGPROB)
    logp = jax.nn.log_softmax(zt, axis=-1)
    if static:
        return logp
    return jnp.where(greedy, jax.lax.stop_gradient(_greedy(z)), logp)


def _greedy(z: jax.Array) -> jax.Array:
    """One-hot limit of T -> 0: 0 at the argmax (first on ties), `MASKED_LOGPROB` elsewhere."""
    import jax
    import jax.numpy as jnp

    onehot = jax.nn.one_hot(jnp.argmax(z, axis=-1), z.shape[-1], dtype=bool)
    return jnp.where(onehot, 0.0, MASKED_LOGPROB).astype(jnp.float32)


def _keep_mask(z: jax.Array, top_p: Any, top_k: Any) -> jax.Array:
    """`[..., vocab] bool`: tokens kept by top-k then top-p on tempered logits z (ties at the cut kept).

    top_k <= 0 or >= vocab disables top-k; top_p >= 1 disables top-p (no round-off can drop the tail)."""
    import jax
    import jax.numpy as jnp

    vocab = z.shape[-1]
    desc = -jnp.sort(-z, axis=-1)  # descending
    k = jnp.asarray(top_k, jnp.int32)
    k_on = (k > 0) & (k < vocab)
    kth = jnp.take_along_axis(desc, jnp.broadcast_to(jnp.clip(k - 1, 0, vocab - 1), z.shape[:-1] + (1,)), axis=-1)
    threshold = jnp.where(k_on, kth, -jnp.inf)
    desc = jnp.where(k_on & (jnp.arange(vocab) >= k), -jnp.inf, desc)
    p = jnp.asarray(top_p, jnp.float32)
    probs = jax.nn.softmax(desc, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    in_nucleus = (mass_before < p) | (p >= 1.0)  # the first entry is always in
    n_keep = jnp.sum(in_nucleus, axis=-1, keepdims=True)
    cut = jnp.take_along_axis(desc, n_keep - 1, axis=-1)
    return z >= jnp.maximum(threshold, cut)


def token_logprobs(logits: jax.Array, ids: jax.Array, temperature: Any, top_p: Any = 1.0,
                   top_k: Any = 0) -> jax.Array:
    """Logprob as sampled of `ids` under `logits` (module docstring).

    Args:
      logits: `[..., vocab]` logits that predicted each id (for a full forward over prompt+completion, the
        logits at positions t-1 predict the id at position t: shift before calling).
      ids: `[...] int32` token ids, same leading shape as logits.
      temperature, top_p, top_k: the sampling parameters the ids were drawn with (see `processed_logprobs`).
    Returns: `[...] float32`.
    """
    import jax.numpy as jnp

    logp = processed_logprobs(logits, temperature, top_p, top_k)
    return jnp.take_along_axis(logp, ids[..., None].astype(jnp.int32), axis=-1)[..., 0]
