"""The held-out evaluator (bicurl/evaluation.py): only aggregates leave; disjoint controller / final runs; cell runners
count scored agent failures apart from unscored cells; the external adapter."""

import dataclasses
import sys

import pytest

from bat_jax.bicurl import evaluation as evaluator
from bat_jax.benchmark.scoring import Cell, Summary
from bat_jax.sandbox.backends import local_sandbox
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.stages import STAGES
from bat_jax.benchmarks.imaging.teacher import DoNothingPolicy, ScriptedExpert
from doubles import failed_trajectory

IMAGING = ImagingBenchmark()


def test_controller_and_final_runs_are_disjoint():
    cfg = evaluator.EvalConfig(repeats=3, tracks=("segmentation", "vqa"))
    controller = evaluator.suite_jobs(cfg, IMAGING)
    final = evaluator.suite_jobs(evaluator.EvalConfig(repeats=3, tracks=("segmentation", "vqa"), purpose="final"),
                                 IMAGING)
    assert len(controller) == len(final) == 2 * 3
    assert not {j.task.task_id for j in controller} & {j.task.task_id for j in final}
    assert not {j.seed for j in controller} & {j.seed for j in final}
    # repeats cycle over the variants: success, recovery, success
    assert [j.task.variant for j in controller if j.track == "vqa"] == ["success", "recovery", "success"]
    assert all(j.task.task_id.startswith("hx") for j in controller)


def test_dev_suite_is_disjoint_from_the_test_suite_and_in_the_manifest():
    """final_suite='dev' plays its own suite seed (2): tasks and policy seeds disjoint from the controller's and the
    test suite's; the leakage manifest names all three suites' tasks."""
    base = evaluator.EvalConfig(repeats=2, tracks=("segmentation", "vqa"), purpose="final")
    test = evaluator.suite_jobs(base, IMAGING)
    dev = evaluator.suite_jobs(dataclasses.replace(base, final_suite="dev"), IMAGING)
    controller = evaluator.suite_jobs(dataclasses.replace(base, purpose="controller"), IMAGING)
    assert base.suite_seed == 1 and dataclasses.replace(base, final_suite="dev").suite_seed == 2
    assert dataclasses.replace(base, purpose="controller", final_suite="dev").suite_seed == 0
    ids = [{j.task.task_id for j in jobs} for jobs in (test, dev, controller)]
    assert len(dev) == 4 and not ids[1] & ids[0] and not ids[1] & ids[2]
    assert {j.seed for j in dev} == {2 * 1_000_003, 2 * 1_000_003 + 1}
    listed = {t["task_id"] for t in evaluator.heldout_manifest(base, IMAGING)["tasks"]}
    assert ids[0] | ids[1] | ids[2] <= listed
    with pytest.raises(ValueError, match="final_suite must be one of.*got 'val'"):
        evaluator.EvalConfig(final_suite="val")


def test_bad_purpose_is_named():
    with pytest.raises(ValueError, match="purpose.*'nightly'"):
        evaluator.EvalConfig(purpose="nightly")


@pytest.mark.slow
def test_scripted_expert_beats_do_nothing_on_two_tracks():
    cfg = evaluator.EvalConfig(repeats=2, tracks=("segmentation", "classification"), max_workers=2)
    expert = evaluator.evaluate(evaluator.PolicyCells(IMAGING, lambda seed: ScriptedExpert(), local_sandbox,
                                                      progress=False), cfg, IMAGING)
    idle = evaluator.evaluate(evaluator.PolicyCells(IMAGING, lambda seed: DoNothingPolicy(), local_sandbox,
                                                    progress=False), cfg, IMAGING)
    assert isinstance(expert, Summary)
    assert expert.overall >= 0.9 and idle.overall <= 0.1
    assert set(expert.tracks) == {"segmentation", "classification"} and expert.n_unscored == 0


def test_evaluate_returns_the_aggregate_of_the_runner_cells():
    def runner(jobs):
        return [Cell(j.track, j.repeat, {s: 0.5 for s in STAGES.ids}, task=1.0 if j.track == "vqa" else 0.0)
                for j in jobs]

    summary = evaluator.evaluate(runner, evaluator.EvalConfig(repeats=2, tracks=("vqa", "synthesis")), IMAGING)
    assert summary.task == pytest.approx(0.5) and summary.agentic == pytest.approx(0.5)
    assert summary.overall == pytest.approx(0.5)


def _write_script(tmp_path, records):
    script = tmp_path / "bench.py"
    script.write_text("import json, sys\n"
                      f"json.dump({records!r}, open(sys.argv[2], 'w'))\n"
                      "print('scored', sys.argv[1])\n")
    return script


def test_external_evaluator_reads_cells_back(tmp_path):
    records = [
        {"track": "a", "repeat": 0, "stages": {"S1": 100, "S2": 100, "S3": 100, "S4": 100, "S5": "n/a"}, "task": 50},
        {"track": "b", "repeat": 0, "stages": {"S1": 0, "S2": 0, "S3": 0, "S4": 0, "S5": 0}, "task": 0},
        {"track": "b", "repeat": 1, "stages": {"S1": 0, "S2": None, "S3": 0, "S4": 0, "S5": 0}, "task": 0},
    ]
    script = _write_script(tmp_path, records)
    ext = evaluator.ExternalEvaluator(argv=(sys.executable, str(script), "{checkpoint}", "{output}"), scale=100.0)
    summary = ext("/ckpt/7", tmp_path, STAGES)
    # track a: agentic 1.0 (S5 n/a renormalised), task 0.5 → overall 0.75; track b: 0 (unscored repeat dropped)
    assert summary.tracks["a"]["overall"] == pytest.approx(0.75)
    assert summary.overall == pytest.approx(0.375)
    assert summary.n_unscored == 1


def test_external_evaluator_errors_name_the_record(tmp_path):
    script = _write_script(tmp_path, [{"track": "a", "repeat": 0, "stages": {"S1": 1}, "task": 0.5}])
    ext = evaluator.ExternalEvaluator(argv=(sys.executable, str(script), "{checkpoint}", "{output}"))
    with pytest.raises(ValueError, match=r"record 0: field 'stages' has no S2"):
        ext("ck", tmp_path, STAGES)
    failing = evaluator.ExternalEvaluator(argv=(sys.executable, "-c", "import sys; sys.exit(3)"))
    with pytest.raises(RuntimeError, match="exited 3"):
        failing("ck", tmp_path, STAGES)


def test_final_repeats_apply_to_the_final_evaluation_only():
    from bat_jax.bicurl.run_loops import eval_cells

    cfg = evaluator.EvalConfig(repeats=1, final_repeats=4, tracks=("segmentation", "vqa"))
    controller = evaluator.suite_jobs(cfg, IMAGING)
    final = evaluator.suite_jobs(dataclasses.replace(cfg, purpose="final"), IMAGING)
    assert len(controller) == 2 * 1 and len(final) == 2 * 4
    assert [j.repeat for j in final if j.track == "vqa"] == [0, 1, 2, 3]
    # 4 repeats over (success, recovery): two tasks of each variant per track, every repeat its own policy seed
    assert [j.task.variant for j in final if j.track == "vqa"] == ["success", "recovery", "success", "recovery"]
    assert len({j.task.task_id for j in final}) == 8 and len({j.seed for j in final}) == 4
    # the held-out manifest guards the tasks of both purposes (and the final dev suite); the warm pool fits the
    # larger evaluation
    assert len(evaluator.heldout_manifest(cfg, IMAGING)["tasks"]) == 2 + 8 + 8
    assert eval_cells(cfg, IMAGING) == 8
    assert evaluator.EvalConfig(repeats=3).purpose_repeats == 3  # final_repeats None: repeats for both
    with pytest.raises(ValueError, match="final_repeats"):
        evaluator.EvalConfig(final_repeats=0)


class _Loop:
    """An AgentLoop stand-in: returns one prepared trajectory per request, in request order."""

    def __init__(self, errors):
        self.errors = errors

    def run(self, requests, seed=0):
        return [failed_trajectory(req.state_id, *self.errors[i]) for i, req in enumerate(requests)]


def test_engine_cells_count_scored_agent_failed_cells(capsys):
    from bat_jax.bicurl.evaluation import EngineCells

    jobs = evaluator.suite_jobs(evaluator.EvalConfig(repeats=4, tracks=("vqa",)), IMAGING)
    errors = [("", ""), ("sandbox died after agent code", ""), ("", "engine down"),
              ("sandbox died after agent code", "engine down")]
    runner = EngineCells(_Loop(errors), IMAGING)
    cells = runner(jobs)
    assert [c.scored(STAGES) for c in cells] == [True, True, False, False]
    assert runner.agent_failed == 1  # the agent-failed cell is scored; the one also hit by infra is unscored
    assert capsys.readouterr().out.splitlines() == [
        "[bat_jax] warning: 2 held-out cells unscored by infrastructure failures (left out of the means); 2 of them: "
        "engine down"]
    config = evaluator.EvalConfig(repeats=4, tracks=("vqa",))
    summary = evaluator.evaluate(EngineCells(_Loop(errors), IMAGING), config, IMAGING)
    assert (summary.n_cells, summary.n_unscored) == (4, 2)
    assert runner(jobs[:1]) and runner.agent_failed == 0  # reset by each call


def test_policy_cells_count_scored_agent_failed_cells(monkeypatch):
    from types import SimpleNamespace

    from bat_jax.verify.rubric import Evidence

    outcomes = iter([("", 0.5), ("sandbox died after agent code", 0.0), ("sandbox died after agent code", None)])

    def fake_play(benchmark, task, policy, make_sandbox=None, max_turns=24):
        assert benchmark is IMAGING and task.track == "vqa"
        agent_error, value = next(outcomes)

        def cell(track, repeat, stages):
            return Cell(track, repeat, {s: value for s in stages.ids}, task=value)

        return SimpleNamespace(evidence=Evidence((), {}, None, agent_error=agent_error),
                               score=SimpleNamespace(to_cell=cell))

    monkeypatch.setattr(evaluator, "play", fake_play)
    runner = evaluator.PolicyCells(IMAGING, lambda seed: None, None, max_workers=1, progress=False)
    cells = runner(evaluator.suite_jobs(evaluator.EvalConfig(repeats=3, tracks=("vqa",)), IMAGING))
    assert [c.scored(STAGES) for c in cells] == [True, True, False] and runner.agent_failed == 1


