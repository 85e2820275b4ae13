"""The tabular suite's tasks: briefs that carry their parameters, stage skills, and a held-out suite disjoint from
every training task by construction (seeds, ids, column vocabulary) whose manifest the leakage scanner guards."""

import json
import re

import pytest

from bat_jax.stage_bank.leakage import HeldOutManifest, LeakageScanner
from bat_jax.benchmarks.tabular import tables, tasks
from bat_jax.benchmarks.tabular.stages import STAGES


def test_a_brief_carries_its_parameters_and_outputs():
    task = tasks.training_task("top_corr", 12, "mixed")
    assert task.task_id == "tr-top_corr-12-mixed"
    params = json.loads(re.search(r"Parameters: (.+)", task.brief).group(1))
    assert params == {"family": "top_corr", **task.params} and params["k"] == 2 and len(params["candidates"]) == 3
    for path in (tasks.RAW, tasks.INSPECT, tasks.CLEAN_CSV, tasks.CLEAN_LOG, tasks.RESULT, tasks.REPORT):
        assert path in task.brief
    assert set(task.state().files) == {"task.md", tasks.RAW}
    assert task.state().files[tasks.RAW] == task.table.csv_bytes()


def test_stage_skills():
    assert [tasks.stage_skill(s).split(":")[0] for s in STAGES.ids] == [
        "Stage inspect", "Stage clean", "Stage analyse", "Stage report"]
    with pytest.raises(ValueError, match="unknown stage 'S1' for benchmark 'tabular'"):
        tasks.stage_skill("S1")


def test_training_tasks_refuse_heldout_seeds_templates_and_unknown_names():
    with pytest.raises(ValueError, match=r"training seeds are in \[0, 1000000000\)"):
        tasks.training_task("group_mean", tasks.HELDOUT_SEED_BASE, "clean")
    with pytest.raises(ValueError, match="one brief template"):
        tasks.training_task("group_mean", 1, "clean", template=1)
    with pytest.raises(ValueError, match="no task family 'mode'"):
        tasks.training_task("mode", 1, "clean")
    with pytest.raises(ValueError, match="no variant 'dirty'"):
        tasks.training_task("group_mean", 1, "dirty")


def test_the_heldout_suite_is_disjoint_by_construction():
    suite = tasks.heldout_suite(2, ("clean", "mixed"), 0)
    assert len(suite) == 3 * 2 * 2 and [t.track for t in suite[::4]] == list(tables.TASK_FAMILIES)
    assert len({t.task_id for t in suite}) == len(suite)
    held_names = set(tables.HELDOUT_VOCAB.categories + tables.HELDOUT_VOCAB.numeric)
    for t in suite:
        assert t.task_id.startswith("ho-") and t.seed >= tasks.HELDOUT_SEED_BASE
        assert set(t.table.header[1:]) <= held_names
    other = tasks.heldout_suite(2, ("clean", "mixed"), 1)
    assert not {t.task_id for t in suite} & {t.task_id for t in other}
    assert [t.track for t in tasks.heldout_suite(1, ("clean",), 0, ["filtered_median"])] == ["filtered_median"]


def test_the_manifest_guards_heldout_ids_and_passes_training_text():
    suite = tasks.heldout_suite(1, ("missing",), 0)
    man = tasks.manifest(suite)
    assert man["version"] == tasks.MANIFEST_VERSION
    assert [t["task_id"] for t in man["tasks"]] == [t.task_id for t in suite]
    scanner = LeakageScanner(HeldOutManifest.from_task_manifest(man))
    assert scanner.scan_text(f"a row that names {suite[0].task_id} leaks") == [("task_id", suite[0].task_id)]
    train = tasks.training_task(suite[0].track, 5, "missing")
    assert scanner.scan_text(train.brief + train.table.csv_bytes().decode()) == []
    assert scanner.scan_text(suite[0].brief.replace(suite[0].task_id, "x")) == []  # the template identifies nothing
