"""One process of tests/test_multihost.py's two-process checks of bat_jax/bicurl/multihost.py.

    python tests/multihost_pieces_worker.py OUT_JSON SCENARIO     (SCENARIO: 'pieces', 'no_docker' or 'die')

Joins the job the environment describes (JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID,
BAT_JAX_HEARTBEAT_TIMEOUT_S) and writes what it saw to OUT_JSON:

* 'pieces': broadcast, on_primary (a value; an error raised on process 0), agree (equal; different), allgather,
  a writer made by primary_only, and scored_rollouts over a stand-in loop that records which episodes it ran;
* 'no_docker': all_ok where process 1 raises BackendUnavailable (a host without Docker);
* 'die': process 1 exits at once after start-up; process 0 waits for a value from it (the fault test).
"""

import json
import os
import pathlib
import sys
import time

from bat_jax.learn import distributed

distributed.initialize(distributed.DistributedConfig.from_env(initialization_timeout_s=120))

from bat_jax.bicurl import multihost  # noqa: E402
from bat_jax.rollout.sampling import SamplingConfig  # noqa: E402
from bat_jax.sandbox.backends import BackendUnavailable  # noqa: E402


class _Config:
    sampling = SamplingConfig(group_size=2)


class _Loop:
    """Stands in for an AgentLoop: episode (request, i, k) gives the trajectory '<request>/<k>@<seed>'."""

    config = _Config()

    def __init__(self):
        self.ran = []

    def run_episodes(self, episodes, *, seed, on_trajectory):
        out = []
        for position, (request, i, k) in enumerate(episodes):
            self.ran.append([i, k])
            out.append(f"{request}/{k}@{seed}")
            on_trajectory(position, out[-1])
        return out


class _Scorer:
    """Stands in for RolloutScorer: the reward of a trajectory is its length, plus 1000 × the scoring process."""

    def __init__(self):
        self.scored = {}

    def submit(self, position, trajectory):
        self.scored[position] = len(trajectory) + 1000 * multihost.process_index()

    def results(self, positions=None):
        return [self.scored[p] for p in positions]


def _caught(fn):
    try:
        return ["ok", fn()]
    except Exception as e:  # noqa: BLE001 - the test reads the type and message
        return [type(e).__name__, str(e)]


def pieces(run_dir: pathlib.Path) -> dict:
    me = multihost.process_index()
    out = {"index": me, "count": multihost.process_count(), "primary": multihost.is_primary()}
    out["broadcast"] = multihost.broadcast({"from": me}, "value")
    out["on_primary"] = multihost.on_primary(lambda: ["made by", multihost.process_index()], "made")

    def fails():
        raise ValueError("the bank is broken")

    out["on_primary_error"] = _caught(lambda: multihost.on_primary(fails, "bank check"))
    out["agree_same"] = _caught(lambda: multihost.agree(("accept", "ckpt-1"), "decision"))
    out["agree_different"] = _caught(lambda: multihost.agree(("fallback" if me else "accept", "ckpt-0"),
                                                             "round 3 decision"))
    out["allgather"] = multihost.allgather(me * 10, "numbers")
    writer = multihost.primary_only(lambda: open(run_dir / f"written_by_{me}.txt", "w"))
    writer.write("ledger line\n")
    writer.close()
    multihost.barrier("written")
    out["files"] = sorted(p.name for p in run_dir.iterdir() if p.name.startswith("written_by"))
    loop, scorer = _Loop(), _Scorer()
    trajectories, rewards = multihost.scored_rollouts(loop, ["a", "b", "c"], 7, scorer)
    out.update(trajectories=trajectories, rewards=rewards, ran=loop.ran)
    return out


def no_docker() -> dict:
    def open_sandboxes():
        if multihost.process_index() == 1:
            raise BackendUnavailable("Docker engine not reachable (unix:///var/run/docker.sock)")
        return "pool"

    released = []
    got = _caught(lambda: multihost.all_ok(open_sandboxes, "opening the sandboxes", release=released.append))
    return {"all_ok": got, "released": released}


def die() -> dict:
    if multihost.process_index() == 1:
        os._exit(3)
    t0 = time.monotonic()
    got = _caught(lambda: multihost.on_primary(lambda: multihost.allgather(0, "after the death"), "waiting"))
    return {"waited": got, "seconds": time.monotonic() - t0}


if __name__ == "__main__":
    out_path = pathlib.Path(sys.argv[1])
    scenario = sys.argv[2]
    result = {"pieces": lambda: pieces(out_path.parent), "no_docker": no_docker, "die": die}[scenario]()
    out_path.write_text(json.dumps(result))
