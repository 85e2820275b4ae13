"""The GRPO block's learner time with the ratio's old logprobs recomputed vs the engine's, in the same run.

Recomputed by the learner is the default; the engine's is bypass mode.

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import time
import types

import numpy as np


class _Scorer:
    """Stand-in for `bicurl/reward.RolloutScorer`: rewards 0 / 1 alternating (every group has variance)."""

    def __init__(self, rows, starts, benchmark, judge, config, tasks):
        self.n = len(rows)

    def submit(self, position, trajectory):
        pass

    def results(self):
        return [types.SimpleNamespace(reward=float(i % 2), version="bench", items={}) for i in range(self.n)]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8, help="rollouts per batch (a multiple of the tiny default's K, 4)")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=3, help="GRPO steps (pool batches) per block")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--micro", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)

    import dataclasses

    from bat_jax.bicurl import grpo_round as gr
    from bat_jax.learn.learner import Learner
    from bat_jax.models.mesh import MeshConfig
    from bat_jax.models.tokenizer import TINY_VOCAB_SIZE
    from launch.bench.workloads import tiny_default, tiny_policy

    tiny = tiny_default()
    group = tiny.sampling.group_size
    if args.rows % group:
        raise SystemExit(f"--rows {args.rows} is not a multiple of the tiny default's K = {group}")
    learner = Learner(tiny_policy().model, MeshConfig(data=1, fsdp=1, tensor=1), tiny.memory)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, TINY_VOCAB_SIZE, (args.rows, args.seq)).astype(np.int32)
    loss_mask = np.zeros_like(ids)
    loss_mask[:, args.seq // 2:] = 1
    probe = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    engine_lp = (learner.logprobs(learner.params, probe, tiny.block.grpo) - 0.1) * loss_mask
    trajectories = [types.SimpleNamespace(ids=ids[i], loss_mask=loss_mask[i], logprobs=engine_lp[i], agent_error=None)
                    for i in range(args.rows)]

    def run(requests, seed, on_trajectory):  # the same trajectories for every batch, one group per request
        return [types.SimpleNamespace(**vars(trajectories[i * group + k]), state_id=r)
                for i, r in enumerate(requests) for k in range(group)]

    gr.rl_request = lambda row, start, state_id, prompt: state_id
    gr.RolloutScorer = _Scorer
    gr.tqdm = lambda xs, **kw: xs
    loop = types.SimpleNamespace(run=run, engine=types.SimpleNamespace(update_weights=lambda model: None))
    item = lambda b, i: types.SimpleNamespace(round_state_id=f"b{b}r{i}", pool="target",  # noqa: E731
                                              row=types.SimpleNamespace(state=None))
    view = types.SimpleNamespace(batches=[[item(b, i) for i in range(args.rows // group)] for b in range(args.batches)],
                                 spares={})
    bank = types.SimpleNamespace(load_state=lambda state: None)
    start = learner.host_copy(learner.params)

    def block(mode: str) -> tuple[float, float]:
        learner.params = learner.on_mesh(start)
        cfg = dataclasses.replace(tiny.block.grpo, old_logprobs=mode, epochs=args.epochs)
        c = gr.GRPOBlockConfig(grpo=cfg, micro_batches=args.micro, max_context_tokens=args.seq)
        t, cpu = time.perf_counter(), time.process_time()
        stats = gr.grpo_block(learner, loop, bank, view, c, None, seed=1)  # no benchmark: `_Scorer` scores
        elapsed = (time.perf_counter() - t, time.process_time() - cpu)
        assert stats.rollout_mismatch["mismatch_mean_abs"] > 0
        return elapsed

    modes = ("bypass", "recompute")
    first = {mode: block(mode) for mode in modes}  # compiles
    times = {mode: [] for mode in modes}
    for _ in range(args.repeats):
        for mode in modes:
            times[mode].append(block(mode))
    print(f"rollouts {args.rows} x {args.seq} tokens, {args.batches} batches, {args.epochs} epoch(s), "
          f"{args.micro} micro-batches")
    for k, name in ((0, "wall"), (1, "CPU")):
        best = {mode: min(t[k] for t in ts) for mode, ts in times.items()}
        for mode in modes:
            print(f"  {name:<4} {mode:<10} block {best[mode]:7.2f} s (first {first[mode][k]:.2f} s; runs "
                  f"{', '.join(f'{t[k]:.2f}' for t in times[mode])})")
        extra = (best["recompute"] - best["bypass"]) / max(args.batches - 1, 1)
        print(f"  {name:<4} recompute / bypass {best['recompute'] / best['bypass']:.3f}; extra per batch after the "
              f"first {extra:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
