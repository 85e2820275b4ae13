"""launch/bench/bench_rollout.py --loops runs end to end at a small size (local sandboxes, 4 episodes, cheap
simulated latency): every workload prints both loops and their ratio, and both loops finish the same episodes."""

import re

import pytest

from launch.bench import bench_rollout, workloads


def test_the_old_loop_is_lockstep_on_fresh_containers_and_the_new_one_continuous_in_flight():
    assert (workloads.OLD.schedule, workloads.OLD.max_workers, workloads.OLD.warm,
            workloads.OLD.inflight) == ("lockstep", 16, False, False)
    assert (workloads.NEW.schedule, workloads.NEW.max_workers, workloads.NEW.warm,
            workloads.NEW.inflight) == ("continuous", 0, True, True)
    from bat_jax.rollout.agent_loop import AgentLoopConfig

    new = workloads.agent_config(workloads.NEW, AgentLoopConfig(), 32)
    old = workloads.agent_config(workloads.OLD, AgentLoopConfig(), 32)
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
