"""Per-stage rubric items of the imaging suite (bat_jax/benchmarks/imaging/rubric.py): the items a task's rubric holds,
and S1 / S2 verdicts on hand-made evidence (r = η · mean(v), hand-computed)."""

import json

import pytest

from bat_jax.sandbox.types import Receipt
from bat_jax.benchmarks.imaging.registry import get_track
from bat_jax.benchmarks.imaging.rubric import build_rubric
from bat_jax.benchmarks.imaging.stages import Stage
from bat_jax.verify.rubric import Evidence, verify_stage

VQA = get_track("vqa")
ITEMS = {
    Stage.PLAN: ["plan.read_brief", "plan.inventory", "plan.written"],
    Stage.SETUP: ["setup.env_checked", "setup.version_printed", "setup.env_recorded"],
    Stage.VALIDATE: ["validate.smoke_run", "validate.shape", "validate.nondegenerate", "validate.issues"],
    Stage.INFERENCE: ["inference.ran", "inference.all_usable"],
    Stage.SUBMIT: ["submit.schema", "submit.complete", "submit.submitted"],
}


def _call(i, stdout, reads):
    """A successful execute_code call whose kernel trace shows it read `reads`."""
    return Receipt(i, "execute_code", "bash", "cat", 0, "", "", 0.0, 1.0, False, stdout, reads=tuple(reads),
                   trace_complete=True)


def _ids(rubric, stage):
    return [i.item_id for i in rubric.for_stage(stage)]


def test_a_task_without_a_fault_has_fifteen_items_and_a_faulty_one_sixteen():
    inst = VQA.generate(3, "success")
    rubric = build_rubric(VQA, inst)
    assert inst.fault is None and {s: _ids(rubric, s) for s in ITEMS} == ITEMS
    faulty = next(i for i in (VQA.generate(s, "recovery") for s in range(20)) if i.fault is not None)
    assert _ids(build_rubric(VQA, faulty), Stage.INFERENCE) == ITEMS[Stage.INFERENCE] + ["inference.fault_handled"]


def test_plan_stage_reward_on_hand_made_evidence():
    inst = VQA.generate(3, "success")
    L, rubric = inst.layout, build_rubric(VQA, inst)
    receipts = (_call(0, inst.task_id, ["task.md"]), _call(1, inst.case_ids[0], [L.cases_csv]))
    plan = f"Run {L.method_dir}/model.py over {len(inst.cases)} cases, write {L.submission}.".encode()
    full = verify_stage(rubric, Stage.PLAN, Evidence(receipts, {L.plan_path: plan}))
    assert full.reward == 1.0 and all(full.items.values())
    # no plan file: η = 2/3 of the evidence, 2 of 3 items → 2/3 · 2/3
    no_plan = verify_stage(rubric, Stage.PLAN, Evidence(receipts, {}))
    assert no_plan.eta == pytest.approx(2 / 3) and no_plan.reward == pytest.approx(4 / 9)
    assert no_plan.items == {"plan.read_brief": True, "plan.inventory": True, "plan.written": False}
    # a plan without the case count: all evidence, 2 of 3 items
    vague = verify_stage(rubric, Stage.PLAN, Evidence(receipts, {L.plan_path: f"{L.method_dir}/model.py".encode()}))
    assert vague.eta == 1.0 and vague.reward == pytest.approx(2 / 3)
    # the brief read, but its task id never printed: that evidence and its item fail
    blind = verify_stage(rubric, Stage.PLAN, Evidence((_call(0, "", ["task.md"]),) + receipts[1:], {L.plan_path: plan}))
    assert blind.items["plan.read_brief"] is False and blind.reward == pytest.approx(2 / 3 * 2 / 3)


def test_setup_stage_needs_the_true_method_version():
    inst = VQA.generate(3, "success")
    L, rubric = inst.layout, build_rubric(VQA, inst)
    model_py, config_json = f"{L.method_dir}/model.py", f"{L.method_dir}/config.json"
    check = _call(0, f"numpy ok, method {inst.method_version}", [model_py, config_json])
    env = {L.env_json: json.dumps({"numpy": "2.3.5", "method_version": inst.method_version}).encode()}
    assert verify_stage(rubric, Stage.SETUP, Evidence((check,), env)).reward == 1.0
    wrong = {L.env_json: json.dumps({"numpy": "2.3.5", "method_version": "0.0.0-made-up"}).encode()}
    verdict = verify_stage(rubric, Stage.SETUP, Evidence((check,), wrong))
    assert verdict.items["setup.env_recorded"] is False and verdict.reward == pytest.approx(2 / 3)
