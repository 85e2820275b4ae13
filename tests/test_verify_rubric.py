"""Rubric verifier: binary items, evidence completeness η, r = η · mean(items) (Eq. 4), E2E, unscored."""

import dataclasses
import random

import pytest

from bat_jax.benchmark.scoring import NOT_APPLICABLE, Cell
from bat_jax.benchmarks.imaging.stages import STAGES, Stage
from bat_jax.sandbox.types import Receipt
from bat_jax.verify.rubric import (
    REWARD_VERSION, Evidence, EvidenceRequirement, Rubric, RubricItem, ScorerError, e2e_reward, score, verify_stage)


def _receipt(i, code, exit_code=0, stdout="", reads=(), writes=()):
    return Receipt(i, "execute_code", "python", code, exit_code, "", "", 0.0, 1.0, False, stdout, reads=reads,
                   writes=writes, trace_complete=True)


def _rubric():
    req = {
        "r.run": EvidenceRequirement("r.run", "ran the tool", lambda ev: bool(ev.ran(reads=("tool.py",), writes_under="out"))),
        "f.out": EvidenceRequirement("f.out", "out.json exists", lambda ev: "out.json" in ev.files),
        "f.log": EvidenceRequirement("f.log", "log.txt exists", lambda ev: "log.txt" in ev.files),
    }
    items = (
        RubricItem("ran", Stage.VALIDATE, "ran", ("r.run",), lambda ev: True),
        RubricItem("shape", Stage.VALIDATE, "shape ok", ("r.run", "f.out"), lambda ev: ev.json("out.json")["n"] == 3),
        RubricItem("logged", Stage.VALIDATE, "log ok", ("f.log",), lambda ev: True),
        RubricItem("claim", Stage.VALIDATE, "claims done", (), lambda ev: True),
    )
    return Rubric(items, req, STAGES)


def test_reward_is_eta_times_item_mean():
    ev = Evidence((_receipt(0, "run_tool(1)", reads=("tool.py",), writes=("out/x",)),), {"out.json": b'{"n": 3}'})
    v = verify_stage(_rubric(), "S3", ev)
    # evidence: r.run ✓, f.out ✓, f.log ✗ → η = 2/3; items: ran ✓ shape ✓ logged ✗ (no evidence) claim ✓ → 3/4
    assert v.evidence == {"f.log": False, "f.out": True, "r.run": True}
    assert v.items == {"ran": True, "shape": True, "logged": False, "claim": True}
    assert v.eta == pytest.approx(2 / 3)
    assert v.reward == pytest.approx(2 / 3 * 3 / 4)
    assert v.version == REWARD_VERSION
    pub = _rubric().public()
    assert pub["items"][1] == {"item_id": "shape", "stage": "S3", "description": "shape ok",
                               "evidence": ["r.run", "f.out"]}
    assert pub["evidence"]["f.log"] == "log.txt exists" and pub["version"] == REWARD_VERSION


def test_failed_receipts_and_malformed_artefacts_earn_nothing():
    ev = Evidence((_receipt(0, "run_tool(1)", exit_code=1, reads=("tool.py",), writes=("out/x",)),),
                  {"out.json": b"not json", "log.txt": b""})
    v = verify_stage(_rubric(), Stage.VALIDATE, ev)
    # r.run ✗ (exit 1) → ran ✗ and shape ✗; malformed JSON is a failed check, not a crash
    assert v.items == {"ran": False, "shape": False, "logged": True, "claim": True}
    assert v.eta == pytest.approx(2 / 3)
    assert v.reward == pytest.approx(2 / 3 * 2 / 4)


def test_claim_without_evidence_is_discounted_by_eta():
    v = verify_stage(_rubric(), "S3", Evidence((), {}))
    assert v.eta == 0.0 and v.reward == 0.0 and v.items["claim"] is True


def test_infrastructure_failure_is_unscored_not_zero():
    ev = Evidence((), {}, infra_error="sandbox died")
    assert verify_stage(_rubric(), "S3", ev) is None
    s = score(_rubric(), ev, task=None, focus="S3")
    assert s.reward is None and s.task is None and s.version == REWARD_VERSION


def test_unknown_evidence_key_and_stage_without_items_raise():
    with pytest.raises(ValueError, match="unknown evidence"):
        Rubric((RubricItem("x", Stage.PLAN, "x", ("nope",), lambda ev: True),), {}, STAGES)
    with pytest.raises(ValueError, match="no items for stage S1"):
        verify_stage(_rubric(), "S1", Evidence((), {}))
    with pytest.raises(ValueError, match="'x' is tagged with stage 'S6', which benchmark 'imaging' does not have"):
        Rubric((RubricItem("x", "S6", "x", (), lambda ev: True),), {}, STAGES)


def test_e2e_reward_released_code_formula_and_cell():
    rewards = {Stage.PLAN: 1.0, Stage.SETUP: 0.5, Stage.VALIDATE: 0.0, Stage.INFERENCE: 1.0, Stage.SUBMIT: 1.0}
    # released code: 0.5 * (.25 * 1 + .15 * .5 + .35 * 0 + .15 * 1 + .10 * 1) + 0.5 * task
    assert e2e_reward(rewards, 0.6, STAGES) == pytest.approx(0.5 * 0.575 + 0.5 * 0.6)
    assert e2e_reward({**rewards, Stage.SETUP: None}, 0.6, STAGES) is None
    assert e2e_reward(rewards, None, STAGES) is None
    items = tuple(RubricItem(f"i{s}", s, "ok", ("f.out",), lambda ev: True) for s in STAGES.ids)
    rub = Rubric(items, {"f.out": EvidenceRequirement("f.out", "", lambda ev: "out.json" in ev.files)}, STAGES)
    sc = score(rub, Evidence((), {"out.json": b"{}"}), task=0.4)
    assert sc.reward == pytest.approx(0.5 * 1.0 + 0.5 * 0.4) and sc.version == "bat_rubric/v6"
    cell = sc.to_cell("segmentation", 2, STAGES)
    assert isinstance(cell, Cell) and cell.task == 0.4 and cell.agentic(STAGES) == pytest.approx(1.0)
    single = score(rub, Evidence((), {}), task=0.4, focus="S2")
    assert single.reward == 0.0 and list(single.verdicts) == [Stage.SETUP]
    with pytest.raises(ValueError, match="missing"):
        single.to_cell("segmentation", 0, STAGES)


def test_e2e_reward_weights_stages_by_the_agentic_weights_as_released():
    """All S1 items pass, every other item fails, task 0: released 0.5 * 0.25 = 0.125 (an unweighted stage mean
    would give 0.100)."""
    items = tuple(RubricItem(f"i{s}", s, "ok", (), (lambda ev, s=s: s == Stage.PLAN)) for s in STAGES.ids)
    sc = score(Rubric(items, {}, STAGES), Evidence((), {}), task=0.0)
    assert sc.stage_rewards() == {Stage.PLAN: 1.0, Stage.SETUP: 0.0, Stage.VALIDATE: 0.0, Stage.INFERENCE: 0.0,
                                  Stage.SUBMIT: 0.0}
    assert sc.reward == pytest.approx(0.125, abs=1e-15)
    # each stage alone passing: its weight / 2; random stage scores: the released weighted sum
    for stage, w in zip(STAGES, (0.25, 0.15, 0.35, 0.15, 0.10)):
        assert e2e_reward({s: float(s == stage) for s in STAGES.ids}, 0.0, STAGES) == pytest.approx(w / 2)
    rng = random.Random(0)
    for _ in range(20):
        r, task = {s: rng.random() for s in STAGES.ids}, rng.random()
        released = 0.5 * sum(w * r[s] for s, w in zip(STAGES, (0.25, 0.15, 0.35, 0.15, 0.10))) + 0.5 * task
        assert e2e_reward(r, task, STAGES) == pytest.approx(released, abs=1e-12)


def test_e2e_reward_renormalises_over_applicable_stages_and_refuses_bad_scores():
    # S5 not applicable: S1's weight .25 over .90; only S1 and S3 given: .25 over .60
    r = {Stage.PLAN: 1.0, Stage.SETUP: 0.0, Stage.VALIDATE: 0.0, Stage.INFERENCE: 0.0, Stage.SUBMIT: NOT_APPLICABLE}
    assert e2e_reward(r, 0.0, STAGES) == pytest.approx(0.5 * 0.25 / 0.90)
    assert e2e_reward({Stage.PLAN: 1.0, "S3": 0.0}, 1.0, STAGES) == pytest.approx(0.5 * 0.25 / 0.60 + 0.5)
    assert e2e_reward({}, 1.0, STAGES) is None
    assert e2e_reward(dict.fromkeys(STAGES, NOT_APPLICABLE), 1.0, STAGES) is None
    with pytest.raises(ScorerError, match="task metric must be in"):
        e2e_reward({Stage.PLAN: 1.0}, float("nan"), STAGES)
    with pytest.raises(ValueError, match="S2"):
        e2e_reward({Stage.SETUP: 1.5}, 0.0, STAGES)


class _StubClient:
    """Stands in for ChatClient: returns queued replies or raises queued ChatErrors."""

    def __init__(self, replies):
        self.replies, self.seen = list(replies), []

    def complete(self, messages, temperature=None):
        self.seen.append((messages, temperature))
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply


def _judged_rubric(judge):
    from bat_jax.verify.judge import judged_item, render_evidence

    req = {"f.plan": EvidenceRequirement("f.plan", "plan exists", lambda ev: "plan.md" in ev.files)}
    item = judged_item("plan.recovery", Stage.PLAN, "the plan names a recovery step", ("f.plan",), judge,
                       lambda ev: render_evidence(ev, ("plan.md",)))
    return Rubric((item,), req, STAGES)


def test_llm_judge_items_and_unscored_on_judge_failure():
    from bat_jax.clients.chat_endpoint import ChatError
    from bat_jax.verify.judge import LLMJudge

    ev = Evidence((_receipt(0, "cat task.md", stdout="# Task"),), {"plan.md": b"restore from archive"})
    client = _StubClient(['ok {"verdict": "yes", "reason": "names restore"}', '{"verdict": "no"}',
                          ChatError("unreachable", "down"), ChatError("unreachable", "down"), "maybe", "maybe"])
    judge = LLMJudge(client)
    rub = _judged_rubric(judge)
    assert verify_stage(rub, "S1", ev).reward == 1.0
    assert judge.reasons["the plan names a recovery step"] == "names restore"
    messages, temperature = client.seen[0]
    assert temperature == 0.0 and "restore from archive" in messages[1]["content"]
    assert "cat task.md" in messages[1]["content"]
    assert verify_stage(rub, "S1", ev).reward == 0.0
    assert verify_stage(rub, "S1", ev) is None  # judge unreachable, and on the control question → unscored, not 0
    assert verify_stage(rub, "S1", ev) is None  # no verdict, nor to the control question → unscored
    # without the evidence file the judge is never asked and the item fails
    assert verify_stage(rub, "S1", Evidence((), {})).reward == 0.0 and judge.calls == 6


def test_receipt_evidence_is_the_kernel_trace_not_the_code_text():
    rub = _rubric()
    # the code names the tool, but the call read and wrote nothing: no evidence
    talk = _receipt(0, "# run_tool(1) tool.py out/x\n'run_tool(1)'\nif False: run_tool(1)")
    assert verify_stage(rub, "S3", Evidence((talk,), {"out.json": b'{"n": 3}'})).evidence["r.run"] is False
    # read the tool but wrote nowhere under out/, or wrote but never read it: no evidence
    for reads, writes in ((("tool.py",), ("elsewhere/x",)), ((), ("out/x",)), (("tool.pyc",), ("out/x",)),
                          (("tool.py",), ("out",)), (("tool.py",), ("outside/out/x",))):
        ev = Evidence((_receipt(0, "", reads=reads, writes=writes),), {"out.json": b'{"n": 3}'})
        assert verify_stage(rub, "S3", ev).evidence["r.run"] is False, (reads, writes)
    # a code text that never mentions the tool still counts when the call did the work
    ev = Evidence((_receipt(0, "import t; t.go()", reads=("tool.py",), writes=("out/a/b",)),), {})
    assert verify_stage(rub, "S3", ev).evidence["r.run"] is True
    # a timed-out call counts for nothing
    late = dataclasses.replace(ev.receipts[0], timed_out=True)
    assert verify_stage(rub, "S3", Evidence((late,), {})).evidence["r.run"] is False


def test_wrote_is_a_successful_call_that_read_its_inputs_and_left_the_final_bytes():
    """`Evidence.wrote`: a call's write digest of the path (SHA-256) compared with the final workspace's bytes."""
    import hashlib

    final, stale = b'{"n": 3}', b'{"n": 2}'
    digest = hashlib.sha256(final).hexdigest()
    wrote = _receipt(0, "", reads=("in.csv",), writes=("out.json",))
    wrote = dataclasses.replace(wrote, write_digests=(("out.json", digest),))
    older = dataclasses.replace(wrote, index=1, write_digests=(("out.json", hashlib.sha256(stale).hexdigest()),))
    failed = dataclasses.replace(wrote, index=2, exit_code=1)
    ev = Evidence((wrote, older, failed), {"out.json": final})
    assert [r.index for r in ev.wrote("out.json")] == [0]  # the stale writer and the failed call do not count
    assert [r.index for r in ev.wrote("out.json", reads=("in.csv",))] == [0]
    assert ev.wrote("out.json", reads=("other.csv",)) == []  # it did not read that input
    assert ev.wrote("missing.json") == []
    assert Evidence((older,), {"out.json": final}).wrote("out.json") == []  # changed after the call
