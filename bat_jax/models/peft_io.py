"""A model's LoRA adapter written in PEFT's layout: ``adapter_config.json`` and ``adapter_model.safetensors``.

The directory loads with ``peft.PeftModel.from_pretrained`` over the base checkpoint (and in vLLM as a LoRA request);
tensor names are PEFT's (``base_model.model.<HF module path>.lora_A.weight``). Merged full weights:
``hf_io.save_pretrained``.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import jax
from flax import nnx
from safetensors.numpy import save_file

from bat_jax.atomic_io import atomic_directory
from bat_jax.models import lora
from bat_jax.models.hf_io import host_array
from bat_jax.models.layers import Linear

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # a PeftModel's state-dict prefix before the base model's own names


def target_modules(model: nnx.Module) -> list[str]:
    """PEFT ``target_modules`` selecting exactly the adapted projections of ``model``.

    The adapted modules' last names when those select no other ``Linear`` (e.g. ``['down_proj', 'q_proj']``), else
    their full paths."""
    adapted = [p for p, _ in lora.adapted_linears(model)]
    names = sorted({p.rsplit(".", 1)[-1] for p in adapted})
    every = [".".join(map(str, p)) for p, m in nnx.iter_modules(model) if isinstance(m, Linear)]
    if [p for p in every if lora.is_target(p, tuple(names))] == adapted:
        return names
    return adapted


def adapter_config(model: nnx.Module, base_model_name_or_path: str | None = None) -> dict:
    """The ``adapter_config.json`` dict of ``model``'s adapter (PEFT ``LoraConfig`` fields).

    Raises ValueError when the model has no adapter or its adapters differ in rank or scale (one ``add_lora``
    gives one of each)."""
    found = lora.adapted_linears(model)
    if not found:
        raise ValueError("the model carries no LoRA adapter (models.lora.add_lora)")
    ranks = {m.lora_a.shape[0] for _, m in found}
    scales = {m.lora_scale for _, m in found}
    if len(ranks) != 1 or len(scales) != 1:
        raise ValueError(f"adapters of different ranks {sorted(ranks)} or scales {sorted(scales)}")
    rank, scale = ranks.pop(), scales.pop()
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model_name_or_path,
        "r": rank, "lora_alpha": scale * rank, "lora_dropout": 0.0, "target_modules": target_modules(model),
        "bias": "none", "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "init_lora_weights": True,
        "modules_to_save": None, "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {},
        "alpha_pattern": {}, "inference_mode": True,
    }


def adapter_tensors(model: nnx.Module) -> dict[str, jax.Array]:
    """PEFT name → array (``lora_A.weight [r, in]``, ``lora_B.weight [out, r]``) of every adapted projection."""
    out = {}
    for path, m in lora.adapted_linears(model):
        out[f"{PEFT_PREFIX}{path}.lora_A.weight"] = m.lora_a.get_value()
        out[f"{PEFT_PREFIX}{path}.lora_B.weight"] = m.lora_b.get_value()
    return out


def save_adapter(model: nnx.Module, out_dir: str | os.PathLike, *, base_model_name_or_path: str | None = None,
                 overwrite: bool = False, every_process: bool = False) -> Path:
    """Writes ``model``'s adapter to ``out_dir`` in PEFT's layout (float32 tensors), all or nothing; returns it.

    With several processes every process joins the gathers and process 0 writes (every process, to its own
    ``out_dir``, with ``every_process``: a host's own rollout engine reads it). Raises FileExistsError if
    ``out_dir`` exists and ``overwrite`` is false, ValueError as :func:`adapter_config`."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir}: already exists (pass overwrite=True)")
    config = adapter_config(model, base_model_name_or_path)
    tensors = {k: host_array(v) for k, v in adapter_tensors(model).items()}
    writer = every_process or jax.process_index() == 0
    with atomic_directory(out_dir) if writer else contextlib.nullcontext() as tmp:
        if tmp is not None:
            save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
            with open(tmp / ADAPTER_CONFIG, "w") as f:
                json.dump(config, f, indent=2)
    return out_dir
