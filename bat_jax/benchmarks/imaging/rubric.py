"""Per-stage rubric items and evidence predicates shared by every track.

Details: docs/design.md.
"""

from __future__ import annotations

import re

from bat_jax.benchmarks.imaging.stages import STAGES, Stage
from bat_jax.benchmarks.imaging.base import TaskInstance, Track
from bat_jax.benchmarks.imaging.method_replay import case_matches, method_run_calls
from bat_jax.verify.rubric import Evidence, EvidenceRequirement, Rubric, RubricItem


def _true_issues(inst: TaskInstance) -> set[tuple[str, str]]:
    return {(inst.fault.case_id, inst.fault.kind)} if inst.fault else set()


def _validation(ev: Evidence, inst: TaskInstance) -> dict:
    data = ev.json(inst.layout.validation_json)
    if not isinstance(data, dict):
        raise ValueError("validation report is not an object")
    return data


def _pred_entries(ev: Evidence, inst: TaskInstance) -> dict[str, object]:
    out = {}
    for cid in inst.case_ids:
        data = ev.json(f"{inst.layout.pred_dir}/{cid}.json")
        if data is not None:
            out[cid] = data
    return out


def build_rubric(track: Track, inst: TaskInstance) -> Rubric:
    """The reward contract (c, G) of one task instance over S1–S5."""
    L = inst.layout
    first_case = inst.case_ids[0]
    model_py, config_json = f"{L.method_dir}/model.py", f"{L.method_dir}/config.json"
    inputs = (L.images_dir,)

    def submission(ev: Evidence) -> dict:
        data = ev.json(L.submission)
        if not isinstance(data, dict):
            raise ValueError("submission is not an object")
        return data

    def method_ran(ev: Evidence, out_dir: str) -> bool:
        """A call read model.py and a case input and ran the method into `out_dir`.

        Every case entry it wrote equals the host's replay, and one is this call's own, unguessable output
        (`method_replay`)."""
        candidates = ev.ran((model_py,), inputs, writes_under=out_dir)
        return bool(method_run_calls(inst, ev.receipts, candidates, out_dir, ev.files, ev.start_files))

    req = [
        # S1
        EvidenceRequirement("receipt.read_brief", "a successful call that read task.md and printed its task id",
                            lambda ev: any(inst.task_id in r.stdout for r in ev.ran(reads=("task.md",)))),
        EvidenceRequirement("receipt.inventory", "a successful call that read the case manifest and printed a case id",
                            lambda ev: any(first_case in r.stdout for r in ev.ran(reads=(L.cases_csv,)))),
        EvidenceRequirement("file.plan", "the plan file exists", lambda ev: L.plan_path in ev.files, L.plan_path),
        # S2
        EvidenceRequirement("receipt.env_check", "a successful call that imported the provided method (read its "
                            "model.py) and loaded its config", lambda ev: bool(ev.ran(reads=(model_py, config_json)))),
        EvidenceRequirement("file.env", "the env file exists", lambda ev: L.env_json in ev.files, L.env_json),
        # S3
        EvidenceRequirement("receipt.smoke_run", "a successful call that ran the method (read model.py and a case "
                            "input) and wrote into the validation dir an entry equal to the method's output",
                            lambda ev: method_ran(ev, L.validation_dir)),
        EvidenceRequirement("file.validation", "the validation report exists",
                            lambda ev: L.validation_json in ev.files, L.validation_json),
        EvidenceRequirement("receipt.input_check", "a successful call that read the case manifest and loaded case "
                            "inputs", lambda ev: bool(ev.ran((L.cases_csv,), inputs))),
        # S4
        EvidenceRequirement("receipt.inference", "a successful call that ran the method (read model.py and case "
                            "inputs) and wrote into the prediction dir an entry equal to the method's output",
                            lambda ev: method_ran(ev, L.pred_dir)),
        EvidenceRequirement("file.predictions", "at least one saved prediction entry",
                            lambda ev: bool(_pred_entries(ev, inst))),
        # S5
        EvidenceRequirement("file.submission", "the submission file exists", lambda ev: L.submission in ev.files,
                            L.submission),
        EvidenceRequirement("receipt.submit", "a successful submit call",
                            lambda ev: bool(ev.ok_receipts(tool="submit"))),
    ]

    def plan_ok(ev: Evidence) -> bool:
        text = ev.text(L.plan_path) or ""
        return (f"{L.method_dir}/model.py" in text and L.submission in text
                and re.search(rf"\b{len(inst.cases)} cases\b", text) is not None)

    def env_ok(ev: Evidence) -> bool:
        data = ev.json(L.env_json)
        return (isinstance(data, dict) and data.get("method_version") == inst.method_version
                and bool(data.get("numpy")))

    def version_printed(ev: Evidence) -> bool:
        return any(inst.method_version in r.stdout for r in ev.ran(reads=(config_json,)))

    def shape_ok(ev: Evidence) -> bool:
        v = _validation(ev, inst)
        case = inst.case(v["case_id"])
        return list(v["output_shape"]) == track.expected_shape(case)

    def nondeg_ok(ev: Evidence) -> bool:
        v = _validation(ev, inst)
        entry = v["entry"]
        return (v.get("nondegenerate") is True and not track.check_entry(entry, ev.files)
                and track.nondegenerate(entry, ev.files))

    def issues_ok(ev: Evidence) -> bool:
        issues = _validation(ev, inst)["issues"]
        found = {(i["case_id"], i["kind"]) for i in issues}
        return found == _true_issues(inst)

    def predicted(ev: Evidence, entries: dict, cid: str, correct_only: bool = False) -> bool:
        """A valid entry for the case whose content is the method's output on it (when it has a replay)."""
        entry = entries.get(cid)
        return (entry is not None and not track.check_entry(entry, ev.files)
                and case_matches(inst, cid, entry, ev.files, correct_only) is not False)

    def all_usable_predicted(ev: Evidence) -> bool:
        entries = _pred_entries(ev, inst)
        return all(predicted(ev, entries, cid) for cid in inst.recoverable_ids())

    def fault_handled(ev: Evidence) -> bool:
        entries = _pred_entries(ev, inst)
        if inst.fault.recoverable:  # restored / repaired: the method's output on the correct input
            return predicted(ev, entries, inst.fault.case_id, correct_only=True)
        return inst.fault.case_id not in entries

    def entries_computed(ev: Evidence) -> bool:
        """Every submitted prediction is the method's output on its case.

        Content is compared with the replay, as S4's items compare the prediction files. A prediction must be what the
        start state's predictions or this episode's run hold, never an answer made up at submission time."""
        preds = submission(ev).get("predictions", {})
        usable = set(inst.recoverable_ids())  # an entry for an unknown or unrecoverable case is made up
        return isinstance(preds, dict) and all(cid in usable and predicted(ev, preds, cid) for cid in preds)

    def schema_ok(ev: Evidence) -> bool:
        return not track.check_submission(inst, ev.files.get(L.submission), ev.files) and entries_computed(ev)

    def complete(ev: Evidence) -> bool:
        if not entries_computed(ev):
            return False
        sub = submission(ev)
        preds, failed = set(sub.get("predictions", {})), set(sub.get("failed", {}))
        unrecoverable = set(inst.case_ids) - set(inst.recoverable_ids())
        return preds | failed == set(inst.case_ids) and not preds & failed and failed == unrecoverable

    def submitted_ok(ev: Evidence) -> bool:
        return ev.submitted == L.submission and entries_computed(ev)

    S = Stage
    items = [
        RubricItem("plan.read_brief", S.PLAN, "the brief was read", ("receipt.read_brief",), lambda ev: True),
        RubricItem("plan.inventory", S.PLAN, "the case manifest was inspected", ("receipt.inventory",),
                   lambda ev: True),
        RubricItem("plan.written", S.PLAN, "the plan names the method, the case count and the submission path",
                   ("file.plan",), plan_ok),
        RubricItem("setup.env_checked", S.SETUP, "numpy and the method import cleanly", ("receipt.env_check",),
                   lambda ev: True),
        RubricItem("setup.version_printed", S.SETUP, "the method config was loaded and its version observed",
                   ("receipt.env_check",), version_printed),
        RubricItem("setup.env_recorded", S.SETUP, "the env file records numpy and the true method version",
                   ("file.env",), env_ok),
        RubricItem("validate.smoke_run", S.VALIDATE, "a real small-case execution of the method happened",
                   ("receipt.smoke_run", "file.validation"), lambda ev: True),
        RubricItem("validate.shape", S.VALIDATE, "the reported output shape is correct for the smoke case",
                   ("receipt.smoke_run", "file.validation"), shape_ok),
        RubricItem("validate.nondegenerate", S.VALIDATE, "the smoke output is valid and non-degenerate",
                   ("receipt.smoke_run", "file.validation"), nondeg_ok),
        RubricItem("validate.issues", S.VALIDATE, "every faulty input (and only those) is diagnosed with its kind",
                   ("receipt.input_check", "file.validation"), issues_ok),
        RubricItem("inference.ran", S.INFERENCE, "the method ran over the cases", ("receipt.inference",),
                   lambda ev: True),
        RubricItem("inference.all_usable", S.INFERENCE, "every usable case has a valid prediction",
                   ("receipt.inference", "file.predictions"), all_usable_predicted),
    ]
    if inst.fault is not None:
        desc = ("the restored/repaired case was predicted on the right grid" if inst.fault.recoverable
                else "no output was fabricated for the unrecoverable case")
        items.append(RubricItem("inference.fault_handled", S.INFERENCE, desc, ("receipt.inference", "file.predictions"),
                                fault_handled))
    items += [
        # the public texts stay those the Stage Bank's rows store; each check also requires `entries_computed`
        RubricItem("submit.schema", S.SUBMIT, "the submission passes the format checker", ("file.submission",),
                   schema_ok),
        RubricItem("submit.complete", S.SUBMIT, "every case is predicted or failed (only unrecoverable ones)",
                   ("file.submission",), complete),
        RubricItem("submit.submitted", S.SUBMIT, "the submission file was submitted",
                   ("file.submission", "receipt.submit"), submitted_ok),
    ]
    return Rubric(tuple(items), {r.key: r for r in req}, STAGES)
