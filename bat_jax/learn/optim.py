"""Optimizers for the SFT cold start and GRPO (optax).

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses

import optax

LR_SCHEDULES = ("cosine", "constant")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW + global-norm clipping + schedule. Defaults: the SFT cold start of the paper.

    Attributes:
      learning_rate: peak learning rate.
      schedule: ``'cosine'`` (linear warmup to the peak, cosine decay to ``end_lr_ratio`` · peak at the last
        step) or ``'constant'`` (linear warmup, then flat).
      warmup_ratio: warmup steps as a fraction of the total optimizer steps (0.03 = 3 %).
      end_lr_ratio: final learning rate of the cosine schedule as a fraction of the peak.
      weight_decay: AdamW decoupled weight decay.
      grad_clip_norm: max global L2 norm of the gradient; None disables clipping.
      b1, b2, eps: Adam moments and epsilon.
    """

    learning_rate: float = 2e-5
    schedule: str = "cosine"
    warmup_ratio: float = 0.03
    end_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    grad_clip_norm: float | None = 1.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8


GRPO_OPTIMIZER = OptimizerConfig(learning_rate=1e-6, schedule="constant", warmup_ratio=0.0)
"""Paper default for the GRPO actor (Table 8: lr 1e-6). Released code: learning_rate=2.5e-7."""


def learning_rate_schedule(config: OptimizerConfig, total_steps: int) -> optax.Schedule:
    """The schedule as a function of the optimizer step (0-based).

    Raises:
      ValueError: unknown schedule name or ``total_steps < 1``.
    """
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    if config.schedule not in LR_SCHEDULES:
        raise ValueError(f"OptimizerConfig.schedule must be one of {LR_SCHEDULES}, got {config.schedule!r}")
    warmup = int(round(config.warmup_ratio * total_steps))
    peak = config.learning_rate
    if config.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0 if warmup else peak,
            peak_value=peak,
            warmup_steps=warmup,
            decay_steps=total_steps,
            end_value=config.end_lr_ratio * peak,
        )
    if not warmup:
        return optax.constant_schedule(peak)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak)], [warmup]
    )


def make_optimizer(config: OptimizerConfig, total_steps: int) -> optax.GradientTransformation:
    """``clip_by_global_norm(grad_clip_norm)`` followed by ``adamw(schedule, weight_decay)``.

    An all-zero gradient passes the clip unchanged (scale 1) and gives an all-zero update when
    ``weight_decay`` is 0 (Adam moments stay 0).
    """
    parts = []
    if config.grad_clip_norm is not None:
        parts.append(optax.clip_by_global_norm(config.grad_clip_norm))
    parts.append(
        optax.adamw(
            learning_rate_schedule(config, total_steps),
            b1=config.b1,
            b2=config.b2,
            eps=config.eps,
            weight_decay=config.weight_decay,
        )
    )
    return optax.chain(*parts)
