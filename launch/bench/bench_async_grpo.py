"""Bounded-staleness GRPO on a simulated 9B engine: steps per hour and busy fractions at max_staleness 0, 1, 2.

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
import types

import numpy as np

from bat_jax.bicurl import async_block, grpo_round
from bat_jax.learn import grpo
from bat_jax.learn.staleness import StalenessConfig
from bat_jax.rollout.engine import Completion
from bat_jax.rollout.simulated_engine import SimulatedLatency, SimulatedLatencyEngine
from launch.bench import async_kl, async_tiny
from launch.bench.workloads import BusyMeter

MAX_TURNS = 24


class TokenSource:
    """Instant inner engine: `len` tokens of id 7, logprob −0.5, on its weight version."""

    def __init__(self):
        self.weight_version = 0

    def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
        n = int(max_new_tokens[0]) if max_new_tokens is not None else params.max_new_tokens
        return [Completion(np.full(n, 7, np.int32), np.full(n, -0.5, np.float32), "stop", self.weight_version)
                for _ in prompts]

    def update_weights(self, params):
        self.weight_version += 1
        return self.weight_version


class EpisodeLoop:
    """Stand-in agent loop (module docstring): episodes as turns of engine calls and sandbox sleeps, all of a call's
    episodes concurrent; turns and sandbox times drawn from (seed, i, k)."""

    def __init__(self, engine, scale: float, turn_tokens: int):
        self.engine, self.scale, self.turn_tokens = engine, scale, turn_tokens

    def _episode(self, state, i, k, seed):
        from bat_jax.rollout.engine import SamplingParams

        rng = np.random.default_rng([seed, i, k])
        turns = int(np.clip(np.round(rng.lognormal(np.log(5.0), 0.7)), 1, MAX_TURNS))
        versions = []
        for _ in range(turns):
            (comp,) = self.engine.generate([[1]], SamplingParams(max_new_tokens=self.turn_tokens),
                                           max_new_tokens=[self.turn_tokens])
            versions.append(comp.weight_version)
            time.sleep(rng.lognormal(np.log(5.0 * self.scale), 0.5))  # the tool call in its sandbox
        return types.SimpleNamespace(state_id=state, ids=np.arange(6, dtype=np.int32), agent_error=None,
                                     loss_mask=np.array([0, 0, 1, 1, 1, 0], np.int32),
                                     logprobs=np.array([0, 0, -0.5, -0.5, -0.5, 0], np.float32),
                                     turn_versions=tuple(versions), weight_version=versions[-1], infra_error="")

    def run_episodes(self, episodes, seed, on_trajectory=None):
        out = [None] * len(episodes)

        def one(p):
            req, i, k = episodes[p]
            out[p] = self._episode(req, i, k, seed)

        threads = [threading.Thread(target=one, args=(p,)) for p in range(len(episodes))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for p, t in enumerate(out):
            if on_trajectory is not None:
                on_trajectory(p, t)
        return out

    def run(self, requests, seed, on_trajectory=None):
        return self.run_episodes([(r, i, k) for i, r in enumerate(requests) for k in range(4)], seed, on_trajectory)


class SleepingLearner:
    """Stand-in learner: each optimizer step sleeps `train_s`; logprobs are the engine's (no mismatch)."""

    mesh = types.SimpleNamespace(devices=np.zeros((1,)))

    def __init__(self, train_s: float, meter: BusyMeter):
        self.train_s, self.meter, self.params, self.busy_s, self.last_step_end = train_s, meter, 0, 0.0, 0.0
        self.engine_at_last_step = (0.0, 0.0)

    def grpo_block(self, config, optimizer, total_steps, num_micro_batches):
        return self.step, types.SimpleNamespace(params=0)

    def step(self, state, host):
        t = time.monotonic()
        time.sleep(self.train_s)
        self.last_step_end = time.monotonic()
        self.busy_s += self.last_step_end - t
        self.engine_at_last_step = self.meter.snapshot()  # the after-block probe is left out
        return types.SimpleNamespace(params=state.params + 1), {}

    def sync_model(self, params):
        return params

    def logprobs(self, params, host, config):
        return np.where(np.asarray(host["loss_mask"]) > 0, -0.5, 0.0).astype(np.float32)

    def adopt(self, state):
        self.params = state.params


class _Scorer:
    """Rewards of a row's K rollouts: a fixed 0/1 pattern with variance (the rubric is not what is measured)."""

    def __init__(self, rows, starts, benchmark, judge, config, tasks):
        self.rows = rows

    def submit(self, position, trajectory):
        pass

    def results(self):
        return [types.SimpleNamespace(reward=float(i % 2), version="bench", items=None) for i in range(len(self.rows))]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@contextlib.contextmanager
def _stand_in_scoring():
    """The block's request builder and scorer replaced by the stand-ins for the duration (restored after)."""
    saved = grpo_round.rl_request, grpo_round.RolloutScorer
    grpo_round.rl_request = lambda row, start, state_id, prompt: state_id
    grpo_round.RolloutScorer = _Scorer
    try:
        yield
    finally:
        grpo_round.rl_request, grpo_round.RolloutScorer = saved


def measure(s: int, steps: int, rows: int, scale: float, turn_tokens: int) -> dict:
    """One block of `steps` pool batches at max_staleness `s`; returns its timings and staleness."""
    latency = SimulatedLatency(prefill_s=0.05 * scale, decode_s_per_step=0.03 * scale, max_batch=0,
                               inflight=True)  # ~9B on one accelerator (simulated_engine's constants) × scale
    engine = BusyMeter(SimulatedLatencyEngine(TokenSource(), latency))
    loop = EpisodeLoop(engine, scale, turn_tokens)
    learner = SleepingLearner(57.0 * scale, engine)
    item = lambda name: types.SimpleNamespace(round_state_id=name, pool="target",  # noqa: E731
                                              row=types.SimpleNamespace(state=None, name=name,
                                                                        provenance=types.SimpleNamespace(track="t")))
    view = types.SimpleNamespace(batches=[[item(f"b{b}r{r}") for r in range(rows)] for b in range(steps)],
                                 spares={"target": [item(f"spare{r}") for r in range(rows)]})
    c = grpo_round.GRPOBlockConfig(grpo=grpo.GRPOConfig(kl_coef=0.0, tis_cap=2.0), micro_batches=1,
                                   max_response_tokens=64, staleness=StalenessConfig(max_staleness=s))
    bank = types.SimpleNamespace(load_state=lambda state: None)
    with _stand_in_scoring():
        start = time.monotonic()
        stats = async_block.run_grpo_block(learner, loop, bank, view, c, None, seed=11)
    wall = learner.last_step_end - start
    return {"s": s, "wall_s": wall, "steps_per_hour": steps / wall * 3600,
            "engine_busy": learner.engine_at_last_step[0] / wall,
            "episodes_decoding": learner.engine_at_last_step[1] / wall,
            "learner_busy": learner.busy_s / wall, "trained": stats.groups_trained,
            "staleness_mean": stats.staleness_mean, "staleness_max": stats.staleness_max,
            "dropped_stale": stats.groups_dropped_stale}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps (pool batches) per setting")
    parser.add_argument("--rows", type=int, default=8, help="rows per batch (K = 4 rollouts each)")
    parser.add_argument("--scale", type=float, default=0.01, help="seconds of the bench per paper-scale second")
    parser.add_argument("--turn-tokens", type=int, default=256, help="sampled tokens per turn")
    parser.add_argument("--staleness", type=int, nargs="+", default=None, help="default 0 1 2 (--tiny: 0 1)")
    parser.add_argument("--kl-steps", type=int, default=8, help="GRPO steps of the KL comparison (0: skip it)")
    parser.add_argument("--tiny", action="store_true", help="the tiny default on the CPU (launch/bench/async_tiny.py)")
    async_tiny.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.tiny:
        return async_tiny.run(args)
    args.staleness = args.staleness or [0, 1, 2]
    results = [measure(s, args.steps, args.rows, args.scale, args.turn_tokens) for s in args.staleness]
    kl = async_kl.policy_kl(tuple(args.staleness), steps=args.kl_steps) if args.kl_steps else None
    base = results[0]
    gen_per_step = (base["wall_s"] * (1 - base["learner_busy"])) / args.steps
    print(f"simulated 9B engine (in-flight batching), {args.rows} rows x K=4 per step, {args.steps} steps, scale "
          f"{args.scale}: train {57.0 * args.scale:.2f} s/step; at s={base['s']} generation {gen_per_step:.2f} s/step "
          f"(paper: 310 s generate vs 57 s train per step = 5.4x; here {gen_per_step / (57.0 * args.scale):.1f}x)")
    print(f"{'s':>3}{'wall s':>9}{'steps/h':>10}{'ratio':>8}{'KL vs s=0':>11}{'engine busy':>13}"
          f"{'learner busy':>14}{'decoding':>10}{'lag mean':>10}{'lag max':>9}{'stale':>7}")
    for r in results:
        lag = "—" if r["staleness_mean"] is None else f"{r['staleness_mean']:.2f}"
        shift = "—" if kl is None else f"{kl['kl'][r['s']]:.2e}"
        print(f"{r['s']:>3}{r['wall_s']:>9.1f}{r['steps_per_hour']:>10.0f}"
              f"{r['steps_per_hour'] / base['steps_per_hour']:>7.2f}x{shift:>11}{r['engine_busy']:>13.0%}"
              f"{r['learner_busy']:>14.0%}{r['episodes_decoding']:>10.1f}{lag:>10}"
              f"{'—' if r['staleness_max'] is None else r['staleness_max']:>9}"
              f"{r['dropped_stale']:>7}")
    if kl is not None:
        print(async_kl.describe(kl))
    return results


if __name__ == "__main__":
    main()
