"""Rollout / training mismatch: the rollout engine's logprobs are not the learner's.

Details: docs/design.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

_LOG_RATIO_CLAMP = 20.0  # as the PPO ratio: exp stays finite
METRICS = ("mismatch_mean_abs", "mismatch_max_abs", "tis_truncated_frac", "seq_masked")
"""The per-round metrics a ledger records (:func:`merge_metrics` also returns the counts they rest on)."""


CONVENTIONS = ("geometric", "seq_mean_k1")


def correct(learner_logprobs: Any, engine_logprobs: Any, loss_mask: Any, *, tis_cap: float | None,
            seq_ratio_range: tuple[float, float] | None, convention: str = "geometric"
            ) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Importance weights, rollouts kept and mismatch metrics of one batch (host side, float64 inside).

    Args:
      learner_logprobs: ``[B, T]`` the learner's shifted logprobs of the sampled ids, under the parameters and
        sampling transform the rollouts used (the behaviour policy in the learner's numerics).
      engine_logprobs: ``[B, T]`` the rollout engine's logprobs of the same tokens, as sampled.
      loss_mask: ``[B, T]`` 1 on sampled tokens (the only tokens read).
      tis_cap: C of token-level truncated IS (> 0), or None (weights 1).
      seq_ratio_range: (lo, hi), or None (every rollout kept). With m = mean log w over a rollout's sampled
        tokens (each log w clamped to ±20): ``'geometric'`` keeps lo ≤ exp(m) ≤ hi; ``'seq_mean_k1'`` keeps
        lo ≤ exp(−m) ≤ hi (verl ``seq_mean_k1``: w = 1.8 with (0.5, 1.5) is kept there, masked in the other).
        Compared in log space, as verl does.
      convention: ``'geometric'`` or ``'seq_mean_k1'``.
    Returns:
      ``(is_weights [B, T] float32, keep [B] bool, metrics)``; weights are 0 off the loss mask. Metrics (floats):
      ``mismatch_mean_abs`` / ``mismatch_max_abs`` — mean / max of |log π_learner − log π_engine| over sampled
      tokens (nats; each difference clamped to ±20 first, as the ratio's log is).
  ``tis_truncated_frac`` — share of sampled tokens whose weight was cut to C.
      ``seq_masked`` — rollouts masked by the geometric-mean bounds. ``rollouts`` — rows with sampled tokens.
      ``tokens`` — sampled tokens.
    Raises:
      ValueError: shapes that differ, a non-positive cap, bounds with not 0 < lo ≤ 1 ≤ hi, or an unknown
        convention.
    """
    learner = np.asarray(learner_logprobs, np.float64)
    eng = np.asarray(engine_logprobs, np.float64)
    mask = np.asarray(loss_mask) > 0
    if learner.shape != eng.shape or learner.shape != mask.shape or learner.ndim != 2:
        raise ValueError(f"correct: learner {learner.shape}, engine {eng.shape} and loss_mask {mask.shape} logprobs "
                         "must all be [B, T]")
    if tis_cap is not None and not tis_cap > 0:
        raise ValueError(f"correct: tis_cap must be > 0 or None, got {tis_cap}")
    if convention not in CONVENTIONS:
        raise ValueError(f"correct: convention must be one of {CONVENTIONS}, got {convention!r}")
    if seq_ratio_range is not None:
        lo, hi = seq_ratio_range
        if not 0.0 < lo <= 1.0 <= hi:
            raise ValueError(f"correct: seq_ratio_range must satisfy 0 < lo <= 1 <= hi, got {seq_ratio_range}")
    log_w = np.where(mask, np.clip(learner - eng, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP), 0.0)
    tokens = mask.sum(1)
    rows = tokens > 0
    weights = np.where(mask, 1.0, 0.0)
    truncated = np.zeros_like(mask)
    if tis_cap is not None:
        w = np.exp(log_w)
        truncated = mask & (w > tis_cap)
        weights = np.where(mask, np.minimum(w, tis_cap), 0.0)
    keep = np.ones(mask.shape[0], bool)
    if seq_ratio_range is not None:
        lo, hi = np.log(seq_ratio_range[0]), np.log(seq_ratio_range[1])
        if convention == "seq_mean_k1":  # bounds on mean log(1 / w)
            lo, hi = -hi, -lo
        mean_log_w = log_w.sum(1) / np.maximum(tokens, 1)
        keep = ~rows | ((mean_log_w >= lo) & (mean_log_w <= hi))
    n = max(int(mask.sum()), 1)
    diff = np.abs(log_w)[mask]
    metrics = {"mismatch_mean_abs": float(diff.sum() / n), "mismatch_max_abs": float(diff.max(initial=0.0)),
               "tis_truncated_frac": float(truncated.sum() / n), "seq_masked": float((~keep & rows).sum()),
               "rollouts": float(rows.sum()), "tokens": float(mask.sum())}
    return weights.astype(np.float32), keep, metrics


def merge_metrics(per_batch: list[Mapping[str, float]]) -> dict[str, float]:
    """One round's mismatch metrics from its batches' (:func:`correct`).

    Means weighted by the batches' sampled tokens, the max of the maxima, sums of the counts. Empty list: {}."""
    if not per_batch:
        return {}
    tokens = sum(m["tokens"] for m in per_batch)
    mean = lambda key: float(sum(m[key] * m["tokens"] for m in per_batch) / max(tokens, 1))  # noqa: E731
    return {"mismatch_mean_abs": mean("mismatch_mean_abs"), "tis_truncated_frac": mean("tis_truncated_frac"),
            "mismatch_max_abs": max(m["mismatch_max_abs"] for m in per_batch),
            "seq_masked": float(sum(m["seq_masked"] for m in per_batch)),
            "rollouts": float(sum(m["rollouts"] for m in per_batch)), "tokens": float(tokens)}
