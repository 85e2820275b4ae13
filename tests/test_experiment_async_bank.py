"""The asynchronous Stage Bank in a real run (micro configuration, local sandboxes): the Data Factory runs beside
training in its own process, a round reads the version it admitted during the round before, the ledger and
report.md show the version and new rows per round, the steering record holds aggregates only, and the factory stops
with the run."""

import dataclasses
import json
import time

import pytest

from bat_jax.bicurl import experiment as ex
from bat_jax.bicurl import grpo_round as gr
from bat_jax.ledger import Ledger
from bat_jax.stage_bank import steering
from bat_jax.stage_bank.bank import StageBank
from bat_jax.stage_bank.factory_loop import FactoryLoopConfig

import micro_config


@pytest.mark.slow
def test_a_round_reads_the_version_the_factory_admitted_during_the_round_before(tmp_path, monkeypatch, capfd):
    comps = dataclasses.replace(micro_config.components(tmp_path / "bank"), factory_loop=FactoryLoopConfig(
        rule=steering.SteeringRule(sources_per_version=2, weak_share=0.5), idle_s=0.5, stop_timeout_s=60))
    bank = StageBank(tmp_path / "bank")
    real_block = gr.grpo_block
    waited = {}

    def block_after_a_new_version(learner, rollouts, bank_, round_view, *args, **kwargs):
        if not waited:  # round 1 trains until the factory has admitted a version after the one round 1 reads
            started_on = json.loads((run_dir / "bank_versions.json").read_text())["1"]
            t0 = time.time()
            while bank.latest() <= started_on and time.time() - t0 < 900:
                time.sleep(1)
            waited["s"] = time.time() - t0
        return real_block(learner, rollouts, bank_, round_view, *args, **kwargs)

    monkeypatch.setattr(gr, "grpo_block", block_after_a_new_version)  # what run_grpo_block calls at s = 0
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ex.run(run_dir, ex.BiCuRLConfig(rounds=2, grpo_steps_per_round=1, backend="local"), comps)

    first, second = Ledger(run_dir / "ledger.jsonl").read()
    recorded = json.loads((run_dir / "bank_versions.json").read_text())
    assert recorded == {"0": 1, "1": first.bank_version, "2": second.bank_version}  # SFT read the first build
    assert first.bank_rows_new == bank.rl_count(first.bank_version) - 12  # the micro build: 12 RL rows
    assert second.bank_version > first.bank_version  # admitted while round 1 trained
    new = bank.rl_count(second.bank_version) - bank.rl_count(first.bank_version)
    assert second.bank_rows_new == new > 0
    report = (run_dir / "report.md").read_text()
    assert f"{'round 2':<12}{'v' + str(second.bank_version):>14}{new:>13}" in report
    record = json.loads((tmp_path / "bank" / "steering.json").read_text())
    assert record["round"] == 2 and record["target_stage"] == second.selected_stage
    assert record["rows_by_pool"] == {"target": 4, "mix": 2, "e2e": 2}  # two rounds of 2 / 1 / 1
    assert sum(record["rows_by_focus"].values()) == 8
    assert not (tmp_path / "bank" / "writer.lock").exists()  # the factory stopped with the run
    out = capfd.readouterr().out
    assert "Data Factory started beside training" in out and "Data Factory: generation 1: v2 admitted" in out
    assert f"round 2 reads Stage Bank v{second.bank_version}" in out
    assert "crashed" not in out
