"""Weight sync from the JAX learner to a rollout engine.

The tensors go by Hugging Face name, checked against the engine's checkpoint, cast and all-gathered on the learner's
mesh in buckets of at most 1 GB, and handed over by DLPack.

Details: docs/design.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from bat_jax.models.hf_io import byte_buckets

_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def flat_named_arrays(params: Any) -> Iterator[tuple[str, Any]]:
    """(HF name, array) pairs of an ``nnx.Module``, an ``nnx.State`` or a ``{name: array}`` mapping."""
    from flax import nnx

    if isinstance(params, nnx.Module):
        params = nnx.state(params, nnx.Param)
    if isinstance(params, nnx.State):
        for path, var in nnx.to_flat_state(params):
            value = var.get_value() if hasattr(var, "get_value") else var
            yield ".".join(map(str, path)), value
        return
    if isinstance(params, Mapping):
        yield from params.items()
        return
    raise TypeError(f"update_weights: params must be an nnx.Module, nnx.State or a mapping of HF names to "
                    f"arrays, got {type(params).__name__}")


def to_torch(x: Any, dtype: str):
    """One tensor as a torch tensor of `dtype` (a torch dtype name), without a host copy where possible.

    jax.Array: zero-copy through DLPack (a sharded array is first gathered onto its first device, on the
    device); numpy arrays: `torch.from_numpy` (bfloat16 ones by their bits); torch tensors pass through. The cast copies only if the dtype
    differs.
    """
    import jax
    import torch

    if isinstance(x, jax.Array):
        if len(x.sharding.device_set) > 1:
            x = jax.device_put(x, sorted(x.sharding.device_set, key=lambda d: d.id)[0])
        t = torch.from_dlpack(x)
    elif isinstance(x, torch.Tensor):
        t = x
    else:
        x = np.ascontiguousarray(np.asarray(x))
        if x.dtype.name == "bfloat16":  # ml_dtypes' bfloat16, which torch.from_numpy does not know: same bits
            t = torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(x)
    return t.to(getattr(torch, dtype))


SYNC_BUCKET_BYTES = 1 << 30
"""Largest bucket of tensors (bytes, in the transfer dtype) gathered onto one device at a time by weight sync."""


def sync_dtype(name: str, dtype: str) -> str:
    """Transfer dtype of one tensor.

    It is ``dtype``, except the Gated DeltaNet tensors kept float32 (``gated_deltanet.FLOAT32_PARAMS``), which travel as
    float32."""
    from bat_jax.models.gated_deltanet import FLOAT32_PARAMS

    return "float32" if name.endswith(FLOAT32_PARAMS) else dtype


def plan_buckets(named: Sequence[tuple[str, Any, str]], max_bytes: int = SYNC_BUCKET_BYTES) -> list[list[int]]:
    """Consecutive index groups of ``(name, array, dtype)`` whose bytes in ``dtype`` stay ≤ ``max_bytes``.

    A single larger tensor gets a bucket of its own (`models.hf_io.byte_buckets`)."""
    return byte_buckets([int(np.prod(x.shape)) * _ITEMSIZE[dtype] for _, x, dtype in named], max_bytes)


_GATHERS: dict[tuple, Any] = {}
GATHER_BUILDS = [0]
"""How many gather functions :func:`gather_bucket_fn` has built (one per signature; tests read it)."""


def gather_bucket_fn(dtypes: Sequence[str], mesh, rows: Sequence[tuple[int, int] | None] | None = None):
    """A jitted function that casts arrays to their transfer dtype, then all-gathers them.

    Its signature is ``(arrays...) -> arrays``; arrays sharded on ``mesh`` come back replicated on ``mesh``. The cast
    happens before the gather, so devices receive bf16, not fp32, and each holds at most one bucket of gathered copies.
    ``rows[i]`` = ``(r0, r1)`` gathers only those rows of array i (a row chunk of a tensor larger than the bucket
    bound).

    Built once per ``(dtypes, mesh, rows)`` and kept: jit then compiles once per input shape and sharding, so a sync
    compiles each bucket signature once and later syncs compile nothing."""
    import jax
    import jax.numpy as jnp

    rows = tuple(rows) if rows is not None else (None,) * len(dtypes)
    key = (tuple(dtypes), mesh, rows)
    fn = _GATHERS.get(key)
    if fn is None:
        rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

        def gather(*xs):
            return tuple((x if r is None else x[r[0]:r[1]]).astype(jnp.dtype(d)) for x, d, r in zip(xs, dtypes, rows))

        fn = _GATHERS[key] = jax.jit(gather, out_shardings=tuple(rep for _ in dtypes))
        GATHER_BUILDS[0] += 1
    return fn


def _on_mesh(x: Any) -> bool:
    import jax

    return (isinstance(x, jax.Array) and isinstance(x.sharding, jax.sharding.NamedSharding)
            and len(x.sharding.device_set) > 1)


def stream_pieces(named: Mapping[str, Any], plan: Any) -> Iterator[tuple[list[Any], list[Any]]]:
    """The values of a `sync_staging.SyncPlan`, one bucket at a time.

    Per bucket ``(pieces, values)``, value i being piece i (its rows for a row chunk). Mesh-sharded jax arrays are cast
    and all-gathered by :func:`gather_bucket_fn` (every device of the mesh holds a copy); other values are as given
    (sliced to the piece's rows). At most one bucket of gathered copies exists at once when the consumer drops each
    before asking for the next."""
    for pieces in plan.buckets:
        values: list[Any] = [None] * len(pieces)
        by_mesh: dict[Any, list[int]] = {}
        for i, p in enumerate(pieces):
            x = named[p.name]
            if _on_mesh(x):
                by_mesh.setdefault(x.sharding.mesh, []).append(i)
            else:
                values[i] = x if p.row0 is None else x[p.row0:p.row0 + p.shape[0]]
        for mesh, idx in by_mesh.items():
            rows = [None if pieces[i].row0 is None else (pieces[i].row0, pieces[i].row0 + pieces[i].shape[0])
                    for i in idx]
            gathered = gather_bucket_fn([pieces[i].dtype for i in idx], mesh, rows)(*[named[pieces[i].name]
                                                                                       for i in idx])
            for i, g in zip(idx, gathered):
                values[i] = g
            del gathered
        yield pieces, values
        del values


def sync_plan(named: Sequence[tuple[str, Any]], dtype: str, max_bytes: int = SYNC_BUCKET_BYTES):
    """The `sync_staging.SyncPlan` of ``(name, array)`` pairs sent in engine dtype `dtype`.

    DeltaNet float32 tensors go as float32 (:func:`sync_dtype`)."""
    from bat_jax.rollout.sync_staging import plan_sync

    return plan_sync([(n, tuple(x.shape), sync_dtype(n, dtype)) for n, x in named], max_bytes)


def stream_buckets(named: Sequence[tuple[str, Any]], dtype: str, max_bytes: int = SYNC_BUCKET_BYTES
                   ) -> Iterator[list[tuple[str, Any, str]]]:
    """The tensors of a weight sync, one bucket (≤ ``max_bytes`` in the transfer dtype) at a time.

    Per bucket a list of ``(name, value, transfer dtype)``. Mesh-sharded jax arrays come cast and all-gathered by
    :func:`gather_bucket_fn` (replicated: every device of the mesh holds a full copy, so a consumer on any of those
    devices reads its own); other values come as given. A bucket's gathered copies are released when the consumer moves
    on to the next, so at most one bucket of them exists at once."""
    import jax

    items = [(n, x, sync_dtype(n, dtype)) for n, x in named]
    for bucket in plan_buckets(items, max_bytes):
        group = [items[i] for i in bucket]
        on_mesh = [i for i, (_, x, _) in enumerate(group) if isinstance(x, jax.Array)
                   and isinstance(x.sharding, jax.sharding.NamedSharding) and len(x.sharding.device_set) > 1]
        if on_mesh:  # the gather is built once per signature (gather_bucket_fn)
            mesh = group[on_mesh[0]][1].sharding.mesh
            same = [i for i in on_mesh if group[i][1].sharding.mesh == mesh]
            gathered = gather_bucket_fn([group[i][2] for i in same], mesh)(*[group[i][1] for i in same])
            for i, g in zip(same, gathered):
                group[i] = (group[i][0], g, group[i][2])
            del gathered
        yield group
        del group


_CASTS: dict[str, Any] = {}


def host_weights(params: Any, dtype: str) -> dict[str, np.ndarray]:
    """``{HF name: numpy array}`` of `params` on this host, each tensor in its transfer dtype (`sync_dtype`).

    One tensor at a time: a jax array is cast on its own devices (sharding kept), then gathered to the host
    (``process_allgather`` when it spans processes: a collective, every process calls it), so the host receives the
    engine's dtype, never float32 to cast; numpy values are cast on the host. A multi-host run feeds its own engines
    with it (`bicurl.multihost.HostWeights`)."""
    import jax
    from jax.experimental import multihost_utils

    out = {}
    for name, x in flat_named_arrays(params):
        d = sync_dtype(name, dtype)
        if isinstance(x, jax.Array):
            if x.dtype.name != d:
                if d not in _CASTS:
                    _CASTS[d] = jax.jit(lambda a, d=d: a.astype(d))
                x = _CASTS[d](x)
            x = jax.device_get(x) if x.is_fully_addressable else multihost_utils.process_allgather(x, tiled=True)
        arr = np.asarray(x)
        out[name] = arr if arr.dtype.name == d else arr.astype(d)
    return out


def device_copy(x: Any, device_id: int | None = None) -> Any:
    """One device's full copy of a replicated (all-gathered) jax array.

    The device is the one with `local_hardware_id` `device_id` (None: the lowest device id); other values unchanged."""
    import jax

    if not (isinstance(x, jax.Array) and len(x.sharding.device_set) > 1 and x.sharding.is_fully_replicated):
        return x
    shards = x.addressable_shards
    if device_id is None:
        return min(shards, key=lambda sh: sh.device.id).data
    for sh in shards:
        if getattr(sh.device, "local_hardware_id", sh.device.id) == device_id:
            return sh.data
    raise ValueError(f"device_copy: no copy on device {device_id} (devices {sorted(d.id for d in x.devices())})")


def stream_torch_weights(named: Sequence[tuple[str, Any]], dtype: str, max_bytes: int = SYNC_BUCKET_BYTES
                         ) -> Iterator[tuple[str, Any]]:
    """``(name, torch tensor)`` pairs for vLLM, produced one bucket at a time (:func:`stream_buckets`).

    The first device's copy of each gathered array is handed over by DLPack; other arrays go through :func:`to_torch`.
    """
    for group in stream_buckets(named, dtype, max_bytes):
        for name, x, d in group:
            yield name, to_torch(device_copy(x), d)


def named_weights(params: Any, shapes: Mapping[str, tuple[int, ...]], where: str) -> list[tuple[str, Any]]:
    """``(HF name, array)`` pairs of `params`, checked against the checkpoint's tensor `shapes`.

    `params` is an ``nnx.Module``, ``nnx.State`` or ``{name: array}``. `shapes` come from `checkpoint_tensor_shapes`;
    `where` names the checkpoint.

    Raises: ValueError naming missing or unknown tensor names or a shape mismatch; TypeError for another params
    type."""
    named = list(flat_named_arrays(params))
    given = {name for name, _ in named}
    missing, unknown = sorted(shapes.keys() - given), sorted(given - shapes.keys())
    if missing or unknown:
        raise ValueError(f"update_weights: tensor names differ from {where}: "
                         f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                         f"unknown {unknown[:5]}{'...' if len(unknown) > 5 else ''}")
    for name, t in named:
        if tuple(t.shape) != tuple(shapes[name]):
            raise ValueError(f"update_weights: tensor {name!r} has shape {tuple(t.shape)}, {where} has "
                             f"{tuple(shapes[name])}")
    return named
