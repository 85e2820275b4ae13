"""Teacher trajectory → Stage Bank rows: SFT slices (Eq. 9), stage contracts (c, G) and per-stage checks.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from bat_jax.benchmark.stages import E2E, StageSet
from bat_jax.sandbox import tools
from bat_jax.sandbox.tools import dispatch
from bat_jax.sandbox.types import Sandbox, SandboxState
from bat_jax.stage_bank.row import (EvidenceSpec, Message, Provenance, RubricSpec, SFTRow,
                                    Transformation, content_digest)
from bat_jax.staged_benchmark.episode import Conversation, RecordedEpisode, snapshot_state
from bat_jax.verify.rubric import Rubric, StageVerdict


#: The provenance step of an E2E row of a benchmark without a surrogate: the whole task is the E2E row.
E2E_WHOLE_TASK = "e2e_whole_task"


def row_action(action: tools.Action) -> tools.Action:
    """The row form of an episode action: the same action without its stage (the row's focus names it)."""
    return dataclasses.replace(action, stage=None, arguments=dict(action.arguments))


def transformation(name: str, **params) -> Transformation:
    """A provenance step whose digest is the SHA-256 of its canonical parameters."""
    return Transformation(name, content_digest({"name": name, **params}), params)


def sft_slices(episode: RecordedEpisode, brief: str, skill: str, stages: StageSet, provenance: Provenance,
               trajectory_digest: str) -> list[SFTRow]:
    """One SFT row (h_t, a_t) per recorded teacher response of `episode` (paper Eq. 9).

    Context h_t = the system message and the user message (brief + the stage skills of the episode's focus,
    exactly what the teacher saw, `Conversation.messages`), then every earlier response (assistant message
    with its structured action) and observation (tool message, the rendered observation text). The target is
    a_t. Row focus: the turn's stage for a single-stage or full-task trajectory; 'E2E' when `provenance`
    marks an E2E row's trajectory (its transformations contain 'e2e_reduce' or `E2E_WHOLE_TASK`).

    Args:
      episode: a finished, checked episode (turns carry their stage labels).
      brief: the task brief the teacher saw.
      skill: the stage skill text κ the teacher saw (the benchmark's `row_skill` of the episode's focus).
      stages: the benchmark's stages.
      provenance: base provenance (source, track, outcome, transformations so far).
      trajectory_digest: content digest of the episode, recorded in each row's 'sft_slice' step.

    Returns:
      `len(episode.turns)` rows, in turn order.
    """
    head = Conversation(brief, episode.focus, skill, stages).messages()[:2]
    context: list[Message] = [Message(m["role"], m["content"]) for m in head]
    surrogate = any(t.name in ("e2e_reduce", E2E_WHOLE_TASK) for t in provenance.transformations)
    rows = []
    for turn in episode.turns:
        step = transformation("sft_slice", trajectory=trajectory_digest, turn=turn.index)
        prov = Provenance(provenance.source_id, provenance.source_digest, provenance.track, provenance.outcome,
                          provenance.transformations + (step,))
        target = row_action(turn.action)
        rows.append(SFTRow(context=tuple(context), target=target, focus=E2E if surrogate else turn.stage,
                           provenance=prov))
        context += [Message("assistant", action=target), Message("tool", turn.observation.render())]
    return rows


def stage_contract(rubric: Rubric, stages: Sequence[str]) -> tuple[tuple[RubricSpec, ...],
                                                                   tuple[EvidenceSpec, ...]]:
    """Row rubric c and evidence G for the given stage ids (one stage: c_s, G_s; every stage: Eq. 14's union).

    Evidence kind is the key's prefix ('receipt' or 'file'); params carry the public description.
    """
    items = [i for i in rubric.items if i.stage in stages]
    keys = list(dict.fromkeys(k for i in items for k in i.evidence))
    c = tuple(RubricSpec(i.item_id, f"[{i.stage}] {i.description}") for i in items)
    g = tuple(EvidenceSpec(k, k.split(".", 1)[0], {"description": rubric.requirements[k].description})
              for k in keys)
    return c, g


def failed_checks(verdicts: dict[str, StageVerdict | None], stages: Sequence[str]) -> list[str]:
    """Stage ids whose check fails.

    A check fails when unscored, or any rubric item or evidence requirement not met (Check_s = 1 iff the stage reward r
    = η · mean(v) equals 1)."""
    bad = []
    for s in stages:
        v = verdicts.get(s)
        if v is None or not (all(v.items.values()) and all(v.evidence.values())):
            bad.append(s)
    return bad


class ReplayMismatch(RuntimeError):
    """A replayed call exited differently from the recorded one (the prefix is not reproducible)."""


def boundary_state(make_sandbox: Callable[[SandboxState], Sandbox], initial: SandboxState, episode: RecordedEpisode,
                   stage: str, stages: StageSet) -> SandboxState:
    """p_{i,s} = Φ_ξ((a_t, o_t)_{t < b_s}) (Eq. 11): the workspace at the start of `stage`.

    Replays the recorded calls of every turn before stage `stage` (a stage id of `stages`) in a fresh sandbox started
    from `initial` and returns the workspace reached (env of `initial`).

    Raises:
      ReplayMismatch: a replayed call's exit code differs from the recorded observation's (names the turn).
      Exception: whatever the sandbox factory or a dead sandbox raises (callers count it as a sandbox failure).
    """
    box = make_sandbox(initial)
    try:
        for t in episode.turns:
            if stages.index(t.stage) >= stages.index(stage):
                break
            obs = dispatch(box, t.action)
            if obs.exit_code != t.observation.exit_code:
                raise ReplayMismatch(f"{episode.task_id} turn {t.index}: replay exited {obs.exit_code}, "
                                     f"recorded {t.observation.exit_code}")
        return snapshot_state(box, dict(initial.env))
    finally:
        box.close()
