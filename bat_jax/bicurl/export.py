"""The end of a run: the retained policy exported as a Hugging Face checkpoint directory, `run_dir/export/`.

The directory holds safetensors weights, config.json, tokenizer files and the chat template; it loads as it is in
transformers and vLLM and by `policy.PolicyConfig(checkpoint_dir=...)`. Written all or nothing
(`models.hf_io.save_pretrained`); a previous export of the same run is replaced."""

from __future__ import annotations

import pathlib
from typing import Any

from bat_jax.models import lora, peft_io
from bat_jax.models.hf_io import save_pretrained

EXPORT_DIR = "export"
ADAPTER_DIR = "export_adapter"


def export_retained(model: Any, run_dir: pathlib.Path, tokenizer: Any) -> pathlib.Path:
    """Writes `model` and `tokenizer` to `run_dir/export/` in the HF layout; returns that directory.

    `model` is an NNX causal LM holding the retained weights, e.g. `Learner.sync_model(best_params)`; `tokenizer` a
    transformers one. Tensors keep their parameter dtype. With several processes only process 0 writes (all join the
    gathers). A model with a LoRA adapter is exported merged, and its adapter alone to `run_dir/export_adapter/` in
    PEFT's layout (`models.peft_io`). Raises OSError when the directory cannot be written."""
    out = save_pretrained(model, pathlib.Path(run_dir) / EXPORT_DIR, tokenizer=tokenizer, overwrite=True)
    print(f"[bat_jax] retained policy exported to {out} (weights, config, tokenizer, chat template)", flush=True)
    if lora.has_lora(model):
        adapter = peft_io.save_adapter(model, pathlib.Path(run_dir) / ADAPTER_DIR, overwrite=True)
        print(f"[bat_jax] its LoRA adapter exported to {adapter} (PEFT layout; {EXPORT_DIR}/ holds the merged "
              "weights)", flush=True)
    return out
