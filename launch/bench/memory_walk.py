"""Live bytes per device, phase by phase, of a run's learner on its mesh: where a paper-scale run's memory goes.

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gc
from typing import Any

import numpy as np


def live_bytes() -> list[int]:
    """Bytes of every live jax array's shards, per device in `jax.devices()` order."""
    import jax

    per, seen = collections.Counter(), set()
    for a in jax.live_arrays():  # each device buffer once: a shard's `.data` and a gathered array alias them
        for shard in a.addressable_shards:
            key = (shard.device.id, shard.data.unsafe_buffer_pointer())
            if key not in seen:
                seen.add(key)
                per[shard.device.id] += shard.data.nbytes
    return [per[d.id] for d in jax.devices()]


def plan(learner: Any) -> dict[str, int]:
    """``share``: parameter bytes `learner.param_shardings` puts on one device; ``bucket``: the largest tensor."""
    import jax

    leaves, shardings = jax.tree.leaves(learner.params), jax.tree.leaves(learner.param_shardings)
    share = sum(int(np.prod(s.shard_shape(x.shape))) * x.dtype.itemsize for x, s in zip(leaves, shardings))
    return {"share": share, "bucket": max(x.nbytes for x in leaves), "total": sum(x.nbytes for x in leaves)}


def _batch(rows: int, seq: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, (rows, seq)).astype(np.int32)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids),
            "loss_mask": np.tile(np.arange(seq) >= seq // 2, (rows, 1)).astype(np.int32)}


def walk(components: Any, rows: int, seq: int, seed: int = 0) -> tuple[list[tuple[str, list[int]]], dict[str, int]]:
    """``(phases, plan)``: live bytes per device after each phase (module docstring) of `components`' learner.

    `rows` is rounded up to a multiple of the learner's batch devices and GRPO micro-batches."""
    import jax

    from bat_jax.learn import grpo
    from bat_jax.learn.learner import Learner, checkpoint_sharding
    from bat_jax.policy import build_policy

    phases: list[tuple[str, list[int]]] = []

    def mark(name: str) -> None:
        gc.collect()
        phases.append((name, live_bytes()))

    policy = build_policy(components.policy, checkpoint_sharding(components.mesh))
    learner = Learner(policy.model, components.mesh, components.memory)
    mark("load")
    per = learner.batch_devices * max(components.grpo_micro_batches, components.sft.num_micro_batches)
    rows = -(-rows // per) * per
    batch = _batch(rows, seq, policy.model.config.vocab_size, seed)
    step, state = learner.sft_block(components.sft, 1)
    state, _ = step(state, batch)
    jax.block_until_ready(state.params)
    mark("sft step")
    learner.adopt(state)
    del state
    mark("after sft")
    config = components.grpo
    lp = learner.logprobs(learner.params, batch, config)
    extra = {"advantages": np.random.default_rng(seed).standard_normal(rows).astype(np.float32)}
    full = {f: batch.get(f, extra.get(f, lp)) for f in grpo.batch_fields(config)}
    step, state = learner.grpo_block(config, components.grpo_optimizer, 1, components.grpo_micro_batches)
    state, _ = step(state, full)
    jax.block_until_ready(state.params)
    mark("grpo step")
    learner.adopt(state)
    del state, step
    mark("after grpo")
    learner.sync_model(learner.host_copy(learner.params))
    mark("evaluation sync")
    return phases, plan(learner)


def describe(phases: list[tuple[str, list[int]]], planned: dict[str, int]) -> str:
    """The table `main` prints: MiB per device per phase, and each phase's largest device in shares."""
    mib = 1 << 20
    n = len(phases[0][1])
    lines = [f"plan per device: parameter share {planned['share'] / mib:.2f} MiB (all parameters "
             f"{planned['total'] / mib:.2f} MiB), largest tensor {planned['bucket'] / mib:.2f} MiB",
             f"{'phase':16s}" + "".join(f"{'dev ' + str(i):>9s}" for i in range(n)) + "   max / share"]
    for name, per in phases:
        lines.append(f"{name:16s}" + "".join(f"{b / mib:9.2f}" for b in per) + f"   {max(per) / planned['share']:.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gin_file", default="bicurl_tiny.gin", help="run file (on the launch's search path)")
    ap.add_argument("--gin_bindings", action="append", default=[])
    ap.add_argument("--fsdp", type=int, default=0, help="learner mesh MeshConfig(fsdp=N) (0: the run file's)")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args(argv)
    import gin

    from bat_jax import launch
    from bat_jax.bicurl import experiment
    from bat_jax.models.mesh import MeshConfig

    launch.parse_gin([args.gin_file], list(args.gin_bindings))
    try:
        components = gin.get_configurable(experiment.Components)()
    finally:
        gin.clear_config(clear_constants=True)
    if args.fsdp:
        components = dataclasses.replace(components, mesh=MeshConfig(fsdp=args.fsdp))
    phases, planned = walk(components, args.rows, args.seq)
    print(describe(phases, planned), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
