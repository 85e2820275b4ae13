"""Validation of Stage Bank rows.

The error that names file, row and field, and the field checks the row types (`stage_bank.row`) and the row parser
(`stage_bank.row_parse`) share."""

from __future__ import annotations

import re
from typing import Any


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


def fail(reason: str, field: str) -> None:
    """Raises RowValidationError(reason) naming `field` (file and row are added by the parser)."""
    raise RowValidationError(reason, field=field)


def check_text(value: Any, field: str, *, allow_empty: bool = False) -> None:
    """A string; non-blank unless `allow_empty`."""
    if not isinstance(value, str):
        fail(f"must be a string, got {type(value).__name__}", field)
    if not allow_empty and not value.strip():
        fail("must be a non-empty string", field)


def check_hex(value: Any, field: str) -> None:
    """A SHA-256 hex digest (64 lowercase hex characters)."""
    if not isinstance(value, str) or not _HEX64.match(value):
        fail(f"must be a 64-character lowercase SHA-256 hex digest, got {value!r}", field)


def check_ident(value: Any, field: str) -> None:
    """A lowercase identifier (track names, reward sources)."""
    if not isinstance(value, str) or not _IDENT.match(value):
        fail(f"must be a lowercase identifier like 'segmentation', got {value!r}", field)


_FOCUS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_focus(focus: Any, field: str = "focus") -> None:
    """A row focus: 'E2E' or a stage id (letters, digits, '_', '.', '-'; ≤ 64 characters).

    Whether the id is a stage of the run's benchmark is checked when a run opens the bank
    (`benchmark.stages.StageSet.foci`)."""
    if not isinstance(focus, str) or not _FOCUS.match(focus):
        fail(f"must be 'E2E' or a stage id (letters, digits, '_', '.', '-'), got {focus!r}", field)
