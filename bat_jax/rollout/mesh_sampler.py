"""The JAX sampler on a device mesh: batch rows split over devices, weights replicated or tensor-sharded.

The rollout engine on a TPU slice (and the no-vLLM engine on GPUs). `SamplerMeshConfig` (gin) says how the
sampler spreads over the devices the learner uses:

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from bat_jax.models import mesh as mesh_lib
from bat_jax.models.cache import AttentionCache, DecodeCache, DeltaNetCache
from bat_jax.models.gated_deltanet import FLOAT32_PARAMS

_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class SamplerMeshConfig:
    """How the JAX sampler spreads over devices (module docstring).

    Attributes:
      devices: devices the sampler uses: the first `devices` of `jax.devices()`; 0 = all of them (the learner's).
      tensor: devices per weight copy: 1 = weights replicated on every device (pure data parallel); > 1 = heads,
        MLP channels and vocabulary split over groups of `tensor` devices. Must divide `devices`.
      param_dtype: dtype of the rollout weights (float32 / bfloat16 / float16); None keeps the model's.
    Raises:
      ValueError: naming the field, for a bound < 0 / < 1 or an unknown dtype.
    """

    devices: int = 0
    tensor: int = 1
    param_dtype: str | None = None

    def __post_init__(self):
        if self.devices < 0:
            raise ValueError(f"SamplerMeshConfig.devices must be >= 0 (0 = all), got {self.devices}")
        if self.tensor < 1:
            raise ValueError(f"SamplerMeshConfig.tensor must be >= 1, got {self.tensor}")
        if self.param_dtype is not None and self.param_dtype not in _DTYPES:
            raise ValueError(f"SamplerMeshConfig.param_dtype must be one of {_DTYPES} or None, "
                             f"got {self.param_dtype!r}")


def rollout_mesh(config: SamplerMeshConfig, devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
    """The (data, fsdp = 1, tensor) mesh of the sampler over `devices`.

    `devices` default to `config.devices` of `jax.devices()`. Raises ValueError when `config.tensor` does not divide the
    device count or more devices are asked for than exist."""
    devs = list(jax.devices() if devices is None else devices)
    if config.devices:
        if config.devices > len(devs):
            raise ValueError(f"SamplerMeshConfig.devices = {config.devices} but only {len(devs)} devices exist")
        devs = devs[:config.devices]
    if len(devs) % config.tensor:
        raise ValueError(f"SamplerMeshConfig.tensor = {config.tensor} does not divide {len(devs)} devices")
    return mesh_lib.build_mesh(mesh_lib.MeshConfig(data=len(devs) // config.tensor, fsdp=1, tensor=config.tensor),
                               devs)


def _flat_leaves(state: Any) -> tuple[list[tuple], list[Any]]:
    """(paths, arrays) of an `nnx.State`, in `jax.tree.leaves` order."""
    flat = list(nnx.to_flat_state(state))
    values = [v.get_value() if hasattr(v, "get_value") else v for _, v in flat]
    leaves = jax.tree.leaves(state)
    if len(leaves) != len(values) or any(a is not b for a, b in zip(leaves, values)):
        raise ValueError("SamplerPlacement: the model state's leaves are not its flat variables (one array each)")
    return [p for p, _ in flat], values


def _rollout_dtype(path: tuple, x: Any, param_dtype: str | None) -> Any:
    """The dtype a parameter has on the sampler.

    `param_dtype` for floating parameters, except the float32 DeltaNet tensors; other dtypes (and everything when
    `param_dtype` is None) unchanged."""
    name = ".".join(map(str, path))
    if param_dtype is None or not jnp.issubdtype(x.dtype, jnp.floating) or name.endswith(FLOAT32_PARAMS):
        return jnp.dtype(x.dtype)
    return jnp.dtype(param_dtype)


def _divides(size: int, mesh: jax.sharding.Mesh, axis: str) -> str | None:
    """`axis` when it has more than one device and divides `size`, else None (replicated)."""
    n = mesh.shape[axis]
    return axis if n > 1 and size % n == 0 else None


@dataclasses.dataclass(frozen=True)
class CacheLayout:
    """Where a decode cache's arrays live on the rollout mesh.

    It is hashable: a static argument of the sampler's jitted programs. Batch axis over (data, fsdp); head / channel
    axes over tensor where they divide."""

    mesh: jax.sharding.Mesh

    @property
    def data(self) -> int:
        """Devices along the batch axes (padded batches are multiples of it)."""
        return math.prod(self.mesh.shape[a] for a in mesh_lib.BATCH_AXES)

    def batch(self, ndim: int) -> NamedSharding:
        """Rows split over the batch axes, other dims replicated."""
        return mesh_lib.batch_sharding(self.mesh, ndim)

    def cache_shardings(self, cache: DecodeCache) -> DecodeCache:
        """A `DecodeCache` of `NamedSharding`s for `cache` (arrays or `ShapeDtypeStruct`s)."""
        b = mesh_lib.BATCH_AXES
        layers = []
        for layer in cache.layers:
            if isinstance(layer, AttentionCache):  # k, v [b, kv_heads, L, head_dim]
                spec = PartitionSpec(b, _divides(layer.k.shape[1], self.mesh, "tensor"), None, None)
                layers.append(AttentionCache(k=NamedSharding(self.mesh, spec), v=NamedSharding(self.mesh, spec)))
            elif isinstance(layer, DeltaNetCache):  # conv [b, kernel-1, conv_dim], state [b, heads, dk, dv]
                conv = PartitionSpec(b, None, _divides(layer.conv.shape[2], self.mesh, "tensor"))
                state = PartitionSpec(b, _divides(layer.state.shape[1], self.mesh, "tensor"), None, None)
                layers.append(DeltaNetCache(conv=NamedSharding(self.mesh, conv), state=NamedSharding(self.mesh, state)))
            else:
                raise TypeError(f"CacheLayout: unknown cache layer type {type(layer).__name__}")
        return DecodeCache(layers=tuple(layers), length=NamedSharding(self.mesh, PartitionSpec()),
                           slot_mask=self.batch(2), next_position=self.batch(1))

    def constrain(self, cache: DecodeCache) -> DecodeCache:
        """`cache` (inside jit) constrained to `cache_shardings`."""
        return jax.lax.with_sharding_constraint(cache, self.cache_shardings(cache))

    def put(self, cache: DecodeCache) -> DecodeCache:
        """A host (numpy) cache placed on the mesh with `cache_shardings`."""
        return jax.device_put(cache, self.cache_shardings(cache))


class SamplerPlacement:
    """The rollout mesh, the rollout weights' shardings and dtypes, and the on-device reshard (module docstring).

    Args:
      state: the sampler model's `nnx.State` (from `nnx.split(model)`; arrays or `ShapeDtypeStruct`s) with the
        logical axis names its parameters carry.
      config: the `SamplerMeshConfig`.
      devices: the devices to build the rollout mesh on (default: `config.devices` of `jax.devices()`).
      rules: logical-axis rules (default the learner's, `mesh.DEFAULT_LOGICAL_AXIS_RULES`).
    """

    def __init__(self, state: Any, config: SamplerMeshConfig = SamplerMeshConfig(),
                 devices: Sequence[jax.Device] | None = None,
                 rules: Sequence[tuple[str, Any]] = mesh_lib.DEFAULT_LOGICAL_AXIS_RULES):
        self.config = config
        self.mesh = rollout_mesh(config, devices)
        self.layout = CacheLayout(self.mesh)
        paths, values = _flat_leaves(state)
        specs = {p: v.get_value() for p, v in nnx.to_flat_state(nnx.get_partition_spec(state))}
        self._treedef = jax.tree.structure(state)
        self.dtypes = [_rollout_dtype(p, x, config.param_dtype) for p, x in zip(paths, values)]
        self.shardings = [NamedSharding(self.mesh, mesh_lib.logical_to_mesh_spec(
            tuple(specs.get(p) or ()), x.shape, self.mesh, rules)) for p, x in zip(paths, values)]
        dtypes = self.dtypes
        self._reshard = jax.jit(lambda leaves: [x.astype(d) for x, d in zip(leaves, dtypes)],
                                out_shardings=self.shardings)

    @property
    def data(self) -> int:
        """Devices along the batch axis."""
        return self.layout.data

    def state_shardings(self) -> Any:
        """The rollout weights' `NamedSharding`s, shaped like the model state."""
        return jax.tree.unflatten(self._treedef, self.shardings)

    def bytes_per_device(self, state: Any) -> int:
        """Bytes of the rollout weights on each device (the largest shard of every array, in its rollout dtype)."""
        total = 0
        for x, d, sh in zip(jax.tree.leaves(state), self.dtypes, self.shardings):
            total += math.prod(sh.shard_shape(tuple(x.shape))) * jnp.dtype(d).itemsize
        return total

    def reshard(self, state: Any) -> Any:
        """`state` as rollout weights: cast to the rollout dtypes and placed with the rollout shardings.

        `state` has the model's structure and any placement (the learner's fsdp shards, one device, host arrays). One
        jitted program casts and places it, on device when the input is (module docstring). Arrays on the same devices
        in another order (a learner mesh laid out differently) cannot enter that program; they are cast where they are
        and moved by `jax.device_put`, which the CPU backend routes through the host. Build the sampler on the learner's
        device order (`devices`) to stay on device. Raises ValueError on another structure."""
        leaves = jax.tree.leaves(state)
        if jax.tree.structure(state) != self._treedef:
            raise ValueError("SamplerPlacement.reshard: the state's structure differs from the sampler model's")
        try:
            out = self._reshard(leaves)
        except ValueError as exc:  # arrays on another device order than the rollout mesh's: jit cannot span both
            if "incompatible devices" not in str(exc):
                raise
            out = [jax.device_put(x.astype(d), sh) for x, d, sh in zip(leaves, self.dtypes, self.shardings)]
        return jax.tree.unflatten(self._treedef, out)


GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class SamplerMemoryPlan:
    """What the sampler holds on each device of its mesh (bytes), and how many full-length rollouts fit there.

    Attributes:
      devices, data, tensor: the rollout mesh (devices = data × tensor).
      weights: rollout weights per device.
      per_rollout: decode cache of one row of `max_len` tokens on its device (attention K/V, DeltaNet conv and
        recurrent state; split over `tensor` where the heads divide).
      rows_per_device: the rows the engine runs at once on each data group (slots / data).
      max_len: tokens per row (the run's context).
      budget: bytes the sampler may use per device (free memory beside the learner), None when unknown (CPU).
    """

    devices: int
    data: int
    tensor: int
    weights: int
    per_rollout: int
    rows_per_device: int
    max_len: int
    budget: int | None

    @property
    def rollouts_fit(self) -> int | None:
        """Full-length rows one device holds beside the weights (None without a budget)."""
        if self.budget is None:
            return None
        return max(0, self.budget - self.weights) // max(self.per_rollout, 1)

    def describe(self) -> str:
        g = lambda b: f"{b / GiB:.2f} GiB"  # noqa: E731
        fit = ("budget unknown" if self.budget is None else
               f"budget {g(self.budget)}: {self.rollouts_fit} fit at once")
        return (f"JAX sampler on {self.devices} devices (data {self.data} x tensor {self.tensor}), per device: weights "
                f"{g(self.weights)} + {self.rows_per_device} rows x {self.per_rollout / (1 << 20):.1f} MiB "
                f"(one {self.max_len:,}-token rollout) = {g(self.weights + self.rows_per_device * self.per_rollout)}; "
                f"{fit}")


def plan_memory(placement: SamplerPlacement, state: Any, cache: Any, rows: int, budget: int | None
                ) -> SamplerMemoryPlan:
    """The plan of a sampler (`placement`, its model `state`) running `rows` rows at once over the data devices.

    Args:
      cache: the `DecodeCache` (or its `jax.eval_shape`) of `placement.data` rows × the full context, one row per
        data group (`JaxSampler.cache_template(data, max_len)`).
      budget: bytes per device the sampler may use (None: unknown).
    """
    layout = placement.layout
    shardings = jax.tree.leaves(layout.cache_shardings(cache))
    per_row = sum(math.prod(sh.shard_shape(tuple(x.shape))) * jnp.dtype(x.dtype).itemsize
                  for x, sh in zip(jax.tree.leaves(cache), shardings) if x.ndim >= 2)
    return SamplerMemoryPlan(devices=placement.mesh.size, data=placement.data, tensor=placement.mesh.shape["tensor"],
                             weights=placement.bytes_per_device(state), per_rollout=per_row,
                             rows_per_device=-(-rows // placement.data), max_len=cache.slot_mask.shape[1],
                             budget=budget)


def check_memory(plan: SamplerMemoryPlan) -> SamplerMemoryPlan:
    """Refuses a sampler that cannot hold one full-length rollout per device beside its weights.

    Raises ValueError naming the numbers; returns the plan."""
    if plan.budget is not None and plan.rollouts_fit < 1:
        raise ValueError("JAX sampler: not one full-length rollout fits per device; shorten max_context_tokens, "
                         "raise SamplerMeshConfig.tensor (split the weights) or use bf16 rollout weights. "
                         + plan.describe())
    return plan


def free_device_bytes(device: jax.Device) -> int | None:
    """Bytes free on `device` by its allocator's statistics (limit − in use), None where it keeps none (CPU)."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
