"""One GRPO optimizer step and one reference-logprob pass of the tiny default's model, under three attention /
Gated DeltaNet settings, in the same run: where the 2-core budget of a tiny-default run goes.

Model: the tiny default's policy as `gin/bicurl_tiny.gin` binds it (Qwen3.5, hidden 128, 4 layers: 3 Gated DeltaNet
+ 1 gated attention, the shipped tokenizer's 3,584 ids), random init; its GRPO loss, learner memory settings and
GRPO optimizer from the same file. Batch: `--rows` rows of `--seq` random tokens (all real, loss on the second
half), random advantages; `--micro` micro-batches per step. Settings (`learner.MemoryConfig.attention_block`,
`Qwen3_5Config.chunk_size`):

  * dense:  attention_block 0 (one `[b, heads, seq, seq]` score tensor), DeltaNet chunk 64 — the baseline;
  * 1024/64: 1,024-query blocks, chunk 64 (the paper-scale gin files' block);
  * the tiny default's: `gin/bicurl_tiny.gin`'s blocks and chunk (128-query blocks, chunk 16 when this was written).

Query blocks read only the keys they may see (`models/layers.attend_causal`), so smaller blocks do less work.
Per setting: the first step (compiles) and the mean of `--steps` more, one logprob pass after a warm-up; then each
warm time as a ratio of the baseline's. Values agree to float round-off across settings (tests/test_memory_parity.py
checks the blockwise attention; tests/test_gated_deltanet.py the chunk sizes); the bench prints the largest logprob
difference to the baseline.

  python -m launch.bench.bench_learner_step [--rows 8] [--seq 3072] [--micro 2] [--steps 2]

Its output on 2 cores (defaults, commit after d41b7f7, beside a sweep at nice 10): warm step dense 14.6 s, 1024/64
12.6 s (1.16x), 128/16 7.4 s (1.96x); logprob pass 5.6 / 4.9 / 2.6 s (2.11x); first steps 22.6 / 29.1 / 32.4 s
(more unrolled blocks compile longer); max |logprob difference| 1.9e-06.
Measured before this script existed, on the real batch of a GRPO step (32 rollouts of ~3,100 tokens of the trained
tiny policy, 8 micro-batches, 2 idle cores), by a scratch script: one step 57 s (block 1024 over every key, chunk
64, the code before commit d41b7f7) → 27 s (128/16); one logprob pass 20.4 → 8.2 s.
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
    config = tiny.grpo
    lp = learner.logprobs(learner.params, batch, config)  # warm-up (compile)
    t = time.perf_counter()
    lp = learner.logprobs(learner.params, batch, config)
    logprob_s = time.perf_counter() - t
    full = dict(batch, old_logprobs=lp, ref_logprobs=lp)
    step, state = learner.grpo_block(config, tiny.grpo_optimizer, args.steps + 1, args.micro)
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
