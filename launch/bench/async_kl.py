"""How far apart bounded staleness takes the policy: KL(π_s=0 ‖ π_s) after the same GRPO steps on the same rows.

`bench_async_grpo`'s KL column (`python -m launch.bench.bench_async_grpo`; on its own:
`python -m launch.bench.async_kl [--steps 8] [--staleness 0 1 2]`).

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import time
import types

import numpy as np


class PromptLoop:
    """Single-turn episodes on a real engine: row `request`'s prompt ids, one completion of `tokens` tokens.

    Each is drawn with the seed of (block seed, row index, episode) — the agent loop's per-episode seeding, so a
    group's draws do not depend on which other groups share the engine call."""

    def __init__(self, engine, prompts: dict[str, list[int]], tokens: int, k: int, temperature: float):
        self.engine, self.prompts, self.tokens, self.k, self.temperature = engine, prompts, tokens, k, temperature

    def run_episodes(self, episodes, seed, on_trajectory=None):
        from bat_jax.rollout.engine import SamplingParams

        seeds = [int(np.random.SeedSequence([seed, i, k]).generate_state(1)[0] & 0x7FFFFFFF) for _, i, k in episodes]
        completions = self.engine.generate([self.prompts[req] for req, _, _ in episodes],
                                           SamplingParams(temperature=self.temperature, max_new_tokens=self.tokens),
                                           seeds=seeds)
        out = []
        for position, ((req, _, k), comp) in enumerate(zip(episodes, completions)):
            prompt, n = np.asarray(self.prompts[req], np.int32), len(comp.token_ids)
            out.append(types.SimpleNamespace(
                state_id=req, episode=k, ids=np.concatenate([prompt, np.asarray(comp.token_ids, np.int32)]),
                loss_mask=np.concatenate([np.zeros(len(prompt), np.int32), np.ones(n, np.int32)]),
                logprobs=np.concatenate([np.zeros(len(prompt), np.float32), np.asarray(comp.logprobs, np.float32)]),
                agent_error="", infra_error="", finish_reason=comp.finish_reason,
                turn_versions=(comp.weight_version,), weight_version=comp.weight_version))
            if on_trajectory is not None:
                on_trajectory(position, out[-1])
        return out

    def run(self, requests, seed, on_trajectory=None):
        return self.run_episodes([(r, i, k) for i, r in enumerate(requests) for k in range(self.k)], seed,
                                 on_trajectory)


def even_share(trajectory) -> float:
    """The stand-in reward: the share of the rollout's sampled ids that are even."""
    sampled = np.asarray(trajectory.ids)[np.asarray(trajectory.loss_mask) > 0]
    return float(np.mean(sampled % 2 == 0)) if len(sampled) else 0.0


class _Scorer:
    """Stand-in for `bicurl/reward.RolloutScorer`: `even_share` of every rollout handed over."""

    def __init__(self, rows, starts, benchmark, judge, config, tasks):
        self.n, self.got = len(rows), {}

    def submit(self, position, trajectory):
        self.got[position] = trajectory

    def results(self):
        return [types.SimpleNamespace(reward=even_share(self.got[p]), version="even-share", items=None)
                for p in range(self.n)]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@contextlib.contextmanager
def stand_in_scoring():
    """The GRPO block's request builder, scorer and progress bar replaced by the stand-ins (restored after)."""
    from bat_jax.bicurl import grpo_round as gr

    saved = gr.rl_request, gr.RolloutScorer, gr.tqdm
    gr.rl_request = lambda row, start, state_id, prompt: state_id
    gr.RolloutScorer, gr.tqdm = _Scorer, (lambda xs, **kw: xs)
    try:
        yield
    finally:
        gr.rl_request, gr.RolloutScorer, gr.tqdm = saved


def policy_kl(staleness=(0, 1, 2), steps: int = 8, rows: int = 4, tokens: int = 16, prompt_len: int = 12,
              probes: int = 16, learning_rate: float | None = None, seed: int = 5) -> dict:
    """KL(π_s=0 ‖ π_s) of the tiny default's policy trained at each max_staleness in `staleness`.

    Trains it for `steps` GRPO steps of `rows` rows × K at each s (plus s = 0 with another rollout seed) from the
    same weights on the same rows (the tiny default's GRPO optimizer, at `learning_rate` when given); returns
    {'kl': {s: KL(π_s=0 ‖ π_s)}, 'kl_untrained': KL(π_s=0 ‖ π_init), 'kl_other_seed': KL(π_s=0 ‖ π_s=0'),
    'reward': {s: mean reward of the block's rollouts}, 'staleness_mean': {s: ...}, 'seconds': wall seconds}."""
    from bat_jax.bicurl import async_block
    from bat_jax.bicurl import grpo_round as gr
    from bat_jax.learn import kl
    from bat_jax.learn.learner import Learner
    from bat_jax.learn.staleness import StalenessConfig
    from bat_jax.models.mesh import MeshConfig
    from bat_jax.rollout.jax_sampler import JaxSampler
    from launch.bench.workloads import tiny_default, tiny_policy

    t0 = time.perf_counter()
    tiny = tiny_default()
    policy = tiny_policy()
    vocab = len(policy.tokenizer)
    learner = Learner(policy.model, MeshConfig(data=1, fsdp=1, tensor=1), tiny.memory)
    init = learner.host_copy(learner.params)
    rng = np.random.default_rng(seed)
    names = [f"b{b}r{r}" for b in range(steps) for r in range(rows)]
    prompts = {name: [int(x) for x in rng.integers(1, vocab, prompt_len)] for name in names}
    probe_ids = rng.integers(1, vocab, (probes, prompt_len + tokens)).astype(np.int32)
    k = tiny.sampling.group_size
    engine = JaxSampler(policy.model, max_context=prompt_len + tokens + 1)
    loop = PromptLoop(engine, prompts, tokens, k, tiny.sampling.temperature)
    item = lambda name: types.SimpleNamespace(round_state_id=name, pool="target",  # noqa: E731
                                              row=types.SimpleNamespace(state=None, provenance=types.SimpleNamespace(
                                                  track="bench")))
    view = types.SimpleNamespace(batches=[[item(f"b{b}r{r}") for r in range(rows)] for b in range(steps)],
                                 spares={"target": []})
    bank = types.SimpleNamespace(load_state=lambda state: None)
    cfg = dataclasses.replace(tiny.block.grpo, tis_cap=tiny.block.grpo.tis_cap or 2.0)
    optimizer = tiny.block.optimizer
    if learning_rate is not None:
        optimizer = dataclasses.replace(optimizer, learning_rate=learning_rate)

    def train(s: int, block_seed: int):
        learner.params = learner.on_mesh(init)
        block = gr.GRPOBlockConfig(grpo=cfg, optimizer=optimizer, micro_batches=1,
                                   max_context_tokens=prompt_len + tokens, max_response_tokens=tokens,
                                   staleness=StalenessConfig(max_staleness=s))
        stats = async_block.run_grpo_block(learner, loop, bank, view, block, None, seed=block_seed)
        return learner.host_copy(learner.params), stats

    with stand_in_scoring():
        trained = {s: train(s, seed) for s in sorted(set(staleness) | {0})}
        other, _ = train(0, seed + 1)
    mask = np.ones_like(probe_ids)
    shift = kl.PolicyShiftConfig(num_prompts=probes, batch_size=probes)

    def kl_from_s0(params) -> float:
        return kl.policy_shift_kl(learner.apply_fn, learner.on_mesh(trained[0][0]), learner.on_mesh(params),
                                  probe_ids, mask, config=shift)

    return {"kl": {s: kl_from_s0(params) for s, (params, _) in trained.items()},
            "kl_untrained": kl_from_s0(init), "kl_other_seed": kl_from_s0(other),
            "reward": {s: stats.reward_mean for s, (_, stats) in trained.items()},
            "staleness_mean": {s: stats.staleness_mean for s, (_, stats) in trained.items()},
            "learning_rate": optimizer.learning_rate, "steps": steps, "rows": rows, "k": k, "probes": probes, "seconds": time.perf_counter() - t0}


def describe(result: dict) -> str:
    """The lines the bench prints under its table."""
    per_s = ", ".join(f"s={s}: {v:.2e}" for s, v in result["kl"].items() if s)
    return (f"KL(pi_s0 || pi_s) on {result['probes']} probe prompts after {result['steps']} GRPO steps of "
            f"{result['rows']} rows x K={result['k']}, lr {result['learning_rate']:g} (tiny default policy, real learner and JAX sampler, one-turn "
            f"episodes, even-token reward; {result['seconds']:.0f} s): {per_s}\n"
            f"  for scale: KL(pi_s0 || untrained) {result['kl_untrained']:.2e}; two s=0 runs, rollout seeds differing: "
            f"{result['kl_other_seed']:.2e}; mean reward "
            + ", ".join(f"s={s} {r:.3f}" for s, r in result["reward"].items()))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--lr", type=float, default=None, help="GRPO learning rate (default: the tiny default's)")
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    result = policy_kl(tuple(args.staleness), steps=args.steps, rows=args.rows, tokens=args.tokens,
                       learning_rate=args.lr)
    print(describe(result))
    return result


if __name__ == "__main__":
    main()
