"""Live bytes per device, phase by phase, of a run's learner on its mesh: where a paper-scale run's memory goes.

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gc
import tempfile
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


_WIDTHS = ("hidden_size", "intermediate_size", "vocab_size", "head_dim", "linear_key_head_dim", "linear_value_head_dim")


def scaled_config(config: Any, k: int) -> Any:
    """`config` with every width in `_WIDTHS` divided by `k`; layers, layer types and head counts kept."""
    bad = [f for f in _WIDTHS if getattr(config, f) % k]
    if bad:
        raise ValueError(f"--scale {k} does not divide {', '.join(f'{f}={getattr(config, f)}' for f in bad)}")
    return dataclasses.replace(config, **{f: getattr(config, f) // k for f in _WIDTHS})


def abstract_share(config: Any, components: Any) -> int:
    """Bytes of one parameter copy per device for `config` on `components`' learner mesh, from shapes only."""
    import jax
    from flax import nnx

    from bat_jax.learn import train_state as ts
    from bat_jax.learn.learner import learner_mesh
    from bat_jax.models import mesh as mesh_lib
    from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM

    mesh = learner_mesh(components.mesh)
    model = nnx.eval_shape(lambda: Qwen3_5ForCausalLM(config, rngs=nnx.Rngs(0)))
    _, params, specs = ts.split_model(model, components.memory.forward_options(mesh), components.memory.logit_chunk)
    shardings = mesh_lib.param_shardings(params, specs, mesh, components.mesh.logical_axis_rules)
    return sum(int(np.prod(s.shard_shape(x.shape))) * x.dtype.itemsize
               for x, s in zip(jax.tree.leaves(params), jax.tree.leaves(shardings)))


def scaled_checkpoint(config: Any, out_dir: Any, dtype: str) -> str:
    """Writes a random-init Qwen3.5 of `config` in the Hugging Face layout (shipped tiny tokenizer) to `out_dir`."""
    import importlib.resources

    from flax import nnx

    from bat_jax.models import hf_io
    from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM

    model = Qwen3_5ForCausalLM(dataclasses.replace(config, dtype=dtype), rngs=nnx.Rngs(0))
    tokenizer_dir = importlib.resources.files("bat_jax") / "assets" / "tiny_tokenizer"
    return str(hf_io.save_pretrained(model, out_dir, tokenizer_dir=str(tokenizer_dir)))


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
    per = learner.batch_devices * max(components.block.micro_batches, components.sft.num_micro_batches)
    rows = -(-rows // per) * per
    batch = _batch(rows, seq, policy.model.config.vocab_size, seed)
    step, state = learner.sft_block(components.sft, 1)
    state, _ = step(state, batch)
    jax.block_until_ready(state.params)
    mark("sft step")
    learner.adopt(state)
    del state
    mark("after sft")
    config = components.block.grpo
    lp = learner.logprobs(learner.params, batch, config)
    extra = {"advantages": np.random.default_rng(seed).standard_normal(rows).astype(np.float32)}
    full = {f: batch.get(f, extra.get(f, lp)) for f in grpo.batch_fields(config)}
    step, state = learner.grpo_block(config, components.block.optimizer, 1, components.block.micro_batches)
    state, _ = step(state, full)
    jax.block_until_ready(state.params)
    mark("grpo step")
    learner.adopt(state)
    del state, step
    mark("after grpo")
    learner.sync_model(learner.host_copy(learner.params))
    mark("evaluation sync")
    return phases, plan(learner)


def describe(phases: list[tuple[str, list[int]]], planned: dict[str, int], full_share: int = 0) -> str:
    """The table `main` prints: MiB per device per phase, and each phase's largest device in shares; with
    `full_share` (one parameter copy per device at full size) also that largest device scaled to full size,
    ``max × full_share / share`` in GB."""
    mib = 1 << 20
    n = len(phases[0][1])
    lines = [f"plan per device: parameter share {planned['share'] / mib:.2f} MiB (all parameters "
             f"{planned['total'] / mib:.2f} MiB), largest tensor {planned['bucket'] / mib:.2f} MiB"
             + (f"; full size: share {full_share / 1e9:.2f} GB (x {full_share / planned['share']:.2f})"
                if full_share else ""),
             f"{'phase':16s}" + "".join(f"{'dev ' + str(i):>9s}" for i in range(n)) + "   max / share"
             + ("   full GB" if full_share else "")]
    for name, per in phases:
        lines.append(f"{name:16s}" + "".join(f"{b / mib:9.2f}" for b in per) + f"   {max(per) / planned['share']:11.2f}"
                     + (f"   {max(per) * full_share / planned['share'] / 1e9:7.2f}" if full_share else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gin_file", default="bicurl_tiny.gin", help="run file (on the launch's search path)")
    ap.add_argument("--gin_bindings", action="append", default=[])
    ap.add_argument("--fsdp", type=int, default=0, help="learner mesh MeshConfig(fsdp=N) (0: the run file's)")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--model", choices=("9b", "4b"), default=None,
                    help="instead of the run file's checkpoint: a random-init Qwen3.5 of this size (compile_probe's "
                         "config) divided by --scale, written as a checkpoint and loaded as the run loads one")
    ap.add_argument("--scale", type=int, default=8, help="with --model: divide every width by this")
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
    full_share = 0
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            from launch.bench.compile_probe import MODELS

            full = MODELS[args.model]
            small = scaled_config(full, args.scale)
            full_share = abstract_share(full, components)
            ckpt = scaled_checkpoint(small, f"{tmp}/checkpoint", components.policy.dtype)
            components = dataclasses.replace(
                components, policy=dataclasses.replace(components.policy, checkpoint_dir=ckpt, lora=None))
            print(f"Qwen3.5-{args.model} with widths / {args.scale} ({', '.join(_WIDTHS)}); layers and heads kept",
                  flush=True)
        phases, planned = walk(components, args.rows, args.seq)
    print(describe(phases, planned, full_share), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
