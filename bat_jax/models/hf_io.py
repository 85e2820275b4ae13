"""Hugging Face safetensors I/O for the Qwen3 / Qwen3.5 / Llama NNX models.

Details: docs/design.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Callable, Sequence

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy so safetensors can read it)
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from bat_jax.atomic_io import atomic_directory
from bat_jax.models import lora
from bat_jax.models.configs import LlamaConfig, Qwen3_5Config, Qwen3Config, config_from_hf
from bat_jax.models.llama import LlamaForCausalLM
from bat_jax.models.qwen3 import Qwen3ForCausalLM
from bat_jax.models.qwen3_5 import Qwen3_5ForCausalLM

log = logging.getLogger(__name__)

TEXT_PREFIXES = ("model.language_model.", "model.")
SKIPPED_PREFIXES = ("model.visual.", "visual.", "mtp.", "model.mtp.")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "chat_template.jinja", "chat_template.json", "generation_config.json",
                   "added_tokens.json")

ShardingFn = Callable[[tuple, tuple], jax.sharding.Sharding]


def model_class(config):
    """The NNX model class for a config."""
    if isinstance(config, Qwen3_5Config):
        return Qwen3_5ForCausalLM
    if isinstance(config, Qwen3Config):
        return Qwen3ForCausalLM
    if isinstance(config, LlamaConfig):
        return LlamaForCausalLM
    raise TypeError(f"no model class for config type {type(config).__name__}")


def logical_sharding(mesh: jax.sharding.Mesh, rules: dict[str, str | tuple | None]) -> ShardingFn:
    """A ``ShardingFn`` mapping logical axis names to mesh axes with ``rules`` (name -> mesh axis).

    An axis whose size does not divide by its mesh axes is replicated instead."""

    def fn(names: tuple, shape: tuple) -> jax.sharding.Sharding:
        spec = []
        for name, dim in zip(names, shape):
            axes = rules.get(name) if name is not None else None
            size = 1
            for a in (axes if isinstance(axes, tuple) else (axes,)):
                size *= mesh.shape[a] if a is not None else 1
            spec.append(axes if axes is not None and dim % size == 0 else None)
        return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))

    return fn


def read_hf_config(path: str | os.PathLike) -> dict:
    """``config.json`` of a checkpoint directory as a dict. Raises FileNotFoundError naming it."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path}: checkpoint has no config.json")
    with open(cfg_path) as f:
        return json.load(f)


def _weight_files(path: Path) -> dict[str, Path]:
    """Tensor name -> safetensors file, from the index file if present, else from every shard."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        with open(index) as f:
            return {k: path / v for k, v in json.load(f)["weight_map"].items()}
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors files")
    out = {}
    for fp in files:
        with safe_open(fp, "numpy") as f:
            out.update({k: fp for k in f.keys()})
    return out


def _text_prefix(keys) -> str:
    return next(p for p in TEXT_PREFIXES if any(k.startswith(p + "embed_tokens") for k in keys))


def load_pretrained(path: str | os.PathLike, *, sharding_fn: ShardingFn | None = None,
                    **config_overrides):
    """Loads a local HF checkpoint directory into a ``Qwen3ForCausalLM`` / ``Qwen3_5ForCausalLM``.

    ``sharding_fn(logical_names, shape) -> jax.sharding.Sharding`` places each parameter (default:
    the first local device); ``config_overrides`` replace config fields (e.g. ``dtype="bfloat16"``,
    ``param_dtype``). Tensors are cast to their parameter's dtype: ``param_dtype``, except the Gated
    DeltaNet ``A_log`` and output-norm weight, which stay float32 (``gated_deltanet.FLOAT32_PARAMS``). Raises FileNotFoundError /
    ValueError naming the file and tensor on a missing tensor or a shape mismatch.
    """
    path = Path(path)
    config = config_from_hf(read_hf_config(path), **config_overrides)
    cls = model_class(config)
    abstract = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    files = _weight_files(path)
    try:
        prefix = _text_prefix(files)
    except StopIteration:
        raise ValueError(f"{path}: no embed_tokens tensor under {TEXT_PREFIXES}") from None
    default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    used = set()
    with contextlib.ExitStack() as stack:
        handles: dict[Path, object] = {}
        for var_path, var in nnx.to_flat_state(state):
            key = ".".join(map(str, var_path))
            hf_key = prefix + key[len("model."):] if key.startswith("model.") else key
            if hf_key not in files:
                raise ValueError(f"{path}: tensor {hf_key!r} is missing from the checkpoint")
            fp = files[hf_key]
            if fp not in handles:
                handles[fp] = stack.enter_context(safe_open(fp, "numpy"))
            tslice = handles[fp].get_slice(hf_key)
            abs_val = var.get_value()
            if tuple(tslice.get_shape()) != tuple(abs_val.shape):
                raise ValueError(f"{fp}: tensor {hf_key!r} has shape {tuple(tslice.get_shape())}, "
                                 f"model expects {tuple(abs_val.shape)}")
            names = var.get_metadata().get("out_sharding") or (None,) * len(abs_val.shape)
            sharding = sharding_fn(tuple(names), tuple(abs_val.shape)) if sharding_fn else default
            dtype = abs_val.dtype
            arr = jax.make_array_from_callback(
                abs_val.shape, sharding, lambda idx, s=tslice, d=dtype: np.asarray(s[idx]).astype(d))
            var.set_value(arr)
            used.add(hf_key)
    skipped = [k for k in files if k.startswith(SKIPPED_PREFIXES)]
    if skipped:
        log.info("%s: skipped %d vision-tower/MTP tensors (text model only)", path, len(skipped))
    extra = [k for k in files if k not in used and k not in skipped]
    if extra:
        log.info("%s: ignored %d tensors not in the text model, e.g. %s", path, len(extra), extra[:3])
    return nnx.merge(graphdef, state)


def host_array(x: jax.Array | np.ndarray) -> np.ndarray:
    """`x` as one numpy array on this host (a multi-process array is gathered from every process first)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def byte_buckets(sizes: Sequence[int], max_bytes: int) -> list[list[int]]:
    """Consecutive index groups of items of `sizes` bytes each, each group at most `max_bytes`.

    Greedy: a group closes before the item that would take it past `max_bytes` (an item larger than `max_bytes` gets a
    group of its own). Checkpoint shards here; weight-sync buckets of `rollout.vllm_engine`. E.g. sizes (3, 3, 5, 1)
    with max 6 → [[0, 1], [2, 3]]."""
    groups, current, total = [], [], 0
    for i, nbytes in enumerate(sizes):
        if current and total + nbytes > max_bytes:
            groups.append(current)
            current, total = [], 0
        current.append(i)
        total += int(nbytes)
    if current:
        groups.append(current)
    return groups


def _hf_items(model, merge_lora: bool = True) -> list[tuple[str, jax.Array]]:
    """(HF name, array) of every base parameter; a projection with a LoRA adapter gives its merged weight.

    With `merge_lora` false it gives the frozen base weight instead."""
    merged = ({f"{path}.weight": lora.merged_weight(m) for path, m in lora.adapted_linears(model)}
              if merge_lora else {})
    return [(name, merged.get(name, v.get_value())) for name, v in
            ((".".join(map(str, p)), v) for p, v in nnx.to_flat_state(nnx.state(model, lora.BASE)))]


def save_pretrained(model, out_dir: str | os.PathLike, *, tokenizer_dir: str | os.PathLike | None = None,
                    tokenizer=None, max_shard_bytes: int = 4 << 30, overwrite: bool = False,
                    merge_lora: bool = True) -> Path:
    """Writes ``model`` in the HF layout to ``out_dir`` (tensors in their parameter dtype).

    Gathers one tensor at a time to the host. With several processes and parameters that span them, every process
    joins the gathers and process 0 alone writes; parameters local to each process (a host's own engine copy) are
    written by every process to its own ``out_dir``.
    A LoRA adapter (``models.lora``) is merged into its base weight (``lora.merged_weight``), or left out with
    ``merge_lora=False`` (the frozen base, which an adapter is served over; the adapter itself:
    ``peft_io.save_adapter``). Tokenizer files found in ``tokenizer_dir`` are copied; a ``tokenizer`` object (transformers) is written with
    its own ``save_pretrained`` (tokenizer.json, tokenizer_config.json, chat_template.jinja), so the directory
    loads in transformers and vLLM as it is. Raises FileExistsError if ``out_dir`` exists and ``overwrite`` is
    false. Returns ``out_dir``.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir}: already exists (pass overwrite=True)")
    items = _hf_items(model, merge_lora)
    shards = byte_buckets([x.size * x.dtype.itemsize for _, x in items], max_shard_bytes)
    local = all(not isinstance(x, jax.Array) or x.is_fully_addressable for _, x in items)
    writer = local or jax.process_index() == 0  # global parameters: every process joins the gathers, process 0 writes
    with atomic_directory(out_dir) if writer else contextlib.nullcontext() as tmp:
        weight_map = {}
        for n, shard in enumerate(shards):
            tensors = {items[i][0]: host_array(items[i][1]) for i in shard}
            if tmp is None:
                continue
            name = "model.safetensors" if len(shards) == 1 else f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(tensors, str(tmp / name), metadata={"format": "pt"})
            weight_map.update({k: name for k in tensors})
        if tmp is not None:
            if len(shards) > 1:
                total = sum(x.size * x.dtype.itemsize for _, x in items)
                with open(tmp / "model.safetensors.index.json", "w") as f:
                    json.dump({"metadata": {"total_size": int(total)}, "weight_map": weight_map}, f, indent=2)
            with open(tmp / "config.json", "w") as f:
                json.dump(model.config.to_hf_config(), f, indent=2)
            if tokenizer is not None:
                tokenizer.save_pretrained(str(tmp))
            if tokenizer_dir is not None:
                for fname in TOKENIZER_FILES:
                    src = Path(tokenizer_dir) / fname
                    if src.is_file():
                        shutil.copy2(src, tmp / fname)
    return out_dir
