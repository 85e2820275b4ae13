"""One process of tests/test_multihost.py's two-process checks of bat_jax/bicurl/multihost.py.

    python tests/multihost_pieces_worker.py OUT_JSON SCENARIO
        (SCENARIO: 'pieces', 'no_docker', 'die', 'raises', 'async')

Joins the job the environment describes (JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID,
BAT_JAX_HEARTBEAT_TIMEOUT_S) and writes what it saw to OUT_JSON:

* 'pieces': broadcast, on_primary (a value; an error raised on process 0), agree (equal; different), allgather,
  a writer made by primary_only, scored_rollouts over a stand-in loop that records which episodes it ran, and
  finished over each process's own futures (results; an error on process 1);
* 'no_docker': all_ok where process 1 raises BackendUnavailable (a host without Docker);
* 'die': process 1 exits at once after start-up; process 0 waits for a value from it (the fault test);
* 'raises': as 'die', but process 1 raises inside `launch.guarded` (the run's error path with several processes);
* 'async': the bounded-staleness GRPO block (max_staleness = 1) over a stand-in loop, scorer and learner: three
  steps of two rows, row s1 stale at step 0 and row s2 failed (both refilled from the pool's spares): the batches
  each step trained, the round's counts and the rows this process rolled out. Also run as one process (no
  JAX_COORDINATOR_ADDRESS) for the reference.
"""

import concurrent.futures
import json
import os
import pathlib
import sys
import time
import types

import numpy as np

from bat_jax.learn import distributed

if __name__ == "__main__":  # not in the processes vLLM spawns (they import this file as __mp_main__)
    distributed.initialize(distributed.DistributedConfig.from_env(initialization_timeout_s=120))

from bat_jax.bicurl import hosts, multihost  # noqa: E402
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


REWARDS = {"s0": [1.0, 0.0], "s1": [0.0, 1.0], "s2": [1.0, 1.0], "s3": [1.0, 0.0], "s4": [0.0, 1.0],
           "s5": [1.0, 0.0], "r0": [0.0, 1.0], "r1": [1.0, 0.0]}


class _Engine:
    weight_version = 0

    def update_weights(self, params):
        self.weight_version += 1
        return self.weight_version


class _GroupLoop:
    """Stands in for an AgentLoop under the GRPO block; records the states it rolled out.

    Episode (state, i, k) gives a 4-token trajectory whose logprobs are drawn from (seed, i, k), begun on the
    engine's version (3 versions earlier for s1: stale at once); s2's episode 1 fails for infrastructure.
    """

    config = types.SimpleNamespace(sampling=SamplingConfig(group_size=2))

    def __init__(self):
        self.engine, self.ran = _Engine(), []

    def run_episodes(self, episodes, *, seed, on_trajectory):
        out = []
        for position, (state, i, k) in enumerate(episodes):
            self.ran.append(state)
            began = self.engine.weight_version - (3 if state == "s1" else 0)
            draw = np.random.default_rng([seed, i, k]).uniform(-1, 0, 2)
            out.append(types.SimpleNamespace(
                state_id=state, ids=np.arange(4, dtype=np.int32), loss_mask=np.array([0, 1, 1, 0], np.int32),
                logprobs=np.array([0, *draw, 0], np.float32), turn_versions=(began,), weight_version=began,
                agent_error=None, infra_error="sandbox down" if state == "s2" and k == 1 else "", episode_k=k))
            on_trajectory(position, out[-1])
        return out

    def run(self, requests, *, seed, on_trajectory):
        return self.run_episodes([(r, i, k) for i, r in enumerate(requests) for k in range(2)], seed=seed,
                                 on_trajectory=on_trajectory)


class _GroupScorer:
    """Stands in for RolloutScorer: row r's rollout k scores REWARDS[r][k]."""

    def __init__(self, rows, starts, benchmark, judge, config, tasks):
        self.rows, self.got = rows, {}

    def submit(self, position, trajectory):
        self.got[position] = trajectory

    def results(self, positions=None):
        positions = range(len(self.rows)) if positions is None else positions
        return [types.SimpleNamespace(reward=REWARDS[self.rows[p].name][self.got[p].episode_k], version="v",
                                      items=None) for p in positions]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def async_block() -> dict:
    from bat_jax.bicurl import async_block as ab
    from bat_jax.bicurl import grpo_round as gr
    from bat_jax.learn import grpo
    from bat_jax.learn.staleness import StalenessConfig

    from doubles import FakeLearner

    gr.rl_request = lambda row, start, state_id, prompt: state_id
    gr.RolloutScorer = _GroupScorer
    loop = _GroupLoop()
    item = lambda name: types.SimpleNamespace(  # noqa: E731
        round_state_id=name, pool="target",
        row=types.SimpleNamespace(state=None, name=name, provenance=types.SimpleNamespace(track="t")))
    view = types.SimpleNamespace(batches=[[item("s0"), item("s1")], [item("s2"), item("s3")],
                                          [item("s4"), item("s5")]], spares={"target": [item("r0"), item("r1")]})
    learner = FakeLearner()
    block = gr.GRPOBlockConfig(grpo=grpo.GRPOConfig(kl_coef=0.0, tis_cap=2.0, sampling=SamplingConfig(group_size=2)),
                               micro_batches=1,
                               max_response_tokens=8, staleness=StalenessConfig(max_staleness=1))
    stats = ab.async_grpo_block(learner, loop, types.SimpleNamespace(load_state=lambda s: None), view, block,
                                benchmark=None, seed=3, hosts=hosts.current())
    steps = [{k: np.asarray(v).round(6).tolist() for k, v in host.items()} for host in learner.seen]
    return {"steps": steps, "stats": stats.__dict__, "ran": sorted(set(loop.ran))}


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
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # process 0 holds groups 0 and 1, process 1 group 2
        own = {0: [0, 1], 1: [2]}[me]
        done = multihost.finished({i: pool.submit(lambda i=i: [f"group {i}", me]) for i in own}, "step 0's groups")
        out["finished"] = sorted([k, v] for k, v in done.items())

        def group(i):
            if me == 1:
                raise RuntimeError("sandbox of group 2 gone")
            return i

        out["finished_error"] = _caught(lambda: multihost.finished({i: pool.submit(group, i) for i in own},
                                                                   "step 1's groups"))
    return out


def no_docker() -> dict:
    def open_sandboxes():
        if multihost.process_index() == 1:
            raise BackendUnavailable("Docker engine not reachable (unix:///var/run/docker.sock)")
        return "pool"

    released = []
    got = _caught(lambda: multihost.all_ok(open_sandboxes, "opening the sandboxes", release=released.append))
    return {"all_ok": got, "released": released}


def raises() -> dict:
    if multihost.process_index() == 1:  # what `python -m bat_jax.launch` does when the run raises on this process
        from bat_jax import launch
        launch.guarded(lambda: _fail("sandbox pool lost"), several=True)
    return die()


def _fail(message: str) -> None:
    raise RuntimeError(message)


def die() -> dict:
    if multihost.process_index() == 1:
        os._exit(3)
    t0 = time.monotonic()
    got = _caught(lambda: multihost.on_primary(lambda: multihost.allgather(0, "after the death"), "waiting"))
    return {"waited": got, "seconds": time.monotonic() - t0}


if __name__ == "__main__":
    out_path = pathlib.Path(sys.argv[1])
    scenario = sys.argv[2]
    result = {"pieces": lambda: pieces(out_path.parent), "no_docker": no_docker, "die": die, "raises": raises,
              "async": async_block}[scenario]()
    out_path.write_text(json.dumps(result))
