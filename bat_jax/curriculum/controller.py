"""The BiCuRL checkpoint controller: every acceptance decision of a run, and the best checkpoint θ*.

Two acceptance rules (`ControllerConfig.acceptance`):

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from bat_jax.benchmark.scoring import Summary
from bat_jax.curriculum.router import SCORE_TOL

#: Acceptance rules (`ControllerConfig.acceptance`).
RULE_FALLBACK = "fallback"
RULE_GATE = "noninferiority"
ACCEPT, FALLBACK, HOLD, UNSCORED = "accept", "fallback", "hold", "unscored"
#: Every decision the controller makes (and a ledger records).
DECISIONS = (ACCEPT, FALLBACK, HOLD, UNSCORED)


@dataclasses.dataclass(frozen=True)
class NonInferiorityMargins:
    """Allowed drops of the paired gate, 0–1 scale, exactly the released code's thresholds.

    Attributes:
      overall: ``maximum_overall_drop`` 0.01.
      task: ``maximum_task_drop`` 0.03.
      track: ``maximum_per_track_drop`` 0.05 (each track's Overall).
      late_stage: ``maximum_late_stage_drop`` 0.03, for each stage of ``late_stages``.
      catastrophic_overall: ``catastrophic_overall_drop`` 0.20: the candidate is held when Overall fell by this
        much or more (the released check is ``drop < 0.20``).
      late_stages: the stage ids held to ``late_stage``; None = the run's benchmark's late stages (the imaging
        suite's S3–S5, the released gate's), filled in by the experiment.
    """

    overall: float = 0.01
    task: float = 0.03
    track: float = 0.05
    late_stage: float = 0.03
    catastrophic_overall: float = 0.20
    late_stages: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class ControllerConfig:
    """Controller settings (gin binds these; defaults from paper Eq. 6 and Appendix A.4).

    Attributes:
      patience: consecutive Overall drops that trigger fallback (paper: 3).
      kl_threshold: τ on the mean per-token KL(candidate ‖ θ*) in nats (paper: 0.1); None disables the rule.
      acceptance: RULE_FALLBACK (paper) or RULE_GATE (released code).
      margins: gate margins (used by RULE_GATE only).
    """

    patience: int = 3
    kl_threshold: float | None = 0.1
    acceptance: str = RULE_FALLBACK
    margins: NonInferiorityMargins = NonInferiorityMargins()

    def __post_init__(self):
        if self.patience < 1:
            raise ValueError(f"ControllerConfig.patience must be >= 1, got {self.patience}")
        if self.acceptance not in (RULE_FALLBACK, RULE_GATE):
            raise ValueError(f"ControllerConfig.acceptance must be {RULE_FALLBACK!r} or {RULE_GATE!r}, "
                             f"got {self.acceptance!r}")
        if self.kl_threshold is not None and not self.kl_threshold >= 0:
            raise ValueError(f"ControllerConfig.kl_threshold must be >= 0 or None, got {self.kl_threshold}")


def _require_finite(v: Any, what: str) -> float:
    v = float(v)
    if not math.isfinite(v):
        raise ValueError(f"{what} must be finite, got {v!r}")
    return v


CellKey = tuple[Any, ...]


def _cell_key(key: Any) -> CellKey:
    """A cell key as a tuple of str / int (a JSON list comes back as a tuple)."""
    parts = tuple(key) if isinstance(key, (list, tuple)) else (key,)
    if not parts or not all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in parts):
        raise ValueError(f"Evaluation.cells: a cell key is a tuple of str / int (e.g. (track, repeat)), got {key!r}")
    return parts


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """Controller-evaluation aggregates of one checkpoint.

    Attributes:
      overall: M, or None when every cell was unscored (the decision is then 'unscored', never a score of 0).
      task: Task score, or None.
      stage_scores: stage id → score (None / missing = unscored).
      track_scores: track → per-track Overall.
      cells: the keys of the cells the aggregates rest on (`Summary.cells`: ``(track, repeat)``), or None when
        not recorded. The non-inferiority gate pairs two evaluations only over identical cells.
    Raises:
      ValueError: a non-finite score or a malformed cell key (the message names the field).
    """

    overall: float | None
    task: float | None = None
    stage_scores: Mapping[str, float | None] = dataclasses.field(default_factory=dict)
    track_scores: Mapping[str, float] = dataclasses.field(default_factory=dict)
    cells: frozenset[CellKey] | None = None

    def __post_init__(self):
        if self.overall is not None:
            object.__setattr__(self, "overall", _require_finite(self.overall, "Evaluation.overall"))
        if self.task is not None:
            object.__setattr__(self, "task", _require_finite(self.task, "Evaluation.task"))
        stages = {str(k): (None if v is None else _require_finite(v, f"stage score {k}"))
                  for k, v in self.stage_scores.items()}
        object.__setattr__(self, "stage_scores", stages)
        object.__setattr__(self, "track_scores",
                           {str(k): _require_finite(v, f"track score {k}") for k, v in self.track_scores.items()})
        if self.cells is not None:
            object.__setattr__(self, "cells", frozenset(_cell_key(k) for k in self.cells))

    def to_dict(self) -> dict[str, Any]:
        out = {"overall": self.overall, "task": self.task, "stage_scores": dict(self.stage_scores),
               "track_scores": dict(self.track_scores)}
        if self.cells is not None:
            out["cells"] = [list(k) for k in sorted(self.cells, key=repr)]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Evaluation":
        return cls(d["overall"], d.get("task"), d.get("stage_scores", {}), d.get("track_scores", {}), d.get("cells"))

    @classmethod
    def from_summary(cls, summary: Summary) -> "Evaluation":
        """The aggregates of an evaluator `Summary`, its scored cells included; unscored values stay None."""
        return cls(summary.overall, summary.task, dict(summary.stages),
                   {t: row["overall"] for t, row in summary.tracks.items()}, summary.cells)


@dataclasses.dataclass(frozen=True)
class ControllerState:
    """Everything the controller remembers between rounds (serialisable for resume).

    Attributes:
      best_checkpoint / best: θ* and its evaluation (None before the first observation; `best` stays None while
        every evaluation so far was unscored).
      previous_overall: M_r of the policy the next round starts from.
      drops: the counter c_r.
      retained_checkpoint: the checkpoint the next round starts from (θ̄_{r+1}).
      last_decision: the latest decision (one of `DECISIONS`), None before the first.
    """

    best_checkpoint: str | None = None
    best: Evaluation | None = None
    previous_overall: float | None = None
    drops: int = 0
    retained_checkpoint: str | None = None
    last_decision: str | None = None

    @property
    def held(self) -> bool:
        """The latest candidate was scored and not accepted (fallback or hold): the router's corrective rule."""
        return self.last_decision in (FALLBACK, HOLD)

    @property
    def reference_scores(self) -> Mapping[str, float | None] | None:
        """θ*'s stage scores: the reference of the router's corrective rule (None while nothing was scored)."""
        return None if self.best is None else self.best.stage_scores

    def to_dict(self) -> dict[str, Any]:
        return {"best_checkpoint": self.best_checkpoint, "best": self.best.to_dict() if self.best else None,
                "previous_overall": self.previous_overall, "drops": self.drops,
                "retained_checkpoint": self.retained_checkpoint, "last_decision": self.last_decision}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], last_decision: str | None = None) -> "ControllerState":
        """The state of `to_dict`; `last_decision` fills in for a state written before the field existed."""
        best = d.get("best")
        return cls(d.get("best_checkpoint"), Evaluation.from_dict(best) if best else None,
                   d.get("previous_overall"), int(d.get("drops", 0)), d.get("retained_checkpoint"),
                   d.get("last_decision", last_decision))


@dataclasses.dataclass(frozen=True)
class ControllerDecision:
    """One round's acceptance decision.

    Attributes:
      round_index, checkpoint: the candidate judged.
      decision: one of `DECISIONS`: 'accept', 'fallback' (Eq. 6 rule), 'hold' (gate rule) or 'unscored'.
      reasons: why it was not accepted (e.g. 'patience: 3 consecutive drops', 'kl 0.11 > 0.1'), else ().
      retained_checkpoint: the checkpoint the next round starts from.
      best_checkpoint, best_overall: θ* after this decision (`best_overall` None while nothing was scored).
      drops: counter c_{r+1} after the decision (0 after a fallback).
      kl: the KL estimate used, or None.
    """

    round_index: int
    checkpoint: str
    decision: str
    reasons: tuple[str, ...]
    retained_checkpoint: str
    best_checkpoint: str
    best_overall: float | None
    drops: int
    kl: float | None

    @property
    def held(self) -> bool:
        """True when the candidate was scored and not accepted (router's corrective rule applies)."""
        return self.decision in (FALLBACK, HOLD)

    @property
    def new_best(self) -> bool:
        """True when this candidate became θ*."""
        return self.decision == ACCEPT and self.best_checkpoint == self.checkpoint

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"reasons": list(self.reasons)}


def _difference(what: str, candidate: Iterable, incumbent: Iterable, shown: int = 5) -> str:
    """'only the candidate has [...]; only the incumbent has [...]' (at most `shown` of each)."""
    cand, inc = set(candidate), set(incumbent)
    parts = []
    for side, extra in (("candidate", cand - inc), ("incumbent", inc - cand)):
        if extra:
            listed = sorted(extra, key=repr)
            more = f" and {len(listed) - shown} more" if len(listed) > shown else ""
            parts.append(f"only the {side} has {what} {listed[:shown]}{more}")
    return "; ".join(parts)


def check_paired(candidate: Evaluation, incumbent: Evaluation) -> None:
    """The released gate's pairing check: both evaluations cover the same cells, tracks and scored stages.

    Raises:
      ValueError: naming what only one side has (cells when both record them; a side that records cells
        against one that does not; tracks; a Task score; scored stages).
    """
    problems = []
    if (candidate.cells is None) != (incumbent.cells is None):
        side = "candidate" if candidate.cells is None else "incumbent"
        problems.append(f"the {side}'s evaluation records no cells")
    elif candidate.cells is not None and candidate.cells != incumbent.cells:
        problems.append(_difference("cells", candidate.cells, incumbent.cells))
    if set(candidate.track_scores) != set(incumbent.track_scores):
        problems.append(_difference("tracks", candidate.track_scores, incumbent.track_scores))
    if (candidate.task is None) != (incumbent.task is None):
        problems.append(f"only the {'incumbent' if candidate.task is None else 'candidate'} has a Task score")
    scored = lambda ev: {k for k, v in ev.stage_scores.items() if v is not None}  # noqa: E731
    if scored(candidate) != scored(incumbent):
        problems.append(_difference("scored stages", scored(candidate), scored(incumbent)))
    if problems:
        raise ValueError("non-inferiority gate: the candidate and the incumbent were not evaluated on the same "
                         "cells (a paired comparison needs identical cells): " + "; ".join(problems))


def gate_failures(candidate: Evaluation, incumbent: Evaluation, margins: NonInferiorityMargins) -> list[str]:
    """Reasons the candidate fails the released paired non-inferiority gate against the incumbent ([] = passes).

    A drop is incumbent − candidate; it fails when it exceeds its margin by more than `SCORE_TOL` (released:
    ``drop <= margin`` passes), and Overall fails the catastrophic check when it fell by 0.20 or more (within
    `SCORE_TOL`). Stages outside ``margins.late_stages`` are not checked.

    Raises:
      ValueError: the two evaluations are not paired (:func:`check_paired`).
    """
    check_paired(candidate, incumbent)
    reasons = []
    overall_drop = incumbent.overall - candidate.overall
    catastrophic = overall_drop >= margins.catastrophic_overall - SCORE_TOL
    if catastrophic:
        reasons.append(f"catastrophic: overall fell {overall_drop:.4f} >= {margins.catastrophic_overall}")
    pairs: list[tuple[str, float, float, float]] = []
    if not catastrophic:  # one reason for Overall
        pairs.append(("overall", candidate.overall, incumbent.overall, margins.overall))
    if candidate.task is not None and incumbent.task is not None:
        pairs.append(("task", candidate.task, incumbent.task, margins.task))
    for track in sorted(candidate.track_scores):
        pairs.append((f"track {track}", candidate.track_scores[track], incumbent.track_scores[track], margins.track))
    for stage in sorted(margins.late_stages or ()):
        c, b = candidate.stage_scores.get(stage), incumbent.stage_scores.get(stage)
        if c is not None and b is not None:
            pairs.append((f"stage {stage}", c, b, margins.late_stage))
    for name, c, b, margin in pairs:
        drop = b - c
        if drop > margin + SCORE_TOL:
            reasons.append(f"{name} fell {drop:.4f} > {margin}")
    return reasons


def step(
    state: ControllerState,
    config: ControllerConfig,
    *,
    round_index: int,
    checkpoint: str,
    evaluation: Evaluation | float | None,
    kl: float | None = None,
) -> tuple[ControllerState, ControllerDecision]:
    """Judges one candidate (pure function; see module docstring).

    Args:
      state: controller state before this round.
      config: ControllerConfig.
      round_index: round r+1 of the candidate.
      checkpoint: the candidate's checkpoint name (`checkpoint.checkpoint_name`).
      evaluation: Evaluation, a bare Overall number, or None / an Evaluation with overall None (unscored).
      kl: mean per-token KL(candidate ‖ θ*) in nats, or None when not measured.

    Returns:
      (new state, decision).

    Raises:
      ValueError: a non-finite score or negative KL.
    """
    ev = evaluation if isinstance(evaluation, Evaluation) else Evaluation(overall=evaluation)
    if kl is not None:
        kl = _require_finite(kl, "kl")
        if kl < 0:
            raise ValueError(f"kl must be >= 0, got {kl}")
    if ev.overall is None:  # no evidence either way: not accepted, not a drop; θ̄ stays
        keep = state.retained_checkpoint or checkpoint
        new = dataclasses.replace(state, best_checkpoint=state.best_checkpoint or checkpoint, retained_checkpoint=keep,
                                  last_decision=UNSCORED)
        reasons = ("every cell of the evaluation was unscored",)
        return new, ControllerDecision(round_index, checkpoint, UNSCORED, reasons, keep, new.best_checkpoint,
                                       None if new.best is None else new.best.overall, new.drops, kl)
    if state.best is None:  # first scored evaluation: θ* := candidate
        new = ControllerState(checkpoint, ev, ev.overall, 0, checkpoint, ACCEPT)
        return new, ControllerDecision(round_index, checkpoint, ACCEPT, (), checkpoint, checkpoint, ev.overall, 0, kl)

    drops = state.drops + 1 if ev.overall < state.previous_overall - SCORE_TOL else 0
    reasons = []
    if config.kl_threshold is not None and kl is not None and kl > config.kl_threshold:
        reasons.append(f"kl {kl:.4g} > tau {config.kl_threshold}")
    if config.acceptance == RULE_FALLBACK:
        if drops >= config.patience:
            reasons.insert(0, f"patience: {drops} consecutive Overall drops (patience {config.patience})")
        rejected = FALLBACK
    else:
        try:
            reasons = gate_failures(ev, state.best, config.margins) + reasons
        except ValueError as unpaired:  # no paired comparison, so no evidence of non-inferiority
            reasons.insert(0, f"unpaired: {unpaired}")
        rejected = HOLD

    if reasons:
        new = ControllerState(state.best_checkpoint, state.best, state.best.overall, 0, state.best_checkpoint, rejected)
        decision = rejected
    else:
        decision = ACCEPT
        if config.acceptance == RULE_GATE or ev.overall > state.best.overall + SCORE_TOL:
            best_ckpt, best = checkpoint, ev  # gate: an accepted candidate becomes the incumbent
        else:
            best_ckpt, best = state.best_checkpoint, state.best
        new = ControllerState(best_ckpt, best, ev.overall, drops, checkpoint, ACCEPT)
    return new, ControllerDecision(round_index, checkpoint, decision, tuple(reasons), new.retained_checkpoint,
                                   new.best_checkpoint, new.best.overall, new.drops, kl)


class Controller:
    """Stateful wrapper around `step` for the experiment loop.

    Usage: `controller = Controller(config)`; each round `decision = controller.observe(r, name, evaluation, kl)`;
    persist `controller.state.to_dict()` (the ledger does) and resume with
    `Controller(config, ControllerState.from_dict(d))`.
    """

    def __init__(self, config: ControllerConfig = ControllerConfig(), state: ControllerState | None = None):
        self.config = config
        self.state = state or ControllerState()

    def observe(self, round_index: int, checkpoint: str, evaluation: Evaluation | float | None,
                kl: float | None = None) -> ControllerDecision:
        """Judges one candidate (`step`) and keeps the new state."""
        self.state, decision = step(self.state, self.config, round_index=round_index, checkpoint=checkpoint,
                                    evaluation=evaluation, kl=kl)
        return decision
