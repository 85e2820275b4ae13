"""The BiCuRL checkpoint controller: accept a candidate, or fall back to the best retained checkpoint θ*.

Two acceptance policies (ControllerConfig.policy, selectable in gin):

'fallback' — paper Eq. 6 (default). A counter of consecutive Overall drops,
    c_{r+1} = c_r + 1 if M_{r+1} < M_r else 0,
  and the next round starts from θ* when c_{r+1} ≥ patience (3) or KL(candidate ‖ θ*) > τ (0.1); otherwise it
  starts from the candidate. θ* is the accepted checkpoint with the highest Overall (ties keep the earlier one).
  After a fallback the counter restarts at 0 and M_r becomes θ*'s Overall (the policy that is now running).
  This policy only compares scores, so any scale (0–1 or 0–100) works.

'noninferiority' — the released code's paired non-inferiority gate against the incumbent θ* (REFERENCE.md):
  the candidate is accepted only if Overall ≥ θ* − 0.01, Task ≥ θ* − 0.03, every track ≥ θ* − 0.05, each of
  S3–S5 ≥ θ* − 0.03, and no Overall/Task/track/stage score falls by more than 0.20 (catastrophic). Otherwise it is
  held and θ* stays. Margins are absolute on the 0–1 scale. The KL rule applies to both policies (disable
  with kl_threshold=None).

The first evaluation (no θ* yet) is always accepted.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from bat_jax.benchmark.stages import Stage

POLICY_FALLBACK = "fallback"
POLICY_GATE = "noninferiority"
ACCEPT, FALLBACK, HOLD = "accept", "fallback", "hold"


@dataclasses.dataclass(frozen=True)
class NonInferiorityMargins:
    """Allowed drops of the paired gate (0–1 scale, released code)."""

    overall: float = 0.01
    task: float = 0.03
    track: float = 0.05
    late_stage: float = 0.03
    catastrophic: float = 0.20
    late_stages: tuple[str, ...] = ("S3", "S4", "S5")


@dataclasses.dataclass(frozen=True)
class ControllerConfig:
    """Controller settings (gin binds these; defaults from paper Eq. 6 and Appendix A.4).

    Attributes:
      patience: consecutive Overall drops that trigger fallback (paper: 3).
      kl_threshold: τ on the mean per-token KL(candidate ‖ θ*) in nats (paper: 0.1); None disables the rule.
      policy: POLICY_FALLBACK (paper) or POLICY_GATE (released code).
      margins: gate margins (used by POLICY_GATE only).
    """

    patience: int = 3
    kl_threshold: float | None = 0.1
    policy: str = POLICY_FALLBACK
    margins: NonInferiorityMargins = NonInferiorityMargins()

    def __post_init__(self):
        if self.patience < 1:
            raise ValueError(f"ControllerConfig.patience must be >= 1, got {self.patience}")
        if self.policy not in (POLICY_FALLBACK, POLICY_GATE):
            raise ValueError(f"ControllerConfig.policy must be {POLICY_FALLBACK!r} or {POLICY_GATE!r}, "
                             f"got {self.policy!r}")
        if self.kl_threshold is not None and not self.kl_threshold >= 0:
            raise ValueError(f"ControllerConfig.kl_threshold must be >= 0 or None, got {self.kl_threshold}")


def _finite(v: Any, what: str) -> float:
    v = float(v)
    if not math.isfinite(v):
        raise ValueError(f"{what} must be finite, got {v!r}")
    return v


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """Controller-evaluation aggregates of one checkpoint.

    Attributes:
      overall: M (required).
      task: Task score, or None.
      stage_scores: 'S1'..'S5' → score (None / missing = unscored).
      track_scores: track → per-track Overall.
    """

    overall: float
    task: float | None = None
    stage_scores: Mapping[str, float | None] = dataclasses.field(default_factory=dict)
    track_scores: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "overall", _finite(self.overall, "Evaluation.overall"))
        if self.task is not None:
            object.__setattr__(self, "task", _finite(self.task, "Evaluation.task"))
        stages = {Stage.parse(k).value: (None if v is None else _finite(v, f"stage score {k}"))
                  for k, v in self.stage_scores.items()}
        object.__setattr__(self, "stage_scores", stages)
        object.__setattr__(self, "track_scores",
                           {str(k): _finite(v, f"track score {k}") for k, v in self.track_scores.items()})

    def to_dict(self) -> dict[str, Any]:
        return {"overall": self.overall, "task": self.task, "stage_scores": dict(self.stage_scores),
                "track_scores": dict(self.track_scores)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Evaluation":
        return cls(d["overall"], d.get("task"), d.get("stage_scores", {}), d.get("track_scores", {}))


@dataclasses.dataclass(frozen=True)
class ControllerState:
    """Everything the controller remembers between rounds (serialisable for resume).

    Attributes:
      best_checkpoint / best: θ* and its evaluation (None before the first round).
      previous_overall: M_r of the policy the next round starts from.
      drops: the counter c_r.
      retained_checkpoint: the checkpoint the next round starts from (θ̄_{r+1}).
    """

    best_checkpoint: str | None = None
    best: Evaluation | None = None
    previous_overall: float | None = None
    drops: int = 0
    retained_checkpoint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"best_checkpoint": self.best_checkpoint, "best": self.best.to_dict() if self.best else None,
                "previous_overall": self.previous_overall, "drops": self.drops,
                "retained_checkpoint": self.retained_checkpoint}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ControllerState":
        best = d.get("best")
        return cls(d.get("best_checkpoint"), Evaluation.from_dict(best) if best else None,
                   d.get("previous_overall"), int(d.get("drops", 0)), d.get("retained_checkpoint"))


@dataclasses.dataclass(frozen=True)
class ControllerDecision:
    """One round's acceptance decision.

    Attributes:
      round_index, checkpoint: the candidate judged.
      decision: 'accept', 'fallback' (Eq. 6 policy) or 'hold' (gate policy).
      reasons: why it was not accepted (e.g. 'patience: 3 consecutive drops', 'kl 0.11 > 0.1'), else ().
      retained_checkpoint: the checkpoint the next round starts from.
      best_checkpoint, best_overall: θ* after this decision.
      drops: counter c_{r+1} after the decision (0 after a fallback).
      kl: the KL estimate used, or None.
    """

    round_index: int
    checkpoint: str
    decision: str
    reasons: tuple[str, ...]
    retained_checkpoint: str
    best_checkpoint: str
    best_overall: float
    drops: int
    kl: float | None

    @property
    def held(self) -> bool:
        """True when the candidate was not accepted (router's corrective rule applies)."""
        return self.decision != ACCEPT

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"reasons": list(self.reasons)}


def gate_failures(candidate: Evaluation, incumbent: Evaluation, margins: NonInferiorityMargins) -> list[str]:
    """Reasons the candidate fails the paired non-inferiority gate against the incumbent ([] = passes)."""
    reasons = []
    pairs: list[tuple[str, float, float, float | None]] = [("overall", candidate.overall, incumbent.overall,
                                                             margins.overall)]
    if candidate.task is not None and incumbent.task is not None:
        pairs.append(("task", candidate.task, incumbent.task, margins.task))
    for track in sorted(set(candidate.track_scores) & set(incumbent.track_scores)):
        pairs.append((f"track {track}", candidate.track_scores[track], incumbent.track_scores[track], margins.track))
    for stage in sorted(set(candidate.stage_scores) & set(incumbent.stage_scores)):
        c, b = candidate.stage_scores[stage], incumbent.stage_scores[stage]
        if c is not None and b is not None:
            pairs.append((f"stage {stage}", c, b, margins.late_stage if stage in margins.late_stages else None))
    for name, c, b, margin in pairs:
        drop = b - c
        if drop > margins.catastrophic:
            reasons.append(f"catastrophic: {name} fell {drop:.4f} > {margins.catastrophic}")
        elif margin is not None and drop > margin:
            reasons.append(f"{name} fell {drop:.4f} > {margin}")
    return reasons


def step(
    state: ControllerState,
    config: ControllerConfig,
    *,
    round_index: int,
    checkpoint: str,
    evaluation: Evaluation | float,
    kl: float | None = None,
) -> tuple[ControllerState, ControllerDecision]:
    """Judges one candidate (pure function; see module docstring).

    Args:
      state: controller state before this round.
      config: ControllerConfig.
      round_index: round r+1 of the candidate.
      checkpoint: the candidate's checkpoint id (e.g. its Orbax step or directory name).
      evaluation: Evaluation, or a bare Overall number.
      kl: mean per-token KL(candidate ‖ θ*) in nats, or None when not measured.

    Returns:
      (new state, decision).

    Raises:
      ValueError: a non-finite score or negative KL.
    """
    ev = evaluation if isinstance(evaluation, Evaluation) else Evaluation(overall=evaluation)
    if kl is not None:
        kl = _finite(kl, "kl")
        if kl < 0:
            raise ValueError(f"kl must be >= 0, got {kl}")
    if state.best is None:  # first evaluation: θ* := candidate
        new = ControllerState(checkpoint, ev, ev.overall, 0, checkpoint)
        return new, ControllerDecision(round_index, checkpoint, ACCEPT, (), checkpoint, checkpoint, ev.overall, 0, kl)

    drops = state.drops + 1 if ev.overall < state.previous_overall else 0
    reasons = []
    if config.kl_threshold is not None and kl is not None and kl > config.kl_threshold:
        reasons.append(f"kl {kl:.4g} > tau {config.kl_threshold}")
    if config.policy == POLICY_FALLBACK:
        if drops >= config.patience:
            reasons.insert(0, f"patience: {drops} consecutive Overall drops (patience {config.patience})")
        rejected = FALLBACK
    else:
        reasons = gate_failures(ev, state.best, config.margins) + reasons
        rejected = HOLD

    if reasons:
        new = ControllerState(state.best_checkpoint, state.best, state.best.overall, 0, state.best_checkpoint)
        decision = rejected
    else:
        decision = ACCEPT
        if config.policy == POLICY_GATE or ev.overall > state.best.overall:
            best_ckpt, best = checkpoint, ev  # gate: an accepted candidate becomes the incumbent
        else:
            best_ckpt, best = state.best_checkpoint, state.best
        new = ControllerState(best_ckpt, best, ev.overall, drops, checkpoint)
    return new, ControllerDecision(round_index, checkpoint, decision, tuple(reasons), new.retained_checkpoint,
                                   new.best_checkpoint, new.best.overall, new.drops, kl)


class Controller:
    """Stateful wrapper around `step` for the experiment loop.

    Usage: `c = Controller(config)`; each round `decision = c.observe(r, ckpt, evaluation, kl)`;
    persist `c.state.to_dict()` (e.g. in the ledger) and resume with `Controller(config, ControllerState.from_dict(d))`.
    """

    def __init__(self, config: ControllerConfig = ControllerConfig(), state: ControllerState | None = None):
        self.config = config
        self.state = state or ControllerState()

    def observe(self, round_index: int, checkpoint: str, evaluation: Evaluation | float,
                kl: float | None = None) -> ControllerDecision:
        self.state, decision = step(self.state, self.config, round_index=round_index, checkpoint=checkpoint,
                                    evaluation=evaluation, kl=kl)
        return decision
