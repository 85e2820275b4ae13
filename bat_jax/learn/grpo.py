"""Multi-turn GRPO: group advantages, the policy's logprobs (and entropy), the loss over a batch.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from bat_jax.learn import objective, rollout_correction
from bat_jax.rollout import engine
from bat_jax.rollout.sampling import SamplingConfig


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """GRPO hyper-parameters.

    Each option names its source; the paper's value is the default (verl's where the paper is silent), the released BaT
    run's value (verl defaults it inherits included; ``gin/presets/released_bat.gin``) is in brackets.

    Attributes:
      sampling: K, the group size (`group_size`, 4 [4]), and the transform the rollouts were drawn with (paper:
        T = 0.7 [0.7]); the learner computes its logprobs under the same transform, so the first ratios start at 1.
        One `rollout/sampling.SamplingConfig`: a run fills it from `experiment.Components.sampling`, which fills the
        agent loop's too.
      kl_coef: β on the KL penalty (Eq. 19), 1e-3 [0.006, verl ``kl_loss_coef``]. 0 disables the KL term
        (ref_logprobs not read).
      kl_estimator: ``'k1'`` (log r), ``'k2'`` (½ (log r)²) or ``'k3'`` (r⁻¹ − 1 + log r, Schulman's unbiased
        low-variance estimator) of KL(π_θ ‖ π_ref), with r = π_θ/π_ref per sampled token: ``'k3'``
        [``'k3'``, verl ``kl_loss_type='low_var_kl'``].
      kl_value_clamp: the per-token KL value is clamped to ±this; clamped tokens pass no gradient. 10 [10: verl
        clamps k3 to [−10, 10]]; verl leaves k1 / k2 unclamped (None here reproduces that). None disables it.
      log_ratio_clamp: |log ratio| is clamped to this before any ``exp`` (the policy ratio and k3), so float32
        stays finite, 20 [20, verl]. Half of verl's KL guard; the other half is ``kl_value_clamp``.
      clip_eps: PPO clip ε of Eq. 18, 0.2 [0.2, verl ``clip_ratio``]; the ratio is clipped to
        [1 − ε_low, 1 + ε_high] with both ε = ``clip_eps`` unless set below.
      clip_eps_low, clip_eps_high: asymmetric clip (DAPO "clip-higher": ε_low = 0.2, ε_high = 0.28; verl
        ``clip_ratio_low`` / ``clip_ratio_high``). None = ``clip_eps`` [None, None].
      dual_clip: None, or c > 1 for dual-clip PPO: for negative advantages the token loss is capped at −c·A.
        None (paper) [3.0: verl's ``clip_ratio_c``, always on in its vanilla policy loss].
      loss_agg: how per-token terms become the batch loss (:func:`objective.aggregate_loss`, verl ``loss_agg_mode``):
        ``'seq-mean-token-mean'`` (paper Eq. 19: each rollout's token mean, then the mean over rollouts; equal
        to Eq. 19's mean over groups of group means whenever every group keeps all K rollouts)
        [``'seq-mean-token-mean'``], ``'token-mean'`` (all loss tokens of the batch weighted equally; DAPO),
        ``'seq-mean-token-sum'`` or ``'seq-mean-token-sum-norm'`` (Dr.GRPO: token sums over a constant).
      seq_mean_rows: the rollouts a sequence mean divides by: ``'all'`` (every rollout of the batch, unscored
        or masked ones included; verl's ``agg_loss`` with ``global_batch_size``, the mini-batch's rows) [``'all'``]
        or ``'nonempty'`` (the rollouts with loss tokens). The paper's groups are full, where both agree.
      loss_scale_factor: the constant C of ``'seq-mean-token-sum-norm'`` (tokens; Dr.GRPO: the generation
        budget). None: the GRPO block passes the run's response budget ``AgentLoopConfig.max_response_tokens``
        (verl's default: the padded response width, its ``response_length``) [not used].
      entropy_coef: entropy bonus: the loss subtracts this × the aggregated per-token entropy of the sampling
        distribution (verl ``entropy_coeff``), 0 [0]. Non-zero makes the learner compute the entropy, chunk by
        chunk like the logprobs.
      adv_eps: ε in (r − mean) / (std + ε), 1e-6 [1e-6, verl]; > 0, so a group equal up to round-off
        (std ~1e-17) gets advantages ~1e-11, not ±1.
      adv_std_normalize: divide by the group std (paper) or not [False: ``norm_adv_by_std_in_grpo=false``,
        Dr.GRPO style].
      adv_std_ddof: 1 = sample std (as ``torch.std`` in verl/TRL), 0 = population std.
      singleton_advantage: the advantage of a group with one scored rollout: ``'zero'`` (paper: r − mean = 0)
        or ``'reward'`` (verl: mean 0 and std 1, so r / (1 + ε), or r without std normalisation) [``'reward'``].
      negative_advantage_weight: λ multiplying every negative advantage after normalisation, 1 (paper) [1]. 0 keeps
        positive-sample reinforcement only (PSR: Zhu et al. 2025, arXiv:2506.01347, §3; RAFT's positives, Dong et
        al. 2023), so failed rollouts push nothing down; values in between weigh them down.
      old_logprobs: the ratio's denominator (Eq. 17): ``'recompute'`` — the learner's logprobs of the batch under
        the parameters the rollouts were sampled with, computed before the update (verl's default; the round's
        first batch reuses the round-start reference pass, later batches cost one more learner pass).
        Or ``'bypass'``: the rollout engine's logprobs as sampled (verl's ``rollout_correction.bypass_mode``)
        [``'recompute'``]. With ``'recompute'`` the first update's ratios start at 1 up to float round-off between
        two learner passes; with ``'bypass'`` they start at π_learner / π_engine, which is 1 only when engine
        and learner compute alike (the JAX sampler in float32), and the clip acts on their mismatch.
      epochs: optimizer steps taken on each rollout batch (verl's ``ppo_epochs``) [1]. Steps after the first
        are off-policy by the earlier ones; the clipped ratio (Eq. 18) against the batch's behaviour logprobs
        bounds them.
      tis_cap, seq_ratio_range: rollout correction (:mod:`bat_jax.learn.rollout_correction`; off in the paper
        and the released run [None, None]; needs ``old_logprobs = 'recompute'``; a None ``tis_cap`` becomes
        :data:`STALENESS_TIS_CAP` with bounded staleness s > 0, :func:`for_staleness`). The engine's logprobs give the
        importance weight w = π_learner / π_engine per sampled token: truncated at ``tis_cap`` C and multiplied
        into the policy loss (TIS; verl ``rollout_is_threshold``, slime ``--tis-clip``), and a rollout whose
        per-token-clamped (±20) mean log w leaves the bounds ``seq_ratio_range`` (lo, hi) is masked out.
      seq_ratio_convention: what ``seq_ratio_range`` bounds: ``'geometric'`` — exp(mean log w) (verl ≤ 0.7
        ``rollout_rs='geometric'``, since removed) [``'geometric'``] — or ``'seq_mean_k1'`` — exp(mean log(1/w)),
        so numbers copied from verl's ``rollout_rs='seq_mean_k1'``, ``rollout_rs_threshold='lo_hi'`` mean what
        they mean there: (0.5, 1.5) keeps 0.667 ≤ exp(mean log w) ≤ 2.
    Raises:
      ValueError: an unknown estimator or aggregation, or a value out of range (the message names the field).
    """

    sampling: SamplingConfig = SamplingConfig()
    kl_coef: float = 1e-3
    kl_estimator: str = "k3"
    kl_value_clamp: float | None = 10.0
    log_ratio_clamp: float = 20.0
    clip_eps: float = 0.2
    clip_eps_low: float | None = None
    clip_eps_high: float | None = None
    dual_clip: float | None = None
    loss_agg: str = "seq-mean-token-mean"
    seq_mean_rows: str = "all"
    loss_scale_factor: float | None = None
    entropy_coef: float = 0.0
    adv_eps: float = 1e-6
    adv_std_normalize: bool = True
    adv_std_ddof: int = 1
    singleton_advantage: str = "zero"
    negative_advantage_weight: float = 1.0
    old_logprobs: str = "recompute"
    epochs: int = 1
    tis_cap: float | None = None
    seq_ratio_range: tuple[float, float] | None = None
    seq_ratio_convention: str = "geometric"

    @property
    def rollout_correction(self) -> bool:
        """Whether the batch carries ``is_weights`` (``tis_cap`` or ``seq_ratio_range`` set)."""
        return self.tis_cap is not None or self.seq_ratio_range is not None

    @property
    def eps_low(self) -> float:
        """ε_low: the ratio's lower clip is 1 − ε_low."""
        return self.clip_eps if self.clip_eps_low is None else self.clip_eps_low

    @property
    def eps_high(self) -> float:
        """ε_high: the ratio's upper clip is 1 + ε_high."""
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    def __post_init__(self):
        if self.kl_estimator not in objective.KL_ESTIMATORS:
            raise ValueError(f"GRPOConfig.kl_estimator must be one of {objective.KL_ESTIMATORS}, "
                             f"got {self.kl_estimator!r}")
        if self.loss_agg not in objective.LOSS_AGGREGATIONS:
            raise ValueError(f"GRPOConfig.loss_agg must be one of {objective.LOSS_AGGREGATIONS}, got {self.loss_agg!r}")
        for name, allowed in (("seq_mean_rows", objective.SEQ_MEAN_ROWS), ("singleton_advantage", ("zero", "reward")),
                              ("old_logprobs", ("recompute", "bypass")),
                              ("seq_ratio_convention", rollout_correction.CONVENTIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"GRPOConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.old_logprobs == "bypass" and self.rollout_correction:
            raise ValueError("GRPOConfig.old_logprobs = 'bypass' with tis_cap / seq_ratio_range: rollout correction "
                             "weighs the engine's logprobs against recomputed ones; use old_logprobs='recompute'")
        if not 0.0 <= self.negative_advantage_weight <= 1.0:
            raise ValueError(f"GRPOConfig.negative_advantage_weight must be in [0, 1], got "
                             f"{self.negative_advantage_weight}")
        if self.epochs < 1:
            raise ValueError(f"GRPOConfig.epochs must be >= 1, got {self.epochs}")
        if self.dual_clip is not None and not self.dual_clip > 1.0:
            raise ValueError(f"GRPOConfig.dual_clip must be > 1 or None, got {self.dual_clip}")
        for name in ("clip_eps", "clip_eps_low", "clip_eps_high"):
            value = getattr(self, name)
            if value is not None and not 0.0 < value < (1.0 if name != "clip_eps_high" else math.inf):
                raise ValueError(f"GRPOConfig.{name} must be in (0, 1) (clip_eps_high > 0) or None, got {value}")
        for name in ("kl_value_clamp", "loss_scale_factor"):
            value = getattr(self, name)
            if value is not None and not 0.0 < value < math.inf:
                raise ValueError(f"GRPOConfig.{name} must be a positive number or None, got {value}")
        if not 0.0 < self.log_ratio_clamp < math.inf:
            raise ValueError(f"GRPOConfig.log_ratio_clamp must be a positive number, got {self.log_ratio_clamp}")
        if not 0.0 < self.adv_eps < math.inf:
            raise ValueError(f"GRPOConfig.adv_eps must be a positive number (verl: 1e-6), got {self.adv_eps}")
        if not math.isfinite(self.entropy_coef):
            raise ValueError(f"GRPOConfig.entropy_coef must be finite, got {self.entropy_coef}")
        if self.tis_cap is not None and not 0.0 < self.tis_cap < math.inf:
            raise ValueError(f"GRPOConfig.tis_cap must be a positive number or None, got {self.tis_cap}")
        if self.seq_ratio_range is not None:
            lo, hi = self.seq_ratio_range
            if not 0.0 < lo <= 1.0 <= hi < math.inf:
                raise ValueError(f"GRPOConfig.seq_ratio_range must be (lo, hi) with 0 < lo <= 1 <= hi, got "
                                 f"{self.seq_ratio_range}")
            object.__setattr__(self, "seq_ratio_range", (float(lo), float(hi)))


STALENESS_TIS_CAP = 2.0  # TIS cap C of a bounded-staleness run that binds none (verl rollout_is_threshold's 2.0)


def for_staleness(config: GRPOConfig, max_staleness: int) -> GRPOConfig:
    """`config` as a block with bounded staleness `max_staleness` trains it: with s > 0, TIS on at the cap given.

    With s > 0 and ``old_logprobs = 'recompute'`` the ratio's denominator is the learner's current policy, so only the
    importance weight π_learner / π_engine corrects for the rollouts' older weights: a None ``tis_cap`` becomes
    :data:`STALENESS_TIS_CAP`; a bound one is kept. With s = 0, or ``'bypass'`` (the ratio is taken against the
    engine's logprobs), `config` is returned unchanged."""
    if max_staleness > 0 and config.tis_cap is None and config.old_logprobs == "recompute":
        return dataclasses.replace(config, tis_cap=STALENESS_TIS_CAP)
    return config


BATCH_FIELDS = ("input_ids", "attention_mask", "loss_mask", "old_logprobs", "ref_logprobs", "advantages")


def batch_fields(config: GRPOConfig) -> tuple[str, ...]:
    """The batch record's fields the GRPO step reads.

    :data:`BATCH_FIELDS`, plus ``is_weights`` ``[B, T] float32`` with rollout correction
    (``GRPOConfig.rollout_correction``)."""
    return BATCH_FIELDS + (("is_weights",) if config.rollout_correction else ())


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
      config: ``adv_eps``, ``adv_std_normalize``, ``adv_std_ddof``, ``singleton_advantage``.
    Returns:
      ``(advantages [N] float32, keep [N] bool)``. Unscored rollouts get advantage 0 and ``keep`` False;
      the caller drops them from the batch. A group whose scored rewards are all equal gets advantage 0
      everywhere (also [0.1] * 3, whose float mean is 0.1 + 2⁻⁵⁶); one with a single scored rollout gets 0 too, or
      with ``singleton_advantage='reward'`` verl's r / (1 + ε) (r without std normalisation). No variance floor is
      applied beyond ``adv_eps`` (a group equal up to round-off gets ~1e-11). Negative advantages are then multiplied
      by ``negative_advantage_weight``. Computed in float64.
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
            if config.singleton_advantage == "reward":  # verl: mean 0, std 1 for a group of one
                adv[idx] = r[idx] / (1.0 + config.adv_eps) if config.adv_std_normalize else r[idx]
            continue
        x = r[idx]
        if x.min() == x.max():  # equal rewards: exactly 0, not the round-off of their float mean
            continue
        centred = x - x.mean()
        if config.adv_std_normalize:
            centred = centred / (x.std(ddof=config.adv_std_ddof) + config.adv_eps)
        adv[idx] = centred
    adv = np.where(adv < 0, adv * config.negative_advantage_weight, adv)  # PSR at 0 (Zhu et al. 2025, §3)
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
    """How a GRPO update moved the policy on its own batch (host side, float64; a diagnostic).

    Args:
      old_logprobs, new_logprobs: ``[B, T]`` shifted logprobs of the batch's tokens before / after the update
        (the learner's, under the rollout sampling transform).
      loss_mask: ``[B, T]`` 1 on sampled (loss) tokens.
      advantages: ``[B]`` the rows' GRPO advantages.
    Returns:
      ``logp_shift_pos`` / ``logp_shift_neg``: mean over rollouts with A > 0 / A < 0 of their token-mean
      ``new − old`` logprob (nats per token; NaN when no such rollout). An ascent step raises the first and
      lowers the second.
      ``token_kl``: KL(old ‖ new) per loss token, Schulman's k3 estimate
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


def shifted_token_logprobs(logits: jax.Array, input_ids: jax.Array, temperature: float = 1.0,
                           top_p: float = 1.0, top_k: int = 0) -> jax.Array:
    """``[B, T, V]`` logits, ``[B, T] int32`` ids → ``[B, T] float32`` logprobs, shifted one position right.

    ``out[:, t] = log π(input_ids[:, t] | logits[:, t − 1])`` for t ≥ 1 and ``out[:, 0] = 0``, where π is the
    distribution the rollout engine *sampled from*: tempered and top-k / top-p truncated, renormalised
    (`bat_jax.rollout.engine.token_logprobs`, the one shared definition). With the defaults (T = 1, no
    truncation) this is the plain log-softmax, as SFT uses. GRPO passes the rollout's sampling parameters so
    that the importance ratio against the recorded old logprobs is 1 before any update.
    """
    lp = engine.token_logprobs(logits[:, :-1], input_ids[:, 1:], temperature, top_p, top_k)
    return jnp.pad(lp, ((0, 0), (1, 0)))


def shifted_token_logprobs_and_entropy(logits: jax.Array, input_ids: jax.Array, temperature: float = 1.0,
                                       top_p: float = 1.0, top_k: int = 0) -> tuple[jax.Array, jax.Array]:
    """:func:`shifted_token_logprobs` and the entropy of the same distribution, ``[B, T] float32`` each.

    ``entropy[:, t]`` = H(π(· | input_ids[:, :t])) in nats, π the sampling distribution (tempered, truncated,
    renormalised; verl: the entropy of ``logits / temperature``, which is the same without top-k / top-p);
    ``entropy[:, 0] = 0``.
    """
    lp, ent = _logprobs_and_entropy(logits[:, :-1], input_ids[:, 1:], temperature, top_p, top_k)
    return jnp.pad(lp, ((0, 0), (1, 0))), jnp.pad(ent, ((0, 0), (1, 0)))


def _logprobs_and_entropy(logits, ids, temperature, top_p, top_k):
    logp = engine.processed_logprobs(logits, temperature, top_p, top_k)
    lp = jnp.take_along_axis(logp, ids[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return lp, objective.entropy_from_logprobs(logp)


def map_sequence_chunks(fn: Callable[..., Any], xs: tuple[jax.Array, ...], chunk: int) -> Any:
    """``fn(*xs)`` for per-position ``fn``, ``chunk`` positions at a time.

    ``fn`` maps ``[B, c, ...]`` slices → ``[B, c]`` or a tuple of them.

    ``xs`` are ``[B, T, ...]`` arrays; the sequence is padded to a multiple of ``chunk`` (pad results dropped).
    Each chunk runs under ``jax.checkpoint`` inside a ``lax.map``: the forward keeps one chunk's intermediates
    (e.g. ``[B, chunk, V]`` float32 logits) at a time, and the backward recomputes them chunk by chunk instead
    of storing them. ``chunk`` 0 or ≥ T calls ``fn`` once. Returns ``[B, T]`` (each output of ``fn``).
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
    return jax.tree.map(lambda o: jnp.moveaxis(o, 0, 1).reshape(b, n * chunk)[:, :t], out)


def sequence_logprobs(apply_fn: Callable, params: Any, input_ids: jax.Array, attention_mask: jax.Array,
                      temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                      with_entropy: bool = False) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Shifted logprobs ``[B, T] float32`` of ``input_ids [B, T] int32`` under the model.

    Same values as :func:`shifted_token_logprobs` of the model's logits. With ``with_entropy`` also the shifted entropy
    ``[B, T] float32`` of the sampling distribution (:func:`shifted_token_logprobs_and_entropy`), from the same logits.

    With an ``apply_fn`` that has ``hidden`` / ``head`` / ``logit_chunk``
    (:class:`bat_jax.learn.train_state.ModelApply`) the output head runs ``logit_chunk`` positions at a time
    (:func:`map_sequence_chunks`), so the ``[B, T, V]`` float32 logits never exist; any other ``apply_fn`` is
    called for the full logits.
    """
    sampling = (temperature, top_p, top_k)
    if not hasattr(apply_fn, "hidden"):
        logits = apply_fn(params, input_ids, attention_mask)
        if with_entropy:
            return shifted_token_logprobs_and_entropy(logits, input_ids, *sampling)
        return shifted_token_logprobs(logits, input_ids, *sampling)
    h = apply_fn.hidden(params, input_ids, attention_mask)
    targets = jnp.pad(input_ids[:, 1:], ((0, 0), (0, 1)))  # position t predicts id t + 1

    def per_chunk(h_c, ids_c):
        logits = apply_fn.head(params, h_c)
        if with_entropy:
            return _logprobs_and_entropy(logits, ids_c, *sampling)
        return engine.token_logprobs(logits, ids_c, *sampling)

    nxt = map_sequence_chunks(per_chunk, (h, targets), apply_fn.logit_chunk)
    return jax.tree.map(lambda x: jnp.pad(x[:, :-1], ((0, 0), (1, 0))), nxt)


def grpo_token_terms(logprobs: jax.Array, batch: Mapping[str, jax.Array], config: GRPOConfig,
                     entropy: jax.Array | None = None) -> dict[str, jax.Array]:
    """Per-token pieces, ``[B, T] float32`` each, already zero where ``loss_mask`` is 0.

    Args:
      logprobs: ``[B, T]`` the learner's shifted logprobs of the batch's ids.
      batch: the batch record (module docstring); ``ref_logprobs`` is read only when ``kl_coef`` ≠ 0.
      config: the objective's options.
      entropy: ``[B, T]`` shifted per-token entropy, required when ``entropy_coef`` ≠ 0.
    Returns:
      ``mask`` (effective loss mask), ``pg`` (clipped policy loss), ``kl`` (KL estimate, zeros when
      ``kl_coef`` is 0), ``clipped``, ``entropy`` (zeros when not given) and ``total`` =
      pg + β·kl − entropy_coef·entropy.
    Raises:
      ValueError: ``entropy_coef`` ≠ 0 without ``entropy``.
    """
    mask = objective.effective_loss_mask(batch["loss_mask"])
    on = mask > 0
    pg, clipped = objective.clipped_policy_loss(
        logprobs, batch["old_logprobs"], batch["advantages"], eps_low=config.eps_low, eps_high=config.eps_high,
        dual_clip=config.dual_clip, log_ratio_clamp=config.log_ratio_clamp)
    if config.rollout_correction:  # truncated importance weights π_learner / π_engine (data: no gradient)
        pg = pg * batch["is_weights"].astype(jnp.float32)
    if config.kl_coef:
        kl = objective.kl_penalty(logprobs, batch["ref_logprobs"], config.kl_estimator, config.log_ratio_clamp,
                                  config.kl_value_clamp)
    else:
        kl = jnp.zeros_like(pg)
    if config.entropy_coef and entropy is None:
        raise ValueError("grpo_token_terms: GRPOConfig.entropy_coef is set but no per-token entropy was given")
    ent = jnp.zeros_like(pg) if entropy is None else jnp.where(on, entropy.astype(jnp.float32), 0.0)
    pg = jnp.where(on, pg, 0.0)
    kl = jnp.where(on, kl, 0.0)
    total = pg + config.kl_coef * kl
    if config.entropy_coef:
        total = total - config.entropy_coef * ent
    return {"mask": mask, "pg": pg, "kl": kl, "clipped": jnp.where(on, clipped, 0.0), "entropy": ent,
            "total": total}


def make_grpo_loss(
    apply_fn: Callable[[Any, jax.Array, jax.Array], jax.Array], config: GRPOConfig = GRPOConfig()
) -> Callable[[Any, Mapping[str, jax.Array], Mapping[str, jax.Array]], tuple[jax.Array, dict[str, jax.Array]]]:
    """The GRPO loss for :func:`bat_jax.learn.train_state.make_train_step` (minimise = maximise Eq. 19).

    ``loss(params, batch, normalizers) -> (loss, metrics)``; ``normalizers`` from :func:`grpo_normalizers`
    on the whole batch. Metrics (each aggregated like the loss, so they add over micro-batches):
    ``pg_loss``, ``kl``, ``clip_frac``, and ``entropy`` when ``entropy_coef`` ≠ 0 (then the learner computes
    the per-token entropy alongside the logprobs, from the same chunked logits).

    Raises:
      ValueError: ``'seq-mean-token-sum-norm'`` without ``loss_scale_factor`` (the GRPO block passes the budget).
    """
    if config.loss_agg == "seq-mean-token-sum-norm" and config.loss_scale_factor is None:
        raise ValueError("make_grpo_loss: loss_agg 'seq-mean-token-sum-norm' needs GRPOConfig.loss_scale_factor, "
                         "the constant C (tokens: the response budget)")

    def loss_fn(params, batch, normalizers):
        out = sequence_logprobs(apply_fn, params, batch["input_ids"], batch["attention_mask"],
                                *config.sampling.transform, with_entropy=bool(config.entropy_coef))
        lp, ent = out if config.entropy_coef else (out, None)
        t = grpo_token_terms(lp, batch, config, ent)
        agg = lambda v: objective.aggregate_loss(v, t["mask"], config.loss_agg, normalizers,  # noqa: E731
                                            config.loss_scale_factor, config.seq_mean_rows)
        metrics = {"pg_loss": agg(t["pg"]), "kl": agg(t["kl"]), "clip_frac": agg(t["clipped"])}
        if config.entropy_coef:
            metrics["entropy"] = agg(t["entropy"])
        return agg(t["total"]), metrics

    return loss_fn


def grpo_normalizers(batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """:func:`objective.loss_normalizers` of ``batch['loss_mask']`` and ``batch['attention_mask']``.

    It is the ``normalizer_fn`` of the train step: whole-batch token, rollout and sequence counts, so every aggregation
    is exact under micro-batching."""
    return objective.loss_normalizers(batch["loss_mask"], batch.get("attention_mask"))


def make_logprob_fn(apply_fn: Callable[[Any, jax.Array, jax.Array], jax.Array],
                    config: GRPOConfig = GRPOConfig(), **jit_kwargs) -> Callable:
    """A jitted function of the shifted logprobs (for ref_logprobs; :func:`sequence_logprobs`).

    Its signature is ``(params, input_ids [B, T] int32, attention_mask [B, T]) -> [B, T] float32``. ``jit_kwargs`` go to
    ``jax.jit`` (e.g. in/out shardings)."""

    def fn(params, input_ids, attention_mask):
        return sequence_logprobs(apply_fn, params, input_ids, attention_mask, *config.sampling.transform)

    return jax.jit(fn, **jit_kwargs)
