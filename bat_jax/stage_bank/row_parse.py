"""Reading stored Stage Bank rows back.

`rl_row_from_dict` / `sft_row_from_dict` parse a row record (the JSON form `RLRow.to_record()` /
`SFTRow.to_record()` write), validate it, and recompute its digest (and, for RL rows, its `state_id`), rejecting a
mismatch. Errors are `RowValidationError`s naming file, row and field."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bat_jax.sandbox.tools import STOP, Action, action_error
from bat_jax.stage_bank.row import (ACTION_TOOLS, EvidenceSpec, Message, Provenance, RLRow, RubricSpec, SFTRow,
                                    StateRef, Transformation)
from bat_jax.stage_bank.row_validation import RowValidationError, fail


def _get(d: Mapping, key: str, field: str, kind: type | tuple = str) -> Any:
    if not isinstance(d, Mapping):
        fail(f"must be an object, got {type(d).__name__}", field.rsplit(".", 1)[0] if "." in field else field)
    if key not in d:
        fail("is missing", field)
    value = d[key]
    if not isinstance(value, kind):
        fail(f"must be {getattr(kind, '__name__', kind)}, got {type(value).__name__}", field)
    return value


def _items(d: Mapping, key: str, field: str) -> Sequence:
    return _get(d, key, field, list)


def _parse_provenance(d: Any, field: str = "provenance") -> Provenance:
    if not isinstance(d, Mapping):
        fail("must be an object", field)
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
        fail("must be an object", field)
    text, tool = _get(d, "text", f"{field}.text"), _get(d, "tool", f"{field}.tool")
    arguments = _get(d, "arguments", f"{field}.arguments", dict)
    if tool not in ACTION_TOOLS:
        fail(f"must be one of {ACTION_TOOLS}, got {tool!r}", f"{field}.tool")
    error = action_error(tool or STOP, arguments)
    if error:
        fail(error, f"{field}.arguments")
    return Action(text, tool or STOP, arguments)


def _check_digest(d: Mapping, row: RLRow | SFTRow) -> None:
    if "digest" in d and d["digest"] != row.digest:
        fail(f"stored digest {d['digest']!r} does not match the content digest {row.digest!r}", "digest")
    if isinstance(row, RLRow) and "state_id" in d and d["state_id"] != row.state_id:
        fail(f"stored state_id {d['state_id']!r} does not match the derived {row.state_id!r}", "state_id")


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
        fail(f"a row must be a JSON object, got {type(d).__name__}", "")
    if d.get("kind", "rl") != "rl":
        fail(f"expected an RL row, got kind {d.get('kind')!r}", "kind")
    st = _get(d, "state", "state", dict)
    rubric = [RubricSpec(_get(c, "item_id", f"rubric[{i}].item_id"), _get(c, "text", f"rubric[{i}].text"))
              for i, c in enumerate(_items(d, "rubric", "rubric"))]
    evidence = [EvidenceSpec(_get(g, "item_id", f"evidence[{i}].item_id"),
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
        fail(f"a row must be a JSON object, got {type(d).__name__}", "")
    if d.get("kind", "sft") != "sft":
        fail(f"expected an SFT row, got kind {d.get('kind')!r}", "kind")
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
