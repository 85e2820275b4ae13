"""One GRPO batch of a trained tiny policy, rolled out one call at a time vs continuously batched.

Both with the JAX sampler (`bat_jax.rollout.continuous_batching`), in the same run.

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bank", default="runs/stage_bank_tiny")
    ap.add_argument("--policy", default="runs/bicurl_tiny/export", help="an exported (Hugging Face) checkpoint")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--k", type=int, default=None, help="rollouts per row (default: the tiny default's K)")
    ap.add_argument("--slots", type=int, default=None, help="continuous-batching slots (default: the tiny default's)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--backend", default="docker", choices=["docker", "local"])
    args = ap.parse_args(argv)

    from bat_jax.policy import PolicyConfig, build_policy, make_agent_loop
    from bat_jax.prompts import PromptFormat, rl_request
    from bat_jax.rollout.continuous_batching import jax_engine
    from bat_jax.stage_bank.bank import StageBank
    from bat_jax.sandbox.backends import open_backend
    from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
    from launch.bench.workloads import tiny_default

    tiny = tiny_default()
    args.k = tiny.sampling.group_size if args.k is None else args.k
    args.slots = tiny.engine.slots if args.slots is None else args.slots

    policy = build_policy(PolicyConfig(chat_family="qwen3_5", checkpoint_dir=args.policy,
                                       prompt_style=tiny.policy.prompt_style))
    bank = StageBank(args.bank)
    by_focus = collections.defaultdict(list)
    for row in bank.read().rl_rows:
        by_focus[row.focus].append(row)
    rows = list(itertools.islice((r for group in itertools.zip_longest(*by_focus.values()) for r in group if r),
                                 args.rows))
    prompt = PromptFormat.of(ImagingBenchmark(), tiny.policy.prompt_style)  # the tiny bank's benchmark, the policy's style
    requests = [rl_request(r, bank.load_state(r.state), r.state_id, prompt) for r in rows]
    continuous = dataclasses.replace(tiny.agent, sampling=dataclasses.replace(tiny.sampling, group_size=args.k),
                                     progress=False)
    modes = {"plain": (0, dataclasses.replace(continuous, max_generate_batch=64, max_concurrent_generate=1)),
             "continuous": (args.slots, continuous)}
    print(f"{len(rows)} rows ({', '.join(r.focus for r in rows)}) x K={args.k}, policy {args.policy}, "
          f"{args.backend} sandboxes", flush=True)
    episodes = len(rows) * args.k
    sandboxes = open_backend(args.backend, continuous.workers(episodes), warm=episodes if args.backend == "docker" else 0)
    warm, ids = {}, {}
    try:
        for name, (slots, config) in modes.items():
            engine = jax_engine(policy.model, max_context=continuous.max_context_tokens, max_batch=tiny.engine.max_batch,
                                prefix_cache_rows=tiny.engine.prefix_cache_rows, slots=slots)
            loop = make_agent_loop(policy, engine, sandboxes.make, config, sandboxes.release)
            for rep in range(args.repeats):
                t0 = time.perf_counter()
                trajectories = loop.run(requests, seed=7)
                seconds = time.perf_counter() - t0
                tokens = sum(int(np.sum(t.loss_mask)) for t in trajectories)
                print(f"{name:<11} run {rep + 1}{' (compiles)' if rep == 0 else ''}: {seconds:7.1f} s, {tokens} sampled "
                      f"tokens, {tokens / seconds:7.1f} tok/s", flush=True)
            warm[name] = seconds
            ids[name] = [np.asarray(t.ids).tobytes() for t in trajectories]
    finally:
        sandboxes.close()
    same = sum(a == b for a, b in zip(ids["plain"], ids["continuous"]))
    which = "warm" if args.repeats > 1 else "first runs (compiles included)"
    print(f"{which} plain / continuous: {warm['plain'] / warm['continuous']:5.2f}x; token-identical trajectories "
          f"{same}/{len(ids['plain'])}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
