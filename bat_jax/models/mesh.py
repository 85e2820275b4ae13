"""Device mesh, logical-axis rules and shardings for the learner.

A gin mesh file (gin/mesh/*.gin) binds one :class:`MeshConfig`; everything else in the learner asks this
module for a ``jax.sharding.Mesh`` and for ``NamedSharding`` trees. Swapping hardware means swapping that
one binding:

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

logger = logging.getLogger(__name__)

MESH_AXES: tuple[str, str, str] = ("data", "fsdp", "tensor")
"""Mesh axis names, outermost first."""

BATCH_AXES: tuple[str, str] = ("data", "fsdp")
"""Mesh axes that split the batch dimension of training data."""

# logical name -> mesh axis (or tuple of mesh axes, or None = replicated)
DEFAULT_LOGICAL_AXIS_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", BATCH_AXES),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("layers", None),
    ("norm", None),
    # Gated DeltaNet (Qwen3.5): fused q|k|v channels, value/z-gate channels, per-head a/b/A_log/dt_bias
    ("linear_qkv", "tensor"),
    ("linear_v", "tensor"),
    ("linear_heads", "tensor"),
    ("conv", None),
)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Mesh shape and logical-axis rules (bound by a gin mesh file).

    Attributes:
      data: size of the pure data-parallel axis (replicated parameters).
      fsdp: size of the fully-sharded data-parallel axis (batch and parameters split).
      tensor: size of the tensor-parallel axis (heads / mlp / vocab split).
      logical_axis_rules: pairs (logical axis name, mesh axis | tuple of mesh axes | None).
    At most one of ``data``, ``fsdp``, ``tensor`` may be -1, meaning "all remaining devices".
    """

    data: int = 1
    fsdp: int = -1
    tensor: int = 1
    logical_axis_rules: tuple[tuple[str, Any], ...] = DEFAULT_LOGICAL_AXIS_RULES

    def axis_sizes(self, num_devices: int) -> tuple[int, int, int]:
        """Resolve -1 against ``num_devices``; returns (data, fsdp, tensor).

        Raises:
          ValueError: more than one -1, a size < 1, or a product that does not equal ``num_devices``.
        """
        sizes = [self.data, self.fsdp, self.tensor]
        fills = [i for i, s in enumerate(sizes) if s == -1]
        if len(fills) > 1:
            raise ValueError(f"MeshConfig: at most one axis may be -1, got {dict(zip(MESH_AXES, sizes))}")
        for name, s in zip(MESH_AXES, sizes):
            if s != -1 and s < 1:
                raise ValueError(f"MeshConfig.{name} must be >= 1 or -1, got {s}")
        if fills:
            known = math.prod(s for s in sizes if s != -1)
            if num_devices % known:
                raise ValueError(
                    f"MeshConfig {dict(zip(MESH_AXES, sizes))}: {num_devices} devices do not divide by {known}"
                )
            sizes[fills[0]] = num_devices // known
        if math.prod(sizes) != num_devices:
            raise ValueError(
                f"MeshConfig {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices, "
                f"{num_devices} available"
            )
        return tuple(sizes)  # type: ignore[return-value]


def build_mesh(config: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """Build the (data, fsdp, tensor) mesh with ``AxisType.Auto`` axes.

    Args:
      config: the mesh shape.
      devices: devices to use; default all of ``jax.devices()`` (laid out by ``jax.make_mesh`` for the
        physical topology). Pass e.g. ``jax.devices()[:1]`` for a one-device reference run.
    Raises:
      ValueError: the config does not fit the number of devices.
    """
    devs = list(jax.devices() if devices is None else devices)
    shape = config.axis_sizes(len(devs))
    axis_types = (AxisType.Auto,) * len(MESH_AXES)
    if devices is None:
        return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types)
    return Mesh(np.asarray(devs, dtype=object).reshape(shape), MESH_AXES, axis_types=axis_types)


def logical_to_mesh_spec(
    logical_axes: Sequence[str | None] | None,
    shape: Sequence[int],
    mesh: Mesh,
    rules: Sequence[tuple[str, Any]] = DEFAULT_LOGICAL_AXIS_RULES,
) -> PartitionSpec:
    """Map one array's logical axis names to a mesh ``PartitionSpec``.

    Args:
      logical_axes: one logical name (or None) per array dimension; None or () means replicated.
      shape: the array's shape (used for the divisibility check).
      mesh: target mesh.
      rules: (logical name, mesh axes) pairs; unknown names map to replicated.
    Returns:
      A PartitionSpec of length ``len(shape)``. A dimension stays unsharded when its size does not divide
      by the product of its mesh axes, or when one of those mesh axes is already used in this spec.
    Raises:
      ValueError: ``logical_axes`` has a different length than ``shape``.
    """
    if not logical_axes:
        return PartitionSpec(*([None] * len(shape)))
    if len(logical_axes) != len(shape):
        raise ValueError(f"logical axes {tuple(logical_axes)} do not match array shape {tuple(shape)}")
    table: Mapping[str, Any] = dict(rules)
    used: set[str] = set()
    out: list[Any] = []
    for name, size in zip(logical_axes, shape):
        target = table.get(name) if name is not None else None
        axes = () if target is None else ((target,) if isinstance(target, str) else tuple(target))
        axes = tuple(a for a in axes if mesh.shape[a] > 1)
        n = math.prod(mesh.shape[a] for a in axes) if axes else 1
        if not axes or used.intersection(axes) or size % n:
            if axes and size % n:
                logger.debug("logical axis %s of size %d not divisible by %s; replicated", name, size, axes)
            out.append(None)
            continue
        used.update(axes)
        out.append(axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*out)


def _is_spec(x: Any) -> bool:
    return isinstance(x, PartitionSpec)


def param_shardings(
    params: Any,
    logical_specs: Any,
    mesh: Mesh,
    rules: Sequence[tuple[str, Any]] = DEFAULT_LOGICAL_AXIS_RULES,
) -> Any:
    """NamedSharding tree for ``params`` from a same-structure tree of logical PartitionSpecs.

    Args:
      params: pytree of arrays or ``jax.ShapeDtypeStruct`` (e.g. a pure dict from ``nnx.to_pure_dict``).
      logical_specs: same structure, leaves ``PartitionSpec`` of logical names
        (``nnx.to_pure_dict(nnx.get_partition_spec(state))`` gives it for an nnx model).
    """
    return jax.tree.map(
        lambda p, s: NamedSharding(mesh, logical_to_mesh_spec(tuple(s), p.shape, mesh, rules)),
        params,
        logical_specs,
        is_leaf=_is_spec,
    )


def sharding_fn(mesh: Mesh, rules: Sequence[tuple[str, Any]] = DEFAULT_LOGICAL_AXIS_RULES):
    """``(logical names, shape) -> NamedSharding``: one parameter placed as `param_shardings` places it.

    The form of ``hf_io.load_pretrained``'s ``sharding_fn``, so a checkpoint loads straight into the learner's
    shardings."""
    return lambda names, shape: NamedSharding(mesh, logical_to_mesh_spec(tuple(names), tuple(shape), mesh, rules))


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding for a batch-leading array: dim 0 split over (data, fsdp), the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated sharding on ``mesh``."""
    return NamedSharding(mesh, PartitionSpec())
