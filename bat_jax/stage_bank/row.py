"""Stage Bank rows: the RL row z = (p, s, c, G, κ, m) and the SFT slice (h, a), their validation and digests.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from bat_jax.benchmark.stages import E2E
from bat_jax.sandbox.tools import STOP, Action
from bat_jax.sandbox.types import SandboxState
from bat_jax.stage_bank.row_validation import check_focus, check_hex, check_ident, check_text, fail

#: Reward sources known today; others are accepted if they are lowercase identifiers.
REWARD_SOURCES: tuple[str, ...] = ("rubric", "task_metric")
#: Roles of SFT context messages.
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
#: Tools an action may call (the sandbox contract), or '' for a text-only action.
ACTION_TOOLS: tuple[str, ...] = ("", "execute_code", "submit")


def canonical_json(value: Any) -> str:
    """Canonical JSON text (sorted keys, compact separators, non-ASCII kept) used for all digests."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def content_digest(value: Any) -> str:
    """SHA-256 hex digest of `canonical_json(value)`."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


@dataclasses.dataclass(frozen=True)
class StateRef:
    """Reference to a stored sandbox state p.

    Attributes:
      digest: `SandboxState.digest()` of the state (64 hex chars).
      path: where its archive is stored, relative to the bank root (e.g. 'states/<digest>.tar').
    """

    digest: str
    path: str

    @classmethod
    def from_state(cls, state: SandboxState, path: str) -> "StateRef":
        return cls(digest=state.digest(), path=path)

    def validate(self, field: str = "state") -> None:
        check_hex(self.digest, f"{field}.digest")
        check_text(self.path, f"{field}.path")


@dataclasses.dataclass(frozen=True)
class RubricSpec:
    """One binary rubric item c_ℓ (paper Eq. 4) as a row stores it: its id and public text, no check.

    The executable item is `verify.rubric.RubricItem`, rebuilt from the row's task. `item_id` is unique within a row."""

    item_id: str
    text: str


@dataclasses.dataclass(frozen=True)
class EvidenceSpec:
    """One evidence requirement g ∈ G (paper Eq. 2) as a row stores it.

    It is used for evidence completeness η; the executable requirement is `verify.rubric.EvidenceRequirement`.

    Attributes:
      item_id: unique within the row.
      kind: what must exist, e.g. 'receipt' (an execution receipt), 'artifact' (a file), 'submission'.
      params: JSON-serialisable predicate parameters (e.g. {'path': 'out/result.json'}).
    """

    item_id: str
    kind: str
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Transformation:
    """One provenance step: its `name`, the digest of its output and its `params`.

    `name` (e.g. 'teacher_trajectory', 'stage_slice', 'e2e_reduce') and the SHA-256 digest of its output (or of its
    parameters), plus JSON-serialisable `params` (e.g. the E2E λ grid)."""

    name: str
    digest: str
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Row provenance m (paper Eq. 2).

    Attributes:
      source_id: identity of the fictional source task ξ (stable across versions).
      source_digest: SHA-256 of the source task content.
      track: task family, e.g. 'segmentation' (lowercase identifier).
      outcome: teacher-trajectory outcome label: a variant of the row's benchmark (`StagedBenchmark.variants`,
        e.g. the imaging suite's 'success' / 'recovery' / 'failure'), a lowercase identifier.
      transformations: ordered steps from source to row, each with its digest.
    """

    source_id: str
    source_digest: str
    track: str
    outcome: str
    transformations: tuple[Transformation, ...] = ()


@dataclasses.dataclass(frozen=True)
class Message:
    """One context message of an SFT slice.

    `role` in ROLES; assistant messages carry an `action`, other roles carry `content` (tool messages: the observation
    text the agent saw)."""

    role: str
    content: str = ""
    action: Action | None = None


def action_record(action: Action) -> dict[str, Any]:
    """The stored form of a row action: {"text": thought, "tool": tool ('' for `STOP`), "arguments"}."""
    return {"text": action.thought, "tool": "" if action.tool == STOP else action.tool,
            "arguments": dict(action.arguments)}


def _validate_action(action: Any, field: str) -> None:
    # tools.Action checked its tool and arguments on construction
    if not isinstance(action, Action):
        fail(f"must be an Action, got {type(action).__name__}", field)
    check_text(action.thought, f"{field}.text", allow_empty=True)
    if action.stage is not None:
        fail("a row action names no stage (the row's focus does)", f"{field}.stage")
    if action.tool == STOP and not action.thought.strip():
        fail("an action needs text or a tool call", field)


def _validate_provenance(m: Any, field: str = "provenance") -> None:
    if not isinstance(m, Provenance):
        fail(f"must be a Provenance, got {type(m).__name__}", field)
    check_text(m.source_id, f"{field}.source_id")
    check_hex(m.source_digest, f"{field}.source_digest")
    check_ident(m.track, f"{field}.track")
    check_ident(m.outcome, f"{field}.outcome")
    for i, t in enumerate(m.transformations):
        f = f"{field}.transformations[{i}]"
        if not isinstance(t, Transformation):
            fail(f"must be a Transformation, got {type(t).__name__}", f)
        check_text(t.name, f"{f}.name")
        check_hex(t.digest, f"{f}.digest")


@dataclasses.dataclass(frozen=True)
class RLRow:
    """An RL Stage Bank row z = (p, s, c, G, κ, m) (paper Eq. 2), plus the prompt and reward source.

    Attributes:
      state: p, the stored sandbox state the rollouts start from.
      focus: s, a stage id of the bank's benchmark, or 'E2E'.
      prompt: task brief and stage goal shown to the agent at the start.
      rubric: c, ≥ 1 binary rubric items with unique ids (E2E: the union of the stage rubrics, Eq. 14).
      evidence: G, evidence requirements with unique ids (may be empty).
      skill: κ, the stage skill text (E2E: the ordered stage skills joined).
      provenance: m.
      reward_source: how the reward is computed, e.g. 'rubric' or 'task_metric'.
    """

    state: StateRef
    focus: str
    prompt: str
    rubric: tuple[RubricSpec, ...]
    evidence: tuple[EvidenceSpec, ...]
    skill: str
    provenance: Provenance
    reward_source: str = "rubric"

    @property
    def teacher_turns(self) -> int | None:
        """The turns the teacher took in this stage row's own episode (its `teacher_check` step).

        None for an E2E row or a row whose provenance does not record them."""
        if self.focus == E2E:
            return None
        steps = [t for t in self.provenance.transformations if t.name == "teacher_check"]
        turns = dict(steps[-1].params).get("turns") if steps else None
        return int(turns) if isinstance(turns, int) and turns > 0 else None

    def __post_init__(self):
        object.__setattr__(self, "rubric", tuple(self.rubric))
        object.__setattr__(self, "evidence", tuple(self.evidence))
        self.validate()

    def validate(self) -> None:
        """Raises RowValidationError naming the first bad field."""
        if not isinstance(self.state, StateRef):
            fail(f"must be a StateRef, got {type(self.state).__name__}", "state")
        self.state.validate()
        check_focus(self.focus)
        check_text(self.prompt, "prompt")
        if not self.rubric:
            fail("needs at least one rubric item", "rubric")
        for name, items in (("rubric", self.rubric), ("evidence", self.evidence)):
            seen = set()
            for i, item in enumerate(items):
                kind = RubricSpec if name == "rubric" else EvidenceSpec
                if not isinstance(item, kind):
                    fail(f"must be a {kind.__name__}, got {type(item).__name__}", f"{name}[{i}]")
                check_text(item.item_id, f"{name}[{i}].item_id")
                if item.item_id in seen:
                    fail(f"duplicate item_id {item.item_id!r}", f"{name}[{i}].item_id")
                seen.add(item.item_id)
                if name == "rubric":
                    check_text(item.text, f"{name}[{i}].text")
                else:
                    check_text(item.kind, f"{name}[{i}].kind")
        check_text(self.skill, "skill")
        _validate_provenance(self.provenance)
        check_ident(self.reward_source, "reward_source")

    @property
    def track(self) -> str:
        return self.provenance.track

    @property
    def outcome(self) -> str:
        return self.provenance.outcome

    @property
    def is_e2e(self) -> bool:
        return self.focus == E2E

    @property
    def state_id(self) -> str:
        """Stable id 'st-<24 hex>' from source identity, focus and state digest (not from mutable text)."""
        key = canonical_json([self.provenance.source_id, self.focus, self.state.digest, self.provenance.outcome])
        return "st-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict without the digest (see `to_record` for the stored form)."""
        return {"kind": "rl", **_asdict(self)}

    @property
    def digest(self) -> str:
        """SHA-256 of the canonical JSON of `to_dict()`."""
        return content_digest(self.to_dict())

    def to_record(self) -> dict[str, Any]:
        """The stored form: `to_dict()` plus 'state_id' and 'digest'."""
        d = self.to_dict()
        return {**d, "state_id": self.state_id, "digest": content_digest(d)}


@dataclasses.dataclass(frozen=True)
class SFTRow:
    """An SFT slice (h, a) (paper Eq. 9): context messages and exactly one target assistant action.

    Attributes:
      context: ≥ 1 messages (system/user/assistant/tool); the last one is not an assistant message.
      target: the single teacher action trained on (loss only on it, Eq. 10).
      focus: stage id of the target turn, or 'E2E' for surrogate trajectories.
      provenance: m, as for RL rows.
    """

    context: tuple[Message, ...]
    target: Action
    focus: str
    provenance: Provenance

    def __post_init__(self):
        object.__setattr__(self, "context", tuple(self.context))
        self.validate()

    def validate(self) -> None:
        """Raises RowValidationError naming the first bad field."""
        if not self.context:
            fail("needs at least one message", "context")
        for i, msg in enumerate(self.context):
            f = f"context[{i}]"
            if not isinstance(msg, Message):
                fail(f"must be a Message, got {type(msg).__name__}", f)
            if msg.role not in ROLES:
                fail(f"must be one of {ROLES}, got {msg.role!r}", f"{f}.role")
            if msg.role == "assistant":
                _validate_action(msg.action, f"{f}.action")
            else:
                if msg.action is not None:
                    fail(f"only assistant messages carry an action (role {msg.role!r})", f"{f}.action")
                check_text(msg.content, f"{f}.content", allow_empty=msg.role == "tool")
        if self.context[-1].role == "assistant":
            fail("the last context message must not be an assistant message (the target follows it)",
                  f"context[{len(self.context) - 1}].role")
        _validate_action(self.target, "target")
        check_focus(self.focus)
        _validate_provenance(self.provenance)

    @property
    def track(self) -> str:
        return self.provenance.track

    @property
    def outcome(self) -> str:
        return self.provenance.outcome

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "sft", **_asdict(self)}

    @property
    def digest(self) -> str:
        return content_digest(self.to_dict())

    @property
    def row_id(self) -> str:
        """'sft-<24 hex>' from the content digest."""
        return "sft-" + self.digest[:24]

    def to_record(self) -> dict[str, Any]:
        d = self.to_dict()
        return {**d, "digest": content_digest(d)}


def _asdict(obj: Any) -> Any:
    if isinstance(obj, Action):
        return action_record(obj)
    if dataclasses.is_dataclass(obj):
        return {f.name: _asdict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): _asdict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_asdict(v) for v in obj]
    return obj
