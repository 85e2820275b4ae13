"""Rollouts on more devices, episodes per minute (`bench_rollout --loops --replicas`).

Three comparisons, each the new agent loop (continuous schedule, one engine call per ready turn, a warm pool) on the
same `episodes` episodes over one real E2E task per track, each timed run after an untimed one with the same seed:

Details: docs/design.md.
"""

from __future__ import annotations

import collections
import dataclasses
import tempfile
import threading
import time

from launch.bench.workloads import NEW, ExpertReplay, agent_config, docker_answers, real_tasks, tiny_jax_engine


class RoutedEngines:
    """A `RolloutEngine` over in-process engines, each row on the replica `ReplicaRouter` picks (the routing of
    `VLLMReplicaPool` without processes; for the simulated comparison)."""

    def __init__(self, engines):
        from bat_jax.rollout.replica_router import ReplicaRouter

        self.engines, self.router = list(engines), ReplicaRouter(len(engines))

    @property
    def weight_version(self) -> int:
        return self.engines[0].weight_version

    def update_weights(self, params):
        self.router.forget()
        return [e.update_weights(params) for e in self.engines][0]

    def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
        n = len(prompts)
        budgets = list(max_new_tokens or [params.max_new_tokens] * n)
        seeds = list(seeds or [params.seed + i for i in range(n)])
        routed = [self.router.route(p, b) for p, b in zip(prompts, budgets)]
        out = [None] * n

        def call(r):
            rows = [i for i, x in enumerate(routed) if x == r]
            got = self.engines[r].generate([prompts[i] for i in rows], params,
                                           max_new_tokens=[budgets[i] for i in rows], seeds=[seeds[i] for i in rows])
            for i, c in zip(rows, got):
                out[i] = c

        threads = [threading.Thread(target=call, args=(r,)) for r in sorted(set(routed))]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            for i, (r, p, b) in enumerate(zip(routed, prompts, budgets)):
                self.router.finish(r, p, b, None if out[i] is None else out[i].token_ids)
        if any(c is None for c in out):
            raise RuntimeError("RoutedEngines: a replica failed")
        return out


def _measure(policy, engine, sandboxes, config, requests, seed):
    from bat_jax.policy import make_agent_loop

    t0 = time.perf_counter()
    trajs = make_agent_loop(policy, engine, sandboxes.make, config, sandboxes.release).run(requests, seed=seed)
    return len(trajs) / (time.perf_counter() - t0) * 60, dict(collections.Counter(t.finish_reason for t in trajs))


def nine_b_capacity() -> int:
    """Full-length (12,288-token) rollouts one vLLM replica of Qwen3.5-9B holds in bf16 at 0.3 of an 80 GiB GPU
    beside JAX's 0.6 (`rollout/vllm_memory.py`, bicurl_9b.gin's split)."""
    from bat_jax.rollout import vllm_memory as vm
    from launch.bench import compile_probe

    cache = vm.rollout_cache(compile_probe.MODELS["9b"], "bfloat16")
    return vm.plan(cache, max_model_len=12_288, device_total=80 << 30, jax_fraction=0.6, vllm_fraction=0.3).rollouts_fit


def bench_replicas(model, backend: str, tracks: list[str], episodes: int, turns: int, turn_tokens: int,
                   latency, replicas: int = 8, skip_vllm: bool = False) -> dict:
    """Episodes/min of the three comparisons (module docstring). Returns {(workload, count): (episodes/min,
    finish reasons)}."""
    import importlib.util

    from bat_jax.models.tokenizer import load_tiny_tokenizer
    from bat_jax.policy import Policy
    from bat_jax.rollout.agent_loop import AgentLoopConfig
    from bat_jax.rollout.sampling import SamplingConfig
    from bat_jax.rollout.mesh_sampler import SamplerMeshConfig
    from bat_jax.rollout.simulated_engine import SimulatedLatencyEngine
    from bat_jax.sandbox.backends import open_backend

    policy = Policy(model, load_tiny_tokenizer(), "qwen3_5")
    per_task = max(1, episodes // len(tracks))
    n = per_task * len(tracks)
    base = AgentLoopConfig(sampling=SamplingConfig(group_size=per_task), progress=False)
    rows: dict = {}
    sandboxes = open_backend(backend, n, warm=n)
    try:
        requests = [request for request, _ in real_tasks(tracks, "compact", expert=False)]
        config = agent_config(NEW, dataclasses.replace(base, max_assistant_turns=turns, max_tokens_per_turn=turn_tokens,
                                                       max_context_tokens=4096), n)

        def timed(name, count, engine):
            _measure(policy, engine, sandboxes, config, requests, seed=1)  # untimed: compiles, starts caches
            rows[name, count] = _measure(policy, engine, sandboxes, config, requests, seed=1)
            print(f"  {name:9s} x {count}: {rows[name, count][0]:7.1f} episodes/min  {rows[name, count][1]}",
                  flush=True)

        if skip_vllm or importlib.util.find_spec("vllm") is None:
            print("  vllm: skipped (vllm not installed, or --skip-vllm)", flush=True)
        else:
            from bat_jax.rollout.vllm_replicas import VLLMReplicaPool

            for count in (1, 2):
                with tempfile.TemporaryDirectory() as tmp:
                    pool = VLLMReplicaPool.from_model(model, tmp, count, dtype="float32", max_model_len=4096,
                                                      kv_cache_memory_bytes=64 << 20, max_num_seqs=64)
                    try:
                        timed("vllm", count, pool)
                    finally:
                        pool.close()
        for count in (1, 2):
            mesh = None if count == 1 else SamplerMeshConfig(devices=count)
            timed("sampler", count, tiny_jax_engine(model, max_context=4096, mesh=mesh))
        tasks = real_tasks(tracks)
        requests = [request for request, _ in tasks]
        config = agent_config(NEW, dataclasses.replace(base, max_assistant_turns=max(len(a) for _, a in tasks) + 1,
                                                       max_response_tokens=10 ** 6), n)
        capacity = nine_b_capacity()
        one = dataclasses.replace(latency, inflight=True, max_batch=capacity)
        for count in (1, replicas):
            engine = RoutedEngines([SimulatedLatencyEngine(ExpertReplay(policy.tokenizer, policy.chat_family, tasks),
                                                           one) for _ in range(count)])
            rows["simulated", count] = _measure(policy, engine, sandboxes, config, requests, seed=0)
            print(f"  simulated x {count}: {rows['simulated', count][0]:7.1f} episodes/min (each replica holds "
                  f"{capacity} rollouts)", flush=True)
    finally:
        sandboxes.close()
    return rows


def main_replicas(args, model) -> None:
    """Prints the three ratios (`bench_rollout --loops --replicas`)."""
    import os

    from bat_jax.rollout.simulated_engine import SimulatedLatency

    tracks = [t for t in args.tracks.split(",") if t]
    backend = args.backend or ("docker" if docker_answers() else "local")
    latency = SimulatedLatency(prefill_s=args.prefill_ms / 1000, decode_s_per_step=args.decode_ms / 1000)
    print(f"rollouts on more devices: {args.episodes} episodes, new loop, {backend} sandboxes", flush=True)
    rows = bench_replicas(model, backend, tracks, args.episodes, args.turns, 32, latency,
                          skip_vllm=args.skip_vllm)
    notes = {"vllm": f"tiny {args.family}, random weights; both on this machine's {os.cpu_count()} cores",
             "sampler": f"tiny {args.family}, continuous batcher, fake CPU devices on {os.cpu_count()} cores",
             "simulated": f"9B latency (prefill {args.prefill_ms:g} ms + {args.decode_ms:g} ms per decode step), "
                          f"{nine_b_capacity()} full-length rollouts per replica"}
    for name, note in notes.items():
        counts = sorted(c for w, c in rows if w == name)
        if len(counts) == 2:
            lo, hi = counts
            print(f"{name:>9} {hi} / {lo}: {rows[name, hi][0] / rows[name, lo][0]:5.2f}x  ({rows[name, lo][0]:.1f} -> "
                  f"{rows[name, hi][0]:.1f} episodes/min; {note})", flush=True)
