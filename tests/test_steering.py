"""Steering by aggregates only: the published record crosses the prescription firewall, carries none of the leakage
preflight's strings, and the factory's next sources follow the documented rule (hand-counted)."""

import json
from collections import Counter

import pytest

from bat_jax.stage_bank import steering
from bat_jax.stage_bank.factory import FactoryConfig, sources
from bat_jax.stage_bank.leakage import HeldOutManifest, LeakageReport, LeakageScanner
from bat_jax.stage_bank.prescription import PrescriptionError
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.stages import STAGES

RECORD = {"round": 2, "bank_version": 3, "target_stage": "S3", "overall": 0.41,
          "stage_scores": {"S1": 0.7, "S2": 0.5, "S3": 0.2, "S4": 0.4, "S5": None},
          "rows_by_pool": {"target": 8, "mix": 4, "e2e": 4}, "rows_by_focus": {"S3": 8, "E2E": 4, "S1": 2, "S5": 2}}


def test_the_published_record_holds_only_aggregates_and_none_of_the_preflights_strings(tmp_path):
    benchmark = ImagingBenchmark()
    suite = benchmark.heldout_suite(2, benchmark.eval_variants(), 0)
    manifest = HeldOutManifest.from_task_manifest(benchmark.manifest(suite))
    assert manifest.task_ids and manifest.paths  # the strings the preflight looks for
    clean = steering.publish(tmp_path, RECORD, STAGES)
    on_disk = json.loads((tmp_path / "steering.json").read_text())
    assert on_disk == clean == {**RECORD, "stage_scores": {"S1": 0.7, "S2": 0.5, "S3": 0.2, "S4": 0.4}}
    report = LeakageReport()
    LeakageScanner(manifest).scan_value(on_disk, file="steering.json", row=0, field="", report=report)
    assert report.hits == []
    text = (tmp_path / "steering.json").read_text()
    for marker in manifest.task_ids + manifest.case_ids + manifest.paths:
        assert marker not in text
    assert steering.read(tmp_path, STAGES) == clean
    # anything per task is refused before it is written: the old record stays
    for bad, field in (({"state_ids": ["s-1"]}, "state_ids"),
                       ({"rows_by_pool": {manifest.task_ids[0]: 1}}, "rows_by_pool"),
                       ({"rows_by_focus": {"S3": 1, "data/heldout/x.png": 1}}, "rows_by_focus"),
                       ({"target_stage": manifest.paths[0]}, "target_stage")):
        with pytest.raises(PrescriptionError, match=field):
            steering.publish(tmp_path, {**RECORD, **bad}, STAGES)
    assert json.loads((tmp_path / "steering.json").read_text()) == clean


def test_an_unreadable_record_is_ignored_with_a_warning(tmp_path):
    assert steering.read(tmp_path, STAGES) is None
    (tmp_path / "steering.json").write_text('{"case_ids": ["x"]}')
    with pytest.warns(RuntimeWarning, match="steering record ignored"):
        assert steering.read(tmp_path, STAGES) is None


def test_the_next_sources_favour_the_weak_stage_by_the_rule():
    benchmark = ImagingBenchmark()
    config = FactoryConfig(tracks=("vqa", "segmentation"), outcomes=("success",))
    rule = steering.SteeringRule(sources_per_version=8, weak_share=0.5)
    # generation 0, s* = S3: 4 S3 sources, then the uniform rotation E2E, S1, S2, S3
    got = steering.steered_sources(config, benchmark, {"target_stage": "S3"}, 0, rule)
    assert [s.focus for s in got] == ["S3"] * 4 + ["E2E", "S1", "S2", "S3"]
    assert Counter(s.focus for s in got) == {"S3": 5, "E2E": 1, "S1": 1, "S2": 1}
    assert [s.track for s in got] == ["vqa", "segmentation"] * 4 and {s.outcome for s in got} == {"success"}
    assert [s.index for s in got] == list(range(8))
    # generation 1: the rotation goes on (4·1 = 4 → S4, S5, E2E, S1); new tasks every generation
    got1 = steering.steered_sources(config, benchmark, {"target_stage": "S3"}, 1, rule)
    assert [s.focus for s in got1] == ["S3"] * 4 + ["S4", "S5", "E2E", "S1"]
    assert not {s.task_seed for s in got} & {s.task_seed for s in got1}
    grid_seeds = {s.task_seed for s in sources(config, benchmark)}
    assert not grid_seeds & {s.task_seed for s in got}
    # no record: all 8 uniform; share 3/8 → round(3) = 3 weak; share 0.3 of 5 = 1.5 → 2 (half up)
    assert [s.focus for s in steering.steered_sources(config, benchmark, None, 0, rule)] == \
        ["E2E", "S1", "S2", "S3", "S4", "S5", "E2E", "S1"]
    assert steering.steered_foci(STAGES.foci, "S2", 0, steering.SteeringRule(8, 0.375)) == \
        ["S2"] * 3 + ["E2E", "S1", "S2", "S3", "S4"]
    assert steering.steered_foci(STAGES.foci, "S5", 0, steering.SteeringRule(5, 0.3)) == \
        ["S5", "S5", "E2E", "S1", "S2"]
    # s* outside the configured foci: uniform
    assert steering.steered_foci(("E2E", "S1"), "S3", 0, steering.SteeringRule(4, 0.5)) == ["E2E", "S1"] * 2
    with pytest.raises(ValueError, match="weak_share"):
        steering.SteeringRule(8, 1.5)
