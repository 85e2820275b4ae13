"""The tabular suite as a staged benchmark: its definition validates and reads as four stages, three families and
four variants; its teacher kinds and recipe; and its run file `gin/tabular_tiny.gin` runs bank → SFT → BiCuRL →
final evaluation (shortened by bindings) with a ledger, staircase and report in its own stages."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from bat_jax.staged_benchmark.contract import describe
from bat_jax.benchmarks.tabular.benchmark import TabularBenchmark
from doubles import tabular_micro_bindings

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_the_definition():
    bench = TabularBenchmark()
    bench.validate()
    d = describe(bench)
    assert [(s["id"], s["weight"]) for s in d["stages"]] == [("inspect", 0.2), ("clean", 0.3), ("analyse", 0.3),
                                                              ("report", 0.2)]
    assert list(d["tracks"]) == ["group_mean", "filtered_median", "top_corr"]
    assert d["variants"] == ["clean", "missing", "duplicates", "mixed"] and d["has_e2e_surrogate"] is False
    assert bench.eval_variants() == ("clean", "missing", "duplicates", "mixed")
    assert d["late_stages"] == ["analyse", "report"] and bench.recipe("scripted") == "teacher=scripted/v3"
    assert TabularBenchmark() == bench  # no settings: equal objects


def test_row_prompts_name_its_stages():
    bench = TabularBenchmark()
    task = bench.training_task("group_mean", 1, "clean")
    prompt = bench.row_prompt(task, "analyse")
    assert "boundary of stage analyse" in prompt and "already completed in this workspace: inspect, clean" in prompt
    assert bench.row_skill("E2E").split("\n\n")[0].startswith("Stage inspect")


def test_unknown_teacher_is_refused():
    with pytest.raises(ValueError, match="benchmark 'tabular' has no teacher 'openai'"):
        TabularBenchmark().teacher("openai")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["bicurl", "grpo_e2e"])
def test_its_whole_loop_runs_from_its_gin_file(tmp_path, mode):
    """`python -m bat_jax.launch --gin_file=tabular_tiny.gin`, shortened by bindings (micro model, local sandboxes,
    2 of 3 families, 1 round of 1 GRPO step): bank → SFT → BiCuRL (or the GRPO-E2E baseline, by one binding) → final
    evaluation, and the ledger, the staircase and the report name its stages."""
    bindings = tabular_micro_bindings(tmp_path / "bank", ("group_mean", "top_corr")) + [
        f"experiment.BiCuRLConfig.mode = '{mode}'"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "bat_jax.launch", f"--gin_search_paths={REPO / 'gin'}",
           "--gin_file=tabular_tiny.gin", f"--run_dir={run_dir}"] + [f"--gin_bindings={b}" for b in bindings]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (record,) = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    stages = ["inspect", "clean", "analyse", "report"]
    assert set(record["routing_report"]["scores_in"]) == set(stages)
    if mode == "bicurl":
        assert record["selected_stage"] in stages
    text = (run_dir / "report.md").read_text()
    assert text.startswith("# BiCuRL run report: tabular") and all(s in text for s in stages)
    final = json.loads((run_dir / "summary.json").read_text())["final"]
    assert list(final) == ["untrained", "SFT", "BiCuRL (retained)" if mode == "bicurl" else "GRPO (E2E task reward)"]
    for system in final.values():  # every family is evaluated, in the benchmark's stages
        assert sorted(system["tracks"]) == ["filtered_median", "group_mean", "top_corr"]
        assert list(system["stages"]) == stages
    assert (run_dir / "staircase.png").stat().st_size > 0
