"""Teachers and baselines of the imaging suite (bat_jax/benchmarks/imaging/teacher.py): the LLM teacher over a local
stub endpoint (its request, the stage it names, failures as `PolicyError`) and the two baselines. The scripted expert's
full marks are in the track tests."""

import json

import pytest
from openai_stub import FakeChatServer

from bat_jax.clients.chat_endpoint import ChatEndpointConfig
from bat_jax.sandbox.tools import Action
from bat_jax.sandbox.types import Observation
from bat_jax.staged_benchmark.episode import Conversation, PolicyError, Turn
from bat_jax.benchmarks.imaging.stages import STAGES
from bat_jax.benchmarks.imaging.teacher import ChatTeacher, DoNothingPolicy, RandomCommandPolicy


def _conversation(turns=0):
    conv = Conversation("# Task\nDo it.", "E2E", "skill text", STAGES)
    ls = Action("look", "execute_code", {"language": "bash", "code": "ls"})
    conv.turns.extend(Turn(i, "S1", ls, Observation("task.md\n", "", 0, 0.1)) for i in range(turns))
    return conv


def _reply(content):
    return (200, {"choices": [{"message": {"content": content}}]})


def test_the_llm_teacher_asks_for_the_stage_and_reads_it_back():
    action = {"thought": "check", "tool": "execute_code", "arguments": {"language": "bash", "code": "cat a"},
              "stage": "Validate"}
    server = FakeChatServer([_reply("Sure: " + json.dumps(action)), (400, {}), _reply("no json here")])
    teacher = ChatTeacher(ChatEndpointConfig(server.url, "t-model", api_key_env="", max_retries=0), sleep=lambda s: 0)
    try:
        got = teacher(_conversation(turns=1))
        assert (got.tool, got.arguments["code"], got.stage) == ("execute_code", "cat a", "S3")
        ((_, _, body),) = server.requests
        assert body["messages"][0]["content"].endswith(ChatTeacher.NOTE)  # the stage note joins the system prompt
        assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
        with pytest.raises(PolicyError, match="teacher http_error"):
            teacher(_conversation())
        with pytest.raises(PolicyError, match="teacher bad_reply"):
            teacher(_conversation())
    finally:
        server.close()


def test_the_baselines():
    assert DoNothingPolicy()(_conversation()) is None
    policy, again = RandomCommandPolicy(seed=3, n_turns=2), RandomCommandPolicy(seed=3, n_turns=2)
    first = [policy(_conversation(turns=n)) for n in range(2)]
    assert first == [again(_conversation(turns=n)) for n in range(2)]  # the same commands for the same seed
    assert all(a.tool == "execute_code" and a.arguments["language"] == "bash" for a in first)
    assert policy(_conversation(turns=2)) is None  # n_turns reached: stop
