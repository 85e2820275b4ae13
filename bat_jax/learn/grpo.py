"""Multi-turn GRPO: group advantages, clipped token-level policy loss, KL penalty, loss aggregation.

Paper: Eq. 4 (reward), Eqs. 17–19 (ratio, clipped term, objective with −β·KL toward the round-start
policy π_θ̄r). Defaults follow the paper; the released code's choices are options (REFERENCE.md).

**Batch record** (what rollouts hand to the learner; every per-token array is aligned with
``input_ids``):

* ``input_ids``  ``[B, T] int32`` — the sampled ids verbatim plus tokenised tool responses / template glue.
* ``attention_mask`` ``[B, T]`` 0/1 — 0 on right padding.
* ``loss_mask`` ``[B, T]`` 0/1 — 1 only on tokens the policy sampled (assistant tokens incl. end-of-turn);
  0 on prompt, tool responses, template glue and padding. Observation tokens thus never enter the policy
  loss nor the KL.
* ``old_logprobs`` ``[B, T] float32`` — the rollout policy's logprob of token ``t`` as sampled.
* ``ref_logprobs`` ``[B, T] float32`` — the reference policy's logprob of token ``t``. The reference is the
  round-start policy π_θ̄r (Eq. 19: "a KL penalty toward the current policy"); the learner computes it
  once per round block with :func:`token_logprobs` on the round-start parameters.
* ``advantages`` ``[B] float32`` — from :func:`group_advantages` over ``state_id`` groups.

**Shift convention.** ``logprobs[b, t] = log π(input_ids[b, t] | input_ids[b, :t])``, read from the logits
at position ``t − 1``; ``logprobs[:, 0]`` is 0 and position 0 never carries loss (the first token has no
prediction). Rollout and reference logprobs use the same alignment.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from bat_jax.rollout import engine

KL_ESTIMATORS = ("k1", "k2", "k3")
LOSS_AGGREGATIONS = ("seq-mean-token-mean", "token-mean")


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """GRPO hyper-parameters (paper defaults; released-code values in brackets).

    Attributes:
      group_size: rollouts per state, K = 4 [4].
      kl_coef: β on the KL penalty, 1e-3 [0.006]. 0 disables the KL term (ref_logprobs not read).
      kl_estimator: ``'k1'`` (log r), ``'k2'`` (½ (log r)²) or ``'k3'`` (r⁻¹ − 1 + log r, Schulman's
        unbiased low-variance estimator) of KL(π_θ ‖ π_ref), with r = π_θ/π_ref per sampled token.
      log_ratio_clamp: |log ratio| is clamped to this before any ``exp`` (ratio and KL), so fp32 stays
        finite; 20 as in verl.
      clip_eps: PPO clip ε = 0.2 (Eq. 18).
      dual_clip: None, or c > 1 for dual-clip PPO: for negative advantages the token loss is capped at
        −c·A.
      loss_agg: ``'seq-mean-token-mean'`` (paper Eq. 19: each rollout's token mean, then the mean over
        rollouts [released code too]; equal to Eq. 19's mean over groups of group means whenever every
        group keeps all K rollouts) or ``'token-mean'`` (all loss tokens of the batch weighted equally).
      adv_eps: ε in (r − mean) / (std + ε), 1e-6.
      adv_std_normalize: divide by the group std (paper) or not (released code, Dr.GRPO style).
      temperature, top_p, top_k: the sampling transform the rollouts were drawn with (paper: T = 0.7); the
        learner recomputes logprobs under the same transform, so ratios start at exactly 1.
      adv_std_ddof: 1 = sample std (as ``torch.std`` in verl/TRL), 0 = population std.
      epochs: optimizer steps taken on each rollout batch (verl's ``ppo_epochs``) [1]. Steps after the first
        are off-policy by the earlier ones; the clipped ratio (Eq. 18) against the batch's sampled logprobs
        bounds them.
    """

    group_size: int = 4
    kl_coef: float = 1e-3
    kl_estimator: str = "k3"
    log_ratio_clamp: float = 20.0
    clip_eps: float = 0.2
    dual_clip: float | None = None
    loss_agg: str = "seq-mean-token-mean"
    adv_eps: float = 1e-6
    adv_std_normalize: bool = True
    adv_std_ddof: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    epochs: int = 1

    @property
    def sampling(self) -> tuple[float, float, int]:
        """(temperature, top_p, top_k) of the rollouts: the learner's logprobs use the same transform."""
        return (self.temperature, self.top_p, self.top_k)

    def __post_init__(self):
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"GRPOConfig.kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        if self.loss_agg not in LOSS_AGGREGATIONS:
            raise ValueError(f"GRPOConfig.loss_agg must be one of {LOSS_AGGREGATIONS}, got {self.loss_agg!r}")
        if self.epochs < 1:
            raise ValueError(f"GRPOConfig.epochs must be >= 1, got {self.epochs}")
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"GRPOConfig.dual_clip must be > 1 or None, got {self.dual_clip}")


# ---------------------------------------------------------------------------------------------------
# Advantages (host side, float64)
# ---------------------------------------------------------------------------------------------------


def group_advantages(
    rewards: Any, group_ids: Any, config: GRPOConfig = GRPOConfig()
) -> tuple[np.ndarray, np.ndarray]:
    """Group-relative advantages, Eq. 4 / GRPO: A = (r − mean_g) / (std_g + ε) within each state_id group.

    Args:
      rewards: ``[N]`` rewards on the 0–1 scale; None marks an *unscored* rollout (infrastructure failure),
        which leaves its group: it is ignored in the mean / std and gets ``keep = False``.
      group_ids: ``[N]`` hashable group keys (state_id of the row, or an int per group).
      config: ``adv_eps``, ``adv_std_normalize``, ``adv_std_ddof``.
    Returns:
      ``(advantages [N] float32, keep [N] bool)``. Unscored rollouts get advantage 0 and ``keep`` False;
      the caller drops them from the batch. A group with fewer than two scored rollouts, or whose scored
      rewards are all equal, gets advantage 0 everywhere (nothing to compare). No variance floor is
      applied beyond ``adv_eps``. Computed in float64, so nearly-equal rewards are not lost to rounding.
    Raises:
      ValueError: ``rewards`` and ``group_ids`` differ in length, or a reward is NaN / inf (an error of the
        scorer, never "unscored": a rollout must not leave its group by making its reward NaN).
    """
    unscored = np.asarray([x is None for x in np.asarray(rewards, dtype=object)], dtype=bool)
    r = np.asarray([0.0 if x is None else x for x in np.asarray(rewards, dtype=object)], dtype=np.float64)
    gids = list(group_ids)
    if len(gids) != r.shape[0]:
        raise ValueError(f"group_advantages: {r.shape[0]} rewards but {len(gids)} group ids")
    if not np.all(np.isfinite(r)):
        raise ValueError(f"group_advantages: non-finite rewards at {np.flatnonzero(~np.isfinite(r))[:8].tolist()}"
                         " (a scorer error; None marks an unscored rollout)")
    keep = ~unscored
    adv = np.zeros_like(r)
    groups: dict[Any, list[int]] = {}
    for i, g in enumerate(gids):
        if keep[i]:
            groups.setdefault(g, []).append(i)
    for idx in groups.values():
        if len(idx) < 2:
            continue
        x = r[idx]
        centred = x - x.mean()
        if config.adv_std_normalize:
            centred = centred / (x.std(ddof=config.adv_std_ddof) + config.adv_eps)
        adv[idx] = centred
    return adv.astype(np.float32), keep


def with_advantages(
    batch: Mapping[str, np.ndarray], rewards: Any, group_ids: Any, config: GRPOConfig = GRPOConfig()
) -> dict[str, np.ndarray]:
    """Add ``advantages [B] float32`` to a host batch and take unscored rollouts out of the loss.

    Unscored rows keep their place (the batch shape, hence the compiled step, does not change) but their
    ``loss_mask`` becomes all 0, so they add nothing to the loss, the KL or the normalizers.

    Raises:
      ValueError: ``rewards`` / ``group_ids`` do not have one entry per batch row.
    """
    adv, keep = group_advantages(rewards, group_ids, config)
    rows = np.asarray(batch["loss_mask"]).shape[0]
    if adv.shape[0] != rows:
        raise ValueError(f"with_advantages: {adv.shape[0]} rewards for a batch of {rows} rows")
    out = dict(batch)
    out["advantages"] = adv
    out["loss_mask"] = np.asarray(batch["loss_mask"]) * keep[:, None].astype(np.asarray(batch["loss_mask"]).dtype)
    return out


# ---------------------------------------------------------------------------------------------------
# Per-token terms (traced)
# ---------------------------------------------------------------------------------------------------


def update_shift(old_logprobs: Any, new_logprobs: Any, loss_mask: Any, advantages: Any) -> dict[str, float]:
    """How a GRPO update moved the policy on its own batch (host side, float64; a diagnostic, issue 15).

    Args:
      old_logprobs, new_logprobs: ``[B, T]`` shifted logprobs of the batch's tokens before / after the update
        (the learner's, under the rollout sampling transform).
      loss_mask: ``[B, T]`` 1 on sampled (loss) tokens.
      advantages: ``[B]`` the rows' GRPO advantages.
    Returns:
      ``logp_shift_pos`` / ``logp_shift_neg``: mean over rollouts with A > 0 / A < 0 of their token-mean
      ``new − old`` logprob (nats per token; NaN when no such rollout) — an ascent step raises the first and
      lowers the second; ``token_kl``: KL(old ‖ new) per loss token, Schulman's k3 estimate
      ``r − 1 − log r`` with ``r = π_new / π_old`` on the sampled tokens (unbiased: they were drawn from old).
    Raises:
      ValueError: shapes that do not match.
    """
    old, new = np.asarray(old_logprobs, np.float64), np.asarray(new_logprobs, np.float64)
    mask, adv = np.asarray(loss_mask, bool), np.asarray(advantages, np.float64)
    if old.shape != new.shape or old.shape != mask.shape or adv.shape != old.shape[:1]:
        raise ValueError(f"update_shift: logprobs {old.shape} / {new.shape}, loss_mask {mask.shape} and "
                         f"advantages {adv.shape} must be [B, T], [B, T], [B, T] and [B]")
    log_r = np.where(mask, new - old, 0.0)
    tokens = mask.sum(1)
    per_row = log_r.sum(1) / np.maximum(tokens, 1)

    def mean(sel: np.ndarray) -> float:
        sel = sel & (tokens > 0)
        return float(per_row[sel].mean()) if sel.any() else float("nan")

    k3 = np.where(mask, np.expm1(log_r) - log_r, 0.0)
    return {"logp_shift_pos": mean(adv > 0), "logp_shift_neg": mean(adv < 0),
            "token_kl": float(k3.sum() / max(mask.sum(), 1))}


def token_logprobs(logits: jax.Array, input_ids: jax.Array, temperature: float = 1.0, top_p: float = 1.0,
                   top_k: int = 0) -> jax.Array:
    """``[B, T, V]`` logits, ``[B, T] int32`` ids → ``[B, T] float32`` logprobs, shifted.

    ``out[:, t] = log π(input_ids[:, t] | logits[:, t − 1])`` for t ≥ 1 and ``out[:, 0] = 0``, where π is the
    distribution the rollout engine *sampled from*: tempered and top-k / top-p truncated, renormalised
    (`bat_jax.rollout.engine.token_logprobs`, the one shared definition). With the defaults (T = 1, no
    truncation) this is the plain log-softmax, as SFT uses. GRPO passes the rollout's sampling parameters so
    that the importance ratio against the recorded old logprobs is 1 before any update.
    """
    lp = engine.token_logprobs(logits[:, :-1], input_ids[:, 1:], temperature, top_p, top_k)
    return jnp.pad(lp, ((0, 0), (1, 0)))


def map_sequence_chunks(fn: Callable[..., jax.Array], xs: tuple[jax.Array, ...], chunk: int) -> jax.Array:
    """``fn(*xs)`` for per-position ``fn`` (``[B, c, ...]`` slices → ``[B, c]``), ``chunk`` positions at a time.

    ``xs`` are ``[B, T, ...]`` arrays; the sequence is padded to a multiple of ``chunk`` (pad results dropped).
    Each chunk runs under ``jax.checkpoint`` inside a ``lax.map``: the forward keeps one chunk's intermediates
    (e.g. ``[B, chunk, V]`` float32 logits) at a time, and the backward recomputes them chunk by chunk instead
    of storing them. ``chunk`` 0 or ≥ T calls ``fn`` once. Returns ``[B, T]``.
    """
    b, t = xs[0].shape[:2]
    if not chunk or t <= chunk:
        return fn(*xs)
    pad = (-t) % chunk
    n = (t + pad) // chunk

    def split(x):  # [B, T, ...] -> [n, B, chunk, ...]
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return jnp.moveaxis(x.reshape((b, n, chunk) + x.shape[2:]), 1, 0)

    out = jax.lax.map(jax.checkpoint(lambda args: fn(*args)), tuple(split(x) for x in xs))  # [n, B, chunk]
    return jnp.moveaxis(out, 0, 1).reshape(b, n * chunk)[:, :t]


def sequence_logprobs(apply_fn: Callable, params: Any, input_ids: jax.Array, attention_mask: jax.Array,
                      temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0) -> jax.Array:
    """Shifted logprobs ``[B, T] float32`` of ``input_ids [B, T] int32`` under the model (same values as
    :func:`token_logprobs` of the model's logits).

    With an ``apply_fn`` that has ``hidden`` / ``head`` / ``logit_chunk``
    (:class:`bat_jax.learn.train_state.ModelApply`) the output head runs ``logit_chunk`` positions at a time
    (:func:`map_sequence_chunks`), so the ``[B, T, V]`` float32 logits never exist; any other ``apply_fn`` is
    called for the full logits.
    """
    if not hasattr(apply_fn, "hidden"):
        return token_logprobs(apply_fn(params, input_ids, attention_mask), input_ids, temperature, top_p, top_k)
    h = apply_fn.hidden(params, input_ids, attention_mask)
    targets = jnp.pad(input_ids[:, 1:], ((0, 0), (0, 1)))  # position t predicts id t + 1

    def per_chunk(h_c, ids_c):
        return engine.token_logprobs(apply_fn.head(params, h_c), ids_c, temperature, top_p, top_k)

    nxt = map_sequence_chunks(per_chunk, (h, targets), apply_fn.logit_chunk)
    return jnp.pad(nxt[:, :-1], ((0, 0), (1, 0)))


def effective_loss_mask(loss_mask: jax.Array) -> jax.Array:
    """``[B, T]`` loss mask as float32 with position 0 forced to 0 (it has no prediction)."""
    m = loss_mask.astype(jnp.float32)
    return m.at[:, 0].set(0.0)


def kl_penalty(logprobs: jax.Array, ref_logprobs: jax.Array, estimator: str, clamp: float) -> jax.Array:
    """Per-token estimate of KL(π_θ ‖ π_ref) on tokens sampled from the rollout policy.

    With ``d = clip(logprobs − ref_logprobs, −clamp, clamp)`` (clamped before any exp):
    k1 = d, k2 = ½ d², k3 = exp(−d) − 1 + d (≥ 0). Same shape as the inputs, float32.
    Outside the clamp the gradient with respect to ``logprobs`` is 0 (it stays finite).
    """
    d = jnp.clip(logprobs.astype(jnp.float32) - ref_logprobs.astype(jnp.float32), -clamp, clamp)
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    if estimator == "k3":
        return jnp.expm1(-d) + d
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {KL_ESTIMATORS}")


def policy_token_loss(
    logprobs: jax.Array, old_logprobs: jax.Array, advantages: jax.Array, config: GRPOConfig
) -> tuple[jax.Array, jax.Array]:
    """Per-token clipped surrogate loss (negated Eq. 18), ``[B, T]`` each.

    ``w = exp(clip(logprobs − old_logprobs, ±log_ratio_clamp))`` (Eq. 17), ``A`` broadcast from ``[B]``;
    loss = max(−w·A, −clip(w, 1 − ε, 1 + ε)·A), with the dual clip min(loss, −c·A) for A < 0.
    Returns ``(loss, clipped)`` where ``clipped`` is 1.0 where the clipped branch was active.
    """
    log_w = jnp.clip(logprobs - old_logprobs, -config.log_ratio_clamp, config.log_ratio_clamp)
    w = jnp.exp(log_w)
    a = advantages.astype(jnp.float32)[:, None]
    unclipped = -w * a
    clipped = -jnp.clip(w, 1.0 - config.clip_eps, 1.0 + config.clip_eps) * a
    loss = jnp.maximum(unclipped, clipped)
    if config.dual_clip is not None:
        loss = jnp.where(a < 0, jnp.minimum(loss, -config.dual_clip * a), loss)
    return loss, (clipped > unclipped).astype(jnp.float32)


# ---------------------------------------------------------------------------------------------------
# Aggregation (exact under micro-batching)
# ---------------------------------------------------------------------------------------------------


def loss_normalizers(loss_mask: jax.Array) -> dict[str, jax.Array]:
    """Whole-batch denominators, computed before any micro-batch split.

    Returns ``{'num_tokens': Σ mask, 'num_seqs': #rows with ≥ 1 loss token}`` (float32 scalars, each at
    least 1 so an empty batch gives loss 0, not NaN), using :func:`effective_loss_mask`.
    """
    m = effective_loss_mask(loss_mask)
    return {
        "num_tokens": jnp.maximum(m.sum(), 1.0),
        "num_seqs": jnp.maximum((m.sum(axis=1) > 0).sum().astype(jnp.float32), 1.0),
    }


def aggregate(values: jax.Array, mask: jax.Array, mode: str, normalizers: Mapping[str, jax.Array]) -> jax.Array:
    """Reduce ``[B, T]`` per-token values to this (micro-)batch's share of the whole-batch loss.

    * ``token-mean``: Σ_{b,t} v·m / N_tokens(whole batch).
    * ``seq-mean-token-mean``: Σ_b (Σ_t v·m / Σ_t m) / N_seqs(whole batch); rows with no loss token add 0.

    Masked positions are selected away with ``where`` (a NaN or inf there contributes exactly 0). Summing the
    results over micro-batches gives the unsplit value, because rows are never split and the denominators
    are global.
    """
    m = mask.astype(jnp.float32)
    vm = jnp.where(m > 0, values, 0.0) * m
    if mode == "token-mean":
        return vm.sum() / normalizers["num_tokens"]
    if mode == "seq-mean-token-mean":
        per_seq = vm.sum(axis=1) / jnp.maximum(m.sum(axis=1), 1.0)
        return per_seq.sum() / normalizers["num_seqs"]
    raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {LOSS_AGGREGATIONS}")


def grpo_token_terms(
    logprobs: jax.Array, batch: Mapping[str, jax.Array], config: GRPOConfig
) -> dict[str, jax.Array]:
    """Per-token pieces, ``[B, T] float32`` each, already zero where ``loss_mask`` is 0.

    Keys: ``mask`` (effective loss mask), ``pg`` (clipped policy loss), ``kl`` (KL estimate, zeros when
    ``kl_coef`` is 0), ``clipped``, ``total`` = pg + β·kl.
    """
    mask = effective_loss_mask(batch["loss_mask"])
    on = mask > 0
    pg, clipped = policy_token_loss(logprobs, batch["old_logprobs"], batch["advantages"], config)
    if config.kl_coef:
        kl = kl_penalty(logprobs, batch["ref_logprobs"], config.kl_estimator, config.log_ratio_clamp)
    else:
        kl = jnp.zeros_like(pg)
    pg = jnp.where(on, pg, 0.0)
    kl = jnp.where(on, kl, 0.0)
    return {
        "mask": mask,
        "pg": pg,
        "kl": kl,
        "clipped": jnp.where(on, clipped, 0.0),
        "total": pg + config.kl_coef * kl,
    }


def make_grpo_loss(
    apply_fn: Callable[[Any, jax.Array, jax.Array], jax.Array], config: GRPOConfig = GRPOConfig()
) -> Callable[[Any, Mapping[str, jax.Array], Mapping[str, jax.Array]], tuple[jax.Array, dict[str, jax.Array]]]:
    """The GRPO loss for :func:`bat_jax.learn.train_state.make_train_step` (minimise = maximise Eq. 19).

    ``loss(params, batch, normalizers) -> (loss, metrics)``; ``normalizers`` from :func:`loss_normalizers`
    on the whole batch. Metrics (each aggregated like the loss, so they add over micro-batches):
    ``pg_loss``, ``kl``, ``clip_frac``.
    """

    def loss_fn(params, batch, normalizers):
        lp = sequence_logprobs(apply_fn, params, batch["input_ids"], batch["attention_mask"], *config.sampling)
        t = grpo_token_terms(lp, batch, config)
        agg = lambda v: aggregate(v, t["mask"], config.loss_agg, normalizers)  # noqa: E731
        loss = agg(t["total"])
        return loss, {"pg_loss": agg(t["pg"]), "kl": agg(t["kl"]), "clip_frac": agg(t["clipped"])}

    return loss_fn


def grpo_normalizers(batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """:func:`loss_normalizers` of ``batch['loss_mask']`` (the ``normalizer_fn`` of the train step)."""
    return loss_normalizers(batch["loss_mask"])


def make_logprob_fn(apply_fn: Callable[[Any, jax.Array, jax.Array], jax.Array],
                    config: GRPOConfig = GRPOConfig(), **jit_kwargs) -> Callable:
    """Jitted ``(params, input_ids [B, T] int32, attention_mask [B, T]) -> [B, T] float32`` shifted logprobs
    (for ref_logprobs; :func:`sequence_logprobs`). ``jit_kwargs`` go to ``jax.jit`` (e.g. in/out shardings)."""

    def fn(params, input_ids, attention_mask):
        return sequence_logprobs(apply_fn, params, input_ids, attention_mask, *config.sampling)

    return jax.jit(fn, **jit_kwargs)
