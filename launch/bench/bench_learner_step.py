"""One GRPO optimizer step and one reference-logprob pass of the tiny default's model, in the same run.

Under three attention / Gated DeltaNet settings: where the 2-core budget of a tiny-default run goes.

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

#: (name, attention_block, chunk_size) of the baseline and the paper-scale block; `settings()` adds the tiny default's.
SETTINGS = (("dense", 0, 64), ("1024/64", 1024, 64))


def settings() -> tuple[tuple[str, int, int], ...]:
    """`SETTINGS` and the tiny default's setting, named 'block/chunk' as read from `gin/bicurl_tiny.gin`."""
    from launch.bench.workloads import tiny_default

    tiny = tiny_default()
    block, chunk = tiny.memory.attention_block, tiny.policy.tiny["chunk_size"]
    return SETTINGS + ((f"{block}/{chunk}", block, chunk),)


def run_setting(block: int, chunk: int, batch: dict, args) -> dict:
    """Times of one setting: first step, warm step mean, warm logprob pass (seconds), and the logprobs."""
    import dataclasses

    import jax

    from bat_jax.learn.learner import Learner
    from bat_jax.models.mesh import MeshConfig
    from launch.bench.workloads import tiny_default, tiny_policy

    tiny = tiny_default()
    learner = Learner(tiny_policy(chunk_size=chunk).model, MeshConfig(data=1, fsdp=1, tensor=1),
                      dataclasses.replace(tiny.memory, attention_block=block))
    config = tiny.block.grpo
    lp = learner.logprobs(learner.params, batch, config)  # warm-up (compile)
    t = time.perf_counter()
    lp = learner.logprobs(learner.params, batch, config)
    logprob_s = time.perf_counter() - t
    full = dict(batch, old_logprobs=lp, ref_logprobs=lp)
    step, state = learner.grpo_block(config, tiny.block.optimizer, args.steps + 1, args.micro)
    t = time.perf_counter()
    state, _ = step(state, full)
    jax.block_until_ready(state.params)
    first = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(args.steps):
        state, _ = step(state, full)
    jax.block_until_ready(state.params)
    return {"first": first, "step": (time.perf_counter() - t) / args.steps, "logprobs": logprob_s, "lp": lp}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seq", type=int, default=3072)
    ap.add_argument("--micro", type=int, default=2, help="micro-batches per optimizer step (divides --rows)")
    ap.add_argument("--steps", type=int, default=2, help="warm steps timed after the first")
    args = ap.parse_args(argv)
    if args.rows % args.micro:
        ap.error(f"--rows {args.rows} must divide into --micro {args.micro} micro-batches")
    from bat_jax.models.tokenizer import TINY_VOCAB_SIZE

    rng = np.random.default_rng(0)
    ids = rng.integers(1, TINY_VOCAB_SIZE, (args.rows, args.seq)).astype(np.int32)
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             "loss_mask": np.tile(np.arange(args.seq) >= args.seq // 2, (args.rows, 1)).astype(np.int32),
             "advantages": rng.standard_normal(args.rows).astype(np.float32)}
    print(f"tiny Qwen3.5, {args.rows} rows x {args.seq} tokens, {args.micro} micro-batches per step", flush=True)
    results, every = {}, settings()
    for name, block, chunk in every:
        r = results[name] = run_setting(block, chunk, batch, args)
        print(f"  {name:8s} first step {r['first']:6.1f} s   warm step {r['step']:6.1f} s   "
              f"logprob pass {r['logprobs']:5.1f} s", flush=True)
    base = results[every[0][0]]
    for name, _, _ in every[1:]:
        r = results[name]
        diff = float(np.abs(r["lp"] - base["lp"]).max())
        print(f"  {name} vs dense: step {base['step'] / r['step']:.2f}x faster, logprob pass "
              f"{base['logprobs'] / r['logprobs']:.2f}x faster (max |logprob difference| {diff:.1e})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
