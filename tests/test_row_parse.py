"""Stored Stage Bank rows read back (bat_jax/stage_bank/row_parse.py): errors name file, row and field; a tampered
row fails its digest; stored actions are checked; an SFT parse refuses an RL record."""

import pytest

from bat_jax.stage_bank.row_parse import rl_row_from_dict, sft_row_from_dict
from bat_jax.stage_bank.row_validation import RowValidationError
from doubles import example_rl_row as rl_row, example_sft_row as sft_row


def test_from_dict_error_names_file_row_and_field():
    rec = rl_row().to_record()
    rec["rubric"][0]["text"] = 5
    with pytest.raises(RowValidationError) as e:
        rl_row_from_dict(rec, file="bank/rl.jsonl", row=17)
    assert (e.value.file, e.value.row, e.value.field) == ("bank/rl.jsonl", 17, "rubric[0].text")
    assert str(e.value).startswith("bank/rl.jsonl: row 17: field 'rubric[0].text'")
    rec = rl_row().to_record()
    del rec["provenance"]["source_digest"]
    with pytest.raises(RowValidationError, match="provenance.source_digest"):
        rl_row_from_dict(rec, file="f", row=0)


def test_tampered_row_is_rejected_by_digest():
    rec = rl_row().to_record()
    rec["prompt"] = "tampered"
    with pytest.raises(RowValidationError) as e:
        rl_row_from_dict(rec, file="f.jsonl", row=2)
    assert e.value.field == "digest"


@pytest.mark.parametrize("target, field", [
    ({"text": "", "tool": "execute_code", "arguments": {"language": "python"}}, "target.arguments"),
    ({"text": "x", "tool": "rm_rf", "arguments": {}}, "target.tool"),
    ({"text": "x", "tool": "", "arguments": {"path": "a"}}, "target.arguments"),
    ({"text": 3, "tool": "", "arguments": {}}, "target.text"),
    ({"text": "", "tool": "", "arguments": {}}, "target"),
])
def test_stored_action_records_are_checked_and_name_the_field(target, field):
    record = sft_row().to_dict()
    record["target"] = target
    with pytest.raises(RowValidationError) as e:
        sft_row_from_dict(record)
    assert e.value.field == field


def test_sft_parse_rejects_rl_kind():
    with pytest.raises(RowValidationError) as e:
        sft_row_from_dict(rl_row().to_record(), file="sft.jsonl", row=0)
    assert e.value.field == "kind"
