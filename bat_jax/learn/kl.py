"""Policy-shift estimate for checkpoint fallback (paper Eq. 6, Appendix A.4 "Fallback KL threshold").

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from bat_jax.learn.grpo import map_sequence_chunks

ApplyFn = Callable[[Any, jax.Array, jax.Array], jax.Array]


@dataclasses.dataclass(frozen=True)
class PolicyShiftConfig:
    """Settings of the policy-shift (KL) probe.

    Attributes:
    num_prompts: probe prompts used, 256 (paper).
    batch_size: prompts per forward pass.
    """

    num_prompts: int = 256
    batch_size: int = 16


def token_kl(candidate_logits: jax.Array, best_logits: jax.Array) -> jax.Array:
    """Exact KL(candidate ‖ best) of the next-token distributions, ``[B, T, V]`` → ``[B, T] float32``."""
    lc = jax.nn.log_softmax(candidate_logits.astype(jnp.float32), axis=-1)
    lb = jax.nn.log_softmax(best_logits.astype(jnp.float32), axis=-1)
    return jnp.sum(jnp.exp(lc) * (lc - lb), axis=-1)


def sequence_kl(apply_fn: ApplyFn, candidate_params: Any, best_params: Any, input_ids: jax.Array,
                attention_mask: jax.Array) -> jax.Array:
    """``[B, T] float32`` exact KL(candidate ‖ best) of the next-token distributions at every position.

    With a ``ModelApply`` (``hidden`` / ``head`` / ``logit_chunk``) the two output heads run ``logit_chunk``
    positions at a time (``grpo.map_sequence_chunks``): no ``[B, T, V]`` float32 logits exist. Any other
    ``apply_fn`` is called for the full logits of both models (:func:`token_kl`)."""
    if not hasattr(apply_fn, "hidden"):
        return token_kl(apply_fn(candidate_params, input_ids, attention_mask),
                        apply_fn(best_params, input_ids, attention_mask))
    hc = apply_fn.hidden(candidate_params, input_ids, attention_mask)
    hb = apply_fn.hidden(best_params, input_ids, attention_mask)
    return map_sequence_chunks(
        lambda c, b: token_kl(apply_fn.head(candidate_params, c), apply_fn.head(best_params, b)), (hc, hb),
        apply_fn.logit_chunk)


def make_kl_sum_fn(apply_fn: ApplyFn, **jit_kwargs) -> Callable[[Any, Any, jax.Array, jax.Array],
                                                                 tuple[jax.Array, jax.Array]]:
    """A jitted function of the summed KL and the position count of one batch (:func:`sequence_kl`).

    Its signature is ``(candidate_params, best_params, input_ids, attention_mask) -> (Σ KL, #positions)``. Positions
    with ``attention_mask == 0`` are excluded. ``jit_kwargs`` go to ``jax.jit`` (e.g. in/out shardings)."""

    def fn(candidate_params, best_params, input_ids, attention_mask):
        kl = sequence_kl(apply_fn, candidate_params, best_params, input_ids, attention_mask)
        m = attention_mask.astype(jnp.float32)
        return jnp.sum(jnp.where(m > 0, kl, 0.0)), m.sum()

    return jax.jit(fn, **jit_kwargs)


def policy_shift_kl(
    apply_fn: ApplyFn,
    candidate_params: Any,
    best_params: Any,
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    config: PolicyShiftConfig = PolicyShiftConfig(),
) -> float:
    """Mean per-token KL(candidate ‖ best) over the first ``config.num_prompts`` probe prompts.

    Args:
      apply_fn: ``(params, input_ids [b, T] int32, attention_mask [b, T]) -> logits [b, T, V]``.
      candidate_params, best_params: parameter trees for ``apply_fn`` (the candidate θ̃ and the retained θ*).
      input_ids: ``[N, T] int32`` right-padded prompt ids, N ≥ ``config.num_prompts``.
      attention_mask: ``[N, T]`` 0/1.
    Returns:
      The mean KL in nats per token (float, ≥ 0; round-off below 0 is clamped to 0).
    Raises:
      ValueError: fewer than ``config.num_prompts`` prompts, mismatched shapes, or no valid token.
    """
    input_ids = np.asarray(input_ids)
    attention_mask = np.asarray(attention_mask)
    if input_ids.shape != attention_mask.shape or input_ids.ndim != 2:
        raise ValueError(f"policy_shift_kl: input_ids {input_ids.shape} and attention_mask {attention_mask.shape} must be equal [N, T]")
    n = config.num_prompts
    if input_ids.shape[0] < n:
        raise ValueError(f"policy_shift_kl: {input_ids.shape[0]} probe prompts given, num_prompts={n} required")
    fn = make_kl_sum_fn(apply_fn)
    total, count = 0.0, 0.0
    bs = config.batch_size
    for start in range(0, n, bs):
        ids = input_ids[start : min(start + bs, n)]
        mask = attention_mask[start : min(start + bs, n)]
        if ids.shape[0] < bs:  # pad the last batch to keep one compiled shape
            pad = bs - ids.shape[0]
            ids = np.concatenate([ids, np.zeros((pad, ids.shape[1]), ids.dtype)])
            mask = np.concatenate([mask, np.zeros((pad, mask.shape[1]), mask.dtype)])
        s, c = fn(candidate_params, best_params, jnp.asarray(ids, jnp.int32), jnp.asarray(mask))
        total += float(s)
        count += float(c)
    if count == 0:
        raise ValueError("policy_shift_kl: the prompts contain no valid token")
    # KL >= 0 exactly; a tiny negative mean (identical policies) is float round-off, not a signal
    return max(0.0, total / count)
