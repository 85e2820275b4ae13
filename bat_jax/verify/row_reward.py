"""The reward of one GRPO rollout from a Stage Bank RL row (paper Eq. 4, released code's E2E rule).

A row stores only public contract text; the verifier's checks need the task's hidden answer key, which is
regenerated deterministically from the row's provenance (`task_synthesis` seed / variant / template, and the
`e2e_reduce` λ actually applied for E2E surrogates). Stage rows are scored on their stage's rubric only
(r = η · mean of binary items); E2E rows on S1–S5 plus the task metric (0.5 · stage mean + 0.5 · task).
`reward_source='task_metric'` scores the task metric alone (the paper's GRPO baseline on E2E rows).
With a `RubricJudge` its items are decided by the LLM judge and the version names the judge model.
An infrastructure failure (sandbox, or the judge unreachable) gives None (unscored), never 0.
"""

from __future__ import annotations

import dataclasses

from bat_jax.benchmark.stages import E2E, STAGES, Stage
from bat_jax.rollout.trajectory import Trajectory
from bat_jax.sandbox.types import SandboxState
from bat_jax.stage_bank.row import RLRow
from bat_jax.verify.judge import RubricJudge
from bat_jax.verify.rubric import REWARD_VERSION, Evidence, score


@dataclasses.dataclass(frozen=True)
class RolloutReward:
    """reward: 0–1 or None (unscored); version: the reward contract; focus: the row's stage or 'E2E'."""

    reward: float | None
    version: str
    focus: str


def row_task(row: RLRow):
    """(track, TaskInstance) of the task a row was built from, hidden answer key included.

    Raises:
      ValueError: the provenance lacks a `task_synthesis` step (names the row's state_id).
    """
    from bat_jax.stage_bank import e2e_surrogate
    from bat_jax.tasks import heldout
    from bat_jax.tasks.registry import get_track

    steps = {t.name: dict(t.params) for t in row.provenance.transformations}
    if "task_synthesis" not in steps:
        raise ValueError(f"RL row {row.state_id}: provenance has no 'task_synthesis' step; cannot rebuild its "
                         f"rubric (steps: {sorted(steps)})")
    syn = steps["task_synthesis"]
    track = get_track(row.provenance.track)
    inst = heldout.training_task(track, int(syn["seed"]), str(syn["variant"]), int(syn["template"]))
    if "e2e_reduce" in steps:
        p = steps["e2e_reduce"]
        lam = e2e_surrogate.Reduction(cases=int(p["cases"]), input_fraction=float(p["input_fraction"]),
                                      validation_passes=int(p["validation_passes"]))
        inst, _ = e2e_surrogate.reduce_task(track, inst, lam, int(syn["template"]))
    return track, inst


def rollout_reward(row: RLRow, trajectory: Trajectory, start: SandboxState,
                   judge: RubricJudge | None = None) -> RolloutReward:
    """Scores one rollout of `row` that started from `start` (the row's state p); `judge` (optional) decides
    its configured rubric items. Reward None = unscored (sandbox failure, or a judged item the judge could
    not decide)."""
    from bat_jax.policy import evidence_of
    from bat_jax.tasks.rubric_items import build_rubric

    version = judge.version if judge is not None else REWARD_VERSION
    evidence: Evidence = evidence_of(trajectory, start)
    if row.reward_source == "task_metric":
        version = REWARD_VERSION + "+task"
    if evidence.infra_error:
        return RolloutReward(None, version, row.focus)
    track, inst = row_task(row)
    if row.reward_source == "task_metric":
        return RolloutReward(track.score_task(inst, evidence.files, evidence.submitted), version, row.focus)
    stages = STAGES if row.focus == E2E else (Stage.parse(row.focus),)
    task = track.score_task(inst, evidence.files, evidence.submitted) if row.focus == E2E else None
    rubric = build_rubric(track, inst)
    if judge is not None:
        rubric = judge.apply(rubric, inst.layout)
    return RolloutReward(score(rubric, evidence, task, stages).reward, version, row.focus)
