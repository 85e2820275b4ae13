"""Round ledger: one JSON line per round, atomic appends, read back on restart."""

import dataclasses
import json
import warnings

import pytest

from bat_jax.curriculum.controller import Controller, ControllerConfig, ControllerState, Evaluation
from bat_jax.curriculum.router import route
from bat_jax.ledger import GRPOStats, Ledger, LedgerError, RoundRecord
from bat_jax.benchmarks.imaging.stages import STAGES


def record(r, controller):
    decision_in = route({"S1": 0.7, "S2": 0.55, "S3": 0.2, "S4": 0.45, "S5": 0.6}, STAGES, round_index=r)
    ev = Evaluation(0.3 + 0.01 * r, 0.25, {"S3": 0.2}, {"vqa": 0.3})
    d = controller.observe(r, f"ckpt-{r}", ev, kl=0.01 * r)
    return RoundRecord(round=r, selected_stage=decision_in.target, routing_report=decision_in.report(),
                       pool_counts={"target": 4, "mix": 2, "e2e": 2}, bank_version=3,
                       state_ids=[f"st-{r}-{i}" for i in range(8)], reward_version="rubric-v1",
                       controller_scores=ev.to_dict(), kl=d.kl, decision=d.decision,
                       retained_checkpoint=d.retained_checkpoint, controller_state=controller.state.to_dict())


def test_one_line_per_round_and_restart_reads_back(tmp_path):
    path = tmp_path / "run" / "ledger.jsonl"
    ledger, controller = Ledger(path), Controller()
    records = [record(r, controller) for r in (1, 2, 3)]
    for rec in records:
        ledger.append(rec)
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[1])["round"] == 2
    assert json.loads(lines[0])["selected_stage"] == "S3"
    assert Ledger(path).read() == records  # a restarted run sees the same records
    last = Ledger(path).last()
    resumed = Controller(ControllerConfig(), ControllerState.from_dict(last.controller_state))
    assert resumed.state == controller.state
    assert not list(path.parent.glob(".*.tmp"))


def test_rounds_must_increase(tmp_path):
    ledger, controller = Ledger(tmp_path / "l.jsonl"), Controller()
    ledger.append(record(1, controller))
    with pytest.raises(LedgerError, match="round 1 is not after"):
        ledger.append(record(1, Controller()))
    assert Ledger(tmp_path / "missing.jsonl").read() == [] and Ledger(tmp_path / "missing.jsonl").last() is None


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "l.jsonl"
    ledger = Ledger(path)
    ledger.append(record(1, Controller()))
    with open(path, "a") as f:
        f.write('{"round": 2, "colour": "red"}\n')
    with pytest.raises(LedgerError, match=r"l.jsonl: line 2: malformed"):
        ledger.read()


def test_non_serialisable_record_is_refused(tmp_path):
    rec = record(1, Controller())
    bad = RoundRecord(**{**rec.__dict__, "kl": float("nan")})
    with pytest.raises(LedgerError, match="not JSON-serialisable"):
        Ledger(tmp_path / "l.jsonl").append(bad)
    assert not (tmp_path / "l.jsonl").exists()


@pytest.mark.parametrize("torn", [b'{"bank_version": 3, "controller_scores": {"overall": 0.3',
                                  b'{"selected_stage": "S\xc3'], ids=["cut-json", "cut-utf8"])
def test_torn_last_line_is_dropped_with_a_warning_and_the_round_redone(tmp_path, torn):
    """A write cut short (no newline, not JSON) at the end: rounds before it are read, the next append
    replaces it (it must not become a malformed middle line)."""
    path = tmp_path / "l.jsonl"
    ledger, controller = Ledger(path), Controller()
    records = [record(r, controller) for r in (1, 2, 3)]
    ledger.append(records[0])
    ledger.append(records[1])
    with open(path, "ab") as f:
        f.write(torn)
    with pytest.warns(RuntimeWarning, match=r"l.jsonl: line 3: torn last line"):
        assert ledger.read() == records[:2]
    with pytest.warns(RuntimeWarning, match="torn last line"):
        ledger.append(records[2])
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and [json.loads(line)["round"] for line in lines[:-1]] == [1, 2, 3]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the torn bytes are gone: no warning any more
        assert Ledger(path).read() == records


def test_complete_last_line_without_newline_is_kept(tmp_path):
    path = tmp_path / "l.jsonl"
    ledger, controller = Ledger(path), Controller()
    records = [record(r, controller) for r in (1, 2)]
    ledger.append(records[0])
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    assert ledger.read() == records[:1]
    ledger.append(records[1])
    assert ledger.read() == records and len(path.read_text().splitlines()) == 2


def test_grpo_stats_nest_in_the_record_and_round_trip(tmp_path):
    path = tmp_path / "ledger.jsonl"
    stats = GRPOStats(rollouts=36, unscored=3, agent_failed=2, reward_mean=0.25, reward_version="rubric-v1",
                      pool_reward_before=0.125, pool_reward_after=0.3125, groups_with_variance=5, groups_scored=8,
                      groups_drawn=9, groups_dropped=1, groups_trained=8, trained_pool_counts={"target": 4, "mix": 4},
                      rollout_mismatch={"mismatch_mean_abs": 0.01}, judge={"requests": 3.0})
    rec = dataclasses.replace(record(1, Controller()), grpo=stats, decision_reasons=("kl 0.2 > tau 0.1",),
                              eval_cells=7, eval_unscored=1, eval_agent_failed=4)
    Ledger(path).append(rec)
    line = json.loads(path.read_text())
    assert line["format"] == 2 and line["grpo"]["groups_trained"] == 8 and line["decision_reasons"] == [
        "kl 0.2 > tau 0.1"]
    assert Ledger(path).read() == [rec]
    assert stats.scalars() == {"rollouts": 36.0, "unscored": 3.0, "agent_failed": 2.0, "reward_mean": 0.25,
                               "pool_reward_before": 0.125, "pool_reward_after": 0.3125, "groups_with_variance": 5.0,
                               "groups_scored": 8.0, "groups_drawn": 9.0, "groups_dropped": 1.0,
                               "groups_trained": 8.0, "groups_dropped_stale": 0.0, "groups_evicted": 0.0,
                               "groups_aborted": 0.0, "groups_refilled": 0.0, "rc_mismatch_mean_abs": 0.01,
                               "judge_requests": 3.0}


def test_a_format_1_ledger_reads_into_the_nested_record(tmp_path):
    """A run written before the GRPO figures were nested resumes: its flat fields land in `grpo`."""
    path = tmp_path / "ledger.jsonl"
    flat = {k: v for k, v in record(1, Controller()).to_dict().items() if k not in ("grpo", "decision_reasons")}
    flat.update(format=1, rollouts=8, unscored_rollouts=3, agent_failed_rollouts=2, pool_reward_before=0.125,
                pool_reward_after=None, groups_with_variance=5, groups_scored=8, groups_drawn=None,
                trained_pool_counts={"target": 2}, rollout_mismatch=None)
    oldest = {k: v for k, v in flat.items() if k not in ("rollouts", "unscored_rollouts", "agent_failed_rollouts",
                                                          "pool_reward_before", "pool_reward_after",
                                                          "groups_with_variance", "groups_scored", "groups_drawn",
                                                          "trained_pool_counts", "rollout_mismatch")}
    oldest["round"] = 2
    path.write_text(json.dumps(flat) + "\n" + json.dumps(oldest) + "\n")
    first, second = Ledger(path).read()
    assert first.grpo == GRPOStats(rollouts=8, unscored=3, agent_failed=2, reward_version="rubric-v1",
                                   pool_reward_before=0.125, groups_with_variance=5, groups_scored=8,
                                   trained_pool_counts={"target": 2})
    assert second.grpo == GRPOStats(reward_version="rubric-v1") and second.decision_reasons == ()
