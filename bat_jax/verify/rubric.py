"""Rubric verifier: binary items checked against receipts and artefacts, evidence completeness, reward.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import statistics
from collections.abc import Callable, Iterable, Mapping

from bat_jax.benchmark.scoring import NOT_APPLICABLE, Cell, agentic_score
from bat_jax.benchmark.stages import E2E, StageSet
from bat_jax.sandbox.readers import DEFAULT_LIMITS, DecodeLimits, Workspace, json_or_none, text_or_none
from bat_jax.sandbox.types import Receipt

#: Version of the reward contract; bump when items, evidence or the formula change
#: (docs/reward_integrity.md, "Reward versions").
REWARD_VERSION = "bat_rubric/v6"


class ScorerError(RuntimeError):
    """A metric or reward that is not a finite number in its range: an error in the scorer.

    It is never "unscored", never the agent's doing: what an agent writes is read by total readers and scored 0 when
    invalid."""


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What the verifier sees of one episode, collected host-side after it ends.

    Attributes:
      receipts: every tool call's receipt, in order.
      files: workspace-relative path → bytes of the final workspace.
      submitted: the submitted path, or None.
      infra_error: non-empty when infrastructure failed (engine down, image missing, a host-side error before
        the agent's first action): the episode is then unscored.
      agent_error: non-empty when the sandbox died, hung or stopped answering after the agent's code ran: the
        episode is still scored, from the receipts and files gathered until then (the agent's own failure).
      skipped: workspace files left out of `files` for an evidence cap (`sandbox.evidence.EvidenceLimits`);
        items that needed them fail.
      start_files: the workspace the episode started from (path → bytes): what existed before its first call
        ({} when unknown). Output that was already there is not evidence of a call of this episode.
      limits: caps on decoding the agent's files (`sandbox.readers.DecodeLimits`); `files` and `start_files`
        become `readers.Workspace`s that carry them to every reader.
    """

    receipts: tuple[Receipt, ...]
    files: Mapping[str, bytes]
    submitted: str | None = None
    infra_error: str = ""
    agent_error: str = ""
    skipped: tuple[str, ...] = ()
    start_files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    limits: DecodeLimits = DEFAULT_LIMITS

    def __post_init__(self):
        object.__setattr__(self, "files", Workspace(self.files, self.limits))
        object.__setattr__(self, "start_files", Workspace(self.start_files, self.limits))

    def text(self, path: str) -> str | None:
        """UTF-8 text of a workspace file, or None when absent or over `limits.max_text_bytes`."""
        return text_or_none(self.files.get(path), self.limits)

    def json(self, path: str):
        """Parsed JSON of a workspace file (`readers.load_json` within `limits`).

        None when absent or invalid."""
        return json_or_none(self.files.get(path), path, self.limits)

    def ok_receipts(self, tool: str = "execute_code") -> list[Receipt]:
        """Receipts of `tool` that exited 0 and did not time out."""
        return [r for r in self.receipts if r.tool == tool and r.exit_code == 0 and not r.timed_out]

    def ran(self, reads: Iterable[str] = (), read_under: Iterable[str] = (),
            writes_under: str | None = None) -> list[Receipt]:
        """Successful `execute_code` receipts whose kernel-observed file trace shows the given reads and writes.

        The call must read every path of `reads`, read at least one file under each directory of `read_under`, and (when
        given) write at least one file under `writes_under`. The code text plays no part."""
        reads, read_under = tuple(reads), tuple(d.rstrip("/") + "/" for d in read_under)
        out = []
        for r in self.ok_receipts():
            got = set(r.reads)
            if not all(p in got for p in reads):
                continue
            if not all(any(p.startswith(d) for p in got) for d in read_under):
                continue
            if writes_under is not None and not any(p.startswith(writes_under.rstrip("/") + "/") for p in r.writes):
                continue
            out.append(r)
        return out

    def wrote(self, path: str, reads: Iterable[str] = ()) -> list[Receipt]:
        """Successful `execute_code` calls that read every path of `reads` and left `path` with its final bytes.

        A call counts when its write digest of `path` (`Receipt.written_digest`) is the SHA-256 of the file the final
        workspace holds: a file that was already there, or changed by a later call, is not its work. [] when `path` is
        absent."""
        data = self.files.get(path)
        if data is None:
            return []
        digest = hashlib.sha256(data).hexdigest()
        return [r for r in self.ran(reads) if r.written_digest(path) == digest]


Check = Callable[[Evidence], bool]


class InfraError(RuntimeError):
    """Raised by a check when infrastructure failed (e.g. the LLM judge is unreachable).

    The stage becomes unscored (None), never 0."""


@dataclasses.dataclass(frozen=True)
class EvidenceRequirement:
    """One piece of required evidence g ∈ G (a receipt or an artefact), with its host-side check.

    `path`: the workspace file this evidence is, when it is one file ('' otherwise): what an LLM judge deciding an item
    that rests on it is shown (`verify.judge.RubricJudge.apply`)."""

    key: str
    description: str
    check: Check
    path: str = ""


@dataclasses.dataclass(frozen=True)
class RubricItem:
    """One binary rubric item ℓ of a stage (a stage id of the benchmark), with the evidence keys it rests on."""

    item_id: str
    stage: str
    description: str
    evidence: tuple[str, ...]
    check: Check


@dataclasses.dataclass(frozen=True)
class Rubric:
    """The reward contract (c, G) of one task: items per stage and evidence requirements by key.

    Attributes:
      items: the binary items, each tagged with a stage of `stages`.
      requirements: evidence key → requirement.
      stages: the benchmark's stages (their ids, order and Agentic weights).
    Raises:
      ValueError: an item naming unknown evidence, or a stage the benchmark does not have (names both).
    """

    items: tuple[RubricItem, ...]
    requirements: Mapping[str, EvidenceRequirement]
    stages: StageSet

    def __post_init__(self):
        for item in self.items:
            if item.stage not in self.stages:
                raise ValueError(f"rubric item {item.item_id!r} is tagged with stage {item.stage!r}, which benchmark "
                                 f"{self.stages.benchmark!r} does not have (stages {list(self.stages.ids)})")
            for key in item.evidence:
                if key not in self.requirements:
                    raise ValueError(f"rubric item {item.item_id!r} names unknown evidence {key!r}")

    def for_stage(self, stage: str) -> tuple[RubricItem, ...]:
        stage = self.stages.parse(stage)
        return tuple(i for i in self.items if i.stage == stage)

    def focus_stages(self, focus: str) -> tuple[str, ...]:
        """The stages an episode of row focus `focus` is scored on: every stage for 'E2E', else that one."""
        return self.stages.ids if focus == E2E else (self.stages.parse(focus),)

    def public(self) -> dict:
        """The contract without checks: what a Stage Bank row stores and may show the policy.

        Items c (id, stage, description, evidence keys) and evidence requirements G (key → description)."""
        return {"version": REWARD_VERSION,
                "items": [{"item_id": i.item_id, "stage": i.stage, "description": i.description,
                           "evidence": list(i.evidence)} for i in self.items],
                "evidence": {k: r.description for k, r in self.requirements.items()}}


@dataclasses.dataclass(frozen=True)
class StageVerdict:
    """Verifier output for one stage: item decisions v_ℓ, evidence confirmations, η and r (Eq. 4)."""

    stage: str
    items: Mapping[str, bool]
    evidence: Mapping[str, bool]
    eta: float
    reward: float
    version: str = REWARD_VERSION


def _safe(check: Check, evidence: Evidence) -> bool:
    """A predicate that raises on malformed agent artefacts counts as not satisfied; InfraError propagates."""
    try:
        return bool(check(evidence))
    except InfraError:
        raise
    except Exception:  # noqa: BLE001 — agent artefacts may be arbitrary; a crash is a failed check
        return False


def verify_stage(rubric: Rubric, stage: str, evidence: Evidence) -> StageVerdict | None:
    """Scores one stage: r = η · mean(v_ℓ).

    Returns None (unscored) on an infrastructure failure (the evidence's `infra_error`, or a check raising InfraError).

    Raises:
      ValueError: an unknown stage, or the rubric has no item for the stage.
    """
    stage = rubric.stages.parse(stage)
    if evidence.infra_error:
        return None
    items = rubric.for_stage(stage)
    if not items:
        raise ValueError(f"rubric has no items for stage {rubric.stages.label(stage)}")
    keys = sorted({k for i in items for k in i.evidence})
    try:
        confirmed = {k: _safe(rubric.requirements[k].check, evidence) for k in keys}
        decisions = {i.item_id: all(confirmed[k] for k in i.evidence) and _safe(i.check, evidence)
                     for i in items}
    except InfraError:
        return None
    eta = sum(confirmed.values()) / len(keys) if keys else 1.0
    reward = eta * statistics.fmean(float(v) for v in decisions.values())
    return StageVerdict(stage, decisions, confirmed, eta, reward)


def verify_episode(rubric: Rubric, evidence: Evidence, stages: Iterable[str] | None = None
                   ) -> dict[str, StageVerdict | None]:
    """Stage verdicts for the given stage ids (default: every stage of the rubric's benchmark), in that order."""
    return {rubric.stages.parse(s): verify_stage(rubric, s, evidence)
            for s in (rubric.stages.ids if stages is None else stages)}


def e2e_reward(stage_rewards: Mapping[str, object], task: float | None, stages: StageSet,
               stage_weight: float = 0.5) -> float | None:
    """E2E row reward, as the released code computes it.

    The released code is `rl/grpo/core_reward.py`, mode `bat_e2e_rubric`: stage_weight · Σ_s w_s · r_s + (1 −
    stage_weight) · task, with w the benchmark's Agentic weights renormalised over the stages given
    (`benchmark.scoring.agentic_score`: a stage absent from `stage_rewards` or marked `NOT_APPLICABLE` drops its
    weight). With every stage given this is exactly the released formula; e.g. on the imaging suite every S1 item
    passes, the rest fail, task 0: 0.5 · 0.25 · 1 = 0.125.

    Args:
      stage_rewards: stage id → reward in [0, 1], None (unscored) or `NOT_APPLICABLE`.
      task: the task metric in [0, 1], or None (unscored).
      stages: the benchmark's stages and weights.
      stage_weight: weight of the stage part (released code: 0.5, `stage_mean_weight`).
    Returns:
      The reward in [0, 1], or None when the task metric or any given stage is unscored, or no stage is given.
    Raises:
      ScorerError: the task metric outside [0, 1] (NaN included).
      ValueError: a stage reward outside [0, 1], or an unknown stage.
    """
    given = {stages.parse(k): v for k, v in stage_rewards.items()}
    if task is None or not given or any(v is None for v in given.values()):
        return None
    scores = {s: given.get(s, NOT_APPLICABLE) for s in stages.ids}
    if all(v is NOT_APPLICABLE for v in scores.values()):
        return None
    task = float(task)
    if not 0.0 <= task <= 1.0:  # NaN fails too
        raise ScorerError(f"e2e_reward: task metric must be in [0, 1], got {task!r}")
    reward = stage_weight * agentic_score(scores, stages) + (1.0 - stage_weight) * task
    if not math.isfinite(reward):
        raise ScorerError(f"e2e_reward: {reward} from stage rewards {given} and task metric {task}")
    return reward


@dataclasses.dataclass(frozen=True)
class EpisodeScore:
    """A scored episode: stage verdicts (stage id → verdict), task metric, the reward and the reward version."""

    verdicts: Mapping[str, StageVerdict | None]
    task: float | None
    reward: float | None
    version: str = REWARD_VERSION

    def stage_rewards(self) -> dict[str, float | None]:
        return {s: (v.reward if v is not None else None) for s, v in self.verdicts.items()}

    def to_cell(self, track: str, repeat: int, stages: StageSet) -> Cell:
        """The evaluator's Cell: per-stage rubric scores, the task metric and the item decisions.

        The task metric None stays unscored; item decisions are those of every verified stage (`item_decisions`).

        Raises:
          ValueError: a stage of `stages` was not verified (a stage-focus score is no cell).
        """
        scores = self.stage_rewards()
        missing = [s for s in stages.ids if s not in scores]
        if missing:
            raise ValueError(f"to_cell needs every stage of benchmark {stages.benchmark!r} scored or unscored; "
                             f"missing {missing}")
        return Cell(track=track, repeat=repeat, stage_scores=scores, task=self.task, items=self.item_decisions())

    def item_decisions(self) -> dict[str, dict[str, bool]]:
        """Stage id → item id → passed, for every verified stage (an unscored stage is left out)."""
        return {s: dict(v.items) for s, v in self.verdicts.items() if v is not None}


def score(rubric: Rubric, evidence: Evidence, task: float | None, focus: str = E2E) -> EpisodeScore:
    """Verifies the stages of row focus `focus` and combines them with the task metric.

    For a stage focus the reward is that stage's r; for 'E2E' every stage is verified and the reward is the E2E
    reward (`e2e_reward`). `task` must already be None when the task metric is unscored; an infrastructure failure
    forces None.
    """
    verdicts = verify_episode(rubric, evidence, rubric.focus_stages(focus))
    if evidence.infra_error:
        return EpisodeScore(verdicts, None, None)
    rewards = {s: (v.reward if v is not None else None) for s, v in verdicts.items()}
    if focus != E2E:
        reward = next(iter(rewards.values()))
    else:
        reward = e2e_reward(rewards, task, rubric.stages)
    return EpisodeScore(verdicts, task, reward)
