"""GGUF file -> Hugging Face checkpoint directory (safetensors, config, tokenizer, chat template).

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from pathlib import Path

from bat_jax.atomic_io import atomic_directory

#: GGUF ``general.architecture`` -> the transformers ``model_type`` it becomes (a family of ``configs.py``).
SUPPORTED_ARCHITECTURES = {"llama": "llama"}
#: Tensor types that transformers' GGUF loader dequantises exactly as llama.cpp (gguf-py ``quants``).
SUPPORTED_QUANT_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def inspect_gguf(gguf_path: str | os.PathLike) -> tuple[str, dict[str, int]]:
    """(architecture, {tensor type name: tensor count}) of a GGUF file, from its header.

    Raises FileNotFoundError naming a missing file; ValueError naming the file when it is not a GGUF file, its
    architecture is not in ``SUPPORTED_ARCHITECTURES`` or a tensor type is not in ``SUPPORTED_QUANT_TYPES``.
    """
    import gguf

    path = Path(gguf_path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such GGUF file")
    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError) as e:
        raise ValueError(f"{path}: not a readable GGUF file ({e})") from e
    field = reader.fields.get("general.architecture")
    arch = field.contents() if field is not None else None
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported "
                         f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")
    types = Counter(t.tensor_type.name for t in reader.tensors)
    bad = {k: n for k, n in types.items() if k not in SUPPORTED_QUANT_TYPES}
    if bad:
        raise ValueError(f"{path}: GGUF tensor types {sorted(bad)} are not supported "
                         f"({sum(bad.values())} tensors; supported: {', '.join(SUPPORTED_QUANT_TYPES)})")
    return arch, dict(types)


def _write_model(model, out: Path) -> None:
    """Writes ``model.safetensors`` (float32) and the config files without the GGUF quantisation record.

    The tied head is left out as transformers does, and ``config.json`` / ``generation_config.json`` lose the GGUF
    quantisation record: the weights are plain float32 now (the transformers model keeps its GGUF quantizer attached, so
    its ``save_pretrained`` refuses to write)."""
    import json

    from safetensors.torch import save_file

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)  # the GGUF's directory: meaningless once copied
    config["architectures"] = [type(model).__name__]
    config["dtype"] = "float32"
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    if model.generation_config is not None:
        model.generation_config.save_pretrained(out)


def import_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Writes the HF checkpoint directory of a GGUF file (float32 safetensors) to ``out_dir`` and returns it.

    The config is transformers' reading of the GGUF metadata (checked by ``configs.config_from_hf``); the
    tokenizer and its chat template are the GGUF's own. Raises FileExistsError when ``out_dir`` exists and
    ``overwrite`` is false, and the errors of :func:`inspect_gguf`.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bat_jax.models.configs import config_from_hf
    from bat_jax.models.hf_io import read_hf_config

    path, out_dir = Path(gguf_path), Path(out_dir)
    inspect_gguf(path)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir}: already exists (pass overwrite=True / --overwrite)")
    kw = dict(gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), dtype=torch.float32, **kw)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **kw)
    with atomic_directory(out_dir) as tmp:
        _write_model(model, tmp)
        tokenizer.save_pretrained(tmp)
        config_from_hf(read_hf_config(tmp))  # the family loads it, or a ValueError naming the field
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bat_jax.models.gguf_import", description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", required=True, help="path of the .gguf file")
    parser.add_argument("--out", required=True, help="HF checkpoint directory to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out directory")
    args = parser.parse_args(argv)
    arch, types = inspect_gguf(args.gguf)
    out = import_gguf(args.gguf, args.out, overwrite=args.overwrite)
    print(f"{args.gguf}: {arch}, tensor types {types} -> {out}")


if __name__ == "__main__":
    main()
