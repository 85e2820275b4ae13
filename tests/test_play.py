"""Playing one episode of a staged benchmark (bat_jax/rollout/play.py): an E2E episode's stages in order, the
boundary state a stage focus starts from, a stage focus scored on its stage only, the diagnosis ablation, unknown
foci refused."""

import json

import pytest

from bat_jax.rollout.play import play, stage_start_state
from bat_jax.sandbox.backends import local_sandbox
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.registry import get_track
from bat_jax.benchmarks.imaging.stages import Stage
from bat_jax.benchmarks.imaging.teacher import ScriptedExpert

IMAGING = ImagingBenchmark()
SEG = get_track("segmentation")


@pytest.fixture(scope="module")
def recovery_task():
    return SEG.generate(21, "recovery")


@pytest.fixture(scope="module")
def s3_start(recovery_task):
    return stage_start_state(local_sandbox, IMAGING, recovery_task, ScriptedExpert(), "S3")


def test_e2e_episode_records_stages_in_order(recovery_task):
    result = play(IMAGING, recovery_task, ScriptedExpert())
    ep = result.episode
    bounds = ep.boundaries()
    assert list(bounds) == ["S1", "S2", "S3", "S4", "S5"]
    assert list(bounds.values()) == sorted(bounds.values()) and bounds["S1"] == 0
    assert ep.turns[-1].action.tool == "submit" and ep.end_reason == "stop"
    record = json.loads(json.dumps(ep.to_dict()))
    assert record["turns"][0]["action"] == {"thought": "Read the brief first.", "tool": "execute_code",
                                            "arguments": {"language": "bash", "code": "cat task.md"}}
    assert recovery_task.task_id in record["turns"][0]["observation"]
    assert result.score.reward == pytest.approx(0.5 * 1.0 + 0.5 * result.score.task)


def test_stage_start_state_is_the_boundary(recovery_task, s3_start):
    L = recovery_task.layout
    assert L.plan_path in s3_start.files and L.env_json in s3_start.files
    assert L.validation_json not in s3_start.files
    assert not any(p.startswith(L.pred_dir) for p in s3_start.files)


def test_stage_focus_is_scored_on_that_stage_only(recovery_task, s3_start):
    result = play(IMAGING, recovery_task, ScriptedExpert(), focus="S3", start_state=s3_start)
    assert list(result.score.verdicts) == [Stage.VALIDATE] and result.score.task is None  # the metric is E2E's
    assert {t.stage for t in result.episode.turns} == {Stage.VALIDATE}
    assert result.score.reward == pytest.approx(1.0)


def test_the_first_stages_start_state_is_the_tasks_initial_state(recovery_task):
    assert stage_start_state(local_sandbox, IMAGING, recovery_task, ScriptedExpert(), "S1") == recovery_task.state()


def test_unknown_foci_and_stages_are_refused(recovery_task):
    with pytest.raises(ValueError, match="S9"):
        play(IMAGING, recovery_task, ScriptedExpert(), focus="S9")
    with pytest.raises(ValueError, match="S9"):
        stage_start_state(local_sandbox, IMAGING, recovery_task, ScriptedExpert(), "S9")


def test_removing_the_diagnosis_step_loses_validate_credit(recovery_task, s3_start):
    full = play(IMAGING, recovery_task, ScriptedExpert(), focus="S3", start_state=s3_start)
    ablated = play(IMAGING, recovery_task, ScriptedExpert(diagnose=False), focus="S3", start_state=s3_start)
    v = ablated.score.verdicts[Stage.VALIDATE]
    assert v.items["validate.issues"] is False and v.eta == pytest.approx(1.0)
    # 3 of 4 Validate items pass with all evidence present → r = 1 · 3/4
    assert v.reward == pytest.approx(0.75) and full.score.reward - v.reward == pytest.approx(0.25)
