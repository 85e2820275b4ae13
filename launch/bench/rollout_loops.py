"""Agent-loop episodes per minute: the lockstep loop against the loop a run uses (`bench_rollout --loops`).

The two loops (`workloads.OLD`, `workloads.NEW`) differ in how a batch of episodes is run; the engine's cost, the
tasks, the actions and the tool calls stay the same:

Details: docs/design.md.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time

import numpy as np

from launch.bench.workloads import (NEW, OLD, ExpertReplay, Loop, agent_config, docker_answers, real_tasks,
                                    tiny_default, tiny_jax_engine)


def jax_engine_for(loop: Loop, model, episodes: int):
    """The JAX sampler of `loop`: plain (one call at a time, every episode in one call) or the tiny default's
    continuous batcher (`engines.EngineConfig` of gin/bicurl_tiny.gin: slots, rows per call, stored prefixes)."""
    from bat_jax.rollout.continuous_batching import jax_engine

    if loop.inflight:
        return tiny_jax_engine(model, max_context=4096)
    return jax_engine(model, max_context=4096, max_batch=episodes)


def _clear_prefixes(engine) -> None:
    """Forgets the stored prefixes of a JAX engine (so a timed run does not continue its warm-up's turns)."""
    sampler = getattr(engine, "sampler", engine)
    if getattr(sampler, "prefix_cache", None) is not None:
        sampler.prefix_cache.clear()


def bench_loops(model, backend: str, tracks: list[str], episodes: int, turns: int, turn_tokens: int, latency,
                skip_jax: bool = False, skip_simulated: bool = False, new_first: bool = False) -> dict:
    """Episodes/min of the old and the new loop (module docstring) on `episodes` concurrent episodes, split over
    one real E2E task per track, sandboxes of `backend` ('docker' or 'local'; the old loop's fresh, the new loop's
    from a warm pool started first): (a) the JAX sampler on `model` (`turns` turns of <= `turn_tokens` tokens),
    timed after an untimed run of each loop with the same seed (nothing compiles in the timed runs); (b)
    `SimulatedLatencyEngine(ExpertReplay, latency)`, old one call at a time, new in flight. `new_first` times the
    new loop first. Returns {(workload, loop name): (episodes/min, mean turns, mean tool calls, finish reasons,
    engine calls or None)}."""
    from bat_jax.models.tokenizer import load_tiny_tokenizer
    from bat_jax.policy import Policy, make_agent_loop
    from bat_jax.rollout.agent_loop import AgentLoopConfig
    from bat_jax.rollout.sampling import SamplingConfig
    from bat_jax.rollout.simulated_engine import SimulatedLatencyEngine
    from bat_jax.sandbox.backends import open_backend

    policy = Policy(model, load_tiny_tokenizer(), "qwen3_5")
    per_task = max(1, episodes // len(tracks))
    n = per_task * len(tracks)
    order = (NEW, OLD) if new_first else (OLD, NEW)
    base = AgentLoopConfig(sampling=SamplingConfig(group_size=per_task), progress=False)
    rows: dict = {}
    backends = {OLD.name: open_backend(backend, n)}
    try:
        t0 = time.perf_counter()
        backends[NEW.name] = open_backend(backend, n, warm=n)
        print(f"  warm pool of {n} {backend} sandboxes started in {time.perf_counter() - t0:.1f} s (once per run; "
              "not in the timed runs)", flush=True)

        def measure(loop, engine, config, requests, seed, calls=lambda: None):
            sandboxes = backends[loop.name]
            before = calls()
            t0 = time.perf_counter()
            trajs = make_agent_loop(policy, engine, sandboxes.make, config, sandboxes.release).run(requests,
                                                                                                   seed=seed)
            epm = len(trajs) / (time.perf_counter() - t0) * 60
            return (epm, np.mean([t.num_turns for t in trajs]), np.mean([t.num_tool_calls for t in trajs]),
                    dict(collections.Counter(t.finish_reason for t in trajs)),
                    None if before is None else calls() - before)

        if not skip_jax:
            requests = [request for request, _ in real_tasks(tracks, "compact", expert=False)]
            config = dataclasses.replace(base, max_assistant_turns=turns, max_tokens_per_turn=turn_tokens,
                                         max_context_tokens=4096)
            engines = {loop.name: jax_engine_for(loop, model, n) for loop in order}
            for loop in order:  # untimed, same seed: the timed runs find every program compiled
                measure(loop, engines[loop.name], agent_config(loop, config, n), requests, seed=1)
            for loop in order:
                _clear_prefixes(engines[loop.name])
                rows["jax", loop.name] = measure(loop, engines[loop.name], agent_config(loop, config, n), requests,
                                                 seed=1)
                print(f"  (a) jax sampler, {loop.name} loop: {rows['jax', loop.name][0]:7.1f} episodes/min",
                      flush=True)
        if not skip_simulated:
            tasks = real_tasks(tracks)
            requests = [request for request, _ in tasks]
            config = dataclasses.replace(base, max_assistant_turns=max(len(a) for _, a in tasks) + 1,
                                         max_response_tokens=10 ** 6)
            for loop in order:
                engine = SimulatedLatencyEngine(ExpertReplay(policy.tokenizer, policy.chat_family, tasks),
                                                dataclasses.replace(latency, inflight=loop.inflight))
                rows["simulated", loop.name] = measure(loop, engine, agent_config(loop, config, n), requests, seed=0,
                                                       calls=lambda: engine.calls)
                print(f"  (b) simulated, {loop.name} loop: {rows['simulated', loop.name][0]:7.1f} episodes/min",
                      flush=True)
    finally:
        for sandboxes in backends.values():
            sandboxes.close()
    return rows


def bench_synthetic(episodes: int, turns: int, mean_tokens: float, mean_tool_s: float, latency) -> dict:
    """The old and the new loop on a heterogeneous synthetic workload (no Docker, no model): `episodes` episodes of
    `turns` turns; each turn's length in tokens is drawn (seeded by the turn's sampling seed) from an exponential
    with mean `mean_tokens` (a valid `execute_code` call whose thought is padded to that length) and timed by
    `SimulatedLatencyEngine(latency)` (old: one call at a time, new: in flight); each tool call sleeps an
    exponential time of mean `mean_tool_s` seconds (seeded by the episode and call). It shows what the new loop
    gains when episodes differ, which the expert replay's near-identical episodes cannot. Returns
    {loop name: episodes/min}."""
    import itertools

    from bat_jax.models.chat import render_action
    from bat_jax.models.episode import EpisodeBuilder
    from bat_jax.models.tokenizer import load_tiny_tokenizer
    from bat_jax.rollout.agent_loop import AgentLoop, AgentLoopConfig, RolloutRequest
    from bat_jax.rollout.sampling import SamplingConfig
    from bat_jax.rollout.engine import Completion
    from bat_jax.rollout.simulated_engine import SimulatedLatencyEngine
    from bat_jax.sandbox.local import NullSandbox
    from bat_jax.sandbox.tools import Action
    from bat_jax.sandbox.types import SandboxState

    tok = load_tiny_tokenizer()
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    call = Action("", "execute_code", {"language": "bash", "code": "true"})
    base_ids = tok.encode(render_action(call, "qwen3_5"), add_special_tokens=False)
    filler = tok.encode(" x", add_special_tokens=False)[-1]

    class Lengths:
        weight_version = 0

        def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
            out = []
            for seed, budget in zip(seeds, max_new_tokens):
                n = int(np.random.default_rng(seed).exponential(mean_tokens))
                ids = ([filler] * n + base_ids + [eot])[-budget:]
                out.append(Completion(np.asarray(ids, np.int32), np.zeros(len(ids), np.float32), "stop"))
            return out

    def sleeping_sandbox_factory():
        """Sandboxes whose tool calls take exponential times (mean `mean_tool_s`), seeded per sandbox."""
        count = itertools.count(1)

        def make(state):
            rng = np.random.default_rng(next(count))
            return NullSandbox(state, delay_s=lambda: rng.exponential(mean_tool_s))

        return make

    requests = [RolloutRequest(state_id="synthetic", state=SandboxState(files={}), system_prompt="s",
                               user_message="u")]
    base = AgentLoopConfig(sampling=SamplingConfig(group_size=episodes),
                           max_assistant_turns=turns, max_tool_calls=turns,
                           max_tokens_per_turn=4096, max_response_tokens=10 ** 6, max_context_tokens=10 ** 6,
                           progress=False)
    out = {}
    for loop in (OLD, NEW):
        engine = SimulatedLatencyEngine(Lengths(), dataclasses.replace(latency, inflight=loop.inflight))
        agent = AgentLoop(engine, lambda: EpisodeBuilder(tok, "qwen3_5"), sleeping_sandbox_factory(),
                          agent_config(loop, base, episodes))
        t0 = time.perf_counter()
        agent.run(requests, seed=0)
        out[loop.name] = episodes / (time.perf_counter() - t0) * 60
        print(f"  synthetic, {loop.name} loop: {out[loop.name]:7.1f} episodes/min ({engine.calls} engine calls)",
              flush=True)
    return out


def bench_ray_scaling(backend: str, tracks: list[str], episodes: int, turns: int, turn_tokens: int) -> dict:
    """Episodes/min of `RayRollouts` running the new loop (each worker: the tiny default policy (qwen3, compact
    prompts), its continuous JAX batcher with the tiny default's settings, a warm pool of its share of `backend`
    sandboxes) with 1 and with 2 workers on a local Ray cluster, the same `episodes` episodes over one real E2E task
    per track; each timed run follows a warm-up run. Returns {workers: (episodes/min, finish reasons)}."""
    import ray

    from bat_jax.policy import PolicyConfig
    from bat_jax.rollout.agent_loop import AgentLoopConfig
    from bat_jax.rollout.sampling import SamplingConfig
    from bat_jax.bicurl.ray_workers import RayRolloutConfig, RayRollouts, WorkerSpec

    per_task = max(1, episodes // len(tracks))
    requests = [request for request, _ in real_tasks(tracks, "compact", expert=False)]
    agent = agent_config(NEW, AgentLoopConfig(sampling=SamplingConfig(group_size=per_task), max_assistant_turns=turns,
                                              max_tokens_per_turn=turn_tokens, max_context_tokens=4096,
                                              progress=False), episodes)
    out = {}
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        for workers in (1, 2):
            share = -(-per_task * len(tracks) // workers)  # each worker's warm pool: its share of the episodes
            spec = WorkerSpec(PolicyConfig(architecture="qwen3", prompt_style="compact"), agent, backend,
                              tiny_default().engine, warm_pool=share if backend == "docker" else 0)
            rollouts = RayRollouts.start(spec, RayRolloutConfig(num_workers=workers, cpus_per_worker=0.5,
                                                                start_timeout_s=900,
                                                                worker_env={"JAX_PLATFORMS": "cpu"}))
            try:
                rollouts.run(requests, seed=0)  # warm-up: compiles
                t0 = time.perf_counter()
                trajs = rollouts.run(requests, seed=1)
                out[workers] = (len(trajs) / (time.perf_counter() - t0) * 60,
                                dict(collections.Counter(t.finish_reason for t in trajs)))
            finally:
                rollouts.close()
            print(f"  ray, {workers} worker(s): {out[workers][0]:7.1f} episodes/min", flush=True)
    finally:
        ray.shutdown()
    return out


def main_loops(args, build_models) -> int:
    """`bench_rollout --loops`: old vs new loop (JAX sampler, simulated large model), `--synthetic`, `--ray`.
    `build_models(family, vocab, tmp)` makes the tiny random model (`bench_rollout.build_models`)."""
    import importlib.util
    import tempfile

    from bat_jax.models.tokenizer import TINY_VOCAB_SIZE
    from bat_jax.rollout.simulated_engine import SimulatedLatency

    tracks = [t for t in args.tracks.split(",") if t]
    n = max(1, args.episodes // len(tracks)) * len(tracks)
    backend = args.backend or ("docker" if docker_answers() else "local")
    latency = SimulatedLatency(prefill_s=args.prefill_ms / 1000, decode_s_per_step=args.decode_ms / 1000, max_batch=n)
    with tempfile.TemporaryDirectory() as tmp:
        model, _ = build_models(args.family, TINY_VOCAB_SIZE, tmp)
    print(f"agent loops: {n} concurrent episodes on {len(tracks)} real E2E tasks ({','.join(tracks)}), {backend} "
          f"sandboxes; old = {dataclasses.asdict(OLD)}, new = {dataclasses.asdict(NEW)}; simulated engine "
          f"{dataclasses.asdict(latency)} (inflight per loop)", flush=True)
    rows = bench_loops(model, backend, tracks, n, args.turns, 32, latency, args.skip_jax, args.skip_simulated,
                       args.new_first)
    notes = {"jax": f"tiny {args.family}, random weights, {args.turns} turns of <= 32 tokens",
             "simulated": f"expert actions, prefill {args.prefill_ms:g} ms + {args.decode_ms:g} ms per decode step"}
    for workload, note in notes.items():
        if (workload, OLD.name) not in rows:
            continue
        for loop in (OLD, NEW):
            epm, turns, calls, finish, n_calls = rows[workload, loop.name]
            extra = "" if n_calls is None else f", {n_calls} engine calls"
            print(f"{workload:>9} {loop.name} loop {epm:7.1f} episodes/min  ({turns:.1f} turns, {calls:.1f} tool "
                  f"calls{extra}; {finish})")
        ratio = rows[workload, NEW.name][0] / rows[workload, OLD.name][0]
        print(f"{workload:>9} new / old loop: {ratio:5.2f}x  ({note})", flush=True)
    if args.synthetic:
        syn = bench_synthetic(n, 12, args.synthetic_tokens, args.synthetic_tool_s, latency)
        print(f"synthetic new / old loop: {syn[NEW.name] / syn[OLD.name]:5.2f}x  ({n} episodes x 12 turns, "
              f"exponential turn lengths of mean {args.synthetic_tokens:g} tokens and tool calls of mean "
              f"{args.synthetic_tool_s:g} s, the simulated engine above; no Docker, no model)", flush=True)
    if args.ray:
        if importlib.util.find_spec("ray") is None:
            print("ray: not installed (pip install -e '.[ray]')")
        else:
            ray_rows = bench_ray_scaling(backend, tracks, n, args.turns, 32)
            print(f"ray 2 workers / 1 worker: {ray_rows[2][0] / ray_rows[1][0]:5.2f}x  ({ray_rows[1][0]:.1f} -> "
                  f"{ray_rows[2][0]:.1f} episodes/min; {os.cpu_count()} CPU cores shared by both workers' JAX "
                  f"samplers and the sandboxes)", flush=True)
    if getattr(args, "replicas", False):
        from launch.bench.replica_loops import main_replicas

        main_replicas(args, model)
    print(f"load average {os.getloadavg()[0]:.1f} at end", flush=True)
    return 0
