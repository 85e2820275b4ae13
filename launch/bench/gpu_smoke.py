"""GPU smoke test of the learner path (issue 14); run by `launch/gpu_smoke.sh`. UNTESTED: written without a GPU.

A Qwen3.5-0.8B-shaped model (hidden 1024, 24 layers, 8 heads x 256, 2 kv heads, DeltaNet 16 x 128 heads,
intermediate 3584, tied head) with the real 248,320-token vocabulary, random init, bf16 compute and fp32
parameters, on every local GPU (fsdp = device count). Stages, each timed, each printing one `[smoke]` line:

1. SFT step (remat 'full', chunked head) at `--rows` x `--seq`; tokens/s and MFU (6 · N · tokens / s over the
   device's bf16 peak, `--peak_tflops`, default 989 for an H100/H200 SXM dense bf16);
2. GRPO step (sharded reference logprobs first) at the same shape; tokens/s and MFU;
3. Orbax save + restore of the parameters (bit-exact check);
4. vLLM (only when `import vllm` works): engine start on the model written in HF layout, generate with logprobs,
   a streamed weight sync (`update_weights`) and generate again.

Exit status 0 when every stage that ran passed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bat_jax.learn import grpo, sft  # noqa: E402
from bat_jax.learn.learner import Learner, MemoryConfig  # noqa: E402
from bat_jax.learn.mesh import MeshConfig  # noqa: E402
from bat_jax.learn.optim import OptimizerConfig  # noqa: E402
from bat_jax.models.configs import Qwen3_5Config  # noqa: E402
from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM  # noqa: E402

SMOKE_0P8B = Qwen3_5Config(vocab_size=248_320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
                           num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_key_head_dim=128,
                           linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=16,
                           tie_word_embeddings=True, rope_theta=10_000_000.0, dtype="bfloat16", param_dtype="float32")


def _line(stage: str, t0: float, **kv) -> None:
    extra = " ".join(f"{k}={v}" for k, v in kv.items())
    print(f"[smoke] {stage:10s} ok {time.perf_counter() - t0:7.1f} s {extra}", flush=True)


def _timed_steps(step, state, batch, n):
    state, m = step(state, batch)  # compile + first step
    jax.block_until_ready(m["loss"])
    t0 = time.perf_counter()
    for _ in range(n):
        state, m = step(state, batch)
    jax.block_until_ready(m["loss"])
    return state, m, (time.perf_counter() - t0) / n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=0, help="rows per step (default: 2 per device)")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--peak_tflops", type=float, default=989.0)
    ap.add_argument("--tiny", action="store_true", help="a tiny model (checks this script's code paths on a CPU)")
    args = ap.parse_args(argv)
    cfg_model = SMOKE_0P8B if not args.tiny else dataclasses.replace(
        SMOKE_0P8B, vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
        head_dim=32, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2,
        dtype="float32", layer_types=())
    devices = jax.devices()
    print(f"[smoke] jax {jax.__version__} on {len(devices)} x {devices[0].device_kind} ({jax.default_backend()})")
    rows = args.rows or 2 * len(devices)
    t0 = time.perf_counter()
    model = Qwen3_5ForCausalLM(cfg_model, rngs=nnx.Rngs(0))
    learner = Learner(model, MeshConfig(fsdp=-1), MemoryConfig(remat="full"))
    n_params = sum(x.size for x in jax.tree.leaves(learner.params))
    _line("init", t0, params=f"{n_params / 1e9:.2f}e9")

    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg_model.vocab_size, (rows, args.seq)).astype(np.int32)
    ones = np.ones_like(ids)
    loss_mask = ones.copy()
    loss_mask[:, : args.seq // 4] = 0
    flops_per_token = 6 * n_params  # dense matmul estimate; attention and DeltaNet extras not counted

    def mfu(seconds):
        tok_s = rows * args.seq / seconds
        return tok_s, tok_s * flops_per_token / (args.peak_tflops * 1e12 * len(devices))

    t0 = time.perf_counter()
    step, state = learner.sft_block(sft.SFTConfig(global_batch_size=rows, max_seq_len=args.seq), total_steps=10)
    state, m, dt = _timed_steps(step, state, {"input_ids": ids, "attention_mask": ones, "loss_mask": loss_mask},
                                args.steps)
    tok_s, u = mfu(dt)
    assert np.isfinite(float(m["loss"])), m
    _line("sft", t0, loss=f"{float(m['loss']):.3f}", tokens_per_s=f"{tok_s:.0f}", mfu=f"{u:.1%}")
    learner.adopt(state)

    t0 = time.perf_counter()
    cfg = grpo.GRPOConfig(temperature=0.7)
    ref = learner.logprobs(learner.params, {"input_ids": ids, "attention_mask": ones}, cfg)
    batch = {"input_ids": ids, "attention_mask": ones, "loss_mask": loss_mask, "old_logprobs": ref,
             "ref_logprobs": ref, "advantages": rng.normal(size=rows).astype(np.float32)}
    step, state = learner.grpo_block(cfg, OptimizerConfig(learning_rate=1e-6, schedule="constant", warmup_ratio=0.0),
                                     total_steps=10, num_micro_batches=1)
    state, m, dt = _timed_steps(step, state, batch, args.steps)
    tok_s, u = mfu(dt)
    assert np.isfinite(float(m["loss"])), m
    _line("grpo", t0, loss=f"{float(m['loss']):.4f}", tokens_per_s=f"{tok_s:.0f}", mfu=f"{u:.1%}")
    learner.adopt(state)

    t0 = time.perf_counter()
    from bat_jax.checkpoint import CheckpointConfig, Checkpointer

    with tempfile.TemporaryDirectory() as d:
        ckpt = Checkpointer(CheckpointConfig(directory=d))
        ckpt.save(1, {"params": learner.params}, metrics={"overall": 0.0})
        ckpt.wait()
        abstract = {"params": jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                                           learner.params)}
        back = ckpt.restore(abstract, step=1).state["params"]
        same = all(bool(jnp.array_equal(a, b)) for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(learner.params)))
        assert same, "Orbax restore differs from the saved parameters"
        ckpt.close()
    _line("orbax", t0, bytes=f"{sum(x.nbytes for x in jax.tree.leaves(learner.params)) / 1e9:.1f}GB")

    try:
        import vllm  # noqa: F401
    except ImportError:
        print("[smoke] vllm       skipped (not installed: WITH_VLLM=1 bash launch/install_gpu.sh)")
        return 0
    t0 = time.perf_counter()
    from bat_jax.rollout.engine import SamplingParams
    from bat_jax.rollout.vllm_engine import VLLMEngine

    with tempfile.TemporaryDirectory() as d:
        engine = VLLMEngine.from_model(learner.sync_model(), d, dtype="bfloat16", gpu_memory_utilization=0.3,
                                       max_model_len=8192)
        prompts = [list(map(int, ids[i, :64])) for i in range(4)]
        out = engine.generate(prompts, SamplingParams(temperature=0.7, max_new_tokens=32))
        assert all(len(c.token_ids) > 0 and np.all(np.isfinite(c.logprobs)) for c in out)
        t1 = time.perf_counter()
        v = engine.update_weights(learner.sync_model())
        sync_s = time.perf_counter() - t1
        out2 = engine.generate(prompts, SamplingParams(temperature=0.7, max_new_tokens=32))
        assert all(c.weight_version == v for c in out2)
        engine.close()
    _line("vllm", t0, weight_sync_s=f"{sync_s:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
