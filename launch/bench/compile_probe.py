"""Compile (never run) the jitted steps of a paper-scale run and print their per-device memory.

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bat_jax.learn import grpo, kl, sft
from bat_jax.learn import learner as learner_lib
from bat_jax.models import lora as lora_lib
from bat_jax.models import mesh as mesh_lib
from bat_jax.learn import train_state as ts
from bat_jax.models.configs import Qwen3_5Config
from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM
from bat_jax.rollout import weight_sync

GB = 1e9
_COMMON = dict(vocab_size=248_320, num_hidden_layers=32, num_attention_heads=16, num_key_value_heads=4, head_dim=256,
               linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
               linear_num_value_heads=32, full_attention_interval=4, partial_rotary_factor=0.25,
               rope_theta=10_000_000.0, max_position_embeddings=262_144, rms_norm_eps=1e-6)
MODELS = {
    # Qwen/Qwen3.5-9B text_config: hidden 4096, intermediate 12288, untied head (8.95e9 parameters)
    "9b": Qwen3_5Config(hidden_size=4096, intermediate_size=12288, tie_word_embeddings=False, **_COMMON),
    # Qwen/Qwen3.5-4B text_config: hidden 2560, intermediate 9216, tied head
    "4b": Qwen3_5Config(hidden_size=2560, intermediate_size=9216, tie_word_embeddings=True, **_COMMON),
    # reduced size for the CI guard on 8 fake CPU devices
    "tiny": Qwen3_5Config(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_key_head_dim=16,
                          linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                          tie_word_embeddings=False, chunk_size=16),
}
GIN_FILES = {"9b": "bicurl_9b.gin", "4b": "bicurl_4b.gin", "tiny": "bicurl_9b.gin"}
STEPS = ("sft_step", "ref_logprobs", "grpo_step", "policy_shift_kl", "weight_sync_bucket", "sampler_prefill",
         "sampler_decode")
#: The default steps of a LoRA run (`PolicyConfig.lora`): the learner's (its weight sync is not the full-weight one
#: `weight_sync_bucket` lowers; the sampler steps lower the model without its adapter).
LORA_STEPS = ("sft_step", "ref_logprobs", "grpo_step", "policy_shift_kl")


@dataclasses.dataclass(frozen=True)
class RunShapes:
    """The shapes and settings of a run that decide its memory (read from the gin file)."""

    mesh: mesh_lib.MeshConfig
    memory: learner_lib.MemoryConfig
    sft: sft.SFTConfig
    grpo: grpo.GRPOConfig
    grpo_rows: int
    grpo_seq: int
    grpo_micro_batches: int
    kl_rows: int
    kl_seq: int
    compute_dtype: str = "bfloat16"
    param_dtype: str = "float32"
    vllm_share: float = 0.0
    device_copies: int = 0  # experiment.run keeps the untrained / SFT / best copies on the host
    sampler_tensor: int = 1  # the JAX sampler's SamplerMeshConfig (the run's, or replicated bf16 weights)
    sampler_dtype: str | None = "bfloat16"
    turn_tokens: int = 2048  # the longest completion of one turn (the longest prompt is the context minus it)
    sampler_chunk: int = 16  # decode steps per continuous-batching chunk
    lora: lora_lib.LoRAConfig | None = None  # the run's adapter: the learner trains it over a frozen base


def shapes_from_gin(gin_file: str, bindings: tuple[str, ...] = ()) -> RunShapes:
    """Parses a run file and returns the settings its `experiment.Components` carries."""
    import gin

    from bat_jax import launch
    from bat_jax.bicurl import experiment

    launch.parse_gin([gin_file], list(bindings))
    c = gin.get_configurable(experiment.Components)()
    rows = c.pools.batch_size * c.sampling.group_size
    sampler = c.engine.sampler_mesh
    return RunShapes(sampler_tensor=sampler.tensor if sampler else 1,
                     sampler_dtype=sampler.param_dtype if sampler else "bfloat16",
                     turn_tokens=c.agent.max_tokens_per_turn, mesh=c.mesh, memory=c.memory, sft=c.sft, grpo=c.block.grpo, grpo_rows=rows,
                     grpo_seq=c.agent.max_context_tokens, grpo_micro_batches=c.block.micro_batches,
                     kl_rows=c.policy_shift.batch_size, kl_seq=c.agent.max_context_tokens,
                     compute_dtype=c.policy.dtype, param_dtype="float32", lora=c.policy.lora,
                     vllm_share=float(dict(c.engine.vllm_options).get("gpu_memory_utilization", 0.0))
                     if c.engine.kind == "vllm" else 0.0)


def _abstract(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _stats(compiled, seconds: float, resident: float) -> dict[str, float]:
    m = compiled.memory_analysis()
    arg, out, alias, temp = (float(getattr(m, f"{k}_size_in_bytes")) for k in ("argument", "output", "alias", "temp"))
    peak = arg + out - alias + temp
    return {"argument": arg, "output": out, "alias": alias, "temp": temp, "peak": peak, "resident_other": resident,
            "total": peak + resident, "compile_s": seconds}


_UNITS = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def _refused(message: str, seconds: float, resident: float) -> dict[str, Any]:
    """Stats of a step the compiler refused (RESOURCE_EXHAUSTED): the temp bytes it says it needed."""
    import re

    line = next((ln for ln in message.splitlines() if "RESOURCE_EXHAUSTED" in ln), message.splitlines()[0])
    m = re.search(r"required for HLO temporaries \(([\d.]+)([KMGT]?)\)", message)
    temp = float(m.group(1)) * _UNITS[m.group(2)] if m else float("inf")
    return {"argument": float("nan"), "output": float("nan"), "alias": float("nan"), "temp": temp, "peak": temp,
            "resident_other": resident, "total": temp + resident, "compile_s": seconds, "error": line.strip()[:300]}


def step_builders(config: Qwen3_5Config, run: RunShapes, devices, *, scale_seq: int | None = None,
                  scale_rows: int | None = None, log=print) -> tuple[dict[str, Any], dict[str, float]]:
    """The run's steps, not yet lowered: ``({step: () -> (jitted fn, abstract args with shardings)},
    {step: bytes the experiment keeps resident on each device beside it})``.

    ``scale_seq`` / ``scale_rows`` replace the sequence lengths / row counts (reduced-size CPU mode).
    """
    cfg = dataclasses.replace(config, dtype=run.compute_dtype, param_dtype=run.param_dtype)

    def build():
        model = Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(0))
        if run.lora is not None:
            lora_lib.add_lora(model, run.lora)
        return model

    abstract_model = nnx.eval_shape(build)
    mesh = mesh_lib.build_mesh(run.mesh, list(devices))
    # with LoRA, `params` is the adapter (what the optimizer and every parameter copy hold) and the frozen base is one
    # more argument of each step, as `learn.learner.Learner` passes it
    trainable = nnx.LoRAParam if run.lora is not None else nnx.Param
    apply_fn, params, specs = ts.split_model(abstract_model, run.memory.forward_options(mesh), run.memory.logit_chunk,
                                             trainable)
    param_sh = mesh_lib.param_shardings(params, specs, mesh, run.mesh.logical_axis_rules)
    a_params = _abstract(params, param_sh)
    frozen, frozen_specs = ts.frozen_params(abstract_model, trainable)
    frozen_sh = mesh_lib.param_shardings(frozen, frozen_specs, mesh, run.mesh.logical_axis_rules) if frozen else None
    a_frozen = _abstract(frozen, frozen_sh) if frozen else {}
    a_full = ts.join(a_params, a_frozen)
    n_dev = len(devices)
    size = lambda tree: sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))  # noqa: E731
    param_bytes = size(params)
    per_copy = param_bytes / n_dev  # one fully sharded parameter copy per device
    log(f"[probe] {sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params)) / 1e9:.4f}e9 trainable parameters, "
        f"{param_bytes / GB:.2f} GB ({per_copy / GB:.3f} GB per device per copy)"
        + (f"; frozen base {size(frozen) / GB:.1f} GB ({size(frozen) / n_dev / GB:.2f} GB per device, "
           f"{sorted({str(x.dtype) for x in jax.tree.leaves(frozen)})}), an argument of every step" if frozen else "")
        + f"; mesh {dict(mesh.shape)}")
    seq_sft = scale_seq or run.sft.max_seq_len
    seq_grpo = scale_seq or run.grpo_seq
    seq_kl = scale_seq or run.kl_seq
    rows_sft = scale_rows or run.sft.global_batch_size
    rows_grpo = scale_rows or run.grpo_rows
    rows_kl = scale_rows or run.kl_rows
    b_sh = mesh_lib.batch_sharding(mesh, 2)
    ids = lambda r, t: jax.ShapeDtypeStruct((r, t), jnp.int32, sharding=b_sh)  # noqa: E731

    def batch(fields, rows, seq):
        shs = learner_lib.batch_shardings(mesh, fields)
        return {k: jax.ShapeDtypeStruct((rows,) if k == "advantages" else (rows, seq),
                                        jnp.float32 if k.endswith(("logprobs", "advantages", "weights")) else jnp.int32,
                                        sharding=shs[k]) for k in fields}

    def train(loss_fn, norm_fn, optimizer, fields, micro, rows, seq):
        step, state_sh, tx = learner_lib.make_block_step(loss_fn, norm_fn, optimizer, 10, fields, micro, params,
                                                         param_sh, mesh, frozen_sh)
        state = ts.TrainState(step=jax.ShapeDtypeStruct((), jnp.int32, sharding=state_sh.step), params=a_params,
                              opt_state=_abstract(jax.eval_shape(tx.init, params), state_sh.opt_state))
        return step, (state, batch(fields, rows, seq)) + ((a_frozen,) if frozen else ())

    # what the experiment keeps on each device beside the step's own arguments (bat_jax/bicurl/experiment.py), in
    # parameter copies: the learner's params beside the SFT state, the round-start reference beside the GRPO
    # state (params + 2 Adam moments), and `run.device_copies` of the untrained / SFT / best copies (0: the
    # experiment keeps them on the host and puts best on the mesh only for the KL probe, as its argument)
    extra = run.device_copies
    resident = {"sft_step": (1 + min(extra, 1)) * per_copy,  # learner.params + untrained
                "ref_logprobs": (3 + extra) * per_copy,  # the block's train state + the copies
                "grpo_step": (1 + extra) * per_copy,  # reference + the copies
                "policy_shift_kl": max(extra - 1, 0) * per_copy,  # untrained + SFT (best is an argument)
                "weight_sync_bucket": (4 + extra) * per_copy}  # train state + reference + the copies
    builders = {
        "sft_step": lambda: train(sft.make_sft_loss(apply_fn), sft.sft_normalizers, run.sft.optimizer,
                                  learner_lib.BATCH_FIELDS_SFT, run.sft.num_micro_batches, rows_sft, seq_sft),
        "ref_logprobs": lambda: (learner_lib.make_ref_logprob_fn(apply_fn, run.grpo, mesh),
                                 (a_full, ids(n_dev * run.memory.logprob_rows_per_device, seq_grpo),
                                  ids(n_dev * run.memory.logprob_rows_per_device, seq_grpo))),
        "grpo_step": lambda: train(grpo.make_grpo_loss(apply_fn, run.grpo), grpo.grpo_normalizers,
                                   learner_lib.OptimizerConfig(learning_rate=1e-6, schedule="constant",
                                                               warmup_ratio=0.0),
                                   grpo.batch_fields(run.grpo), run.grpo_micro_batches, rows_grpo, seq_grpo),
        # with LoRA both arguments hold the same base arrays: the compiler counts that argument twice
        "policy_shift_kl": lambda: (kl.make_kl_sum_fn(apply_fn), (a_full, a_full, ids(rows_kl, seq_kl),
                                                                  ids(rows_kl, seq_kl))),
        "weight_sync_bucket": lambda: _sync_bucket(params, param_sh, mesh),
    }
    # the JAX sampler on the mesh (rollout/mesh_sampler.py) runs between GRPO steps, beside the block's train state
    # (params + 2 Adam moments) and the round-start reference: 4 fp32 copies, sharded
    resident.update(sampler_prefill=(4 + extra) * per_copy, sampler_decode=(4 + extra) * per_copy)
    builders.update(_sampler_builders(cfg, run, devices, rows_grpo, seq_grpo, log))
    return builders, resident


def _sampler_builders(cfg: Qwen3_5Config, run: RunShapes, devices, rows: int, seq: int, log) -> dict[str, Any]:
    """The sampler's prefill (every rollout's longest prompt, ``seq - turn_tokens`` tokens, into caches of ``seq``
    slots; the rows' caches are returned, as the continuous batcher keeps them) and one decode chunk of the
    running batch (``rows`` slots of ``seq`` tokens), with the rollout weights and caches as `JaxSampler(mesh=...)`
    places them."""
    from bat_jax.rollout import continuous_batching, jax_sampler, mesh_sampler

    model = nnx.eval_shape(lambda: Qwen3_5ForCausalLM(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(model)
    placement = mesh_sampler.SamplerPlacement(state, mesh_sampler.SamplerMeshConfig(
        tensor=run.sampler_tensor, param_dtype=run.sampler_dtype), devices)
    layout = placement.layout
    a_state = jax.tree.unflatten(jax.tree.structure(state), [
        jax.ShapeDtypeStruct(x.shape, d, sharding=sh)
        for x, d, sh in zip(jax.tree.leaves(state), placement.dtypes, placement.shardings)])
    cache_dtype = jnp.dtype(cfg.dtype).name
    rows = -(-rows // layout.data) * layout.data
    prompt = seq - min(run.turn_tokens, seq // 4)  # reduced sizes keep three quarters of the context
    cache = jax.eval_shape(lambda: model.init_cache(rows, seq, cache_dtype))
    a_cache = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), cache,
                           layout.cache_shardings(cache))
    row = lambda dtype, *shape: jax.ShapeDtypeStruct((rows, *shape), dtype, sharding=layout.batch(1 + len(shape)))  # noqa: E731
    scalars = (jnp.float32(0.7), jnp.float32(1.0), jnp.int32(0), jnp.zeros((8,), jnp.int32))
    log(f"[probe] sampler: {rows} rows on {placement.mesh.size} devices (data {layout.data} x tensor "
        f"{run.sampler_tensor}), weights {run.sampler_dtype} {placement.bytes_per_device(state) / GB:.2f} GB per device;"
        f" prefill {prompt:,} tokens into {seq:,} slots; decode chunks of {run.sampler_chunk} steps")
    prefill = functools.partial(jax_sampler._generate, graphdef=graphdef, max_new=1, max_len=seq,
                                cache_dtype=cache_dtype, return_cache=True, layout=layout)
    decode = functools.partial(continuous_batching._decode_chunk, graphdef=graphdef, chunk=run.sampler_chunk,
                               layout=layout)
    return {
        "sampler_prefill": lambda: (jax.jit(prefill), (a_state, None, row(jnp.int32, prompt), row(jnp.int32, prompt),
                                                        row(jnp.int32), row(jnp.uint32), *scalars)),
        "sampler_decode": lambda: (jax.jit(decode), (a_state, a_cache, row(jnp.int32), row(jnp.bool_),
                                                      row(jnp.int32), row(jnp.int32), row(jnp.uint32), *scalars)),
    }


def probe(config: Qwen3_5Config, run: RunShapes, devices, steps=STEPS, *, scale_seq: int | None = None,
          scale_rows: int | None = None, log=print) -> dict[str, dict[str, float]]:
    """Lowers and compiles each step for ``devices``; returns ``{step: per-device byte counts and seconds}``
    (``argument`` / ``output`` / ``alias`` / ``temp`` / ``peak`` / ``resident_other`` / ``total`` bytes,
    ``compile_s``; a step the compiler refuses for memory carries ``error``).

    ``scale_seq`` / ``scale_rows`` replace the sequence lengths / row counts (reduced-size CPU mode).
    """
    builders, resident = step_builders(config, run, devices, scale_seq=scale_seq, scale_rows=scale_rows, log=log)
    results = {}
    for name in steps:
        fn, args = builders[name]()
        t0 = time.perf_counter()
        try:
            compiled = fn.lower(*args).compile()
        except jax.errors.JaxRuntimeError as e:  # the TPU compiler refuses a program that cannot fit its HBM
            results[name] = _refused(str(e), time.perf_counter() - t0, resident[name])
            log(f"[probe] {name:18s} does not fit: {results[name]['error']}; compile {results[name]['compile_s']:.1f} s")
            continue
        results[name] = _stats(compiled, time.perf_counter() - t0, resident[name])
        r = results[name]
        log(f"[probe] {name:18s} peak {r['peak'] / GB:6.2f} GB (arg {r['argument'] / GB:.2f} out {r['output'] / GB:.2f} "
            f"alias {r['alias'] / GB:.2f} temp {r['temp'] / GB:.2f}) + resident {r['resident_other'] / GB:.2f} "
            f"= {r['total'] / GB:6.2f} GB per device; compile {r['compile_s']:.1f} s")
    return results


def _sync_bucket(params, param_sh, mesh):
    """The largest weight-sync bucket (<= 1 GB in bf16) as `weight_sync.gather_bucket_fn` builds it."""
    flat = [(".".join(map(str, k)), v, s) for (k, v), s in zip(
        [(tuple(getattr(p, "key", p) for p in path), leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(params)],
        jax.tree.leaves(param_sh))]
    items = [(n, x, weight_sync.sync_dtype(n, "bfloat16")) for n, x, _ in flat]
    buckets = weight_sync.plan_buckets(items)
    size = lambda b: sum(int(np.prod(items[i][1].shape)) * weight_sync._ITEMSIZE[items[i][2]] for i in b)  # noqa: E731
    biggest = max(buckets, key=size)
    fn = weight_sync.gather_bucket_fn([items[i][2] for i in biggest], mesh)
    args = [jax.ShapeDtypeStruct(flat[i][1].shape, flat[i][1].dtype, sharding=flat[i][2]) for i in biggest]
    return fn, args


def topology_devices(name: str):
    """Devices of a TPU topology (e.g. ``v5p:2x2x2``), compiled against without a TPU; ``cpu`` = jax.devices()."""
    if name == "cpu":
        return jax.devices()
    from jax.experimental import topologies

    return topologies.get_topology_desc(topology_name=name, platform="tpu").devices


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="9b")
    ap.add_argument("--gin_file", default=None, help="run file (default: bicurl_9b.gin / bicurl_4b.gin)")
    ap.add_argument("--gin_bindings", action="append", default=[])
    ap.add_argument("--topology", default="v5p:2x2x2", help="TPU topology name, or 'cpu' (jax.devices())")
    ap.add_argument("--steps", default=None, help="comma-separated (default: every step; a LoRA run's: LORA_STEPS)")
    ap.add_argument("--budget_gb", type=float, default=None, help="per-device budget (default 80 for 9b, 40 for 4b)")
    ap.add_argument("--seq", type=int, default=None, help="replace every sequence length (reduced mode)")
    ap.add_argument("--rows", type=int, default=None, help="replace every row count (reduced mode)")
    ap.add_argument("--layers", type=int, default=None,
                    help="replace the number of decoder layers (a multiple of 4 keeps the hybrid pattern); "
                         "per-layer growth is read off two small compiles")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    run = shapes_from_gin(args.gin_file or GIN_FILES[args.model], tuple(args.gin_bindings))
    devices = topology_devices(args.topology)
    devices = learner_lib.mesh_devices(run.mesh, devices) or devices  # as the learner takes them (None: all)
    budget = args.budget_gb or (40.0 if args.model == "4b" else 80.0)
    print(f"[probe] Qwen3.5-{args.model} on {len(devices)} x {devices[0].device_kind} ({args.topology}); "
          f"memory {run.memory}; SFT {run.sft.global_batch_size} x {run.sft.max_seq_len} in "
          f"{run.sft.num_micro_batches} micro-batches; GRPO {run.grpo_rows} x {run.grpo_seq} in "
          f"{run.grpo_micro_batches}; KL {run.kl_rows} x {run.kl_seq}", flush=True)
    config = MODELS[args.model]
    if args.layers:
        config = dataclasses.replace(config, num_hidden_layers=args.layers, layer_types=())
    steps = tuple(args.steps.split(",")) if args.steps else (LORA_STEPS if run.lora is not None else STEPS)
    results = probe(config, run, devices, steps, scale_seq=args.seq,
                    scale_rows=args.rows)
    over = [k for k, r in results.items() if r["total"] > budget * GB]
    print(f"[probe] budget {budget:.0f} GB per device: "
          + ("every step fits" if not over else f"over budget: {', '.join(over)}"))
    if run.vllm_share:  # the fraction experiment.run gives JAX beside vLLM on the same accelerator
        from bat_jax.bicurl.engines import jax_memory_fraction

        frac = jax_memory_fraction(run.vllm_share)
        crowded = [k for k, r in results.items() if r["total"] > frac * budget * GB]
        print(f"[probe] beside vLLM at {run.vllm_share} JAX may use {frac:.2f} x {budget:.0f} = {frac * budget:.0f} GB "
              "per device: " + ("every step fits" if not crowded else f"over it: {', '.join(crowded)}"))
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "topology": args.topology, "budget_gb": budget,
                                               "steps": results}, indent=2))
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main())
