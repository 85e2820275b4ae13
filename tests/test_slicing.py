"""Stage slicing of teacher trajectories (bat_jax/stage_bank/slicing.py): one SFT row per response with its prior
turns, and the boundary state p_{i,s} replayed from the recorded prefix."""

import pytest

from bat_jax.benchmark.stages import E2E
from bat_jax.sandbox.local import LocalSandbox
from bat_jax.sandbox.tools import Action
from bat_jax.sandbox.types import Observation, SandboxState
from bat_jax.stage_bank import slicing
from bat_jax.stage_bank.row import Provenance
from bat_jax.staged_benchmark.episode import RecordedEpisode, Turn
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.stages import STAGES, Stage

IMAGING = ImagingBenchmark()


def _obs(text, code=0):
    return Observation(text, "", code, 0.1)


def test_sft_slices_one_row_per_response_with_prior_turns():
    acts = [Action("read", "execute_code", {"language": "bash", "code": "cat task.md"}, Stage.PLAN),
            Action("env", "execute_code", {"language": "python", "code": "import numpy"}, Stage.SETUP),
            Action("", "submit", {"path": "outputs/submission.json"}, Stage.SUBMIT)]
    turns = [Turn(i, a.stage, a, _obs(f"out{i}")) for i, a in enumerate(acts)]
    ep = RecordedEpisode("tr-x", E2E, turns, "stop")
    prov = Provenance("tr-x", "a" * 64, "vqa", "success")
    rows = slicing.sft_slices(ep, "# Task tr-x\nbrief", IMAGING.row_skill(E2E), STAGES, prov, "b" * 64)
    assert [r.focus for r in rows] == ["S1", "S2", "S5"]
    assert [len(r.context) for r in rows] == [2, 4, 6]
    assert [m.role for m in rows[2].context] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert "# Task tr-x" in rows[0].context[1].content and "Stage S5 Submit" in rows[0].context[1].content
    assert rows[1].context[2].action.arguments["code"] == "cat task.md"
    assert rows[2].context[5].content == "out1\n[exit code 0]"
    assert rows[2].target.tool == "submit" and rows[1].target.thought == "env" and rows[1].target.stage is None
    assert [r.provenance.transformations[-1].params["turn"] for r in rows] == [0, 1, 2]
    surrogate = Provenance("tr-x", "a" * 64, "vqa", "success",
                           (slicing.transformation("e2e_reduce", cases=2),))
    assert {r.focus for r in slicing.sft_slices(ep, "brief", IMAGING.row_skill(E2E), STAGES, surrogate,
                                                "b" * 64)} == {E2E}


def test_boundary_state_replays_the_prefix_and_detects_mismatch():
    def bash(stage, code, exit_code=0):
        return (Action("", "execute_code", {"language": "bash", "code": code}, stage), _obs("", exit_code))

    steps = [bash(Stage.PLAN, "echo plan > plan.md"), bash(Stage.SETUP, "mkdir -p out && echo 1 > out/env"),
             bash(Stage.VALIDATE, "echo v > out/val")]
    ep = RecordedEpisode("tr-x", E2E, [Turn(i, a.stage, a, o) for i, (a, o) in enumerate(steps)], "stop")
    make = lambda st: LocalSandbox(st, timeout_s=30.0)  # noqa: E731
    initial = SandboxState({"task.md": b"brief"}, {"SEED": "1"})
    state = slicing.boundary_state(make, initial, ep, Stage.VALIDATE, STAGES)
    assert dict(state.files) == {"task.md": b"brief", "plan.md": b"plan\n", "out/env": b"1\n"}
    assert dict(state.env) == {"SEED": "1"}
    assert dict(slicing.boundary_state(make, initial, ep, Stage.SETUP, STAGES).files) == {"task.md": b"brief",
                                                                                            "plan.md": b"plan\n"}
    steps[0] = bash(Stage.PLAN, "exit 3")  # recorded exit 0, replays as 3
    ep = RecordedEpisode("tr-x", E2E, [Turn(i, a.stage, a, o) for i, (a, o) in enumerate(steps)], "stop")
    with pytest.raises(slicing.ReplayMismatch, match="turn 0: replay exited 3, recorded 0"):
        slicing.boundary_state(make, initial, ep, Stage.VALIDATE, STAGES)
