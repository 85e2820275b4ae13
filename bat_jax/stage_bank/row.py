"""Stage Bank rows: the RL row z = (p, s, c, G, κ, m) and the SFT slice (h, a), with validation and digests.

Source: paper Eq. 2 / Eq. 7 (row tuple), Eq. 9 (SFT slices), Appendix A.1. Rows are model-neutral: actions are
stored as structured records (`Action`), never as one model's chat-template text. Rows do not depend on Docker:
the sandbox state p is a `StateRef` (content digest of a `SandboxState` + path of its stored archive).

Every row has a SHA-256 `digest` over its canonical JSON (sorted keys, no whitespace, UTF-8) and a stable
`state_id` (RL rows) that links the K rollouts drawn from the same row. A serialised row carries its digest;
`*_from_dict` recomputes it and rejects a mismatch.

Producers (task families, the factory) build rows like this::

    row = RLRow(
        state=StateRef.from_state(sandbox_state, path="states/<digest>.tar"),
        focus="S3",                      # 'S1'..'S5' or 'E2E' (bat_jax.benchmark.stages.FOCI)
        prompt="Validate the model ...",  # brief + stage goal the agent sees first
        rubric=(RubricItem("s3.metric", "Reports Dice on the validation split"),),
        evidence=(EvidenceRequirement("s3.receipt", "receipt", {"pattern": "dice"}),),
        skill="<stage skill text>",
        provenance=Provenance(source_id="seg-fict-0007", source_digest=..., track="segmentation",
                              outcome="success", transformations=(Transformation("stage_slice", digest),)),
        reward_source="rubric",
    )
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from bat_jax.benchmark.stages import E2E, FOCI, Stage
from bat_jax.sandbox.types import SandboxState

#: Outcome labels of the teacher trajectory a row came from (released code: 3 outcome buckets).
OUTCOMES: tuple[str, ...] = ("success", "recovery", "failure")
#: Reward sources known today; others are accepted if they are lowercase identifiers.
REWARD_SOURCES: tuple[str, ...] = ("rubric", "task_metric")
#: Roles of SFT context messages.
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
#: Tools an action may call (the sandbox contract), or '' for a text-only action.
ACTION_TOOLS: tuple[str, ...] = ("", "execute_code", "submit")

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_IDENT = re.compile(r"^[a-z][a-z0-9_]*$")


class RowValidationError(ValueError):
    """A row failed validation. The message names the file, row and field.

    Attributes:
      file: file name or '' when the row did not come from a file.
      row: 0-based row (line) index or None.
      field: dotted field path, e.g. 'provenance.outcome' or 'context[2].role'.
    """

    def __init__(self, reason: str, *, file: str = "", row: int | None = None, field: str = ""):
        self.file, self.row, self.field, self.reason = file, row, field, reason
        where = []
        if file:
            where.append(str(file))
        if row is not None:
            where.append(f"row {row}")
        if field:
            where.append(f"field {field!r}")
        super().__init__(f"{': '.join(where)}: {reason}" if where else reason)


def canonical_json(value: Any) -> str:
    """Canonical JSON text (sorted keys, compact separators, non-ASCII kept) used for all digests."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def content_digest(value: Any) -> str:
    """SHA-256 hex digest of `canonical_json(value)`."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


def _fail(reason: str, field: str) -> None:
    raise RowValidationError(reason, field=field)


def _check_text(value: Any, field: str, *, allow_empty: bool = False) -> None:
    if not isinstance(value, str):
        _fail(f"must be a string, got {type(value).__name__}", field)
    if not allow_empty and not value.strip():
        _fail("must be a non-empty string", field)


def _check_hex(value: Any, field: str) -> None:
    if not isinstance(value, str) or not _HEX64.match(value):
        _fail(f"must be a 64-character lowercase SHA-256 hex digest, got {value!r}", field)


def _check_ident(value: Any, field: str) -> None:
    if not isinstance(value, str) or not _IDENT.match(value):
        _fail(f"must be a lowercase identifier like 'segmentation', got {value!r}", field)


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
        _check_hex(self.digest, f"{field}.digest")
        _check_text(self.path, f"{field}.path")


@dataclasses.dataclass(frozen=True)
class RubricItem:
    """One binary rubric item c_ℓ (paper Eq. 4). `item_id` is unique within a row."""

    item_id: str
    text: str


@dataclasses.dataclass(frozen=True)
class EvidenceRequirement:
    """One evidence requirement g ∈ G (paper Eq. 2), used for evidence completeness η.

    Attributes:
      item_id: unique within the row.
      kind: what must exist, e.g. 'receipt' (an execution receipt), 'artifact' (a file), 'submission'.
      params: JSON-serialisable predicate parameters (e.g. {'path': 'out/mask.nii.gz'}).
    """

    item_id: str
    kind: str
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Transformation:
    """One provenance step: `name` (e.g. 'teacher_trajectory', 'stage_slice', 'e2e_reduce') and the SHA-256
    digest of its output (or of its parameters), plus JSON-serialisable `params` (e.g. the E2E λ grid)."""

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
      outcome: teacher-trajectory outcome label, one of OUTCOMES.
      transformations: ordered steps from source to row, each with its digest.
    """

    source_id: str
    source_digest: str
    track: str
    outcome: str
    transformations: tuple[Transformation, ...] = ()


@dataclasses.dataclass(frozen=True)
class Action:
    """A model-neutral assistant action: free text plus at most one tool call.

    Attributes:
      text: the visible response text (may be '' when the action is only a tool call).
      tool: '' (no tool call), 'execute_code' or 'submit'.
      arguments: tool arguments, e.g. {'language': 'python', 'code': '...'} or {'path': 'out.csv'}.
    """

    text: str = ""
    tool: str = ""
    arguments: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Message:
    """One context message of an SFT slice: `role` in ROLES; assistant messages carry an `action`,
    other roles carry `content` (tool messages: the observation text the agent saw)."""

    role: str
    content: str = ""
    action: Action | None = None


def _validate_action(action: Any, field: str) -> None:
    if not isinstance(action, Action):
        _fail(f"must be an Action, got {type(action).__name__}", field)
    _check_text(action.text, f"{field}.text", allow_empty=True)
    if action.tool not in ACTION_TOOLS:
        _fail(f"must be one of {ACTION_TOOLS}, got {action.tool!r}", f"{field}.tool")
    if not isinstance(action.arguments, Mapping):
        _fail("must be a mapping", f"{field}.arguments")
    if action.tool == "" and action.arguments:
        _fail("a text-only action has no arguments", f"{field}.arguments")
    if action.tool == "execute_code":
        for key in ("language", "code"):
            if not isinstance(action.arguments.get(key), str):
                _fail(f"execute_code needs a string {key!r}", f"{field}.arguments.{key}")
    if action.tool == "submit" and not isinstance(action.arguments.get("path"), str):
        _fail("submit needs a string 'path'", f"{field}.arguments.path")
    if action.tool == "" and not action.text.strip():
        _fail("an action needs text or a tool call", field)


def _validate_provenance(m: Any, field: str = "provenance") -> None:
    if not isinstance(m, Provenance):
        _fail(f"must be a Provenance, got {type(m).__name__}", field)
    _check_text(m.source_id, f"{field}.source_id")
    _check_hex(m.source_digest, f"{field}.source_digest")
    _check_ident(m.track, f"{field}.track")
    if m.outcome not in OUTCOMES:
        _fail(f"must be one of {OUTCOMES}, got {m.outcome!r}", f"{field}.outcome")
    for i, t in enumerate(m.transformations):
        f = f"{field}.transformations[{i}]"
        if not isinstance(t, Transformation):
            _fail(f"must be a Transformation, got {type(t).__name__}", f)
        _check_text(t.name, f"{f}.name")
        _check_hex(t.digest, f"{f}.digest")


def _check_focus(focus: Any, field: str = "focus") -> None:
    if focus not in FOCI:
        _fail(f"must be one of {FOCI}, got {focus!r}", field)


@dataclasses.dataclass(frozen=True)
class RLRow:
    """An RL Stage Bank row z = (p, s, c, G, κ, m) (paper Eq. 2), plus the prompt and reward source.

    Attributes:
      state: p, the stored sandbox state the rollouts start from.
      focus: s, 'S1'..'S5' or 'E2E'.
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
    rubric: tuple[RubricItem, ...]
    evidence: tuple[EvidenceRequirement, ...]
    skill: str
    provenance: Provenance
    reward_source: str = "rubric"

    def __post_init__(self):
        if isinstance(self.focus, Stage):
            object.__setattr__(self, "focus", self.focus.value)
        object.__setattr__(self, "rubric", tuple(self.rubric))
        object.__setattr__(self, "evidence", tuple(self.evidence))
        self.validate()

    def validate(self) -> None:
        """Raises RowValidationError naming the first bad field."""
        if not isinstance(self.state, StateRef):
            _fail(f"must be a StateRef, got {type(self.state).__name__}", "state")
        self.state.validate()
        _check_focus(self.focus)
        _check_text(self.prompt, "prompt")
        if not self.rubric:
            _fail("needs at least one rubric item", "rubric")
        for name, items in (("rubric", self.rubric), ("evidence", self.evidence)):
            seen = set()
            for i, item in enumerate(items):
                kind = RubricItem if name == "rubric" else EvidenceRequirement
                if not isinstance(item, kind):
                    _fail(f"must be a {kind.__name__}, got {type(item).__name__}", f"{name}[{i}]")
                _check_text(item.item_id, f"{name}[{i}].item_id")
                if item.item_id in seen:
                    _fail(f"duplicate item_id {item.item_id!r}", f"{name}[{i}].item_id")
                seen.add(item.item_id)
                if name == "rubric":
                    _check_text(item.text, f"{name}[{i}].text")
                else:
                    _check_text(item.kind, f"{name}[{i}].kind")
        _check_text(self.skill, "skill")
        _validate_provenance(self.provenance)
        _check_ident(self.reward_source, "reward_source")

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
      focus: stage of the target turn ('S1'..'S5') or 'E2E' for surrogate trajectories.
      provenance: m, as for RL rows.
    """

    context: tuple[Message, ...]
    target: Action
    focus: str
    provenance: Provenance

    def __post_init__(self):
        if isinstance(self.focus, Stage):
            object.__setattr__(self, "focus", self.focus.value)
        object.__setattr__(self, "context", tuple(self.context))
        self.validate()

    def validate(self) -> None:
        """Raises RowValidationError naming the first bad field."""
        if not self.context:
            _fail("needs at least one message", "context")
        for i, msg in enumerate(self.context):
            f = f"context[{i}]"
            if not isinstance(msg, Message):
                _fail(f"must be a Message, got {type(msg).__name__}", f)
            if msg.role not in ROLES:
                _fail(f"must be one of {ROLES}, got {msg.role!r}", f"{f}.role")
            if msg.role == "assistant":
                _validate_action(msg.action, f"{f}.action")
            else:
                if msg.action is not None:
                    _fail(f"only assistant messages carry an action (role {msg.role!r})", f"{f}.action")
                _check_text(msg.content, f"{f}.content", allow_empty=msg.role == "tool")
        if self.context[-1].role == "assistant":
            _fail("the last context message must not be an assistant message (the target follows it)",
                  f"context[{len(self.context) - 1}].role")
        _validate_action(self.target, "target")
        _check_focus(self.focus)
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
    if dataclasses.is_dataclass(obj):
        return {f.name: _asdict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): _asdict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_asdict(v) for v in obj]
    return obj


# ----------------------------------------------------------------------------------------------- parsing


def _get(d: Mapping, key: str, field: str, kind: type | tuple = str) -> Any:
    if not isinstance(d, Mapping):
        _fail(f"must be an object, got {type(d).__name__}", field.rsplit(".", 1)[0] if "." in field else field)
    if key not in d:
        _fail("is missing", field)
    value = d[key]
    if not isinstance(value, kind):
        _fail(f"must be {getattr(kind, '__name__', kind)}, got {type(value).__name__}", field)
    return value


def _items(d: Mapping, key: str, field: str) -> Sequence:
    return _get(d, key, field, list)


def _parse_provenance(d: Any, field: str = "provenance") -> Provenance:
    if not isinstance(d, Mapping):
        _fail("must be an object", field)
    trans = []
    for i, t in enumerate(_items(d, "transformations", f"{field}.transformations")):
        f = f"{field}.transformations[{i}]"
        trans.append(Transformation(_get(t, "name", f"{f}.name"), _get(t, "digest", f"{f}.digest"),
                                    _get(t, "params", f"{f}.params", dict)))
    return Provenance(
        source_id=_get(d, "source_id", f"{field}.source_id"),
        source_digest=_get(d, "source_digest", f"{field}.source_digest"),
        track=_get(d, "track", f"{field}.track"),
        outcome=_get(d, "outcome", f"{field}.outcome"),
        transformations=tuple(trans),
    )


def _parse_action(d: Any, field: str) -> Action:
    if not isinstance(d, Mapping):
        _fail("must be an object", field)
    return Action(_get(d, "text", f"{field}.text"), _get(d, "tool", f"{field}.tool"),
                  _get(d, "arguments", f"{field}.arguments", dict))


def _check_digest(d: Mapping, row: RLRow | SFTRow) -> None:
    if "digest" in d and d["digest"] != row.digest:
        _fail(f"stored digest {d['digest']!r} does not match the content digest {row.digest!r}", "digest")
    if isinstance(row, RLRow) and "state_id" in d and d["state_id"] != row.state_id:
        _fail(f"stored state_id {d['state_id']!r} does not match the derived {row.state_id!r}", "state_id")


def _located(fn):
    def wrapper(d: Any, *, file: str = "", row: int | None = None):
        try:
            return fn(d)
        except RowValidationError as e:
            raise RowValidationError(e.reason, file=str(file), row=row, field=e.field) from None

    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    return wrapper


@_located
def rl_row_from_dict(d: Any) -> RLRow:
    """Parses a stored RL row (from `RLRow.to_record()` / JSON). Keyword args `file`, `row` locate errors.

    Raises:
      RowValidationError: naming file, row and field (including a digest or state_id mismatch).
    """
    if not isinstance(d, Mapping):
        _fail(f"a row must be a JSON object, got {type(d).__name__}", "")
    if d.get("kind", "rl") != "rl":
        _fail(f"expected an RL row, got kind {d.get('kind')!r}", "kind")
    st = _get(d, "state", "state", dict)
    rubric = [RubricItem(_get(c, "item_id", f"rubric[{i}].item_id"), _get(c, "text", f"rubric[{i}].text"))
              for i, c in enumerate(_items(d, "rubric", "rubric"))]
    evidence = [EvidenceRequirement(_get(g, "item_id", f"evidence[{i}].item_id"),
                                    _get(g, "kind", f"evidence[{i}].kind"),
                                    _get(g, "params", f"evidence[{i}].params", dict))
                for i, g in enumerate(_items(d, "evidence", "evidence"))]
    row = RLRow(
        state=StateRef(_get(st, "digest", "state.digest"), _get(st, "path", "state.path")),
        focus=_get(d, "focus", "focus"),
        prompt=_get(d, "prompt", "prompt"),
        rubric=tuple(rubric),
        evidence=tuple(evidence),
        skill=_get(d, "skill", "skill"),
        provenance=_parse_provenance(_get(d, "provenance", "provenance", dict)),
        reward_source=_get(d, "reward_source", "reward_source"),
    )
    _check_digest(d, row)
    return row


@_located
def sft_row_from_dict(d: Any) -> SFTRow:
    """Parses a stored SFT row (from `SFTRow.to_record()` / JSON). Keyword args `file`, `row` locate errors.

    Raises:
      RowValidationError: naming file, row and field.
    """
    if not isinstance(d, Mapping):
        _fail(f"a row must be a JSON object, got {type(d).__name__}", "")
    if d.get("kind", "sft") != "sft":
        _fail(f"expected an SFT row, got kind {d.get('kind')!r}", "kind")
    context = []
    for i, m in enumerate(_items(d, "context", "context")):
        f = f"context[{i}]"
        role = _get(m, "role", f"{f}.role")
        action = m.get("action")
        context.append(Message(role, m.get("content", ""),
                               _parse_action(action, f"{f}.action") if action is not None else None))
    row = SFTRow(
        context=tuple(context),
        target=_parse_action(_get(d, "target", "target", dict), "target"),
        focus=_get(d, "focus", "focus"),
        provenance=_parse_provenance(_get(d, "provenance", "provenance", dict)),
    )
    _check_digest(d, row)
    return row
