"""Leakage preflight (held-out firewall)."""

import io
import json
import tarfile

import numpy as np
import pytest

from bat_jax.sandbox.types import SandboxState
from bat_jax.stage_bank.bank import StageBank
from bat_jax.stage_bank.leakage import (HeldOutManifest, LeakageConfig, LeakageError, LeakageHit, LeakageReport,
                                        LeakageScanner, preflight)
from bat_jax.sandbox.tools import STOP, Action
from bat_jax.stage_bank.row import (EvidenceSpec, Message, Provenance, RLRow, RubricSpec, SFTRow)

H = "ab" * 32
ANSWER = ("the right lower lobe shows a small apical pneumothorax without mediastinal shift "
          "and no pleural effusion is seen")  # 20 words
SPAN12 = "small apical pneumothorax without mediastinal shift and no pleural effusion is seen"
assert len(SPAN12.split()) == 12
MANIFEST = HeldOutManifest(
    task_ids=("amb-seg-001",),
    case_ids=("ISIC_0024306", "case-017"),
    paths=("/benchmarks/heldout/cxr/images/00017.png", "heldout/vqa/questions.json"),
    questions=("Which organ shows the largest lesion in this abdominal CT scan?", "Is the nodule benign?"),
    answers=(ANSWER, "pneumothorax"),
    reports=("Heart size is normal. Lungs are clear bilaterally with no focal consolidation or effusion.",),
)
VOCAB = ("the model lung lobe small large shows image case mask organ liver dice score run python file "
         "output validate plan setup submit apical shift pleural without and no is seen effusion").split()


STATE_TEXT = "segment the liver on the fictional case and write the mask to out and no pleural effusion is seen"


def clean_text(rng, n=30):
    return " ".join(rng.choice(VOCAB, size=n))


def make_row(bank, i, rng, **kw):
    state = SandboxState({"task.md": f"fictional task {i % 50}: {STATE_TEXT}".encode(),  # 50 distinct states
                          "scripts/run.sh": f"python infer.py --input data/fictional/case-0170/{i % 50}.png".encode()})
    args = dict(state=bank.put_state(state), focus=("S1", "S2", "S3", "S4", "S5", "E2E")[i % 6],
                prompt=clean_text(rng), rubric=(RubricSpec("a", clean_text(rng, 12)),),
                evidence=(EvidenceSpec("e", "artifact", {"path": f"out/ISIC_0024307_{i}.png"}),),
                skill=clean_text(rng, 20), provenance=Provenance(f"fict-{i}", H, "vqa", "success"))
    args.update(kw)
    return RLRow(**args)


def sft_row(i, rng, target_text=None):
    return SFTRow((Message("user", clean_text(rng)), Message("tool", clean_text(rng, 40))),
                  Action(target_text or clean_text(rng), STOP), "S4", Provenance(f"fict-{i}", H, "report", "recovery"))


def test_marker_matching_rules():
    scan = LeakageScanner(MANIFEST)
    assert scan.scan_text("see ISIC_0024306.jpg for details") == [("case_id", "ISIC_0024306")]
    assert scan.scan_text("isic_0024306") == [("case_id", "ISIC_0024306")]  # case-insensitive
    assert scan.scan_text("ISIC_00243061 and case-0170 and xcase-017x") == []  # whole parts only
    assert scan.scan_text("cp /mnt/benchmarks/heldout/cxr/images/00017.png .") == [
        ("path", "/benchmarks/heldout/cxr/images/00017.png")]
    assert scan.scan_text("open('./heldout/vqa/questions.json')") == [("path", "heldout/vqa/questions.json")]
    assert scan.scan_text("heldout/vqa/answers.json") == []
    assert scan.scan_text("Answer: pneumothorax.") == []  # 1-word answers are too short to match
    assert scan.scan_text("q: is the nodule benign") == [("question", "is the nodule benign")]
    hits = scan.scan_text("Lungs are clear bilaterally with no focal consolidation or effusion here")
    assert hits == [("report", "lungs are clear bilaterally with no focal consolidation"),
                    ("report", "are clear bilaterally with no focal consolidation or"),
                    ("report", "clear bilaterally with no focal consolidation or effusion")]
    one = LeakageScanner(HeldOutManifest(paths=("questions_2024.json",), case_ids=("00017",)))
    assert one.scan_text("open data/questions_2024.json and img_00017.png") == [
        ("case_id", "00017"), ("path", "questions_2024.json")]
    assert one.scan_text("questions_2024.jsonl and 000170") == []
    # 7 consecutive answer words are below the 8-gram threshold; 8 are found.
    assert scan.scan_text("small apical pneumothorax without mediastinal shift and") == []
    assert LeakageScanner(MANIFEST, LeakageConfig(ngram=7)).scan_text(
        "small apical pneumothorax without mediastinal shift and") != []


def test_planted_markers_are_found_and_named(tmp_path):
    rng = np.random.default_rng(0)
    bank = StageBank(tmp_path / "bank")
    nested = make_row(bank, 1, rng, evidence=(EvidenceSpec(
        "e", "artifact", {"check": {"cases": ["fine", "compare with ISIC_0024306.jpg"]}}),))
    leaky_state = SandboxState(
        {"scripts/run.sh": b"python infer.py --input /mnt/benchmarks/heldout/cxr/images/00017.png"})
    in_state = make_row(bank, 2, rng, state=bank.put_state(leaky_state))
    teacher = sft_row(3, rng, target_text=f"Final answer: {SPAN12}.")
    clean = [make_row(bank, i, rng) for i in range(10, 20)]
    rows = [clean[0], nested, in_state, clean[1], teacher]
    report = preflight(MANIFEST, rows=rows, load_state=bank.load_state, source="round-3")
    got = {(h.row, h.field, h.kind, h.marker) for h in report.hits}
    assert (1, "evidence[0].params.check.cases[1]", "case_id", "ISIC_0024306") in got
    assert (2, "state.files[scripts/run.sh]", "path", "/benchmarks/heldout/cxr/images/00017.png") in got
    answer_hits = [h for h in report.hits if h.kind == "answer"]
    assert {h.row for h in answer_hits} == {4} and {h.field for h in answer_hits} == {"target.text"}
    assert len(answer_hits) == 5  # a 12-word span holds 12 - 8 + 1 = 5 held-out 8-grams
    assert {h.row for h in report.hits} == {1, 2, 4} and all(h.file == "round-3" for h in report.hits)
    with pytest.raises(LeakageError, match="round-3 row 1 field 'evidence"):
        report.raise_if_leaky()

    # The same markers are found by scanning the files on disk (bank rows + state archives).
    bank.admit([nested, in_state] + clean, [teacher])
    disk = preflight(MANIFEST, files=[tmp_path / "bank"])
    by_kind = {(h.kind, h.file.rsplit("/", 1)[-1], h.row, h.field) for h in disk.hits}
    assert ("case_id", "rl.jsonl", 0, "evidence[0].params.check.cases[1]") in by_kind
    assert ("path", f"{leaky_state.digest()}.tar", None, "state.files[scripts/run.sh]") in by_kind
    assert ("answer", "sft.jsonl", 0, "target.text") in by_kind


def test_clean_bank_of_1000_rows_has_zero_hits(tmp_path):
    rng = np.random.default_rng(1)
    bank = StageBank(tmp_path / "bank")
    rl = [make_row(bank, i, rng) for i in range(800)]
    sft = [sft_row(i, rng) for i in range(400)]
    bank.admit(rl, sft)
    (tmp_path / "val").mkdir()
    (tmp_path / "val" / "notes.txt").write_text(clean_text(rng, 500))
    report = preflight(MANIFEST, files=[tmp_path / "bank", tmp_path / "val"])
    assert report.clean and report.hits == []
    assert report.rows_scanned == 1200 and report.files_scanned == 50 + 2 + 1 + 1  # states + jsonl + manifest + val
    mem = preflight(MANIFEST, rows=rl + sft, load_state=bank.load_state)
    assert mem.clean and mem.rows_scanned == 1200
    mem.raise_if_leaky()


def test_hit_str_names_file_row_field():
    hit = LeakageHit("bank/rl.jsonl", 7, "prompt", "case_id", "case-017")
    assert str(hit) == "bank/rl.jsonl row 7 field 'prompt': held-out case_id 'case-017'"


def test_manifest_validation(tmp_path):
    with pytest.raises(ValueError, match="unknown held-out manifest fields"):
        HeldOutManifest.from_dict({"case_ids": ["a"], "secrets": []}, source="m.json")
    with pytest.raises(ValueError, match=r"'case_ids'\[1\]"):
        HeldOutManifest.from_dict({"case_ids": ["a", 3]}, source="m.json")
    path = tmp_path / "m.json"
    path.write_text('{"case_ids": ["case-017"], "paths": ["a/b.png"]}')
    assert HeldOutManifest.load(path) == HeldOutManifest(case_ids=("case-017",), paths=("a/b.png",))


def test_dict_keys_and_state_file_names_are_scanned():
    report = preflight(MANIFEST, rows=[], files=[])
    assert report.clean and report.files_scanned == 0
    scan = LeakageScanner(MANIFEST)
    rep = LeakageReport()
    scan.scan_value({"meta": {"amb-seg-001": 1}}, file="f.json", row=None, field="", report=rep)
    assert [(h.field, h.marker) for h in rep.hits] == [("meta.amb-seg-001<key>", "amb-seg-001")]
    rep = LeakageReport()
    scan.scan_state(SandboxState({"inputs/case-017/img.png": b"\x89PNG"}), file="s.tar", row=None, field="state",
                    report=rep)
    assert [(h.field, h.kind) for h in rep.hits] == [("state.files[inputs/case-017/img.png]<path>", "case_id")]


def test_plain_tar_members_are_scanned_and_unreadable_tar_refused(tmp_path):
    path = tmp_path / "extra.tar"
    with tarfile.open(path, "w") as tar:
        data = b"see case-017 here"
        info = tarfile.TarInfo("notes/readme.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    report = preflight(MANIFEST, files=[path])
    assert [(h.field, h.marker) for h in report.hits] == [("state.files[notes/readme.txt]", "case-017")]
    (tmp_path / "bad.tar").write_bytes(b"not a tar at all" * 10)
    with pytest.raises(LeakageError, match="unreadable tar"):
        preflight(MANIFEST, files=[tmp_path / "bad.tar"])


def test_manifest_from_task_suite_format(tmp_path):
    man = {"version": "bat_heldout_manifest/v1", "tasks": [
        {"task_id": "hx-vqa-1", "track": "vqa", "paths": ["task.md", "study/scans/hx-c1.png"], "brief": "Answer.",
         "cases": [{"case_id": "hx-c1", "file": "study/scans/hx-c1.png", "question": "Q?", "answer": "yes"},
                   {"case_id": "hx-c2", "file": "study/scans/hx-c2.png", "answer": ["a", "b"],
                    "report_text": "No acute cardiopulmonary abnormality is seen on this film today."}]}]}
    path = tmp_path / "heldout.json"
    path.write_text(json.dumps(man))
    got = HeldOutManifest.load(path)
    assert got == HeldOutManifest(
        task_ids=("hx-vqa-1",), case_ids=("hx-c1", "hx-c2"),
        paths=("study/scans/hx-c1.png", "study/scans/hx-c2.png"), questions=("Q?",), answers=("yes",),
        reports=("No acute cardiopulmonary abnormality is seen on this film today.",))
    scan = LeakageScanner(got)
    assert scan.scan_text("cat task.md") == []


def test_a_file_removed_while_the_preflight_runs_is_skipped_and_the_rest_still_scanned(tmp_path, monkeypatch):
    """A Data Factory beside a run renames its staging directory while the run's preflight walks the bank."""
    from bat_jax.stage_bank import leakage

    (tmp_path / "kept.txt").write_text(f"copied {MANIFEST.task_ids[0]} here")
    listed = [tmp_path / ".staging" / "v000002-x" / "rl.jsonl", tmp_path / "kept.txt"]  # the first is gone
    monkeypatch.setattr(leakage, "_walk", lambda files: listed)
    report = preflight(MANIFEST, files=[tmp_path])
    assert report.files_scanned == 1 and [h.file for h in report.hits] == [str(tmp_path / "kept.txt")]
