"""The one episode loop for action-level policies (`bat_jax.rollout.action_loop`): scripted and portable experts
on fixed seeds, stage attribution, `stop_before`, `on_stage_start`, rejections, 'stop' and `max_turns`, and the
Data Factory's bank digest.

The recorded fingerprints (sha256 of the episode record's sorted JSON with the host's numpy / Python versions masked,
first 16 hex digits) and bank digest are those of the turn-by-turn loop this one replaced, which gave identical
episodes, scores and digests on these seeds. A change to a fingerprint means an episode changed: a teacher, task or
observation format change must update them on purpose.
"""

import hashlib
import json
import platform

import numpy
import pytest

from bat_jax.benchmark.stages import E2E
from bat_jax.benchmarks.imaging.stages import STAGES, Stage
from bat_jax.rollout.action_loop import ActionEpisodeRequest, run_action_episode, run_action_episodes
from bat_jax.sandbox.tools import Action
from bat_jax.staged_benchmark.episode import PolicyError, collect_evidence
from bat_jax.sandbox.backends import local_sandbox
from bat_jax.benchmarks.imaging.portable_expert import PortableExpert
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.registry import get_track
from bat_jax.benchmarks.imaging.rubric import build_rubric
from bat_jax.benchmarks.imaging.teacher import ScriptedExpert
from bat_jax.verify.rubric import score

IMAGING = ImagingBenchmark()


# The local backend runs the experts' code on the host's Python; the episodes print the numpy and Python versions
# they observe (S2 records them), so a local episode's fingerprint masks the host's versions: it names the episode,
# not the machine. Docker episodes see the image's versions, which are part of the episode.
HOST_VERSIONS = ((numpy.__version__, "<host numpy>"), (platform.python_version(), "<host python>"))


def _fingerprint(record: dict, host_masked: bool = True) -> str:
    text = json.dumps(record, sort_keys=True)
    for version, mask in HOST_VERSIONS if host_masked else ():
        text = text.replace(f'"{version}"', f'"{mask}"').replace(f"'{version}'", f"'{mask}'").replace(
            f'\\"{version}\\"', f'\\"{mask}\\"')
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _played(track_name, seed, variant, make_policy, **kwargs):
    """(episode record, EpisodeScore) of one episode through `run_action_episode` in a local sandbox."""
    track = get_track(track_name)
    inst = track.generate(seed, variant)
    start = inst.state()
    box = local_sandbox(start)
    focus = kwargs.pop("focus", E2E)
    try:
        episode = run_action_episode(make_policy(), box, inst.brief, inst.task_id, STAGES, IMAGING.row_skill(focus),
                                     focus, **kwargs)
        evidence = collect_evidence(box, start=start)
    finally:
        box.close()
    task = track.score_task(inst, evidence.files, evidence.submitted)
    return episode.to_dict(), score(build_rubric(track, inst), evidence, task, focus)


# (track, seed, variant, policy, recorded fingerprint, turns, task metric)
CASES = [("segmentation", 21, "recovery", ScriptedExpert, "b48750dd4ca5aaed", 13, 1.0),
         ("classification", 5, "success", ScriptedExpert, "c12a9e6c559554a7", 12, 1.0),
         ("vqa", 3, "success", PortableExpert, "5319461679e55884", 6, 1.0),
         ("segmentation", 8, "success", PortableExpert, "691b86761705b6ba", 6, 0.999408)]


@pytest.mark.parametrize("track_name,seed,variant,policy,fingerprint,turns,task", CASES)
def test_experts_give_the_recorded_episode_and_score(track_name, seed, variant, policy, fingerprint, turns, task):
    record, episode_score = _played(track_name, seed, variant, policy)
    cell = episode_score.to_cell(track_name, 0, STAGES)
    assert (_fingerprint(record), len(record["turns"])) == (fingerprint, turns)
    assert record["end_reason"] == "stop" and list(record["boundaries"]) == ["S1", "S2", "S3", "S4", "S5"]
    assert record["turns"][-1]["action"]["tool"] == "submit"
    assert dict(cell.stage_scores) == {s: 1.0 for s in ("S1", "S2", "S3", "S4", "S5")}
    assert cell.task == pytest.approx(task, abs=1e-6)


def test_stop_before_ends_at_the_boundary_and_calls_on_stage_start():
    calls = []
    record, _ = _played("segmentation", 21, "recovery", ScriptedExpert, stop_before=Stage.INFERENCE,
                        on_stage_start=lambda stage, box: calls.append((stage, sorted(box.list_files()))))
    assert (_fingerprint(record), len(record["turns"])) == ("d43cc007ba2cfcb5", 9)
    assert record["end_reason"] == "boundary S4" and list(record["boundaries"]) == ["S1", "S2", "S3"]
    assert [stage for stage, _ in calls] == ["S1", "S2", "S3"]
    assert all("task.md" in files for _, files in calls)  # called on the live sandbox, before the stage ran
    s2_files, s3_files = calls[1][1], calls[2][1]
    assert set(s2_files) < set(s3_files)  # S2's actions wrote files that the S3 hook sees


def test_single_stage_focus_max_turns():
    record, episode_score = _played("segmentation", 21, "recovery", ScriptedExpert, focus=Stage.PLAN, max_turns=2)
    assert _fingerprint(record) == "9c29118c7cfbb037"
    assert record["end_reason"] == "max_turns" and len(record["turns"]) == 2
    assert {t["stage"] for t in record["turns"]} == {"S1"}
    assert episode_score.stage_rewards() == {"S1": pytest.approx(4 / 9)}


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
            expected.append(run_action_episode(policy(), box, inst.brief, inst.task_id, STAGES,
                                               IMAGING.row_skill(E2E)).to_dict())
        finally:
            box.close()
    assert [e["end_reason"] for e in expected] == ["stop", "rejected", "stop"]
    assert expected[1]["rejected"] == "teacher timeout: endpoint gone" and expected[1]["boundaries"] == {"S2": 0}
    for schedule in ("lockstep", "continuous"):
        boxes = [local_sandbox(inst.state()) for _ in range(3)]
        try:
            requests = [ActionEpisodeRequest(p(), box, inst.brief, inst.task_id, STAGES, IMAGING.row_skill(E2E), E2E)
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
        ActionEpisodeRequest(ScriptedExpert(), None, "", "t", STAGES, "", max_turns=-1)


# The factory's episodes run in the local backend on the host's Python: its rows carry the numpy version the teacher
# observed, so the digest is recorded per host numpy (2.3.5: launch/constraints/cpu.txt). Re-recorded when the
# provided imaging methods began writing floats at 12 significant digits (classification scores changed text).
RECORDED_BANK_DIGEST = {"2.3.5": "fb826c523a8bfd7f"}


def test_factory_bank_digest_is_the_recorded_one(tmp_path):
    from bat_jax.stage_bank import factory

    assert numpy.__version__ in RECORDED_BANK_DIGEST, f"no digest recorded for host numpy {numpy.__version__}"
    tiny = dict(tracks=("classification",), foci=("E2E", "S3"), outcomes=("recovery",), workers=2)
    built = factory.build_bank(factory.FactoryConfig(bank_dir=str(tmp_path / "bank"), **tiny), IMAGING,
                               progress=False)
    assert built.rejected == {} and built.version == 1
    assert (built.digest[:16], built.sft_rows, built.rl_by_focus) == (
        RECORDED_BANK_DIGEST[numpy.__version__], 43, {"E2E": 1, "S3": 1})


@pytest.mark.docker
def test_portable_expert_in_docker_gives_the_recorded_episode_and_score():
    from bat_jax.sandbox.backends import BackendUnavailable, backend_factory

    try:
        make = backend_factory("docker")
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    inst = get_track("vqa").generate(3, "success")
    box = make(inst.state())
    try:
        episode = run_action_episode(PortableExpert(), box, inst.brief, inst.task_id, STAGES, IMAGING.row_skill(E2E))
        evidence = collect_evidence(box, start=inst.state())
    finally:
        box.close()
    task = get_track("vqa").score_task(inst, evidence.files, evidence.submitted)
    cell = score(build_rubric(get_track("vqa"), inst), evidence, task).to_cell("vqa", 0, STAGES)
    assert _fingerprint(episode.to_dict(), host_masked=False) == "217f63c53567a802" and episode.end_reason == "stop"
    assert cell.agentic(STAGES) == 1.0 and cell.task == 1.0
