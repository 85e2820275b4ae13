"""The bank versions a run's rounds read: resolved at round start (newest admitted or pinned), recorded before the
first rollout and reused on resume, never waiting on a factory in the middle of a version; a round reads the version
a factory admitted during the round before; the steering record the run publishes (hand-counted aggregates)."""

import json
import threading
import time

import pytest

from bat_jax.bicurl.bank_feed import BankFeed, check_bank_version
from bat_jax.errors import ConfigValueError
from bat_jax.ledger import RoundRecord
from bat_jax.stage_bank import steering
from bat_jax.stage_bank.bank import StageBank
from bat_jax.stage_bank.factory import FactoryConfig, Source
from bat_jax.stage_bank.factory_loop import FactoryLoopConfig, serve
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark

from doubles import fake_build

BENCH = ImagingBenchmark()


def _admit(config, foci, generation=0):
    grid = [Source(i, f, "vqa", "success", 1000 * generation + i, 0) for i, f in enumerate(foci)]
    return fake_build(config, BENCH, grid=grid).version


def _record(r, view, version, target="S3", scores=None):
    return RoundRecord(round=r, selected_stage=target, routing_report={}, pool_counts={"target": 2, "mix": 1, "e2e": 1},
                       bank_version=version, state_ids=[row.state_id for row in view.rl_rows[:4]], reward_version="v",
                       controller_scores={"overall": 0.3, "stage_scores": scores or {"S1": 0.5, "S3": 0.1}},
                       kl=0.0, decision="accept", retained_checkpoint=f"ckpt-{r}")


def test_bank_version_is_latest_or_a_version_number():
    assert check_bank_version("latest") == "latest" and check_bank_version(3) == 3
    for bad in (0, -1, "3", True, None, "newest"):
        with pytest.raises(ConfigValueError, match="BiCuRLConfig.bank_version must be 'latest' or a version"):
            check_bank_version(bad)


def test_versions_are_resolved_at_round_start_recorded_and_reused_on_resume(tmp_path):
    config = FactoryConfig(bank_dir=str(tmp_path / "bank"))
    _admit(config, ["S1", "S2", "E2E"])
    feed = BankFeed(StageBank(config.bank_dir), tmp_path / "run", "latest", BENCH)
    base = feed.view(feed.version_for(0))
    assert base.version == 1 and feed.round_start(1, base).version == 1 and feed.new_rows(1, base) == 0
    _admit(config, ["S3"] * 5, generation=1)  # admitted while round 1 trains
    assert feed.version_for(1) == 1  # round 1 stays on the version it started on
    v2 = feed.round_start(2, base)
    assert v2.version == 2 and len(v2.rl_rows) == 8 and feed.new_rows(2, v2) == 5
    assert json.loads((tmp_path / "run" / "bank_versions.json").read_text()) == {"0": 1, "1": 1, "2": 2}
    _admit(config, ["S4"], generation=2)
    resumed = BankFeed(StageBank(config.bank_dir), tmp_path / "run", "latest", BENCH)  # a killed run, restarted
    assert [resumed.version_for(r) for r in (0, 1, 2, 3)] == [1, 1, 2, 3]
    # pinned
    pinned = BankFeed(StageBank(config.bank_dir), tmp_path / "pinned", 2, BENCH)
    assert [pinned.version_for(r) for r in (0, 1)] == [2, 2] and len(pinned.view(2).rl_rows) == 8
    with pytest.raises(ConfigValueError, match=r"bank_version = 7: Stage Bank .* has versions \[1, 2, 3\]"):
        BankFeed(StageBank(config.bank_dir), tmp_path / "p7", 7, BENCH).version_for(0)


def test_round_start_never_waits_for_a_factory_in_the_middle_of_a_version(tmp_path):
    config = FactoryConfig(bank_dir=str(tmp_path / "bank"))
    _admit(config, ["S1", "S2"])
    bank = StageBank(config.bank_dir)
    staged, release = threading.Event(), threading.Event()

    def mid_version(_staging):
        staged.set()
        release.wait(30)

    # a factory's version held between its staged files and the publishing rename
    from bat_jax.sandbox.types import SandboxState
    from bat_jax.stage_bank.row import Provenance, RLRow, RubricSpec

    ref = bank.put_state(SandboxState({"task.md": b"new task"}))
    row = RLRow(ref, "S3", "Do S3.", (RubricSpec("a", "item a"),), (), "skill",
                Provenance("src-new", "ab" * 32, "vqa", "success"), "rubric")
    writer = threading.Thread(target=lambda: bank.admit([row], on_staged=mid_version))
    with bank.writer("factory mid-version"):
        writer.start()
        assert staged.wait(30)
        feed = BankFeed(StageBank(config.bank_dir), tmp_path / "run", "latest", BENCH)
        base = feed.view(feed.version_for(0))
        t0 = time.perf_counter()
        view = feed.round_start(1, base)
        latency = time.perf_counter() - t0
        release.set()
        writer.join(30)
    assert view.version == 1 and len(view.rl_rows) == 2  # the whole previous version, none of the staged one
    assert latency < 0.5, latency
    print(f"round-start latency with a factory mid-version: {1000 * latency:.1f} ms")
    assert feed.round_start(2, base).version == 2 and feed.new_rows(2, feed.view(2)) == 1


def test_a_round_reads_the_version_the_factory_admitted_during_the_round_before(tmp_path):
    config = FactoryConfig(bank_dir=str(tmp_path / "bank"), tracks=("vqa", "segmentation"), outcomes=("success",))
    _admit(config, ["E2E", "S1", "S2", "S3"])
    feed = BankFeed(StageBank(config.bank_dir), tmp_path / "run", "latest", BENCH)
    base = feed.view(feed.version_for(0))
    view1 = feed.round_start(1, base)
    rec1 = _record(1, view1, view1.version, scores={"S1": 0.5, "S3": 0.1, "S5": None})
    published = feed.publish_steering([rec1], view1)
    # aggregates only: pools and foci of the 4 rows round 1 used (E2E, S1, S2, S3), the scores, s*
    assert published == {"round": 1, "bank_version": 1, "target_stage": "S3", "overall": 0.3,
                         "stage_scores": {"S1": 0.5, "S3": 0.1}, "rows_by_pool": {"target": 2, "mix": 1, "e2e": 1},
                         "rows_by_focus": {"E2E": 1, "S1": 1, "S2": 1, "S3": 1}}
    # the factory, steered by that record, admits a version while round 1 is still running
    factory = threading.Thread(target=serve, args=(config, BENCH, FactoryLoopConfig(
        rule=steering.SteeringRule(8, 0.5), max_versions=1, idle_s=0)), kwargs={"build": fake_build})
    factory.start()
    factory.join(60)
    view2 = feed.round_start(2, base)
    assert view2.version == 2 and feed.new_rows(2, view2) == 8
    new = [r.focus for r in view2.rl_rows[4:]]
    # the factory's generation is the bank's latest version (1): 4 S3, then the rotation from 4·1 = 4: S4 S5 E2E S1
    assert new == ["S3"] * 4 + ["S4", "S5", "E2E", "S1"]
    rec2 = _record(2, view2, 2)
    assert feed.publish_steering([rec1, rec2], view2)["rows_by_pool"] == {"target": 4, "mix": 2, "e2e": 2}


def test_a_crashed_factory_gives_one_log_line_and_the_run_keeps_its_versions(tmp_path, capsys):
    from bat_jax.stage_bank.factory_loop import FactoryProcess

    from doubles import crashing_build

    config = FactoryConfig(bank_dir=str(tmp_path / "bank"), tracks=("vqa",), outcomes=("success",))
    _admit(config, ["S1"])
    feed = BankFeed(StageBank(config.bank_dir), tmp_path / "run", "latest", BENCH)
    feed.factory = FactoryProcess(config, BENCH, FactoryLoopConfig(idle_s=0.1), build=crashing_build).start()
    try:
        deadline = time.time() + 120
        while feed.factory.alive() and time.time() < deadline:
            time.sleep(0.1)
        line = feed.factory_line()
        assert line.startswith("Data Factory (pid ") and "crashed (exit code 1)" in line
        assert feed.factory_line() == ""  # one line, not one per round
        assert capsys.readouterr().out.count("crashed (exit code 1)") == 1
        base = feed.view(feed.version_for(0))
        assert feed.round_start(1, base).version == 1  # training goes on on the last admitted version
        assert feed.factory_lines == [line]
    finally:
        feed.close()


@pytest.mark.slow
def test_the_factory_runs_as_a_ray_actor_when_the_run_is_on_ray(tmp_path):
    ray = pytest.importorskip("ray")
    import doubles

    from bat_jax.bicurl.bank_feed import RayFactory

    ray.cloudpickle.register_pickle_by_value(doubles)  # the stand-in builds travel to the actor by value
    config = FactoryConfig(bank_dir=str(tmp_path / "bank"), tracks=("vqa", "segmentation"), outcomes=("success",))
    bank = StageBank(config.bank_dir)
    steering.publish(config.bank_dir, {"round": 1, "target_stage": "S3"}, BENCH.stages)
    ray.init(num_cpus=1, include_dashboard=False)
    try:
        factory = RayFactory(config, BENCH, FactoryLoopConfig(idle_s=0.1, stop_timeout_s=20),
                             build=doubles.slow_build).start()
        deadline = time.time() + 120
        while bank.latest() < 2 and time.time() < deadline:
            time.sleep(0.2)
        assert bank.latest() >= 2 and factory.alive() and factory.exit_line() == ""
        factory.stop()
        assert factory.exit_line() == "" and not (tmp_path / "bank" / "writer.lock").exists()
        from collections import Counter
        first = bank.read(1).rl_rows
        assert Counter(r.focus for r in first) == {"S3": 5, "E2E": 1, "S1": 1, "S2": 1}  # steered, generation 0

        crashing = RayFactory(config, BENCH, FactoryLoopConfig(idle_s=0.1),
                              build=doubles.crashing_build).start()
        deadline = time.time() + 60
        while crashing.alive() and time.time() < deadline:
            time.sleep(0.2)
        line = crashing.exit_line()
        assert line.startswith("Data Factory (Ray actor, pid ") and "crashed (" in line
        assert "crashed (RuntimeError: teacher endpoint went away)" in line and crashing.exit_line() == ""
        crashing.stop()
    finally:
        ray.shutdown()
