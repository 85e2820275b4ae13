"""`RolloutEngine` backed by vLLM, with in-process weight sync from the JAX learner.

The vLLM engine runs in this Python process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one worker, no tensor
parallelism), so weight sync is a direct call, with no disk round trip and no serialisation.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bat_jax.rollout.engine import FINISH_LENGTH, FINISH_STOP, Completion, SamplingParams
from bat_jax.rollout.inflight import InflightDriver

_TORCH_DTYPES = ("float32", "bfloat16", "float16")
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM accepts as ``max_lora_rank`` (vLLM 0.19-0.33 ``config.lora.MaxLoRARanks``)."""
ADAPTER_NAME, ADAPTER_ID = "policy", 1  # the one adapter a LoRA engine serves (vLLM's name and integer id)
CPU_KV_CACHE_BYTES = 256 << 20
"""Cache size (bytes) of an engine on the CPU backend when `VLLMEngineConfig.kv_cache_memory_bytes` is None."""
CPU_BATCHED_TOKENS = 4096
"""Tokens one engine step may take on the CPU backend (vLLM's CPU default), raised to `max_model_len` when larger."""


@dataclasses.dataclass(frozen=True)
class VLLMEngineConfig:
    """How to start the vLLM engine.

    Attributes:
      model_dir: local Hugging Face checkpoint directory (``config.json`` + ``*.safetensors``); gives the
        architecture, the initial weights and the set of tensor names `update_weights` must provide. No
        tokenizer is needed: prompts and completions are token ids.
      dtype: engine compute/storage dtype, one of float32 / bfloat16 / float16 (float32 on CPU; bfloat16 on GPU).
      max_model_len: context length, prompt + completion (tokens).
      kv_cache_memory_bytes: cache size (bytes: attention KV and Gated DeltaNet state), vLLM's override of its
        own sizing. None: on a GPU vLLM sizes the cache from `gpu_memory_utilization` (its share minus weights and
        activations; `rollout/vllm_memory.py` checks beforehand that one full-length rollout fits); on the CPU
        backend `CPU_KV_CACHE_BYTES`, since vLLM would otherwise reserve `gpu_memory_utilization` of host RAM.
      gpu_memory_utilization: fraction (0–1) of the device's total memory vLLM may hold: weights, activations and
        the cache. vLLM refuses to start when less than that is free.
      max_num_seqs: most rows decoded together.
      block_size: KV-cache block (tokens); None = vLLM's default (128 on CPU, 16 on GPU). Prefix caching reuses
        whole blocks only.
      enforce_eager: no CUDA graphs.
      compile: torch.compile the model (vLLM compilation mode 3); off by default: on CPU it costs about a minute
        at the first batch and the tiny test models gain nothing.
      enable_prefix_caching: reuse KV blocks of shared prompt prefixes (reset at every weight sync).
      seed: engine seed (rows with explicit seeds do not depend on it).
      max_lora_rank: 0 = full weights (`update_weights` installs every tensor); else one of `VLLM_LORA_RANKS`: the
        checkpoint is the frozen base and vLLM serves a LoRA adapter of at most this rank over it (``enable_lora``),
        every request passes it and `update_weights` writes a new version of it and loads that in place.
    """

    model_dir: str
    dtype: str = "float32"
    max_model_len: int = 4096
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.5
    max_num_seqs: int = 256
    block_size: int | None = None
    enforce_eager: bool = True
    compile: bool = False
    enable_prefix_caching: bool = True
    seed: int = 0
    max_lora_rank: int = 0

    def __post_init__(self):
        if self.dtype not in _TORCH_DTYPES:
            raise ValueError(f"VLLMEngineConfig.dtype must be one of {_TORCH_DTYPES}, got {self.dtype!r}")
        if self.max_model_len < 2:
            raise ValueError(f"VLLMEngineConfig.max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_lora_rank != 0 and self.max_lora_rank not in VLLM_LORA_RANKS:
            raise ValueError(f"VLLMEngineConfig.max_lora_rank must be 0 (no adapter) or one of {VLLM_LORA_RANKS} "
                             f"(vLLM's ranks), got {self.max_lora_rank}")


def lora_rank_for(rank: int) -> int:
    """The smallest of `VLLM_LORA_RANKS` that holds an adapter of `rank`. Raises ValueError above 512."""
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise ValueError(f"a LoRA adapter of rank {rank}: vLLM serves ranks up to {VLLM_LORA_RANKS[-1]}")
    return fits[0]


def kv_cache_bytes(config: VLLMEngineConfig) -> int | None:
    """The cache size the engine asks vLLM for.

    `config.kv_cache_memory_bytes`, else `CPU_KV_CACHE_BYTES` without CUDA, else None (vLLM sizes it from
    `gpu_memory_utilization`)."""
    if config.kv_cache_memory_bytes is not None:
        return int(config.kv_cache_memory_bytes)
    import torch

    return None if torch.cuda.is_available() else CPU_KV_CACHE_BYTES


def _on_cpu() -> bool:
    """Whether vLLM runs on its CPU backend (``vllm.platforms.current_platform``)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _recurrent(model_dir: str | os.PathLike) -> bool:
    """Whether the checkpoint's model has recurrent (linear-attention) layers.

    True when its ``config.json`` ``layer_types``, or its ``text_config``'s, name ``linear_attention``."""
    import json  # not hf_io.read_hf_config: bat_jax.models imports JAX, which vLLM replica processes never load

    config = json.loads((Path(model_dir) / "config.json").read_text())
    return any("linear_attention" in (c.get("layer_types") or ()) for c in (config, config.get("text_config") or {}))


def checkpoint_tensor_shapes(model_dir: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of every tensor in the ``*.safetensors`` files of a checkpoint directory.

    Raises FileNotFoundError naming the directory when it holds no safetensors file.
    """
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors files")
    shapes: dict[str, tuple[int, ...]] = {}
    for fp in files:
        with safe_open(fp, "numpy") as f:
            shapes.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})
    return shapes


def write_checkpoint(model: Any, work_dir: str | os.PathLike, *, tokenizer: Any = None,
                     **config_overrides: Any) -> VLLMEngineConfig:
    """Writes an in-memory causal LM to ``work_dir/checkpoint`` for vLLM; returns the engine config on it.

    The model is a `bat_jax.models` causal LM. `VLLMEngine.from_model` documents the arguments, the defaults and the
    errors."""
    import tempfile

    from bat_jax.models import lora
    from bat_jax.models.hf_io import save_pretrained

    fields = {f.name for f in dataclasses.fields(VLLMEngineConfig)}
    unknown = sorted(set(config_overrides) - fields)
    if "model_dir" in config_overrides:
        raise ValueError("VLLMEngine.from_model: config_overrides may set VLLMEngineConfig fields other than "
                         "model_dir (the checkpoint goes to work_dir/checkpoint)")
    if unknown:
        raise ValueError(f"VLLMEngine.from_model: {unknown} are not VLLMEngineConfig fields")
    adapted = lora.adapted_linears(model)
    if adapted and "max_lora_rank" not in config_overrides:  # the frozen base is the checkpoint, the adapter rides
        config_overrides["max_lora_rank"] = lora_rank_for(max(m.lora_a.shape[0] for _, m in adapted))
    if "max_model_len" not in config_overrides:
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        config_overrides["max_model_len"] = min(4096, int(limit)) if limit else 4096
    config = VLLMEngineConfig(model_dir=str(Path(work_dir) / "checkpoint"), **config_overrides)
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work_dir, prefix=".tokenizer-") as tok_dir:
        if tokenizer is not None:
            tokenizer.save_pretrained(tok_dir)
        save_pretrained(model, config.model_dir, tokenizer_dir=tok_dir if tokenizer is not None else None,
                        overwrite=True, merge_lora=config.max_lora_rank == 0)
    return config


def check_request(prompts: Sequence[Sequence[int]], params: SamplingParams, max_new_tokens: Sequence[int] | None,
                  seeds: Sequence[int] | None, max_model_len: int) -> tuple[list[int], list[int]]:
    """The per-row budgets and seeds of a `generate` request, after its checks.

    Defaults: `params.max_new_tokens`, `params.seed` + row index. Raises ValueError naming the row
    (`VLLMEngine.generate`)."""
    n = len(prompts)
    budgets = [params.max_new_tokens] * n if max_new_tokens is None else [int(b) for b in max_new_tokens]
    row_seeds = [params.seed + i for i in range(n)] if seeds is None else [int(s) for s in seeds]
    if len(budgets) != n or len(row_seeds) != n:
        raise ValueError(f"generate: {n} prompts but {len(budgets)} max_new_tokens and {len(row_seeds)} seeds")
    for i, (prompt, budget) in enumerate(zip(prompts, budgets)):
        if len(prompt) == 0:
            raise ValueError(f"generate: prompt {i} is empty")
        if not 1 <= budget <= params.max_new_tokens:
            raise ValueError(f"generate: max_new_tokens[{i}] = {budget} is outside [1, {params.max_new_tokens}]")
        if len(prompt) + budget > max_model_len:
            raise ValueError(f"generate: prompt {i} has {len(prompt)} tokens + budget {budget} tokens, more "
                             f"than the context of {max_model_len} (max_model_len)")
    return budgets, row_seeds


def _refresh_tied_output_head(worker) -> bool:
    """Re-derives the output head's kernel state from the (just reloaded) embedding it is tied to.

    With ``tie_word_embeddings`` the head shares the embedding's weight, so the in-place reload loads nothing into
    the head module and restores its old kernel state; on the CPU backend that state is a oneDNN / packed copy of
    the *old* weight (``dispatch_cpu_unquantized_gemm``), so logits would come from the old weights. Re-running
    the head's ``process_weights_after_loading`` rebuilds it (a no-op on GPU). Runs on the worker through
    ``collective_rpc``; returns whether the head is tied.
    """
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is None or embed is None or getattr(head, "weight", None) is not getattr(embed, "weight", None):
        return False
    head.quant_method.process_weights_after_loading(head)
    return True


def write_rows(worker, rows: Iterator[tuple[str, int, Any]]) -> int:
    """Writes row blocks of checkpoint tensors straight into vLLM's parameters; returns the rows written.

    For tensors larger than a sync bucket (the embedding and output head) that vLLM keeps as one row-major
    parameter with the checkpoint's row layout (padded vocabulary rows past the end are left as they are). Each
    touched module's ``quant_method.process_weights_after_loading`` runs again afterwards (on GPU a no-op for
    unquantized embeddings; on CPU it rebuilds the packed GEMM copy of an output head). Runs on the worker through
    ``collective_rpc``, after the layer-wise reload has put every parameter back (source: vLLM's kernel-format
    reload, ``reload_weights(is_checkpoint_format=False)`` in vLLM 0.19–0.33, which copies into
    ``model.get_parameter(name)`` the same way).

    Raises: ValueError naming the tensor when vLLM has no such parameter, its trailing shape differs, or the rows
    fall outside it.
    """
    import torch

    model = worker.model_runner.get_model()
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    touched, written = {}, 0
    with torch.no_grad():
        for name, row0, block in rows:
            target = (mapper._map_name(name) if mapper is not None and hasattr(mapper, "_map_name") else name) or name
            try:
                param = model.get_parameter(target)
            except AttributeError:
                raise ValueError(f"weight sync: tensor {name!r} travels in row chunks but vLLM has no parameter "
                                 f"{target!r} to write them into; raise sync_bucket_bytes above its size") from None
            if tuple(param.shape[1:]) != tuple(block.shape[1:]) or row0 + block.shape[0] > param.shape[0]:
                raise ValueError(f"weight sync: rows {row0}:{row0 + block.shape[0]} of tensor {name!r} "
                                 f"{tuple(block.shape)} do not fit vLLM's parameter {target!r} {tuple(param.shape)}; "
                                 f"raise sync_bucket_bytes above its size")
            param.data[row0:row0 + block.shape[0]].copy_(block)
            written += int(block.shape[0])
            module_name = target.rpartition(".")[0]
            touched[module_name] = model.get_submodule(module_name)
    for module in touched.values():
        method = getattr(module, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(module)
    return written


def check_adapter_model(config: VLLMEngineConfig, model: Any) -> None:
    """Refuses weights a LoRA engine cannot serve.

    Raises: ValueError when `config` serves full weights or `model` carries no adapter (`models.lora.add_lora`);
    TypeError for a `model` that is not an ``nnx.Module``."""
    from flax import nnx

    from bat_jax.models import lora

    if not config.max_lora_rank:
        raise ValueError("a LoRA adapter was given to an engine that serves full weights "
                         "(VLLMEngineConfig.max_lora_rank = 0)")
    if not isinstance(model, nnx.Module):
        raise TypeError(f"a LoRA engine's weights are a model carrying its adapter (nnx.Module), got "
                        f"{type(model).__name__}")
    if not lora.has_lora(model):
        raise ValueError("a LoRA engine (VLLMEngineConfig.max_lora_rank > 0) was given a model without an "
                         "adapter (models.lora.add_lora)")


def adapter_root(model_dir: str | os.PathLike) -> Path:
    """Where a LoRA engine's adapter versions go: ``<model_dir>/../adapters``.

    Under ``process<i>/`` inside it when several JAX processes each write their own."""
    import jax

    root = Path(model_dir).parent / "adapters"
    return root / f"process{jax.process_index()}" if jax.process_count() > 1 else root


def write_adapter(model: Any, directory: Path, model_dir: str | os.PathLike) -> Path:
    """Writes `model`'s adapter in PEFT's layout to `directory` (over the base `model_dir`) and returns it.

    Callers pass a directory no engine has read (a new one per version), so a load never reads a directory being
    replaced; all or nothing (`peft_io.save_adapter`)."""
    from bat_jax.models import peft_io

    return peft_io.save_adapter(model, directory, base_model_name_or_path=str(model_dir), overwrite=True,
                                every_process=True)


def remove_older_adapters(path: Path) -> None:
    """Removes the adapter directories beside `path` (``v*``) other than `path` itself."""
    import shutil

    for old in Path(path).parent.glob("v*"):
        if old != Path(path):
            shutil.rmtree(old, ignore_errors=True)


class VLLMEngine:
    """`bat_jax.rollout.engine.RolloutEngine` on vLLM (``LLM`` in this process).

    ``VLLMEngine(VLLMEngineConfig(model_dir=...))`` starts the engine on a checkpoint directory (about 15-60 s on
    a 2-core CPU); ``VLLMEngine.from_model(model, work_dir)`` on an in-memory NNX model (writes the checkpoint).
    Raises ImportError when vLLM is not installed (``bash launch/setup.sh --with-vllm`` on CPU,
    ``bash launch/install_gpu.sh`` on GPUs).
    """

    def __init__(self, config: VLLMEngineConfig):
        # The weight sync needs the model in this process; vLLM reads this variable when the engine starts.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        import vllm

        self.config = config
        self._shapes = checkpoint_tensor_shapes(config.model_dir)
        kwargs: dict[str, Any] = {}
        kv_bytes = kv_cache_bytes(config)
        if kv_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = kv_bytes
        if config.block_size is not None:
            kwargs["block_size"] = int(config.block_size)
        if config.max_lora_rank:  # one adapter, loaded before any request (`install_adapter`)
            kwargs.update(enable_lora=True, max_lora_rank=config.max_lora_rank, max_loras=1)
        if _on_cpu() and not (config.enable_prefix_caching and _recurrent(config.model_dir)):
            # A prefill split over engine steps rewinds a seeded request's generator, which the CPU's cannot ("CPU
            # Generator does not use offset", vLLM 0.32 `gpu_model_runner`): every prompt is prefilled in one step.
            # vLLM requires split prefills for recurrent layers with prefix caching (Qwen3.5's Gated DeltaNet).
            kwargs.update(enable_chunked_prefill=False,
                          max_num_batched_tokens=max(config.max_model_len, CPU_BATCHED_TOKENS))
        self._lora = None  # the LoRARequest every request passes (LoRA engines, once an adapter is installed)
        self._llm = vllm.LLM(
            model=str(config.model_dir), skip_tokenizer_init=True, dtype=config.dtype,
            max_model_len=config.max_model_len, max_num_seqs=config.max_num_seqs,
            gpu_memory_utilization=config.gpu_memory_utilization, enforce_eager=config.enforce_eager,
            compilation_config={"mode": 3 if config.compile else 0},
            enable_prefix_caching=config.enable_prefix_caching, logprobs_mode="processed_logprobs",
            seed=config.seed, **kwargs)
        self._version = 0
        engine = self._llm.llm_engine
        # one driver thread steps the engine: concurrent `generate` calls share its running batch (in flight)
        self._driver = InflightDriver(
            add=lambda request_id, item: engine.add_request(request_id, item[0], item[1], lora_request=self._lora),
            step=lambda: [(out.request_id, out) for out in engine.step() if out.finished],
            abort=engine.abort_request, name="vllm")

    @classmethod
    def from_model(cls, model: Any, work_dir: str | os.PathLike, *, tokenizer: Any = None,
                   **config_overrides: Any) -> "VLLMEngine":
        """Starts an engine on the current weights of an in-memory `bat_jax.models` causal LM.

        Writes the model as a Hugging Face checkpoint to ``work_dir/checkpoint`` with
        `bat_jax.models.hf_io.save_pretrained` (tensors in their parameter dtype, ``config.json`` from
        ``model.config``; written to a temporary sibling and renamed into place, replacing a checkpoint a previous
        call left there), then starts ``VLLMEngine(VLLMEngineConfig(model_dir=that directory, **config_overrides))``.
        Later weights go in with `update_weights`; the checkpoint only fixes the architecture and tensor names.

        Args:
          model: a ``Qwen3ForCausalLM`` / ``LlamaForCausalLM`` / ``Qwen3_5ForCausalLM`` (``bat_jax.models``).
            Attention (and Gated DeltaNet) heads must have a size the backend supports (CPU: 32, 64, 80, ..., 256,
            512 for attention, 64 and up for DeltaNet; Qwen3.5 on CPU: dtype bfloat16 and an importable torchvision,
            module docstring).
          work_dir: a directory this engine may write into (created if missing); only ``checkpoint`` (and its
            temporary siblings) inside it are touched.
          tokenizer: optional; a `transformers` tokenizer (e.g. `bat_jax.models.tokenizer.load_tiny_tokenizer()`)
            whose files are saved next to the weights so that other tools (``vllm serve``, transformers) can open
            the directory as a complete checkpoint. The engine itself never reads it: prompts and completions
            are token ids (``skip_tokenizer_init``).
          **config_overrides: any other `VLLMEngineConfig` field (``dtype``, ``max_model_len``,
            ``kv_cache_memory_bytes``, ...). ``max_model_len`` defaults to the smaller of 4,096 and the model's
            ``max_position_embeddings``; ``max_lora_rank`` to the smallest of vLLM's ranks that holds the model's
            LoRA adapter (`models.lora`; 0 without one): the checkpoint is then the frozen base and the adapter is
            served over it.
        Returns: the started engine (``weight_version`` 0 = the model's weights at the call).
        Raises: ValueError when ``config_overrides`` sets ``model_dir`` or a key that is not a `VLLMEngineConfig`
          field, or a field's value is invalid; ImportError without vLLM; vLLM's own errors when it cannot load
          the model family.
        """
        engine = cls(write_checkpoint(model, work_dir, tokenizer=tokenizer, **config_overrides))
        if engine.config.max_lora_rank:
            engine.install_adapter(model, bump=False)  # version 0: the model's adapter at the call
        return engine

    @property
    def weight_version(self) -> int:
        """Version of the installed weights: 0 for the checkpoint in `config.model_dir`, +1 per sync."""
        return self._version

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
                 max_new_tokens: Sequence[int] | None = None,
                 seeds: Sequence[int] | None = None) -> list[Completion]:
        """Samples one completion per prompt (see `RolloutEngine.generate`).

        Each row is a vLLM request with its own seed, so its tokens do not depend on the other rows. A row stops
        after a token in `params.stop_token_ids` (kept, finish 'stop') or after its budget (finish 'length');
        the model's own EOS is ignored unless it is listed as a stop token. Logprobs: module docstring.

        Raises: ValueError naming the row on an empty prompt, a budget outside [1, params.max_new_tokens], a
        prompt + budget above `max_model_len`, or `max_new_tokens` / `seeds` of another length than `prompts`;
        RuntimeError if vLLM aborts a row.
        """
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        n = len(prompts)
        if n == 0:
            return []
        budgets, row_seeds = check_request(prompts, params, max_new_tokens, seeds, self.config.max_model_len)
        requests, sampling = [], []
        for prompt, budget, seed in zip(prompts, budgets, row_seeds):
            ids = [int(t) for t in prompt]
            requests.append(TokensPrompt(prompt_token_ids=ids))
            sampling.append(VSamplingParams(
                temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                max_tokens=budget, seed=seed % (1 << 32), logprobs=0,
                stop_token_ids=list(params.stop_token_ids), ignore_eos=True, detokenize=False,
                output_kind=RequestOutputKind.FINAL_ONLY))
        outputs = self._driver.run(list(zip(requests, sampling)))  # joins the running batch (module docstring)
        return [self._completion(i, out, params) for i, out in enumerate(outputs)]

    def _completion(self, row: int, request_output, params: SamplingParams) -> Completion:
        out = request_output.outputs[0]
        ids = np.asarray(out.token_ids, np.int32)
        if out.finish_reason not in (FINISH_STOP, FINISH_LENGTH):
            raise RuntimeError(f"generate: row {row} finished with {out.finish_reason!r} ({out.stop_reason!r})")
        if params.temperature == 0.0:
            logprobs = np.zeros(len(ids), np.float32)
        else:
            logprobs = np.asarray([step[int(t)].logprob for t, step in zip(ids, out.logprobs)], np.float32)
        finish = FINISH_STOP if out.finish_reason == "stop" else FINISH_LENGTH
        return Completion(token_ids=ids, logprobs=logprobs, finish_reason=finish, weight_version=self._version)

    def score(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Raw logprobs of given completions under the installed weights (teacher forcing, no sampling).

        Each row is one vLLM request on ``prompt + completion`` with ``prompt_logprobs``; its completion part is
        returned. The logprobs are the model's own (temperature 1, no top-k / top-p): vLLM computes prompt
        logprobs from the raw logits whatever its ``logprobs_mode`` (vLLM 0.32 ``GPUModelRunner
        ._get_prompt_logprobs_dict``, which the CPU runner inherits). Requests with prompt logprobs do not read
        the prefix cache. One token is generated per row and dropped.

        Args:
          prompts: token ids per row, non-empty.
          completions: token ids per row, non-empty.
        Returns: per row a float32 array ``[len(completion)]`` (nats), the logprob of each completion token
          given everything before it.
        Raises: ValueError naming the row on an empty prompt or completion, ``prompt + completion + 1`` above
          ``max_model_len``, or lists of different lengths; NotImplementedError for a LoRA engine on the CPU
          backend (vLLM 0.32's CPU LoRA logits processor maps one row per request, so prompt logprobs fail inside
          vLLM; the run never scores through the engine: sampled logprobs come with `generate`).
        """
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if len(prompts) != len(completions):
            raise ValueError(f"score: {len(prompts)} prompts but {len(completions)} completions")
        import torch

        if self.config.max_lora_rank and not torch.cuda.is_available():
            raise NotImplementedError("score: a LoRA engine on vLLM's CPU backend cannot compute prompt logprobs "
                                      "(its LoRA logits processor maps one row per request); use generate's logprobs")
        requests = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions)):
            ids, comp = [int(t) for t in prompt], [int(t) for t in completion]
            if not ids or not comp:
                raise ValueError(f"score: row {i} has an empty {'prompt' if not ids else 'completion'}")
            if len(ids) + len(comp) + 1 > self.config.max_model_len:
                raise ValueError(f"score: row {i} has {len(ids)} + {len(comp)} tokens + 1, more than the context "
                                 f"of {self.config.max_model_len} (max_model_len)")
            requests.append(TokensPrompt(prompt_token_ids=ids + comp))
        if not requests:
            return []
        sampling = VSamplingParams(temperature=1.0, max_tokens=1, prompt_logprobs=0, detokenize=False,
                                   ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
        outputs = self._driver.run([(request, sampling.clone()) for request in requests])
        result = []
        for prompt, completion, out in zip(prompts, completions, outputs):
            steps = out.prompt_logprobs[len(prompt):]
            result.append(np.asarray([step[int(t)].logprob for t, step in zip(completion, steps)], np.float32))
        return result

    def update_weights(self, params: Any) -> int:
        """Installs new weights in place and returns the new weight version.

        Args:
          params: an ``nnx.Module`` or ``nnx.State`` of a `bat_jax.models` causal LM (its Param paths are the HF
            names), or a mapping of HF tensor names to jax / numpy / torch arrays. Every tensor of the
            checkpoint in `config.model_dir` must be given, with the same shape; values are cast to
            `config.dtype`.
        Returns: the new `weight_version`.
        A LoRA engine (`VLLMEngineConfig.max_lora_rank`) takes the model instead and installs its adapter
        (`install_adapter`).
        Raises: ValueError naming missing or unknown tensor names or a shape mismatch (nothing is installed
        then); TypeError for another params type; RuntimeError while `generate` / `score` requests are in flight
        or another update holds the engine (`InflightDriver.exclusive`), or if the prefix cache cannot be reset.
        Source: vLLM ``Worker.reload_weights(weights_iterator=...)`` + ``LLM.reset_prefix_cache`` (module
        docstring).
        """
        from bat_jax.rollout.weight_sync import named_weights, stream_torch_weights  # JAX: the learner's side

        if self.config.max_lora_rank:
            return self.install_adapter(params)
        named = named_weights(params, self._shapes, self.config.model_dir)
        return self.install_weights(stream_torch_weights(named, self.config.dtype))  # buckets of <= 1 GB

    def install_weights(self, weights: Iterator[tuple[str, Any]],
                        rows: Iterator[tuple[str, int, Any]] | None = None) -> int:
        """`update_weights` after its checks: installs the weights and returns the new weight version.

        It installs ``(name, torch tensor)`` pairs (consumed while vLLM reloads: ``model.load_weights`` inside vLLM's
        layer-wise reload), then writes ``(name, first row, torch tensor)`` row blocks of the tensors that travel in row
        chunks straight into their parameters (`write_rows`); together every checkpoint tensor once. Raises RuntimeError
        while requests are in flight (nothing is installed then) or if the prefix cache cannot be reset; ValueError
        naming a row-chunked tensor whose vLLM parameter is not a plain row copy of it."""
        with self._driver.exclusive("update_weights"):  # never under a running request
            self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights,
                                                               "is_checkpoint_format": True})
            if rows is not None:
                self._llm.collective_rpc(write_rows, args=(rows,))
            self._llm.collective_rpc(_refresh_tied_output_head)
            if not self._llm.reset_prefix_cache():
                raise RuntimeError("update_weights: vLLM could not reset its prefix cache (requests still running)")
            self._version += 1  # before any queued call runs on the new weights
        return self._version

    def install_adapter(self, model: Any, *, bump: bool = True) -> int:
        """Serves `model`'s LoRA adapter from now on; returns the weight version (+1 when `bump`).

        The adapter is written by `write_adapter` (a new directory per version), loaded in place (`load_adapter`),
        and older directories are removed.

        Raises: as `check_adapter_model`; RuntimeError as `install_weights`.
        """
        check_adapter_model(self.config, model)
        version = self._version + (1 if bump else 0)
        path = write_adapter(model, adapter_root(self.config.model_dir) / f"v{version}", self.config.model_dir)
        self.load_adapter(str(path), version)
        remove_older_adapters(path)
        return self._version

    def load_adapter(self, path: str, version: int) -> int:
        """Loads the PEFT adapter at `path` in place of the served one and returns `version`, now the weight version.

        vLLM loads it under the one adapter id (``LoRARequest(..., load_inplace=True)``; later requests name it
        without reloading) and the prefix cache is reset. Source: vLLM ``LLMEngine.add_lora``,
        ``WorkerLoRAManager.add_adapter`` (0.19-0.33). Raises RuntimeError as `install_weights`."""
        from vllm.lora.request import LoRARequest

        with self._driver.exclusive("update_weights"):  # never under a running request
            self._llm.llm_engine.add_lora(LoRARequest(ADAPTER_NAME, ADAPTER_ID, str(path), load_inplace=True))
            if not self._llm.reset_prefix_cache():
                raise RuntimeError("update_weights: vLLM could not reset its prefix cache (requests still running)")
            self._lora = LoRARequest(ADAPTER_NAME, ADAPTER_ID, str(path))  # named by requests, loaded already
            self._version = int(version)
        return self._version

    def close(self) -> None:
        """Shuts the engine down (frees its KV cache and weights)."""
        driver = getattr(self, "_driver", None)
        if driver is not None:
            driver.close()
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
