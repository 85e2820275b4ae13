"""Benchmark: our GRPO train step vs Tunix's GRPO learner update, same tiny Qwen3 and batch, one run.

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

MODEL = dict(  # a tiny Qwen3 shared by both sides
    vocab_size=2048,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    tie_word_embeddings=True,
)
BETA, EPS = 1e-3, 0.2  # paper defaults


def make_batch(batch: int, seq: int, vocab: int, seed: int = 0) -> dict:
    """Deterministic GRPO batch: prompt = first half (no loss), completion = second half (loss)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(2, vocab, size=(batch, seq)).astype(np.int32)  # 0 = pad, 1 = eos (Tunix derives masks)
    loss_mask = np.zeros((batch, seq), np.int32)
    loss_mask[:, seq // 2 :] = 1
    return {
        "input_ids": ids,
        "attention_mask": np.ones((batch, seq), np.int32),
        "loss_mask": loss_mask,
        "old_logprobs": rng.normal(-7.6, 0.1, size=(batch, seq)).astype(np.float32),
        "ref_logprobs": rng.normal(-7.6, 0.1, size=(batch, seq)).astype(np.float32),
        "advantages": rng.normal(size=(batch,)).astype(np.float32),
    }


def _timed(step, steps: int, warmup: int) -> dict:
    """Wall and process-CPU seconds for ``steps`` calls of ``step()`` after ``warmup`` untimed calls.

    CPU seconds (all threads of the worker) are less disturbed than wall time when other jobs share the
    cores; both are reported."""
    import jax

    out = None
    for _ in range(warmup):
        out = step()
    jax.block_until_ready(out)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        out = step()
    jax.block_until_ready(out)
    return {"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0}


def run_ours(args) -> dict:
    import jax
    from flax import nnx

    from bat_jax.learn import grpo, optim, train_state
    from bat_jax.models import mesh as mesh_lib
    from bat_jax.models.configs import Qwen3Config
    from bat_jax.models.qwen3 import Qwen3ForCausalLM
    from bat_jax.rollout.sampling import SamplingConfig

    model = Qwen3ForCausalLM(Qwen3Config(**MODEL), rngs=nnx.Rngs(0))
    apply_fn, params, specs = train_state.split_model(model)
    mesh = mesh_lib.build_mesh(mesh_lib.MeshConfig(fsdp=-1))
    tx = optim.make_optimizer(optim.GRPO_OPTIMIZER, total_steps=1000)
    sh = train_state.train_state_shardings(params, mesh_lib.param_shardings(params, specs, mesh), tx, mesh)
    state = train_state.create_train_state(params, tx, sh)
    batch = make_batch(args.batch, args.seq, MODEL["vocab_size"])
    bsh = {k: mesh_lib.batch_sharding(mesh, v.ndim) for k, v in batch.items()}
    cfg = grpo.GRPOConfig(kl_coef=BETA, clip_eps=EPS, loss_agg=args.loss_agg,
                          sampling=SamplingConfig(temperature=1.0))  # as Tunix below
    step_fn = train_state.make_train_step(grpo.make_grpo_loss(apply_fn, cfg), grpo.grpo_normalizers, tx, sh, bsh)
    batch = jax.device_put(batch, bsh)
    holder = [state]

    def one_step():
        holder[0], metrics = step_fn(holder[0], batch)
        return metrics["loss"]

    return _timed(one_step, args.steps, args.warmup)


def run_tunix(args) -> dict:
    """Tunix 0.1.7: its RL ``Trainer`` (the GRPO learner's actor trainer) with its registered ``grpo``
    policy loss, wired exactly as ``GRPOLearner.__init__`` wires it, on Tunix's own Qwen3 model."""
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from tunix.models.qwen3 import model as tq
    from tunix.rl import function_registry, trainer as rl_trainer
    from tunix.rl.grpo import grpo_learner
    from tunix.sft import peft_trainer

    cfg = tq.ModelConfig(
        num_layers=MODEL["num_hidden_layers"], vocab_size=MODEL["vocab_size"], embed_dim=MODEL["hidden_size"],
        hidden_dim=MODEL["intermediate_size"], num_heads=MODEL["num_attention_heads"], head_dim=MODEL["head_dim"],
        num_kv_heads=MODEL["num_key_value_heads"], rope_theta=int(MODEL["rope_theta"]), norm_eps=MODEL["rms_norm_eps"],
        use_tied_embedding=MODEL["tie_word_embeddings"],
    )
    model = tq.Qwen3(cfg, rngs=nnx.Rngs(0))
    algo = grpo_learner.GRPOConfig(num_generations=4, beta=BETA, epsilon=EPS, kl_loss_mode="low_var_kl",
                                   loss_agg_mode="sequence-mean-token-mean")
    algo.temperature = 1.0
    policy_loss_fn = function_registry.get_policy_loss_fn(algo.policy_loss_fn)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-6, weight_decay=0.0))
    trainer = rl_trainer.Trainer(
        model=model, optimizer=tx,
        training_config=peft_trainer.TrainingConfig(eval_every_n_steps=10**9, max_steps=10**9),
        custom_checkpoint_metadata_fn=lambda: {},
    )
    trainer.with_loss_fn(
        lambda model, train_example, algo_config: policy_loss_fn(
            model, train_example, algo_config=algo, pad_id=0, eos_id=1),
        has_aux=True,
    )
    trainer.with_gen_model_input_fn(lambda x: {"train_example": x, "algo_config": algo})
    train_step, _ = trainer.jit_train_and_eval_step(skip_jit=False, cache_nnx_graph=True)

    b = make_batch(args.batch, args.seq, MODEL["vocab_size"])
    half = args.seq // 2
    example = grpo_learner.TrainExample(
        prompt_ids=jnp.asarray(b["input_ids"][:, :half]),
        prompt_mask=jnp.asarray(b["attention_mask"][:, :half]),
        completion_ids=jnp.asarray(b["input_ids"][:, half:]),
        completion_mask=jnp.asarray(b["loss_mask"][:, half:]),
        advantages=jnp.asarray(b["advantages"]),
        ref_per_token_logps=jnp.asarray(b["ref_logprobs"][:, half:]),
        old_per_token_logps=jnp.asarray(b["old_logprobs"][:, half:]),
    )
    return _timed(lambda: train_step(example)[0], args.steps, args.warmup)


def worker(args) -> None:
    out = run_ours(args) if args.worker == "ours" else run_tunix(args)
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    out["device_peak_mib"] = stats.get("peak_bytes_in_use", 0) / 2**20 or None
    out["devices"] = jax.device_count()
    print("RESULT " + json.dumps(out), flush=True)


def spawn(python: str, side: str, args) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
    cmd = [python, "-m", "launch.bench.bench_grpo_vs_tunix", "--worker", side, "--batch", str(args.batch), "--seq", str(args.seq),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--loss-agg", args.loss_agg]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=args.timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{side} worker failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--loss-agg", default="seq-mean-token-mean", help="ours; Tunix runs sequence-mean-token-mean")
    p.add_argument("--tunix-python", default=os.environ.get("TUNIX_PYTHON", os.path.expanduser("~/.venvs/tunix/bin/python")))
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--worker", choices=("ours", "tunix"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    tokens = args.batch * args.seq * args.steps
    have_tunix = os.path.exists(args.tunix_python)
    runs: dict[str, list[dict]] = {"ours": [], "tunix": []}
    for _ in range(args.repeats):  # alternate sides; keep each side's fastest run (shared, noisy CPUs)
        runs["ours"].append(spawn(sys.executable, "ours", args))
        if have_tunix:
            runs["tunix"].append(spawn(args.tunix_python, "tunix", args))
    ours = min(runs["ours"], key=lambda r: r["seconds"])
    ours_tps = tokens / ours["seconds"]
    print(f"model {MODEL}\nbatch {args.batch} x seq {args.seq}, {args.steps} timed steps after {args.warmup} "
          f"warm-up, best of {args.repeats} alternating runs per side")
    print(f"ours : {ours_tps:10.1f} tokens/s  ({ours['seconds']:.2f} s wall, {ours['cpu_seconds']:.2f} s CPU, {ours['devices']} devices, "
          f"peak RSS {ours['peak_rss_mib']:.0f} MiB, device peak {ours['device_peak_mib']} MiB)")
    if not have_tunix:
        print(f"tunix: skipped, no interpreter at {args.tunix_python} (see launch/bench/README.md)")
        return
    tunix = min(runs["tunix"], key=lambda r: r["seconds"])
    tunix_tps = tokens / tunix["seconds"]
    print(f"tunix: {tunix_tps:10.1f} tokens/s  ({tunix['seconds']:.2f} s wall, {tunix['cpu_seconds']:.2f} s CPU, "
          f"peak RSS {tunix['peak_rss_mib']:.0f} MiB)")
    print(f"ratio ours/tunix: {ours_tps / tunix_tps:.2f}x tokens/s (wall); "
          f"{tunix['cpu_seconds'] / ours['cpu_seconds']:.2f}x by CPU seconds")


if __name__ == "__main__":
    main()
