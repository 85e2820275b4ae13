"""Bring your own staged benchmark: the two-stage example that lives outside bat_jax (tests/fixtures/wordcount)
validates, its teacher solves it and a do-nothing policy does not, and its whole loop runs from its gin file through
the gin search path and the import path, without editing bat_jax."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from doubles.processes import without_fast_compile

FIXTURE = pathlib.Path(__file__).resolve().parent / "fixtures" / "wordcount"
REPO = FIXTURE.parents[2]


@pytest.fixture(scope="module")
def wordcount():
    sys.path.insert(0, str(FIXTURE))
    try:
        import wordcount as module

        yield module
    finally:
        sys.path.remove(str(FIXTURE))


def test_the_example_is_small_and_valid(wordcount):
    assert len((FIXTURE / "wordcount.py").read_text().splitlines()) <= 150
    bench = wordcount.WordCountBenchmark()
    bench.validate()
    assert bench.stages.ids == ("count", "submit") and bench.stages.foci == ("E2E", "count", "submit")
    train, held = bench.training_task("count", 7, "success"), bench.heldout_suite(2, ("success",), 1)
    assert train.task_id == "tr-count-7" and all(t.task_id.startswith("hx-") for t in held)
    assert len({t.task_id for t in held}) == 2 and not {t.seed for t in held} & {7}


def test_its_teacher_solves_it_and_doing_nothing_does_not(wordcount):
    from bat_jax.rollout.play import play

    bench = wordcount.WordCountBenchmark()
    task = bench.training_task("count", 3, "success")
    expert = play(bench, task, bench.teacher("scripted"))
    assert expert.score.reward == pytest.approx(1.0) and expert.score.task == 1.0
    assert {s: v.reward for s, v in expert.score.verdicts.items()} == {"count": 1.0, "submit": 1.0}
    idle = play(bench, task, lambda conversation: None)
    assert idle.score.reward == 0.0 and idle.score.task == 0.0
    staged = play(bench, task, bench.teacher("scripted"), focus="submit")  # starts after the teacher's count stage
    assert staged.score.reward == 1.0 and list(staged.score.verdicts) == ["submit"]


def test_a_guess_without_running_the_method_earns_no_count_credit(wordcount):
    from bat_jax.rollout.play import play
    from bat_jax.sandbox.tools import Action

    bench = wordcount.WordCountBenchmark()
    task = bench.training_task("count", 3, "success")
    forged = json.dumps({"word": task.word, "count": task.answer})  # the right answer, written without the method
    steps = iter([Action("Guess.", "execute_code", {"language": "bash", "code": f"echo '{forged}' > count.json"},
                         "count"), Action("Hand in.", "submit", {"path": "count.json"}, "submit")])
    result = play(bench, task, lambda conversation: next(steps, None))
    verdict = result.score.verdicts["count"]
    assert verdict.items == {"count.ran": False, "count.right": False} and verdict.reward == 0.0
    assert result.score.verdicts["submit"].reward == 1.0 and result.score.task == 1.0  # the metric checks the answer


BAD = """import dataclasses

import wordcount
from bat_jax.staged_benchmark.api import StagedBenchmark


@dataclasses.dataclass(frozen=True)
class Bad(wordcount.WordCountBenchmark):
    defect: str = ""

    def score_task(self, task, files, submitted, limits):
        return {"nan": float("nan"), "high": 1.7}.get(self.defect, 0.0)

    def manifest(self, tasks):
        return [t.task_id for t in tasks] if self.defect == "list" else super().manifest(tasks)


NoSuite = type("NoSuite", (StagedBenchmark,), {**{k: v for k, v in vars(wordcount.WordCountBenchmark).items()
                                                   if not k.startswith("__") and k != "heldout_suite"},
                                                "__module__": __name__})
"""
RUN = """from __gin__ import dynamic_registration
import bat_jax.launch as launch
import bat_jax.bicurl.experiment as experiment
import badbench

include 'plugin_base.gin'
launch.run.job = @experiment.run
launch.run.run_name = 'bad'
"""


@pytest.fixture(scope="module")
def badbench(tmp_path_factory, wordcount):
    """The module `badbench` (BAD) on the import path, imported once."""
    folder = tmp_path_factory.mktemp("badbench")
    (folder / "badbench.py").write_text(BAD)
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))


@pytest.mark.parametrize("bindings, line", [
    ([], "experiment.Components.benchmark (the staged benchmark to teach with, e.g. @imaging.ImagingBenchmark()) is "
         "required"),
    (["experiment.Components.benchmark = @badbench.Bad()", "badbench.Bad.defect = 'nan'"],
     "benchmark 'wordcount': score_task returned nan for task 'tr-count-0' (submitted None); it must return None or a "
     "number in [0, 1]"),
    (["experiment.Components.benchmark = @badbench.Bad()", "badbench.Bad.defect = 'high'"],
     "benchmark 'wordcount': score_task returned 1.7 for task 'tr-count-0' (submitted None); it must return None or a "
     "number in [0, 1]"),
    (["experiment.Components.benchmark = @badbench.Bad()", "badbench.Bad.defect = 'list'"],
     "benchmark 'wordcount': manifest(tasks) must return a dict {'tasks': [{'task_id': str, 'paths': [str], "
     "'cases': [dict]}]}, got a list"),
    (["experiment.Components.benchmark = @badbench.NoSuite()"],
     "benchmark 'wordcount' (badbench.NoSuite) does not implement heldout_suite (abstract methods of StagedBenchmark)"),
])
def test_a_plugin_that_cannot_work_stops_the_launch_with_one_line(tmp_path, capsys, badbench, bindings, line):
    """Through `launch` as `python -m bat_jax.launch` runs it (gin, the run directory, the job): each defect is one
    `[bat_jax] error:` line naming the benchmark and the field, exit status 2, before the bank or the policy."""
    import gin
    from absl import flags

    from bat_jax import launch

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    (tmp_path / "bad.gin").write_text(RUN + "".join(f"{b}\n" for b in bindings))  # in the file: gin registers
    try:
        with pytest.raises(SystemExit) as exit_info:
            launch.guarded(lambda: launch.launch([str(tmp_path / "bad.gin")], [], [str(FIXTURE)],
                                                 run_dir=str(tmp_path / "run")), several=False)
    finally:
        gin.clear_config(clear_constants=True)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"[bat_jax] error: {line}\n"
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
@pytest.mark.docker
def test_the_guides_command_runs_as_written(tmp_path):
    """The guide's command, unshortened, from a folder whose `tests/` is this checkout's (so `runs/` lands in
    tmp_path); this checkout first on PYTHONPATH after the fixture, as an installed package would be. It runs the
    plug-in base's sizes on the 3-row bank: bank → SFT → 2 rounds → final evaluation in about 5-9 minutes on 2
    cores (notes: measured under load)."""
    (tmp_path / "tests").symlink_to(REPO / "tests")
    env = {**without_fast_compile(dict(os.environ)),
           "PYTHONPATH": os.pathsep.join(["tests/fixtures/wordcount", str(REPO)])}
    cmd = [sys.executable, "-m", "bat_jax.launch", "--gin_search_paths=tests/fixtures/wordcount",
           "--gin_file=wordcount_tiny.gin"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ("[bat_jax] KL probe: 3 prompts, every RL row of the bank version (kl.PolicyShiftConfig.num_prompts = 32 "
            "asks for more)") in proc.stdout
    run_dir = tmp_path / "runs" / "wordcount_tiny"
    records = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [1, 2]
    assert all(r["selected_stage"] in ("count", "submit") for r in records)
    assert all(set(r["routing_report"]["scores_in"]) == {"count", "submit"} for r in records)
    assert all(r["eval_cells"] == 4 for r in records)  # 4 held-out episodes of the one family each round
    text = (run_dir / "report.md").read_text()
    assert text.startswith("# BiCuRL run report: wordcount") and "count Count" in text and "submit Submit" in text


def test_the_factory_reads_no_seed_from_a_task(wordcount, tmp_path):
    """`Task` declares task_id, track, brief and state(): a benchmark whose tasks carry no `seed` builds its bank, and
    each row's task_synthesis step records the seed the factory asked the benchmark for."""
    import dataclasses

    from bat_jax.stage_bank.bank import StageBank
    from bat_jax.stage_bank.factory import FactoryConfig, build_bank, sources

    @dataclasses.dataclass(frozen=True)
    class SeedlessTask:  # the contract's fields and what this benchmark's own rubric reads; no seed
        task_id: str
        track: str
        variant: str
        brief: str
        text: str
        word: str
        answer: int

        state = wordcount.Task.state

    class SeedlessBenchmark(wordcount.WordCountBenchmark):
        def training_task(self, track, seed, variant, template=0):
            task = super().training_task(track, seed, variant, template)
            return SeedlessTask(**{f.name: getattr(task, f.name) for f in dataclasses.fields(SeedlessTask)})

    bench = SeedlessBenchmark()
    assert not hasattr(bench.training_task("count", 3, "success"), "seed")
    cfg = FactoryConfig(bank_dir=str(tmp_path / "bank"), foci=("E2E", "count"), workers=1)
    built = build_bank(cfg, bench, progress=False)
    assert built.rejected == {} and built.version == 1
    seeds = {src.task_seed for src in sources(cfg, bench)}
    rows = StageBank(cfg.bank_dir).read().rl_rows
    recorded = {r.provenance.transformations[0].params["seed"] for r in rows}
    assert [r.provenance.transformations[0].name for r in rows] == ["task_synthesis"] * 2 and recorded == seeds
