"""One GRPO optimizer step and one reference-logprob pass of the tiny default's model, under three attention /
Gated DeltaNet settings, in the same run (issue 15: where the 2-core budget goes).

Model: the tiny default's Qwen3.5 shape (hidden 128, 4 layers: 3 Gated DeltaNet + 1 gated attention, the shipped
tokenizer's 3,584 ids), random init. Batch: `--rows` rows of `--seq` random tokens (all real, loss on the second
half), random advantages; `--micro` micro-batches per step. Settings (`learner.MemoryConfig.attention_block`,
`Qwen3_5Config.chunk_size`):

  * dense:  attention_block 0 (one `[b, heads, seq, seq]` score tensor), DeltaNet chunk 64 — the baseline;
  * 1024/64: 1,024-query blocks, chunk 64 (the paper-scale gin files' block);
  * 128/16: 128-query blocks, chunk 16 (`gin/bicurl_tiny.gin`).

Query blocks read only the keys they may see (`models/layers.attend_causal`), so smaller blocks do less work.
Per setting: the first step (compiles) and the mean of `--steps` more, one logprob pass after a warm-up; then each
warm time as a ratio of the baseline's. Values agree to float round-off across settings (tests/test_memory_parity.py
checks the blockwise attention; tests/test_deltanet.py the chunk sizes); the bench prints the largest logprob
difference to the baseline.

  python launch/bench/bench_learner_step.py [--rows 8] [--seq 3072] [--micro 2] [--steps 2]

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

SETTINGS = (("dense", 0, 64), ("1024/64", 1024, 64), ("128/16", 128, 16))


def run_setting(block: int, chunk: int, batch: dict, args) -> dict:
    """Times of one setting: first step, warm step mean, warm logprob pass (seconds), and the logprobs."""
    import jax
    from flax import nnx

    from bat_jax.learn import grpo
    from bat_jax.learn.learner import Learner, MemoryConfig
    from bat_jax.models.mesh import MeshConfig
    from bat_jax.learn.optim import OptimizerConfig
    from bat_jax.models.configs import Qwen3_5Config
    from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM

    cfg = Qwen3_5Config(vocab_size=3584, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                        max_position_embeddings=8192, chunk_size=chunk)
    learner = Learner(Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(0)), MeshConfig(data=1, fsdp=1, tensor=1),
                      MemoryConfig(attention_block=block))
    config = grpo.GRPOConfig(kl_coef=1e-3, temperature=0.7)
    lp = learner.logprobs(learner.params, batch, config)  # warm-up (compile)
    t = time.perf_counter()
    lp = learner.logprobs(learner.params, batch, config)
    logprob_s = time.perf_counter() - t
    full = dict(batch, old_logprobs=lp, ref_logprobs=lp)
    step, state = learner.grpo_block(config, OptimizerConfig(learning_rate=1e-4), args.steps + 1, args.micro)
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
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 3584, (args.rows, args.seq)).astype(np.int32)
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             "loss_mask": np.tile(np.arange(args.seq) >= args.seq // 2, (args.rows, 1)).astype(np.int32),
             "advantages": rng.standard_normal(args.rows).astype(np.float32)}
    print(f"tiny Qwen3.5, {args.rows} rows x {args.seq} tokens, {args.micro} micro-batches per step", flush=True)
    results = {}
    for name, block, chunk in SETTINGS:
        r = results[name] = run_setting(block, chunk, batch, args)
        print(f"  {name:8s} first step {r['first']:6.1f} s   warm step {r['step']:6.1f} s   "
              f"logprob pass {r['logprobs']:5.1f} s", flush=True)
    base = results[SETTINGS[0][0]]
    for name, _, _ in SETTINGS[1:]:
        r = results[name]
        diff = float(np.abs(r["lp"] - base["lp"]).max())
        print(f"  {name} vs dense: step {base['step'] / r['step']:.2f}x faster, logprob pass "
              f"{base['logprobs'] / r['logprobs']:.2f}x faster (max |logprob difference| {diff:.1e})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
