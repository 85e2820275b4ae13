"""The micro BiCuRL run (tests/micro_config.py) with an unreachable LLM judge: judged rollouts and cells are
unscored, the run goes on, and the counts reach the ledger and report.md; the tabular run file with a local judge."""

import dataclasses

import pytest

from bat_jax.bicurl import experiment as ex
from bat_jax.ledger import Ledger
from bat_jax.stage_bank.bank import StageBank
from bat_jax.clients.chat_endpoint import ChatEndpointConfig
from bat_jax.verify.judge import JudgeConfig, RubricJudge
from bat_jax.verify.rubric import REWARD_VERSION

import micro_config


@pytest.mark.slow
def test_unreachable_judge_leaves_rollouts_unscored_and_the_run_going(tmp_path, monkeypatch):
    # A random micro policy never writes plan.md, so the judge would never be asked (no evidence → no call).
    # Confirm the plan-file evidence on judged rubrics so every rollout whose stages include S1 reaches the judge.
    apply = RubricJudge.apply

    def apply_with_plan_evidence(self, rubric, brief, facts=lambda item_id: ""):
        out = apply(self, rubric, brief, facts)
        reqs = dict(out.requirements)
        reqs["file.plan"] = dataclasses.replace(reqs["file.plan"], check=lambda ev: True)
        return dataclasses.replace(out, requirements=reqs)

    monkeypatch.setattr(RubricJudge, "apply", apply_with_plan_evidence)
    judge = JudgeConfig(ChatEndpointConfig("http://127.0.0.1:9/v1", "judge-m", timeout_s=0.5, max_retries=0))
    comps = dataclasses.replace(micro_config.components(micro_config.seeded(tmp_path / "bank")), judge=judge)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    out = ex.run(run_dir, ex.BiCuRLConfig(rounds=1, grpo_steps_per_round=1, backend="local"), comps)

    assert out["rounds"] == 1
    (record,) = Ledger(run_dir / "ledger.jsonl").read()
    assert record.reward_version == f"{REWARD_VERSION}+judge:judge-m[plan.written]"
    focus = {row.state_id: row.focus for row in StageBank(comps.bank.bank_dir).read().rl_rows}
    judged_states = sum(focus[s] in ("S1", "E2E") for s in record.state_ids)
    k = comps.sampling.group_size
    assert record.grpo.rollouts == k * len(record.state_ids) == 8
    assert judged_states >= 1 and record.grpo.unscored == k * judged_states
    assert record.eval_cells == 1 and record.eval_unscored == 1  # the E2E eval cell includes S1
    # no scored controller cell: the candidate is neither accepted nor a drop; the run keeps the SFT checkpoint
    assert record.decision == "unscored" and record.retained_checkpoint == "ckpt-0"
    assert record.controller_scores["overall"] is None and record.controller_state["drops"] == 0
    for summary in out["final"].values():
        assert summary["n_unscored"] == summary["n_cells"] == 1 and summary["overall"] is None
    text = (run_dir / "report.md").read_text()
    # the per-round scoring-count table (report.md has other per-round tables too)
    line = next(ln for ln in text.splitlines() if ln.startswith("round 1") and ln.split()[2:3] == ["8"])
    assert record.grpo.agent_failed == 0 and record.eval_agent_failed == 0
    assert line.split() == ["round", "1", "8", str(8 - record.grpo.unscored), "0", str(record.grpo.unscored),
                            "0/1", "1/1"]


@pytest.mark.slow
def test_the_tabular_run_file_runs_with_a_judge_bound_that_sees_the_hosts_answer(tmp_path, monkeypatch):
    """`tabular_tiny.gin` with the LLM judge bound (its `report.written` binding) over a local OpenAI-style judge,
    shortened by bindings as tests/test_tabular_benchmark.py shortens it: the run launches, every judged request
    carries the host's recomputed facts, and the ledger's reward version names the judge."""
    from bat_jax import launch
    from doubles import JudgeServer, tabular_micro_bindings

    apply = RubricJudge.apply

    def apply_with_report_evidence(self, rubric, brief, facts=lambda item_id: ""):
        out = apply(self, rubric, brief, facts)  # a micro policy never writes report.md: confirm its evidence
        reqs = dict(out.requirements)
        reqs["file.report"] = dataclasses.replace(reqs["file.report"], check=lambda ev: True)
        return dataclasses.replace(out, requirements=reqs)

    monkeypatch.setattr(RubricJudge, "apply", apply_with_report_evidence)
    seen = []

    def judge(item, evidence, host, structured):
        seen.append((item, host))
        return '{"verdict": "no", "reason": "no report"}'

    with JudgeServer(judge) as server:
        bindings = tabular_micro_bindings(tmp_path / "bank", ("group_mean",)) + [
                    "experiment.Components.judge = @judge.JudgeConfig()",
                    f"judge/chat_endpoint.ChatEndpointConfig.base_url = '{server.url}'",
                    "judge/chat_endpoint.ChatEndpointConfig.model = 'judge-m'",
                    "judge/chat_endpoint.ChatEndpointConfig.api_key_env = ''"]
        launch.launch(["tabular_tiny.gin"], bindings, run_dir=str(tmp_path / "run"))
    (record,) = Ledger(tmp_path / "run" / "ledger.jsonl").read()
    assert record.reward_version == f"{REWARD_VERSION}+judge:judge-m[report.written]"
    judged = [host for item, host in seen if item == ("a call that read result.json (right, unchanged since) wrote a "
                                                       "report of the task id, the rows kept and the answer, and no "
                                                       "other number")]
    assert judged and all("Facts the host computed" in h and "rows kept: " in h and "the answer: " in h
                          for h in judged)
