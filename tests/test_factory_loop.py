"""The long-running Data Factory: steered versions admitted in a loop, in its own process, stopped with the run; a
crash is reported once; the writer lock is held for the factory's life (a fast stand-in build replaces the teacher)."""

import os
import threading
import time
from collections import Counter

import pytest

from bat_jax.stage_bank import steering
from bat_jax.stage_bank.bank import BankLocked, StageBank
from bat_jax.stage_bank.factory import FactoryConfig, build_bank
from bat_jax.stage_bank.factory_loop import FactoryLoopConfig, FactoryProcess, serve
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.stages import STAGES
from doubles import crashing_build, fake_build, slow_build


def _config(tmp_path):
    return FactoryConfig(bank_dir=str(tmp_path / "bank"), tracks=("vqa", "segmentation"), outcomes=("success",))


def test_serve_admits_steered_versions_whose_mix_follows_the_rule(tmp_path):
    config = _config(tmp_path)
    steering.publish(config.bank_dir, {"round": 1, "target_stage": "S3", "stage_scores": {"S3": 0.1}}, STAGES)
    loop = FactoryLoopConfig(rule=steering.SteeringRule(8, 0.5), max_versions=2, idle_s=0)
    reports = serve(config, ImagingBenchmark(), loop, build=fake_build)
    assert [r.version for r in reports] == [1, 2]
    view = StageBank(config.bank_dir).read()
    v1, v2 = view.rl_rows[:8], view.rl_rows[8:]
    # generation 0: 4 S3 + E2E, S1, S2, S3; generation 1: 4 S3 + S4, S5, E2E, S1
    assert Counter(r.focus for r in v1) == {"S3": 5, "E2E": 1, "S1": 1, "S2": 1}
    assert Counter(r.focus for r in v2) == {"S3": 4, "S4": 1, "S5": 1, "E2E": 1, "S1": 1}
    assert not (tmp_path / "bank" / "writer.lock").exists()  # released when the loop ends


def test_the_factory_process_runs_beside_and_stops_with_the_run(tmp_path):
    config = _config(tmp_path)
    bank = StageBank(config.bank_dir)
    proc = FactoryProcess(config, ImagingBenchmark(), FactoryLoopConfig(idle_s=0.1, stop_timeout_s=10),
                          build=slow_build).start()
    try:
        deadline = time.time() + 120
        while bank.latest() < 2 and time.time() < deadline:
            time.sleep(0.1)
        assert bank.latest() >= 2 and proc.alive() and proc.exit_line() == ""
        with pytest.raises(BankLocked, match=rf"pid {proc.pid} .*data factory"):  # one writer: the factory
            build_bank(config, ImagingBenchmark(), progress=False)
    finally:
        proc.stop()
    assert not proc.alive() and proc.exit_line() == ""  # stopped by the run: nothing to report
    assert not (tmp_path / "bank" / "writer.lock").exists()
    before = bank.latest()
    time.sleep(0.5)
    assert bank.latest() == before  # nothing admitted after stop
    assert not list((tmp_path / "bank" / ".staging").glob("*"))


def test_a_crashed_factory_is_reported_once_and_leaves_the_admitted_versions(tmp_path):
    config = _config(tmp_path)
    proc = FactoryProcess(config, ImagingBenchmark(), FactoryLoopConfig(idle_s=0.1), build=crashing_build).start()
    try:
        deadline = time.time() + 120
        while proc.alive() and time.time() < deadline:
            time.sleep(0.1)
        line = proc.exit_line()
        assert line.startswith(f"Data Factory (pid {proc.pid}) crashed (exit code 1)")
        assert "training continues on the last admitted Stage Bank version" in line
        assert proc.exit_line() == ""  # once
    finally:
        proc.stop()
    assert StageBank(config.bank_dir).versions() == [1]


def test_a_factory_waits_for_a_live_writer_and_stops_when_told(tmp_path, capsys):
    config = _config(tmp_path)
    stop = threading.Event()
    with StageBank(config.bank_dir).writer("another factory"):
        timer = threading.Timer(0.3, stop.set)
        timer.start()
        assert serve(config, ImagingBenchmark(), FactoryLoopConfig(idle_s=0.05), stop=stop, build=fake_build) == []
    assert f"waiting for the writer lock" in capsys.readouterr().out
    assert StageBank(config.bank_dir).versions() == []


def test_a_benchmark_that_cannot_reach_the_factory_process_is_a_configuration_error(tmp_path):
    import threading as th

    from bat_jax.errors import ConfigValueError

    class Unpicklable(ImagingBenchmark):
        def __init__(self):
            super().__init__()
            self.lock = th.Lock()  # cannot be pickled

    with pytest.raises(ConfigValueError, match="factory_loop: the Data Factory process needs the benchmark"):
        FactoryProcess(_config(tmp_path), Unpicklable(), FactoryLoopConfig()).start()
