"""launch/bench/bench_rollout.py --loops runs end to end at a small size (local sandboxes, 4 episodes, cheap
simulated latency): every workload prints both loops and their ratio, and both loops finish the same episodes."""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch" / "bench"))

import bench_rollout  # noqa: E402
import rollout_loops  # noqa: E402


def test_the_two_loops_are_what_issue_17_compares():
    assert (rollout_loops.OLD.schedule, rollout_loops.OLD.max_workers, rollout_loops.OLD.warm,
            rollout_loops.OLD.inflight) == ("lockstep", 16, False, False)
    assert (rollout_loops.NEW.schedule, rollout_loops.NEW.max_workers, rollout_loops.NEW.warm,
            rollout_loops.NEW.inflight) == ("continuous", 0, True, True)
    from bat_jax.rollout.agent_loop import AgentLoopConfig

    new = rollout_loops.agent_config(rollout_loops.NEW, AgentLoopConfig(), 32)
    old = rollout_loops.agent_config(rollout_loops.OLD, AgentLoopConfig(), 32)
    assert (new.max_generate_batch, new.max_concurrent_generate, new.workers(32)) == (1, 32, 32)
    assert (old.max_generate_batch, old.max_concurrent_generate, old.workers(32)) == (64, 1, 16)


@pytest.mark.slow
def test_loops_bench_prints_both_loops_and_their_ratio(capsys):
    assert bench_rollout.main(["--loops", "--backend", "local", "--episodes", "4", "--tracks", "vqa,detection",
                               "--turns", "2", "--synthetic", "--prefill-ms", "1", "--decode-ms", "1"]) == 0
    out = capsys.readouterr().out
    for workload in ("jax", "simulated"):
        for loop in ("old", "new"):
            assert re.search(rf"^\s*{workload} {loop} loop\s+[\d.]+ episodes/min", out, re.M), out
        assert re.search(rf"^\s*{workload} new / old loop:\s+[\d.]+x", out, re.M), out
    assert re.search(r"^synthetic new / old loop:\s+[\d.]+x", out, re.M), out
    # the expert replay submits in every episode under both loops (the same 12 tool calls each)
    assert len(re.findall(r"12\.0 tool calls, \d+ engine calls; \{'submitted': 4\}", out)) == 2, out
