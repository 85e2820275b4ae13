"""The field checks Stage Bank rows share (bat_jax/stage_bank/row_validation.py) and the error naming file, row and
field."""

import pytest

from bat_jax.stage_bank.row_validation import (RowValidationError, check_focus, check_hex, check_ident,
                                               check_text)


def test_the_error_names_file_row_and_field():
    e = RowValidationError("must be a string", file="bank/rl.jsonl", row=3, field="provenance.track")
    assert str(e) == "bank/rl.jsonl: row 3: field 'provenance.track': must be a string"
    assert (e.file, e.row, e.field, e.reason) == ("bank/rl.jsonl", 3, "provenance.track", "must be a string")
    assert str(RowValidationError("bad", row=0)) == "row 0: bad" and str(RowValidationError("bad")) == "bad"


@pytest.mark.parametrize("check, value, message", [
    (check_text, 5, "must be a string, got int"),
    (check_text, "  ", "must be a non-empty string"),
    (check_hex, "AB" * 32, "must be a 64-character lowercase SHA-256 hex digest"),
    (check_hex, "ab" * 31, "must be a 64-character lowercase SHA-256 hex digest"),
    (check_ident, "Segmentation", "must be a lowercase identifier like 'segmentation'"),
    (check_ident, "2d", "must be a lowercase identifier"),
    (check_focus, "S 3", "must be 'E2E' or a stage id"),
    (check_focus, "x" * 65, "must be 'E2E' or a stage id"),
])
def test_bad_values_fail_naming_the_field(check, value, message):
    with pytest.raises(RowValidationError, match=message) as e:
        check(value, "the.field")
    assert e.value.field == "the.field"


def test_good_values_pass():
    check_text("", "f", allow_empty=True)
    check_text("x", "f")
    check_hex("ab" * 32, "f")
    check_ident("report_generation", "f")
    for focus in ("E2E", "S3", "Validate", "t-1.b_2", "x" * 64):
        check_focus(focus)
