"""The tiny default's GRPO block at max_staleness 0 and 1 on the CPU: real engine, agent loop, sandboxes and learner.

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import pathlib
import tempfile
import time

SHORTENED = (
    "agent_loop.AgentLoopConfig.max_assistant_turns = 5",
    "agent_loop.AgentLoopConfig.max_tool_calls = 5",
    "agent_loop.AgentLoopConfig.max_tokens_per_turn = 256",
    "agent_loop.AgentLoopConfig.max_response_tokens = 1024",
    "pools.PoolConfig.batch_size = 4",
    "dynamic_sampling.DynamicSamplingConfig.enabled = False",
    "grpo.GRPOConfig.tis_cap = 2.0",
)


def components(gin_file: str, bindings: tuple[str, ...]):
    """`experiment.Components` as `gin_file` plus `bindings` binds it (the launch's parser; gin cleared after)."""
    import gin

    from bat_jax import launch
    from bat_jax.bicurl import experiment

    launch.parse_gin([gin_file], list(bindings))
    try:
        return gin.get_configurable(experiment.Components)()
    finally:
        gin.clear_config(clear_constants=True)


class Timed:
    """Wraps a learner and times its logprob passes and optimizer steps.

    `busy_s`: seconds spent in them; `last_step_end`: when its last optimizer step ended (monotonic);
    `engine_at_last_step`: the engine meter's snapshot then. Everything else is the learner's."""

    def __init__(self, learner):
        self.inner, self.busy_s, self.last_step_end, self.engine_at_last_step = learner, 0.0, 0.0, (0.0, 0.0)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        if name in ("inner", "busy_s", "last_step_end", "engine_at_last_step", "meter"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    def logprobs(self, *args, **kwargs):
        t = time.monotonic()
        try:
            return self.inner.logprobs(*args, **kwargs)
        finally:
            self.busy_s += time.monotonic() - t

    def grpo_block(self, *args, **kwargs):
        step, state = self.inner.grpo_block(*args, **kwargs)

        def timed_step(state, host):
            t = time.monotonic()
            out = step(state, host)
            import jax

            jax.block_until_ready(out[0].params)
            self.last_step_end = time.monotonic()
            self.busy_s += self.last_step_end - t
            self.engine_at_last_step = self.meter.snapshot()
            return out

        return timed_step, state


def measure(staleness=(0, 1), steps: int = 2, bank_dir: str = "runs/stage_bank_tabular",
            gin_file: str = "tabular_tiny.gin", checkpoint: str | None = None, bindings: tuple[str, ...] = (),
            seed: int = 7, warmup: bool = True) -> list[dict]:
    """One GRPO block of `steps` pool batches at each max_staleness in `staleness` (module docstring).

    With `warmup`, one untimed block of one step at each setting comes first (the engine's and the learner's programs
    are compiled before any timed block, so neither setting pays for them)."""
    from bat_jax.bicurl import async_block
    from bat_jax.bicurl.engines import build_engine
    from bat_jax.bicurl.round_rows import mode_pools
    from bat_jax.bicurl.run_loops import open_run_loops
    from bat_jax.learn.learner import Learner
    from bat_jax.learn.staleness import StalenessConfig
    from bat_jax.policy import build_policy
    from bat_jax.prompts import PromptFormat
    from bat_jax.stage_bank import pools
    from bat_jax.stage_bank.bank import StageBank
    from launch.bench.workloads import BusyMeter

    extra = (f"policy.PolicyConfig.checkpoint_dir = '{checkpoint}'",) if checkpoint else ()
    comps = components(gin_file, SHORTENED + extra + tuple(bindings))
    benchmark, agent = comps.benchmark, comps.agent
    bank = StageBank(bank_dir)
    view = bank.read(bank.latest())
    rows, pool_config = mode_pools(view.rl_rows, "bicurl", comps.pools)
    round_view = pools.build_round_view(rows, benchmark.stages.ids[0], round_index=1, n_batches=steps,
                                        config=pool_config)
    policy = build_policy(comps.policy)
    learner = Timed(Learner(policy.model, comps.mesh, comps.memory))
    start = learner.host_copy(learner.params)
    results = []
    with contextlib.ExitStack() as stack:
        run_dir = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="async_tiny_")))
        engine = build_engine(policy, comps.engine, agent.max_context_tokens, run_dir,
                              batch_episodes=comps.pools.batch_size * comps.sampling.group_size)
        if hasattr(engine, "close"):
            stack.callback(engine.close)
        loops = open_run_loops(policy, engine, agent, comps.evaluation, benchmark,
                               comps.pools.batch_size * (1 + max(staleness)), "local", warm_pool=False)
        stack.callback(loops.close)
        block = comps.block.for_run(agent, PromptFormat.of(benchmark, policy.prompt_style))
        warm = pools.build_round_view(rows, benchmark.stages.ids[0], round_index=2, n_batches=1, config=pool_config)
        for s, timed in [(s, False) for s in staleness if warmup] + [(s, True) for s in staleness]:
            learner.params = learner.on_mesh(start)
            loop = copy.copy(loops.rollouts)
            loop.engine = learner.meter = BusyMeter(loops.rollouts.engine)
            learner.busy_s, learner.last_step_end = 0.0, 0.0
            t0 = time.monotonic()
            stats = async_block.run_grpo_block(learner, loop, bank, round_view if timed else warm,
                                               dataclasses.replace(block, staleness=StalenessConfig(max_staleness=s)),
                                               benchmark, seed=seed)
            if not timed:
                continue
            wall = learner.last_step_end - t0
            busy, calls = learner.engine_at_last_step
            results.append({"s": s, "wall_s": wall, "steps_per_hour": steps / wall * 3600, "engine_busy": busy / wall,
                            "episodes_decoding": calls / wall, "learner_busy": learner.busy_s / wall,
                            "trained": stats.groups_trained, "rollouts": stats.rollouts,
                            "reward_mean": stats.reward_mean, "staleness_mean": stats.staleness_mean,
                            "staleness_max": stats.staleness_max, "dropped_stale": stats.groups_dropped_stale})
    return results


def describe(results: list[dict], steps: int, threads: int | None = None) -> str:
    """The table the bench prints."""
    base = results[0]
    lines = [f"tiny default, real engine / agent loop / local sandboxes / learner, {steps} GRPO steps per setting"
             + (f", {threads} CPU threads" if threads else ""),
             f"{'s':>3}{'wall s':>9}{'steps/h':>10}{'ratio':>8}{'engine busy':>13}{'learner busy':>14}"
             f"{'in flight':>11}{'groups':>8}{'reward':>8}{'lag mean':>10}"]
    for r in results:
        lag = "—" if r["staleness_mean"] is None else f"{r['staleness_mean']:.2f}"
        reward = "—" if r["reward_mean"] is None else f"{r['reward_mean']:.3f}"
        lines.append(f"{r['s']:>3}{r['wall_s']:>9.1f}{r['steps_per_hour']:>10.0f}"
                     f"{r['steps_per_hour'] / base['steps_per_hour']:>7.2f}x{r['engine_busy']:>12.0%}"
                     f"{r['learner_busy']:>14.0%}{r['episodes_decoding']:>11.1f}{r['trained']:>8}{reward:>8}{lag:>10}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the tiny mode (shared with `bench_async_grpo --tiny`)."""
    parser.add_argument("--bank", default="runs/stage_bank_tabular", help="an existing Stage Bank (read only)")
    parser.add_argument("--gin", default="tabular_tiny.gin", help="the run file (the tiny default on a suite)")
    parser.add_argument("--checkpoint", default=None, help="a run's export/ directory (default: random init)")
    parser.add_argument("--tiny-steps", type=int, default=2, help="GRPO steps per setting")
    parser.add_argument("--bindings", nargs="*", default=[], help="more gin bindings after the shortening ones")


def run(args) -> list[dict]:
    """Measures and prints the tiny mode (`add_arguments`' options; `args.staleness`, default 0 and 1)."""
    import os

    staleness = tuple(getattr(args, "staleness", None) or (0, 1))
    results = measure(staleness, steps=args.tiny_steps,
                      bank_dir=args.bank, gin_file=args.gin, checkpoint=args.checkpoint,
                      bindings=tuple(args.bindings))
    print(describe(results, args.tiny_steps, os.cpu_count()))
    return results


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1])
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
