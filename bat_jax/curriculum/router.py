"""The curriculum router: pick the target stage s* from held-out stage scores and write an auditable report.

Source: paper Section 2.2.2 ("The curriculum router reads e_r and writes an auditable report that selects target
stage s*_r"); the released code: weakest stage, ties → earliest stage; after a held candidate →
the stage with the largest positive regression.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from typing import Any

from bat_jax.benchmark.stages import StageSet
from bat_jax.stage_bank.prescription import check_prescription

RULE_WEAKEST = "weakest"
RULE_REGRESSION = "largest_regression"
RULE_NO_SCORED = "no_scored_stage"
RULE_RANDOM = "random"
RULE_BOTTLENECK = "bottleneck"
RULES = (RULE_WEAKEST, RULE_RANDOM, RULE_BOTTLENECK)

#: Scores (0–1) within this of each other are equal in every comparison the router and the controller make.
SCORE_TOL = 1e-12


@dataclasses.dataclass(frozen=True)
class RouterConfig:
    """Router settings (gin binds these).

    `rule`: 'weakest' (the paper), 'random' (ablation: a uniformly random stage each round, drawn from `seed`
    and the round) or 'bottleneck' (not the paper's: the stage whose score falls most below the previous stage's,
    `funnel_drops`, for benchmarks whose stage scores come from whole episodes, where a stage fails whenever an
    earlier one did). `corrective`: use the largest-regression rule after a held candidate (released code); the
    paper's default is the weakest-stage rule only."""

    rule: str = RULE_WEAKEST
    seed: int = 0
    corrective: bool = False

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"router.RouterConfig.rule must be one of {RULES}, got {self.rule!r}")


def _parse_scores(scores: Mapping[str, float | None], stages: StageSet, what: str) -> dict[str, float | None]:
    """`scores` keyed by stage id in workflow order; every stage present, each 0–1 or None."""
    parsed = stages.check_scores(scores, what)
    for stage, v in parsed.items():
        if v is not None:
            v = float(v)
            if not math.isfinite(v) or not 0.0 <= v <= 1.0:
                raise ValueError(f"{what} for {stages.label(stage)} must be in [0, 1], got {v!r}")
            parsed[stage] = v
    return parsed


@dataclasses.dataclass(frozen=True)
class RoutingDecision:
    """The router's choice and its audit trail.

    Attributes:
      round_index: the round the choice is for.
      target: s*, a stage id.
      target_title: its title.
      rule: RULE_WEAKEST, RULE_BOTTLENECK, RULE_RANDOM, RULE_REGRESSION or RULE_NO_SCORED.
      scores_in: stage scores read (candidate's when held), stage id → 0–1 or None, in workflow order.
      reference_scores: the retained checkpoint's scores used by the corrective rule, or None.
      regressions: reference − candidate per stage (positive = fell), empty unless corrective rule was tried.
      held: whether the last candidate was held / fell back.
    """

    round_index: int
    target: str
    target_title: str
    rule: str
    scores_in: Mapping[str, float | None]
    reference_scores: Mapping[str, float | None] | None
    regressions: Mapping[str, float]
    held: bool

    def report(self) -> dict[str, Any]:
        """JSON-serialisable audit report (scores in, rule, choice) for the ledger."""
        return {
            "round": self.round_index,
            "rule": self.rule,
            "held": self.held,
            "scores_in": dict(self.scores_in),
            "reference_scores": dict(self.reference_scores) if self.reference_scores is not None else None,
            "regressions": dict(self.regressions),
            "target_stage": self.target,
            "target_title": self.target_title,
        }

    def prescription(self, stages: StageSet) -> dict[str, Any]:
        """What the data side receives: aggregates only, checked by the firewall against the run's `stages`."""
        payload: dict[str, Any] = {
            "round": self.round_index,
            "target_stage": self.target,
            "stage_scores": {k: v for k, v in self.scores_in.items() if v is not None},
        }
        if self.regressions:
            payload["stage_changes"] = {k: -v for k, v in self.regressions.items()}
        return check_prescription(payload, stages)


def earliest_min(values: Mapping[str, float], stages: StageSet) -> str:
    """The earliest stage (workflow order) whose value is within `SCORE_TOL` of the minimum."""
    low = min(values.values())
    return next(s for s in stages.ids if s in values and values[s] <= low + SCORE_TOL)


def earliest_max(values: Mapping[str, float], stages: StageSet) -> str:
    """The earliest stage (workflow order) whose value is within `SCORE_TOL` of the maximum."""
    high = max(values.values())
    return next(s for s in stages.ids if s in values and values[s] >= high - SCORE_TOL)


def funnel_drops(scores: Mapping[str, float | None], stages: StageSet) -> dict[str, float]:
    """Per scored stage, the previous scored stage's score minus its own (1.0 before the first); None = unscored.

    E.g. scores 0.667, 0.25, 0.083, 0.021 give drops 0.333, 0.417, 0.167, 0.062: the second stage loses most."""
    drops, previous = {}, 1.0
    for stage in stages.ids:
        if scores.get(stage) is not None:
            drops[stage] = previous - scores[stage]
            previous = scores[stage]
    return drops


def route(
    stage_scores: Mapping[str, float | None],
    stages: StageSet,
    *,
    round_index: int = 0,
    held: bool = False,
    reference_scores: Mapping[str, float | None] | None = None,
    config: RouterConfig = RouterConfig(),
) -> RoutingDecision:
    """Chooses the target stage.

    Args:
      stage_scores: e_r, one 0–1 score (or None = unscored) per stage of `stages`; keys ids or titles. When
        `held`, these are the held candidate's scores.
      stages: the benchmark's stages (their order breaks ties).
      round_index: round the decision is for (recorded in the report).
      held: the last candidate was held / fell back.
      reference_scores: the retained checkpoint θ*'s stage scores (needed by the corrective rule).
      config: RouterConfig.

    Returns:
      RoutingDecision.

    Raises:
      ValueError: a missing stage, a score outside [0, 1], or the corrective rule enabled for a held candidate
        without reference_scores.
    """
    scores = _parse_scores(stage_scores, stages, "stage scores")
    scored = {s: v for s, v in scores.items() if v is not None}
    first = stages.ids[0]
    if not scored:
        return RoutingDecision(round_index=round_index, target=first, target_title=stages.title(first),
                               rule=RULE_NO_SCORED, scores_in=scores, reference_scores=None, regressions={},
                               held=held)
    if config.rule == RULE_RANDOM:
        target = random.Random(1_000_003 * config.seed + round_index).choice(stages.ids)
        return RoutingDecision(round_index=round_index, target=target, target_title=stages.title(target),
                               rule=RULE_RANDOM, scores_in=scores, reference_scores=None, regressions={}, held=held)
    reference = None
    regressions: dict[str, float] = {}
    if config.rule == RULE_BOTTLENECK:
        rule, target = RULE_BOTTLENECK, earliest_max(funnel_drops(scored, stages), stages)
    else:
        rule, target = RULE_WEAKEST, earliest_min(scored, stages)
    if held and config.corrective:
        if reference_scores is None:
            raise ValueError("the corrective rule needs reference_scores (the retained checkpoint's stage scores)")
        reference = _parse_scores(reference_scores, stages, "reference stage scores")
        regressions = {s: reference[s] - scored[s] for s in scored if reference[s] is not None}
        fell = {s: d for s, d in regressions.items() if d > SCORE_TOL}
        if fell:
            rule = RULE_REGRESSION
            target = earliest_max(fell, stages)
    return RoutingDecision(round_index=round_index, target=target, target_title=stages.title(target), rule=rule,
                           scores_in=scores, reference_scores=reference, regressions=regressions, held=held)
