import struct

import pytest

from bat_jax import report
from bat_jax.benchmark.scoring import Cell, aggregate
from bat_jax.benchmark.stages import StageSet
from bat_jax.benchmarks.imaging.stages import STAGES, Stage

THREE = StageSet.of([("inspect", "Inspect", 0.2), ("clean", "Clean", 0.3), ("report", "Report", 0.5)], "tabular")


def _summary(values, stages=STAGES):
    return aggregate([Cell(f"t{i}", 0, {s: v for s in stages.ids}, task=v) for i, v in enumerate(values)], stages)


def test_results_table_prints_paper_scale_with_half_widths():
    table = report.results_table([("SFT", _summary([0.1, 0.2, 0.3])), ("BiCuRL", _summary([0.5, 0.5, 0.5]))])
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["System", "Overall", "Agentic", "Task"]
    # mean 20.0, half-width 4.3027 * 10 / sqrt(3) = 24.84 -> 24.8
    assert "20.0 ± 24.8" in lines[2]
    assert "50.0 ± 0.0" in lines[3]


def test_stage_table_and_best_so_far():
    table = report.stage_table([("round 1", {Stage.PLAN: 0.5, Stage.VALIDATE: 0.25})], STAGES)
    assert table.splitlines()[0].split() == ["Round", "S1", "Plan", "S2", "Setup", "S3", "Validate", "S4",
                                             "Inference", "S5", "Submit"]
    assert table.splitlines()[2].split() == ["round", "1", "50.0", "—", "25.0", "—", "—"]
    three = report.stage_table([("round 0", {"inspect": 0.1, "clean": None, "report": 1.0})], THREE)
    assert three.splitlines()[0].split() == ["Round", "inspect", "Inspect", "clean", "Clean", "report", "Report"]
    assert three.splitlines()[2].split() == ["round", "0", "10.0", "—", "100.0"]
    assert report.best_so_far([0.30, None, 0.35, 0.34, 0.36]) == [0.30, 0.30, 0.35, 0.35, 0.36]
    assert report.best_so_far([None, 0.2]) == [None, 0.2]


def test_staircase_plot_writes_a_png(tmp_path):
    path = report.staircase_plot([0.30, 0.35, 0.34, None, 0.40], tmp_path / "staircase.png", baselines={"SFT": 0.3})
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (720, 432)
    assert not list(tmp_path.glob("*.tmp.png"))


def test_scalar_writer_writes_event_file(tmp_path):
    writer = report.ScalarWriter(tmp_path / "tb", STAGES)
    writer.summary("eval", _summary([0.4, 0.6]), step=1)
    writer.summary("final/BiCuRL (retained)", _summary([0.4, 0.6]), step=2)
    writer.close()
    other = report.ScalarWriter(tmp_path / "tb3", THREE)
    other.summary("eval", _summary([0.2], THREE), step=1)
    other.close()
    from tensorboardX.proto import event_pb2

    (events_file,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    data, scalars, pos = events_file.read_bytes(), {}, 0
    while pos < len(data):  # TFRecord framing: u64 length, u32 crc, payload, u32 crc
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
        pos += 16 + length
        for value in event.summary.value:
            scalars[value.tag] = (event.step, value.simple_value)
    assert scalars["eval/overall"] == (1, pytest.approx(50.0))
    assert scalars["eval/S3_Validate"] == (1, pytest.approx(50.0))
    assert scalars["final/BiCuRL_retained/overall"] == (2, pytest.approx(50.0))  # a legal tag, no rename warning
    (events_file,) = (tmp_path / "tb3").glob("events.out.tfevents.*")
    assert b"eval/clean_Clean" in events_file.read_bytes() and b"S3_Validate" not in events_file.read_bytes()


def test_scoring_table_separates_agent_failed_scored_from_unscored_infra():
    table = report.scoring_table([
        report.RoundCounts("round 1", None, None, None, None, None, None),  # an older ledger: nothing recorded
        report.RoundCounts("round 2", 8, 3, 2, 7, 1, 4),
        ("round 3", 8, 0, 0, 7, 0, 0),  # a plain tuple in field order
    ])
    lines = table.splitlines()
    assert lines[0].split() == ["Round", "rollouts", "scored", "agent-failed", "unscored", "eval", "agent-failed",
                                "eval", "unscored"]
    assert lines[1].split() == ["(scored)", "(infra)", "(scored)/cells", "(infra)/cells"]
    assert lines[3].split() == ["round", "1", "—", "—", "—", "—", "—", "—"]
    # 8 rollouts: 3 unscored (infra) → 5 scored, 2 of them agent-failed; eval: 4 of 7 cells agent-failed, 1 unscored
    assert lines[4].split() == ["round", "2", "8", "5", "2", "3", "4/7", "1/7"]
    assert lines[5].split() == ["round", "3", "8", "8", "0", "0", "0/7", "0/7"]
    # right-aligned columns: every head ends where its values end
    assert len({len(line) for line in lines[:6]}) == 1
    assert lines[0].index(" agent-failed") + len(" agent-failed") == lines[4].index("5") + 1 + 14
    assert lines[-2].startswith("agent-failed (scored): the agent's own code killed or hung its sandbox")
    assert lines[-1].startswith("unscored (infra): engine or sandbox start failed, or the LLM judge was unreachable")


def test_signal_table_prints_before_after_change_and_group_share():
    table = report.signal_table([report.RoundSignal("round 1", "S1", 0.125, 0.3125, 5, 8, 0.00215, -0.0035, 2.3e-4),
                                 ("round 2", "S3", None, None, 0, 0), ("round 3", "S2", 0.5, 0.25, None, None)])
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["Round", "target", "reward", "before"]
    assert lines[0].split()[-5:] == ["Δlogp", "A>0", "Δlogp", "A<0", "KL/token"]
    assert lines[2].split()[2:] == ["S1", "0.125", "0.312", "+0.188", "5/8", "(62%)", "+0.0022", "-0.0035", "0.00023"]
    assert lines[3].split()[2:] == ["S3", "—", "—", "—", "0/0", "—", "—", "—"]
    assert lines[4].split()[2:] == ["S2", "0.500", "0.250", "-0.250", "—", "—", "—", "—"]


def _final():
    return {"untrained": _summary([0.0, 0.0, 0.0]), "SFT": _summary([0.1, 0.2, 0.3]),
            "BiCuRL (retained)": _summary([0.2, 0.2, 0.4])}


def test_summary_dict_round_trips_with_track_means():
    s = _final()["SFT"]
    back = report.summary_from_dict(report.summary_dict(s))
    assert back == s and back.tracks["t2"]["overall"] == pytest.approx(0.3)
    assert report.summary_from_dict({"overall": 0.5}).tracks == {}  # an older summary.json


def test_run_report_has_both_paired_differences_and_the_signal_table(tmp_path):
    from bat_jax.curriculum.controller import Evaluation
    from bat_jax.ledger import GRPOStats, RoundRecord

    rec = RoundRecord(round=1, selected_stage="S1", routing_report={}, pool_counts={"target": 4}, bank_version=1,
                      state_ids=["s"], reward_version="v", controller_scores=Evaluation(0.3, 0.2, {"S1": 0.4}, {})
                      .to_dict(), kl=0.01, decision="accept", retained_checkpoint="ckpt-1",
                      grpo=GRPOStats(pool_reward_before=0.1, pool_reward_after=0.2, groups_with_variance=3,
                                     groups_scored=8))
    out = report.write_run_report(tmp_path, _final(), [rec], Evaluation(0.2, 0.1, {"S1": 0.3}, {}), STAGES,
                                  note="A note on the suite.")
    text = (tmp_path / "report.md").read_text()
    assert text.startswith("# BiCuRL run report: imaging\n\nA note on the suite.\n")
    assert "S1 Plan" in text and "round 0 30.0 — — — —" in " ".join(text.split())
    assert "Paired track-level difference SFT − untrained (Overall): 20.0 ± 24.8 (3 tracks)" in text
    assert "Paired track-level difference BiCuRL (retained) − SFT (Overall): 6.7 ± 14.3 (3 tracks)" in text
    assert "3/8 (38%)" in text and "+0.100" in text
    assert (tmp_path / "staircase.png").stat().st_size > 1000
    assert out["final"]["SFT"]["tracks"]["t0"]["overall"] == pytest.approx(0.1)
    # the controller's path, for the sweep report: round 0 (the SFT policy) then each round's target and decision
    assert out["controller"] == [{"round": 0, "target": None, "overall": 0.2, "decision": None},
                                 {"round": 1, "target": "S1", "overall": 0.3, "decision": "accept"}]
    import dataclasses

    ds = dataclasses.replace(rec, grpo=dataclasses.replace(
        rec.grpo, groups_drawn=34, groups_dropped=13, groups_trained=21,
        trained_pool_counts={"target": 11, "mix": 5, "e2e": 5},
        rollout_mismatch={"mismatch_mean_abs": 0.0089, "mismatch_max_abs": 0.024, "tis_truncated_frac": 0.021,
                          "seq_masked": 0.0}))
    row = report.groups_table([ds]).splitlines()[2].split()
    assert row == ["round", "1", "34", "13", "21", "0.0089", "0.0240", "2.1%", "0", "target", "11", "·", "mix", "5",
                   "·", "e2e", "5"]
    assert report.groups_table([rec]).splitlines()[2].split()[2:] == ["0", "0", "0"] + ["—"] * 5  # no mismatch


def test_run_report_prints_the_bank_version_and_new_rows_per_round_and_the_factory_line(tmp_path):
    import dataclasses

    from bat_jax.curriculum.controller import Evaluation
    from bat_jax.ledger import RoundRecord

    rec = RoundRecord(round=1, selected_stage="S1", routing_report={}, pool_counts={"target": 4}, bank_version=1,
                      state_ids=["s"], reward_version="v", controller_scores=Evaluation(0.3, 0.2, {"S1": 0.4}, {})
                      .to_dict(), kl=0.01, decision="accept", retained_checkpoint="ckpt-1", bank_rows_new=0)
    rec2 = dataclasses.replace(rec, round=2, bank_version=3, bank_rows_new=16,
                               factory="Data Factory (pid 7) crashed (exit code 1); training continues on the last "
                                       "admitted Stage Bank version")
    old = dataclasses.replace(rec, round=3, bank_rows_new=None)  # a ledger line from before versions per round
    assert report.bank_table([rec, rec2, old]).splitlines() == [
        "Round         bank version  new RL rows", "round 1                 v1            0",
        "round 2                 v3           16", "round 3                 v1            —"]
    report.write_run_report(tmp_path, _final(), [rec, rec2], Evaluation(0.2, 0.1, {"S1": 0.3}, {}), STAGES)
    text = (tmp_path / "report.md").read_text()
    assert "round 2                 v3           16" in text
    assert ("Data Factory, round 2: Data Factory (pid 7) crashed (exit code 1); training continues on the last "
            "admitted Stage Bank version") in text
