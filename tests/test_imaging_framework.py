"""Common framework: baselines, action parsing, the OpenAI-compatible teacher client
(against a local fake server)."""

import json

import pytest
from openai_stub import FakeChatServer

from bat_jax.clients.chat_endpoint import ChatEndpointConfig

from bat_jax.benchmark.stages import E2E
from bat_jax.benchmarks.imaging.stages import STAGES
from bat_jax.rollout.action_loop import run_action_episode
from bat_jax.sandbox.tools import Action
from bat_jax.staged_benchmark.episode import Conversation, PolicyError
from bat_jax.sandbox.backends import local_sandbox
from bat_jax.rollout.play import play
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.registry import get_track
from bat_jax.benchmarks.imaging.teacher import ChatTeacher, RandomCommandPolicy, ScriptedExpert

IMAGING = ImagingBenchmark()
SEG = get_track("segmentation")


def test_random_commands_score_at_most_ten_percent():
    for name in ("detection", "vqa"):
        track = get_track(name)
        cell = play(IMAGING, track.generate(30), RandomCommandPolicy(seed=2, n_turns=5)).score.to_cell(name, 0,
                                                                                                      STAGES)
        assert cell.task == 0.0 and cell.agentic(STAGES) <= 0.10


def test_action_parsing_names_bad_fields():
    a = Action.from_dict({"thought": "t", "tool": "submit", "arguments": {"path": "x.json"}})
    assert a.to_dict() == {"thought": "t", "tool": "submit", "arguments": {"path": "x.json"}}
    with pytest.raises(ValueError, match="action.tool"):
        Action.from_dict({"tool": "rm"})
    with pytest.raises(ValueError, match="language"):
        Action.from_dict({"tool": "execute_code", "arguments": {"code": "ls"}})


def _reply(action):
    return {"choices": [{"message": {"role": "assistant", "content": "Sure:\n" + json.dumps(action)}}]}


def test_chat_teacher_parses_actions_and_retries(monkeypatch):
    monkeypatch.setenv("BAT_TEST_KEY", "sk-test")
    action = {"thought": "look", "tool": "execute_code", "arguments": {"language": "bash", "code": "ls"}}
    server = FakeChatServer([(503, {}), (200, _reply(action))])
    sleeps = []
    try:
        teacher = ChatTeacher(ChatEndpointConfig(server.url, "m1", "BAT_TEST_KEY", timeout_s=5,
                                                 max_retries=2, backoff_s=0.5), sleep=sleeps.append)
        got = teacher(Conversation("brief", E2E, IMAGING.row_skill(E2E), STAGES))
    finally:
        server.close()
    assert got.to_dict() == action and got.stage is None and sleeps == [0.5]
    path, auth, body = server.requests[-1]
    assert path == "/v1/chat/completions" and auth == "Bearer sk-test" and body["model"] == "m1"
    assert body["messages"][0]["role"] == "system" and "brief" in body["messages"][1]["content"]


def test_chat_teacher_failures_are_rejections():
    recovery_task = SEG.generate(21, "recovery")
    server = FakeChatServer([(500, {}), (500, {}), (200, {"choices": [{"message": {"content": "no json"}}]})])
    try:
        teacher = ChatTeacher(ChatEndpointConfig(server.url, "m", "", timeout_s=5, max_retries=1,
                                                 backoff_s=0.1), sleep=lambda s: None)
        with pytest.raises(PolicyError, match="unreachable"):
            teacher(Conversation("b", E2E, IMAGING.row_skill(E2E), STAGES))
        box = local_sandbox(recovery_task.state())
        try:
            ep = run_action_episode(teacher, box, recovery_task.brief, recovery_task.task_id, STAGES,
                                    IMAGING.row_skill(E2E))
        finally:
            box.close()
        result = play(IMAGING, recovery_task, teacher)  # the server now answers 500: rejected → unscored
    finally:
        server.close()
    assert ep.end_reason == "rejected" and ep.rejected.startswith("teacher bad_reply")
    assert result.episode.rejected.startswith("teacher unreachable")
    assert result.score.reward is None and result.score.task is None
    assert result.score.to_cell("segmentation", 0, STAGES).scored(STAGES) is False
