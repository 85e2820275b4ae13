"""Per-token pieces of the GRPO objective and their aggregation, as the reference implementations compute them.

Details: docs/design.md.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from bat_jax.rollout import engine

KL_ESTIMATORS = ("k1", "k2", "k3")
LOSS_AGGREGATIONS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
SEQ_MEAN_ROWS = ("all", "nonempty")


def clamp(x: jax.Array, lo: float | None, hi: float | None) -> jax.Array:
    """``x`` clipped to ``[lo, hi]`` (``None``: no bound) with ``torch.clamp``'s gradient.

    The gradient is 1 inside (bounds included) and 0 outside. Same shape and dtype as ``x``."""
    lo_ok = True if lo is None else x >= lo
    hi_ok = True if hi is None else x <= hi
    return jnp.where(lo_ok & hi_ok, x, jax.lax.stop_gradient(jnp.clip(x, lo, hi)))


def kl_penalty(logprobs: jax.Array, ref_logprobs: jax.Array, estimator: str, log_ratio_clamp: float = 20.0,
               value_clamp: float | None = 10.0) -> jax.Array:
    """Per-token estimate of KL(π_θ ‖ π_ref) on tokens sampled from the rollout policy, ``[B, T] float32``.

    With ``d = logprobs − ref_logprobs`` (nats): k1 = d; k2 = ½ d²; k3 = exp(−d) − 1 + d (Schulman's
    low-variance estimator, ≥ 0; verl's ``low_var_kl``), where k3 first clamps d to ±``log_ratio_clamp`` so the
    ``exp`` stays finite in float32. Every estimator's value is then clamped to ±``value_clamp`` (None: no
    clamp). verl clamps k3 exactly so (d to ±20, the value to [−10, 10]) and leaves k1 and k2 unclamped; here the
    value clamp guards all three (set ``value_clamp=None`` for verl's k1 / k2). Where a clamp is active the
    gradient with respect to ``logprobs`` is 0. Example: d = −4 gives k3 = e⁴ − 5 = 49.6, clamped to 10 with
    gradient 0 (unclamped it would be 49.6 with gradient 1 − e⁴ = −53.6).

    Raises:
      ValueError: an unknown estimator.
    """
    d = logprobs.astype(jnp.float32) - ref_logprobs.astype(jnp.float32)
    if estimator == "k1":
        kl = d
    elif estimator == "k2":
        kl = 0.5 * d * d
    elif estimator == "k3":
        d = clamp(d, -log_ratio_clamp, log_ratio_clamp)
        kl = jnp.expm1(-d) + d
    else:
        raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {KL_ESTIMATORS}")
    if value_clamp is None:
        return kl
    return clamp(kl, -value_clamp, value_clamp)


def clipped_policy_loss(logprobs: jax.Array, old_logprobs: jax.Array, advantages: jax.Array, *, eps_low: float,
                        eps_high: float, dual_clip: float | None, log_ratio_clamp: float = 20.0
                        ) -> tuple[jax.Array, jax.Array]:
    """Per-token clipped surrogate loss (negated Eq. 18; verl ``compute_policy_loss_vanilla``), ``[B, T]`` each.

    ``w = exp(clamp(logprobs − old_logprobs, ±log_ratio_clamp))`` (Eq. 17), ``A`` broadcast from ``[B]``.
    Loss = max(−w·A, −clip(w, 1 − ε_low, 1 + ε_high)·A) — the paper's symmetric clip when ε_low = ε_high (0.2),
    DAPO's clip-higher with ε_high > ε_low (DAPO: 0.2 / 0.28). With ``dual_clip`` = c (> 1) the loss of a
    token with A < 0 is further capped at −c·A (dual-clip PPO; verl: ``clip_ratio_c`` = 3, on by default).
    Returns ``(loss, clipped)`` where ``clipped`` is 1.0 where the clipped branch is the larger (verl's
    ``pg_clipfrac`` numerator).
    """
    log_w = clamp(logprobs - old_logprobs, -log_ratio_clamp, log_ratio_clamp)
    w = jnp.exp(log_w)
    a = advantages.astype(jnp.float32)[:, None]
    unclipped = -w * a
    clipped = -clamp(w, 1.0 - eps_low, 1.0 + eps_high) * a
    loss = jnp.maximum(unclipped, clipped)
    if dual_clip is not None:
        loss = jnp.where(a < 0, jnp.minimum(loss, -dual_clip * a), loss)
    return loss, (clipped > unclipped).astype(jnp.float32)


def entropy_from_logprobs(logp: jax.Array) -> jax.Array:
    """Entropy −Σ_v p(v) log p(v) of ``[..., V]`` log-probabilities, ``[...] float32`` (nats).

    Entries at ``engine.MASKED_LOGPROB`` (tokens outside a top-k / top-p truncation) have p = 0 and add exactly 0."""
    logp = logp.astype(jnp.float32)
    kept = logp > 0.5 * engine.MASKED_LOGPROB
    return -jnp.sum(jnp.where(kept, jnp.exp(logp) * logp, 0.0), axis=-1)


def effective_loss_mask(loss_mask: jax.Array) -> jax.Array:
    """``[B, T]`` loss mask as float32 with position 0 forced to 0 (it has no prediction)."""
    m = loss_mask.astype(jnp.float32)
    return m.at[:, 0].set(0.0)


def loss_normalizers(loss_mask: jax.Array, attention_mask: jax.Array | None = None) -> dict[str, jax.Array]:
    """Whole-batch loss denominators, computed before any micro-batch split.

    They are float32 scalars, each at least 1 so an empty batch gives loss 0, not NaN, and use
    :func:`effective_loss_mask`:

    * ``num_tokens``: Σ mask (verl ``batch_num_tokens``).
    * ``num_rows``: rows that hold a sequence (any ``attention_mask`` position on; every row without
      ``attention_mask``), loss tokens or not — verl's ``global_batch_size`` (the mini-batch's rows) with the
      rows added only to pad the batch to a device multiple left out.
    * ``num_seqs``: rows with ≥ 1 loss token (verl's fallback when no ``global_batch_size`` is passed).
    """
    m = effective_loss_mask(loss_mask)
    rows = (jnp.ones(m.shape[:1], bool) if attention_mask is None
            else (jnp.asarray(attention_mask) > 0).any(axis=1))
    return {
        "num_tokens": jnp.maximum(m.sum(), 1.0),
        "num_rows": jnp.maximum(rows.sum().astype(jnp.float32), 1.0),
        "num_seqs": jnp.maximum((m.sum(axis=1) > 0).sum().astype(jnp.float32), 1.0),
    }


def aggregate_loss(values: jax.Array, mask: jax.Array, mode: str, normalizers: Mapping[str, jax.Array],
                   loss_scale_factor: float | None = None, seq_mean_rows: str = "all") -> jax.Array:
    """Reduce ``[B, T]`` per-token values to this (micro-)batch's share of the whole-batch loss (scalar float32).

    Let m be the loss mask and N_tok the whole batch's ``num_tokens``. N is the rollouts a sequence mean divides by
    (``seq_mean_rows``: ``'all'`` → ``num_rows``, every rollout of the batch, empty or unscored ones included,
    as verl's ``agg_loss`` with its ``global_batch_size``; ``'nonempty'`` → ``num_seqs``, the rollouts with loss
    tokens). Rows with no loss token add 0 to the numerator (names as verl's ``loss_agg_mode``):

    * ``token-mean``: Σ_{b,t} v·m / N_tok — every loss token of the batch weighs the same.
    * ``seq-mean-token-mean``: Σ_b (Σ_t v·m / Σ_t m) / N — each rollout's token mean, then the mean over
      rollouts (paper Eq. 19; the released run).
    * ``seq-mean-token-sum``: Σ_b Σ_t v·m / N — each rollout's token sum, then the mean over rollouts.
    * ``seq-mean-token-sum-norm``: Σ_b Σ_t v·m / (N · C) with the constant C = ``loss_scale_factor`` — Dr.GRPO's
      token sum over a constant generation budget, averaged over rollouts, so no rollout's length rescales its
      tokens (verl's ``agg_loss`` since February 2026; before, it returned N times this).

    Masked positions are selected away with ``where`` (a NaN or inf there contributes exactly 0). Summing the
    results over micro-batches gives the unsplit value — and so the unsplit gradient — because rows are never
    split and every denominator is a whole-batch one.

    Raises:
      ValueError: an unknown mode or ``seq_mean_rows``, or ``seq-mean-token-sum-norm`` without C.
    """
    if seq_mean_rows not in SEQ_MEAN_ROWS:
        raise ValueError(f"unknown seq_mean_rows {seq_mean_rows!r}; expected one of {SEQ_MEAN_ROWS}")
    m = mask.astype(jnp.float32)
    vm = jnp.where(m > 0, values, 0.0) * m
    n = normalizers["num_rows" if seq_mean_rows == "all" else "num_seqs"]
    if mode == "token-mean":
        return vm.sum() / normalizers["num_tokens"]
    if mode == "seq-mean-token-mean":
        per_seq = vm.sum(axis=1) / jnp.maximum(m.sum(axis=1), 1.0)
        return per_seq.sum() / n
    if mode == "seq-mean-token-sum":
        return vm.sum() / n
    if mode == "seq-mean-token-sum-norm":
        if loss_scale_factor is None:
            raise ValueError("aggregate_loss: 'seq-mean-token-sum-norm' needs loss_scale_factor, the constant C "
                             "(tokens; verl and Dr.GRPO: the response budget)")
        return vm.sum() / (n * jnp.float32(loss_scale_factor))
    raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {LOSS_AGGREGATIONS}")
