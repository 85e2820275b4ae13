"""Does vLLM fit beside JAX on one accelerator? The arithmetic, checked before the engine starts.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

GiB = 1 << 30
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}

DEFAULT_OVERHEAD_BYTES = 2 * GiB
"""vLLM's activation peak and CUDA graphs inside its share, when the caller gives no measurement (bytes). vLLM
measures its own at start-up; 2 GiB covers a 9B model's profile run at its default batch of tokens."""

CONTEXT_RESERVE_FRACTION = 0.1
"""Share of the device neither JAX nor vLLM may claim: CUDA contexts, cuBLAS / cuDNN workspaces, NCCL, torch."""

DEFAULT_CONTEXT_BYTES = int(3.5 * GiB)
"""Two CUDA contexts (learner and replica) with XLA's NCCL and cuBLAS workspaces, outside both fractions (bytes): the
top of the 1.5–3.5 GiB such a pair takes on an 80 GiB card; `launch/gpu_smoke.sh` measures it."""

DEFAULT_CUDA_GRAPH_BYTES = 1 * GiB
"""vLLM's captured CUDA graphs (``enforce_eager=False``), counted outside its share (bytes); vLLM logs the real figure
after capture."""


@dataclasses.dataclass(frozen=True)
class SyncMemory:
    """What one weight sync adds on a device, outside JAX's and vLLM's shares (bytes).

    Attributes:
      staging: the parent's staging buffer on the device (0 for an in-process engine).
      reload_copy: vLLM's layer-wise reload copy of one module (bounded by the largest module group that travels
        whole).
      largest_tensor: the largest tensor of the model in the transfer dtype (what would travel whole without row
        chunks).
      buckets: buckets per sync.
    """

    staging: int
    reload_copy: int
    largest_tensor: int
    buckets: int

    @property
    def peak(self) -> int:
        return self.staging + self.reload_copy


def sync_memory(config: Any, dtype: str, *, bucket_bytes: int | None = None, replicas: bool = True) -> SyncMemory:
    """The transient peak of one weight sync of a model of `config` in engine dtype `dtype` (module docstring).

    Args:
      bucket_bytes: the bucket bound (default `weight_sync.SYNC_BUCKET_BYTES`).
      replicas: True for a `VLLMReplicaPool` (staging buffer + row chunks), False for one in-process engine.
    """
    from flax import nnx

    from bat_jax.models.hf_io import model_class
    from bat_jax.rollout import weight_sync
    from bat_jax.rollout.sync_staging import ITEMSIZE

    bound = weight_sync.SYNC_BUCKET_BYTES if bucket_bytes is None else int(bucket_bytes)
    abstract = nnx.eval_shape(lambda: model_class(config)(config, rngs=nnx.Rngs(0)))
    named = list(weight_sync.flat_named_arrays(nnx.state(abstract, nnx.Param)))
    plan = weight_sync.sync_plan(named, dtype, bound)
    largest = max(int(np.prod(x.shape)) * ITEMSIZE[weight_sync.sync_dtype(n, dtype)] for n, x in named)
    if replicas:
        return SyncMemory(plan.staging_bytes, plan.largest_layer_bytes, largest, len(plan.buckets))
    return SyncMemory(0, max(plan.largest_layer_bytes, largest), largest, len(plan.buckets))


@dataclasses.dataclass(frozen=True)
class RolloutCache:
    """Cache bytes of one sequence in a vLLM engine.

    Attributes:
      kv_bytes_per_token: attention K and V over all attention layers, bytes per token.
      state_bytes: Gated DeltaNet conv + recurrent state over all linear-attention layers, bytes per sequence
        (0 for dense models).
      weight_bytes: the engine's copy of the weights (bytes; parameters × engine dtype, DeltaNet float32 tensors
        at 4 bytes).
    """

    kv_bytes_per_token: int
    state_bytes: int
    weight_bytes: int

    def per_rollout(self, tokens: int) -> int:
        """Bytes one sequence of `tokens` tokens holds (attention KV + DeltaNet state)."""
        return tokens * self.kv_bytes_per_token + self.state_bytes


def rollout_cache(config: Any, dtype: str, state_dtype: str | None = None) -> RolloutCache:
    """Per-token KV, per-sequence DeltaNet state and weight bytes of `config` in an engine of `dtype`.

    Args:
      config: a `bat_jax.models.configs` ``Qwen3_5Config`` (hybrid), ``Qwen3Config`` or ``LlamaConfig``.
      dtype: the engine dtype (float32 / bfloat16 / float16): weights and attention KV.
      state_dtype: the DeltaNet state dtype; None = `dtype` (vLLM's ``mamba_ssm_cache_dtype='auto'``).
    Raises: ValueError for a dtype outside float32 / bfloat16 / float16.
    """
    from bat_jax.models.configs import Qwen3_5Config

    for name in (dtype, state_dtype or dtype):
        if name not in _ITEMSIZE:
            raise ValueError(f"rollout_cache: dtype {name!r} is not one of {sorted(_ITEMSIZE)}")
    item, state_item = _ITEMSIZE[dtype], _ITEMSIZE[state_dtype or dtype]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    if isinstance(config, Qwen3_5Config):
        attention = sum(t == "full_attention" for t in config.layer_types)
        linear = config.num_hidden_layers - attention
        key_dim = config.linear_num_key_heads * config.linear_key_head_dim
        value_dim = config.linear_num_value_heads * config.linear_value_head_dim
        conv = (2 * key_dim + value_dim) * (config.linear_conv_kernel_dim - 1)
        recurrent = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
        state = linear * (conv + recurrent) * state_item
    else:
        attention, state = config.num_hidden_layers, 0
    return RolloutCache(kv_bytes_per_token=attention * kv_heads * head_dim * 2 * item, state_bytes=state,
                        weight_bytes=_weight_bytes(config, item))


def _weight_bytes(config: Any, item: int) -> int:
    """Parameters of `config` times `item` bytes (counted on an abstract model: nothing is allocated)."""
    import jax
    import numpy as np
    from flax import nnx

    from bat_jax.models.hf_io import model_class

    abstract = nnx.eval_shape(lambda: model_class(config)(config, rngs=nnx.Rngs(0)))
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))) * item


@dataclasses.dataclass(frozen=True)
class VLLMMemoryPlan:
    """How one device's memory splits between JAX and vLLM, and how many full-length rollouts vLLM's cache holds.

    All sizes in bytes; fractions of `device_total` (0–1).
    """

    device_total: int
    jax_fraction: float
    vllm_fraction: float
    weights: int
    overhead: int
    cache: int
    per_rollout: int
    max_model_len: int
    rollouts_fit: int
    outside: dict[str, int] = dataclasses.field(default_factory=dict)  # name -> bytes outside both fractions

    def describe(self) -> str:
        g = lambda b: f"{b / GiB:.2f} GiB"  # noqa: E731
        return (f"device {g(self.device_total)}: JAX {self.jax_fraction:.2f} (XLA_PYTHON_CLIENT_MEM_FRACTION) = "
                f"{g(self.jax_fraction * self.device_total)}, vLLM {self.vllm_fraction:.2f} "
                f"(gpu_memory_utilization) = {g(self.vllm_fraction * self.device_total)}: weights {g(self.weights)} "
                f"+ overhead {g(self.overhead)} + cache {g(self.cache)}; one {self.max_model_len:,}-token rollout "
                f"needs {self.per_rollout / (1 << 20):.1f} MiB, so {self.rollouts_fit} fit at once"
                + (f"; outside both: {' + '.join(f'{k} {g(v)}' for k, v in self.outside.items())} = "
                   f"{g(sum(self.outside.values()))} of the {g(self.rest)} left" if self.outside else ""))

    @property
    def rest(self) -> int:
        """Bytes neither JAX's nor vLLM's fraction claims."""
        return int(max(0.0, 1.0 - self.jax_fraction - self.vllm_fraction) * self.device_total)


def plan(cache: RolloutCache, *, max_model_len: int, device_total: int, jax_fraction: float, vllm_fraction: float,
         kv_cache_memory_bytes: int | None = None, overhead: int = DEFAULT_OVERHEAD_BYTES) -> VLLMMemoryPlan:
    """The split of one device (`device_total` bytes).

    With `kv_cache_memory_bytes` the cache is that size (vLLM's own override); otherwise vLLM's share minus weights and
    overhead."""
    share = int(vllm_fraction * device_total)
    if kv_cache_memory_bytes is not None:
        cache_bytes = int(kv_cache_memory_bytes)
    else:
        cache_bytes = max(0, share - cache.weight_bytes - overhead)
    per = cache.per_rollout(max_model_len)
    return VLLMMemoryPlan(device_total=device_total, jax_fraction=jax_fraction, vllm_fraction=vllm_fraction,
                          weights=cache.weight_bytes, overhead=overhead, cache=cache_bytes, per_rollout=per,
                          max_model_len=max_model_len, rollouts_fit=cache_bytes // per if per else 0)


def check(cache: RolloutCache, *, max_model_len: int, device_total: int, device_free: int | None,
          jax_fraction: float, vllm_fraction: float, kv_cache_memory_bytes: int | None = None,
          overhead: int = DEFAULT_OVERHEAD_BYTES, sync: SyncMemory | None = None, cuda_graph_bytes: int = 0,
          context_bytes: int = DEFAULT_CONTEXT_BYTES) -> VLLMMemoryPlan:
    """`plan`, then refuses what cannot run.

    Args:
      device_free: bytes free on the device right now (after JAX's preallocation), or None when unknown (CPU).
      sync: a weight sync's transient peak on the device (`sync_memory`); None: not counted.
      cuda_graph_bytes: vLLM's CUDA graphs (0 with ``enforce_eager``; else about `DEFAULT_CUDA_GRAPH_BYTES`).
      context_bytes: CUDA contexts and workspaces outside both fractions.
      (others: `plan`)
    Returns: the plan (print `describe()`).
    Raises:
      ValueError, naming both fractions and the numbers, when JAX's and vLLM's fractions leave less than
      `CONTEXT_RESERVE_FRACTION` of the device. Also when that rest cannot hold the contexts, the CUDA graphs and a
      weight sync's peak, when less is free than vLLM's share (vLLM would refuse to start), or when not one rollout of
      `max_model_len` tokens fits in the cache. (The device checks apply only where `device_free` is known.)
    """
    p = plan(cache, max_model_len=max_model_len, device_total=device_total, jax_fraction=jax_fraction,
             vllm_fraction=vllm_fraction, kv_cache_memory_bytes=kv_cache_memory_bytes, overhead=overhead)
    outside = {"contexts": int(context_bytes)}
    if cuda_graph_bytes:
        outside["CUDA graphs"] = int(cuda_graph_bytes)
    if sync is not None:
        outside.update({"sync staging": sync.staging, "sync reload copy": sync.reload_copy})
    p = dataclasses.replace(p, outside=outside)
    fix = ("lower XLA_PYTHON_CLIENT_MEM_FRACTION or vllm_options['gpu_memory_utilization'], shorten "
           "max_context_tokens, or set vllm_options['kv_cache_memory_bytes']")
    if device_free is not None:
        if jax_fraction + vllm_fraction > 1.0 - CONTEXT_RESERVE_FRACTION + 1e-9:
            raise ValueError(f"vLLM beside JAX: JAX {jax_fraction:.2f} + vLLM {vllm_fraction:.2f} of the device leave "
                             f"less than {CONTEXT_RESERVE_FRACTION:.2f} for CUDA contexts and workspaces; {fix}. "
                             + p.describe())
        if sum(outside.values()) > p.rest:
            raise ValueError(f"vLLM beside JAX: the {p.rest / GiB:.2f} GiB outside JAX {jax_fraction:.2f} and vLLM "
                             f"{vllm_fraction:.2f} cannot hold {sum(outside.values()) / GiB:.2f} GiB "
                             f"({', '.join(f'{k} {v / GiB:.2f} GiB' for k, v in outside.items())}); lower "
                             f"sync_bucket_bytes, the fractions, or set enforce_eager. " + p.describe())
    if device_free is not None and device_free < vllm_fraction * device_total:
        raise ValueError(f"vLLM beside JAX: {device_free / GiB:.2f} GiB free on the device but vLLM needs its "
                         f"{vllm_fraction:.2f} = {vllm_fraction * device_total / GiB:.2f} GiB (JAX holds "
                         f"{jax_fraction:.2f}); {fix}. " + p.describe())
    if p.rollouts_fit < 1:
        raise ValueError(f"vLLM beside JAX: not one full-length rollout fits: {fix}. " + p.describe())
    return p


def device_memory(index: int = 0) -> tuple[int, int | None]:
    """(total, free) bytes of CUDA device `index` as torch sees it now; (host RAM, None) without CUDA."""
    try:
        import torch

        if torch.cuda.is_available():
            free, total = torch.cuda.mem_get_info(index)
            return int(total), int(free)
    except ImportError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), None


def check_replicas(cache: RolloutCache, *, num_replicas: int, max_model_len: int,
                   devices: list[tuple[int, int | None]], jax_fraction: float, vllm_fraction: float,
                   kv_cache_memory_bytes: int | None = None, overhead: int = DEFAULT_OVERHEAD_BYTES,
                   **outside: Any) -> list[VLLMMemoryPlan]:
    """`check` for every replica of a pool, replica i on device i.

    `devices[i]` = (total, free) bytes. Each must hold its weights and at least one full-length rollout beside JAX's
    share of its device, and the rest of the device the contexts, CUDA graphs and a sync's peak (`outside`: `check`'s
    sync / cuda_graph_bytes / context_bytes).

    Raises: ValueError naming the replica (and `check`'s numbers) for the first that cannot run, or when there are
    fewer devices than replicas."""
    if len(devices) < num_replicas:
        raise ValueError(f"vLLM replicas: {num_replicas} replicas but {len(devices)} devices")
    plans = []
    for i in range(num_replicas):
        total, free = devices[i]
        try:
            plans.append(check(cache, max_model_len=max_model_len, device_total=total, device_free=free,
                               jax_fraction=jax_fraction, vllm_fraction=vllm_fraction,
                               kv_cache_memory_bytes=kv_cache_memory_bytes, overhead=overhead, **outside))
        except ValueError as exc:
            raise ValueError(f"vLLM replica {i} (device {i}): {exc}") from None
    return plans


def describe_replicas(plans: list[VLLMMemoryPlan], rollouts: int) -> str:
    """One line per device, then what the pool holds at once against the `rollouts` of a GRPO step."""
    lines = [f"device {i}: replica {i}: {p.describe()}" for i, p in enumerate(plans)]
    total = sum(p.rollouts_fit for p in plans)
    verdict = "all run at once" if total >= rollouts else f"{rollouts - total} wait for a free slot"
    lines.append(f"{len(plans)} replicas hold {total} full-length rollouts at once; a GRPO step runs {rollouts}: "
                 f"{verdict}")
    return "\n".join(lines)
