"""Row schema z = (p, s, c, G, κ, m) and SFT slices: validation, digests, state ids (paper Eq. 2, 9)."""

import hashlib
import json

import pytest

from bat_jax.staged_benchmark.contract import BenchmarkError
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.stages import Stage
from bat_jax.sandbox import tools
from bat_jax.sandbox.tools import STOP, Action
from bat_jax.stage_bank.row import EvidenceSpec, Message, StateRef, canonical_json
from bat_jax.stage_bank.row_parse import rl_row_from_dict, sft_row_from_dict
from bat_jax.stage_bank.row_validation import RowValidationError
from doubles import EXAMPLE_STATE as STATE
from doubles import example_provenance as provenance, example_rl_row as rl_row, example_sft_row as sft_row

#: digest of `sft_row()`, pinned: the stored form of a row never changes under a bank
SFT_ROW_DIGEST = "e8a41190dbf36a242af9cf86a664f96d4076e74359c41625706680488b54e16a"


def test_state_ref_uses_sandbox_state_digest():
    ref = StateRef.from_state(STATE, "states/a.tar")
    assert ref.digest == STATE.digest() and len(ref.digest) == 64


def test_rl_row_digest_is_sha256_of_canonical_json():
    row = rl_row()
    d = row.to_dict()
    text = json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_json(d) == text
    assert row.digest == hashlib.sha256(text.encode()).hexdigest()
    rec = row.to_record()
    assert rec["digest"] == row.digest and rec["state_id"] == row.state_id


def test_state_id_is_stable_and_keyed_by_source_focus_state_outcome():
    row = rl_row()
    key = json.dumps(["seg-fict-0007", "S3", STATE.digest(), "success"], separators=(",", ":"))
    assert row.state_id == "st-" + hashlib.sha256(key.encode()).hexdigest()[:24]
    # Text edits change the digest but not the state id; focus changes both.
    edited = rl_row(prompt="Another wording.")
    assert edited.state_id == row.state_id and edited.digest != row.digest
    assert rl_row(focus="S4").state_id != row.state_id


def test_rl_row_roundtrip_and_stage_id_focus():
    row = rl_row(focus=Stage.VALIDATE)
    assert row.focus == "S3" and row.track == "segmentation" and row.outcome == "success"
    back = rl_row_from_dict(json.loads(json.dumps(row.to_record())))
    assert back == row
    assert rl_row(focus="E2E").is_e2e


@pytest.mark.parametrize("kw, field", [
    (dict(focus="S3 Validate"), "focus"), (dict(focus=""), "focus"), (dict(focus=3), "focus"),
    (dict(rubric=()), "rubric"),
    (dict(provenance=provenance(outcome="Mixed Defects")), "provenance.outcome"),
    (dict(provenance=provenance(track="Seg Track")), "provenance.track"),
    (dict(reward_source=""), "reward_source"),
    (dict(evidence=(EvidenceSpec("a", "receipt"), EvidenceSpec("a", "artifact"))),
     "evidence[1].item_id"),
    (dict(state=StateRef("nothex", "states/x.tar")), "state.digest"),
])
def test_rl_row_validation_names_field(kw, field):
    with pytest.raises(RowValidationError) as e:
        rl_row(**kw)
    assert e.value.field == field and repr(field) in str(e.value)


def test_an_outcome_is_any_variant_of_the_benchmark():
    """Outcome buckets are the benchmark's variants (the tabular suite's 'mixed'), not the imaging suite's three."""
    assert rl_row(provenance=provenance(outcome="mixed")).outcome == "mixed"


def test_a_focus_the_benchmark_lacks_is_refused_naming_the_row():
    """A row's focus is a stage id of its bank's benchmark: 'S9' has the form of one, and the run that opens the bank
    refuses it naming the row, the field and the benchmark's stages."""
    imaging = ImagingBenchmark()
    assert [imaging.check_focus(f, "row") for f in ("E2E", "S3", "Validate")] == ["E2E", "S3", "S3"]
    with pytest.raises(BenchmarkError, match=r"bank rl row 3 field 'focus': focus 'S9' is not a stage of benchmark "
                                             r"'imaging' \(stages \['S1', 'S2', 'S3', 'S4', 'S5'\], or 'E2E'\)"):
        imaging.check_focus(rl_row(focus="S9").focus, "bank rl row 3 field 'focus'")


def test_sft_row_roundtrip_and_digest():
    row = sft_row()
    back = sft_row_from_dict(json.loads(json.dumps(row.to_record())))
    assert back == row and back.digest == row.digest and row.row_id == "sft-" + row.digest[:24]
    assert row.to_dict()["kind"] == "sft" and row.to_dict()["target"]["tool"] == ""


@pytest.mark.parametrize("kw, field", [
    (dict(context=()), "context"),
    (dict(context=(Message("user", "x"), Message("assistant", action=Action("ok", STOP)))), "context[1].role"),
    (dict(target=Action("", STOP)), "target"),
    (dict(target=Action("Plan.", STOP, stage=Stage.PLAN)), "target.stage"),
    (dict(target={"text": "x", "tool": "", "arguments": {}}), "target"),
    (dict(context=(Message("robot", "x"),)), "context[0].role"),
    (dict(context=(Message("user", "x", action=Action("y", STOP)),)), "context[0].action"),
])
def test_sft_row_validation_names_field(kw, field):
    with pytest.raises(RowValidationError) as e:
        sft_row(**kw)
    assert e.value.field == field


def test_rows_hold_the_one_agent_action_and_keep_their_stored_form_and_digest():
    # the stored form (text / tool '' / arguments) and the digest are pinned, so banks already built stay valid
    row = sft_row()
    assert isinstance(row.target, tools.Action) and row.target.tool == STOP
    assert row.to_dict()["target"] == {"text": "Plan: 1) load 2) train", "tool": "", "arguments": {}}
    assert row.to_dict()["context"][2]["action"] == {"text": "", "tool": "execute_code",
                                                     "arguments": {"language": "bash", "code": "ls"}}
    assert row.digest == SFT_ROW_DIGEST


def test_a_stage_rows_teacher_turns_come_from_its_teacher_check_and_reach_its_rollout_request():
    from bat_jax.prompts import rl_request
    from bat_jax.stage_bank.row import Provenance, Transformation

    def with_steps(focus, *steps):
        p = provenance()
        return rl_row(focus=focus, provenance=Provenance(p.source_id, p.source_digest, p.track, p.outcome,
                                                         p.transformations + steps))

    check = Transformation("teacher_check", "ab" * 32, {"trajectory": "cd" * 32, "turns": 2})
    row = with_steps("S3", check)
    assert row.teacher_turns == 2 and rl_request(row, STATE).teacher_turns == 2
    assert with_steps("E2E", check).teacher_turns is None  # an E2E row's episode is the whole task
    assert rl_row().teacher_turns is None  # no teacher_check step recorded
    assert rl_request(rl_row(), STATE).teacher_turns is None
