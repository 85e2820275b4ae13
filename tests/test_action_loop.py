"""Action-level policies through the agent loop's schedules (`bat_jax.rollout.action_loop`) give the same
episodes and scores as `run_episode` (issue #17, step 3): scripted and portable experts on fixed seeds, stage
attribution, `stop_before`, `on_stage_start`, rejections, 'stop' and `max_turns`."""

import pytest

from bat_jax.benchmark.stages import E2E, STAGES, Stage
from bat_jax.rollout.action_loop import ActionEpisodeRequest, run_action_episode, run_action_episodes
from bat_jax.sandbox.tools import Action
from bat_jax.tasks.episode import PolicyError, collect_evidence, run_episode
from bat_jax.tasks.harness import local_sandbox
from bat_jax.tasks.portable_expert import PortableExpert
from bat_jax.tasks.registry import get_track
from bat_jax.tasks.rubric_items import build_rubric
from bat_jax.tasks.teacher import ScriptedExpert
from bat_jax.verify.rubric import score


def _played(run, track_name, seed, variant, make_policy, **kwargs):
    """(episode record, EpisodeScore) of one episode of `run` (run_episode or run_action_episode)."""
    track = get_track(track_name)
    inst = track.generate(seed, variant)
    start = inst.state()
    box = local_sandbox(start)
    stages = kwargs.pop("stages", STAGES)
    try:
        episode = run(make_policy(), box, inst.brief, inst.task_id, **kwargs)
        evidence = collect_evidence(box, start=start)
    finally:
        box.close()
    task = track.score_task(inst, evidence.files, evidence.submitted)
    return episode.to_dict(), score(build_rubric(track, inst), evidence, task, stages)


CASES = [("segmentation", 21, "recovery", ScriptedExpert), ("classification", 5, "success", ScriptedExpert),
         ("vqa", 3, "success", PortableExpert), ("segmentation", 8, "success", PortableExpert)]


@pytest.mark.parametrize("track_name,seed,variant,policy", CASES)
def test_experts_give_the_same_episode_and_score_as_run_episode(track_name, seed, variant, policy):
    old = _played(run_episode, track_name, seed, variant, policy)
    new = _played(run_action_episode, track_name, seed, variant, policy)
    assert new == old
    record, cell = new[0], new[1].to_cell(track_name, 0)
    assert record["end_reason"] == "stop" and list(record["boundaries"]) == ["S1", "S2", "S3", "S4", "S5"]
    assert record["turns"][-1]["action"]["tool"] == "submit"
    assert cell.agentic() >= 0.9 and cell.task is not None and cell.task > 0.5  # experts: a real, scored run


def test_stop_before_and_on_stage_start_match_run_episode():
    calls = {"old": [], "new": []}

    def hook(key):
        return lambda stage, box: calls[key].append((stage.value, sorted(box.list_files())))

    old = _played(run_episode, "segmentation", 21, "recovery", ScriptedExpert, stop_before=Stage.INFERENCE,
                  on_stage_start=hook("old"))
    new = _played(run_action_episode, "segmentation", 21, "recovery", ScriptedExpert,
                  stop_before=Stage.INFERENCE, on_stage_start=hook("new"))
    assert new == old and calls["new"] == calls["old"]
    assert new[0]["end_reason"] == "boundary S4" and list(new[0]["boundaries"]) == ["S1", "S2", "S3"]
    assert [stage for stage, _ in calls["new"]] == ["S1", "S2", "S3"]


def test_single_stage_focus_max_turns_matches_run_episode():
    old = _played(run_episode, "segmentation", 21, "recovery", ScriptedExpert, focus="S1", max_turns=2,
                  stages=(Stage.PLAN,))
    new = _played(run_action_episode, "segmentation", 21, "recovery", ScriptedExpert, focus="S1", max_turns=2,
                  stages=(Stage.PLAN,))
    assert new == old and new[0]["end_reason"] == "max_turns" and len(new[0]["turns"]) == 2
    assert {t["stage"] for t in new[0]["turns"]} == {"S1"} and set(new[1].stage_rewards()) == {Stage.PLAN}


class _RejectsSecond:
    """One command (stage S2), then a PolicyError."""

    def __init__(self):
        self.calls = 0

    def __call__(self, conv):
        self.calls += 1
        if self.calls > 1:
            raise PolicyError("teacher timeout: endpoint gone")
        return Action("look", "execute_code", {"language": "bash", "code": "ls"}, Stage.SETUP)


def test_policy_error_is_a_rejected_episode_in_a_batch_of_both_schedules():
    inst = get_track("segmentation").generate(21, "recovery")
    expected = []
    for policy in (ScriptedExpert, _RejectsSecond, lambda: (lambda conv: None)):
        box = local_sandbox(inst.state())
        try:
            expected.append(run_episode(policy(), box, inst.brief, inst.task_id).to_dict())
        finally:
            box.close()
    assert [e["end_reason"] for e in expected] == ["stop", "rejected", "stop"]
    assert expected[1]["rejected"] == "teacher timeout: endpoint gone" and expected[1]["boundaries"] == {"S2": 0}
    for schedule in ("lockstep", "continuous"):
        boxes = [local_sandbox(inst.state()) for _ in range(3)]
        try:
            requests = [ActionEpisodeRequest(p(), box, inst.brief, inst.task_id, E2E)
                        for p, box in zip((ScriptedExpert, _RejectsSecond, lambda: (lambda conv: None)), boxes)]
            got = [ep.to_dict() for ep in run_action_episodes(requests, schedule=schedule, max_workers=3)]
        finally:
            for box in boxes:
                box.close()
        assert got == expected, schedule


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="schedule"):
        run_action_episodes([], schedule="async")
    with pytest.raises(ValueError, match="max_turns"):
        ActionEpisodeRequest(ScriptedExpert(), None, "", "t", max_turns=-1)


def test_factory_bank_digest_is_the_same_through_the_action_loop(tmp_path, monkeypatch):
    from bat_jax.stage_bank import factory

    tiny = dict(tracks=("classification",), foci=("E2E", "S3"), outcomes=("recovery",), workers=2)
    old = factory.build_bank(factory.FactoryConfig(bank_dir=str(tmp_path / "old"), **tiny), progress=False)
    monkeypatch.setattr(factory, "run_episode", run_action_episode)
    new = factory.build_bank(factory.FactoryConfig(bank_dir=str(tmp_path / "new"), **tiny), progress=False)
    assert old.rejected == {} and old.version == 1 and old.sft_rows > 0
    assert (new.digest, new.sft_rows, new.rl_by_focus) == (old.digest, old.sft_rows, old.rl_by_focus)


@pytest.mark.docker
def test_portable_expert_in_docker_gives_the_same_episode_and_score():
    from bat_jax.tasks.harness import BackendUnavailable, backend_factory

    try:
        make = backend_factory("docker")
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    inst = get_track("vqa").generate(3, "success")
    got = []
    for run in (run_episode, run_action_episode):
        box = make(inst.state())
        try:
            episode = run(PortableExpert(), box, inst.brief, inst.task_id)
            evidence = collect_evidence(box, start=inst.state())
        finally:
            box.close()
        task = get_track("vqa").score_task(inst, evidence.files, evidence.submitted)
        got.append((episode.to_dict(), score(build_rubric(get_track("vqa"), inst), evidence, task, STAGES)))
    assert got[1] == got[0] and got[1][0]["end_reason"] == "stop" and got[1][1].to_cell("vqa", 0).agentic() >= 0.9
