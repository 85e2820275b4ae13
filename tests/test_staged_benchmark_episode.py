"""Action-level episodes (bat_jax/staged_benchmark/episode.py): what a policy sees, the recorded episode's stage
boundaries, and the evidence a finished episode leaves by whose fault it ended."""

import json

from bat_jax.sandbox.tools import STOP, Action
from bat_jax.sandbox.types import Observation, SandboxState
from bat_jax.staged_benchmark.episode import Conversation, RecordedEpisode, Turn, collect_evidence, snapshot_state
from bat_jax.benchmarks.imaging.stages import STAGES

LS = Action("look", "execute_code", {"language": "bash", "code": "ls"})


def _turn(i, stage):
    return Turn(i, stage, LS, Observation("a.txt\n", "", 0, 0.1))


def test_the_conversation_a_policy_sees():
    assert Conversation("b", "E2E", "k", STAGES).stages == ("S1", "S2", "S3", "S4", "S5")
    conv = Conversation("# Task", "validate", "Check every input.", STAGES, [_turn(0, "S3")])
    assert conv.stages == ("S3",)
    messages = conv.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[1]["content"] == "# Task\n\n## Stage skill\nCheck every input."
    assert json.loads(messages[2]["content"]) == LS.to_dict()
    assert messages[3]["content"].startswith("[tool result]\n")


def test_boundaries_are_each_stages_first_turn():
    episode = RecordedEpisode("t-1", "E2E", [_turn(0, "S1"), _turn(1, "S1"), _turn(2, "S3"), _turn(3, "S1")], STOP)
    assert episode.boundaries() == {"S1": 0, "S3": 2}
    record = episode.to_dict()
    assert (record["end_reason"], record["rejected"], len(record["turns"])) == (STOP, "", 4)


class Box:
    """A finished sandbox: one file, one receipt, a submitted path and a blame (`fault`, `failure`)."""

    def __init__(self, fault="", failure=""):
        self.fault, self.failure = fault, failure

    def receipts(self):
        return ["receipt 0"]

    def submitted(self):
        return "out.json"

    def list_files(self):
        return ["out.json"]

    def read_file(self, path, max_bytes=None):
        return b"{}"


def test_evidence_by_whose_fault_the_episode_ended():
    start = SandboxState({"task.md": b"brief"})
    ok = collect_evidence(Box(), start=start)
    assert dict(ok.files) == {"out.json": b"{}"} and ok.submitted == "out.json" and not ok.infra_error
    agent = collect_evidence(Box("agent", "executor hung"), start=start)
    assert dict(agent.files) == {"task.md": b"brief"} and agent.agent_error == "executor hung"  # scored from start
    infra = collect_evidence(Box("infra", "image missing"), start=start)
    assert dict(infra.files) == {} and infra.infra_error == "image missing" and infra.submitted is None
    assert snapshot_state(Box(), {"SEED": "1"}) == SandboxState({"out.json": b"{}"}, {"SEED": "1"})
