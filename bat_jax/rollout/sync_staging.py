"""The layout of a weight sync through one fixed staging buffer: which tensor bytes travel in which bucket, where.

No JAX here: the replica processes (`bat_jax.rollout.vllm_replica_worker`) import this module to read a
bucket, and they never import JAX.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

ALIGN = 256
"""Byte alignment of every piece in the staging buffer (a float32 / bfloat16 view needs its offset aligned)."""

ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}

_LAYER = re.compile(r"^(.*?layers\.\d+)\.")


@dataclasses.dataclass(frozen=True)
class Piece:
    """One tensor, or rows of one, in a bucket of the staging buffer.

    Attributes:
      name: the Hugging Face tensor name.
      dtype: transfer dtype (float32 / bfloat16 / float16).
      shape: the piece's own shape (a row chunk: ``(rows, *tensor.shape[1:])``).
      offset: byte offset in the staging buffer (a multiple of `ALIGN`).
      row0: None for a whole tensor; else the chunk's first row in the tensor.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    row0: int | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE[self.dtype]


@dataclasses.dataclass(frozen=True)
class SyncPlan:
    """The buckets of one sync and the bytes they need.

    Attributes:
      buckets: per bucket its pieces (every whole-tensor bucket comes before the first row-chunk bucket).
      staging_bytes: bytes of the staging buffer: the largest bucket, padding included (≤ the bound).
      largest_layer_bytes: bytes of the largest decoder layer (or other module group) that travels whole: vLLM's
        layer-wise reload builds a fresh copy of one module of it at a time, so this bounds that copy.
      chunked: names of the tensors that travel in row chunks.
    """

    buckets: list[list[Piece]]
    staging_bytes: int
    largest_layer_bytes: int
    chunked: tuple[str, ...]

    @property
    def tensors(self) -> int:
        """Distinct tensors the plan carries."""
        return len({p.name for b in self.buckets for p in b})


def layer_of(name: str) -> str:
    """The module group a tensor belongs to.

    ``model.layers.3`` for ``model.layers.3.mlp.up_proj.weight``, else the name without its last component
    (``model.embed_tokens`` for ``model.embed_tokens.weight``)."""
    m = _LAYER.match(name)
    return m.group(1) if m else name.rpartition(".")[0]


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def plan_sync(specs: Sequence[tuple[str, Sequence[int], str]], max_bytes: int) -> SyncPlan:
    """Buckets of at most `max_bytes` for ``(name, shape, transfer dtype)`` triples (module docstring).

    Raises: ValueError when `max_bytes` < `ALIGN`, a dtype is not float32 / bfloat16 / float16, or one row of a tensor
    is larger than `max_bytes` (naming the tensor and both sizes).
    """
    if max_bytes < ALIGN:
        raise ValueError(f"plan_sync: the bucket bound must be at least {ALIGN} bytes, got {max_bytes}")
    whole: list[list[tuple[str, tuple[int, ...], str]]] = []  # layer groups, in order
    big: list[tuple[str, tuple[int, ...], str]] = []
    for name, shape, dtype in specs:
        if dtype not in ITEMSIZE:
            raise ValueError(f"plan_sync: tensor {name!r} has transfer dtype {dtype!r}, not one of {sorted(ITEMSIZE)}")
        shape = tuple(int(s) for s in shape)
        if math.prod(shape) * ITEMSIZE[dtype] > max_bytes:
            big.append((name, shape, dtype))
        elif whole and layer_of(whole[-1][-1][0]) == layer_of(name):
            whole[-1].append((name, shape, dtype))
        else:
            whole.append([(name, shape, dtype)])

    buckets: list[list[Piece]] = []
    current: list[Piece] = []
    end = 0

    def add(name, shape, dtype, row0=None):
        nonlocal current, end
        size = math.prod(shape) * ITEMSIZE[dtype]
        offset = _aligned(end)
        if current and offset + size > max_bytes:
            buckets.append(current)
            current, offset = [], 0
        current.append(Piece(name, dtype, shape, offset, row0))
        end = offset + size

    largest = 0
    for group in whole:
        size = sum(_aligned(math.prod(s) * ITEMSIZE[d]) for _, s, d in group)
        largest = max(largest, sum(math.prod(s) * ITEMSIZE[d] for _, s, d in group))
        if current and _aligned(end) + size > max_bytes:  # keep the layer in one bucket when it fits in one
            buckets.append(current)
            current, end = [], 0
        for item in group:
            add(*item)
    if current:
        buckets.append(current)
    for name, shape, dtype in big:
        row = math.prod(shape[1:]) * ITEMSIZE[dtype]
        if row > max_bytes:
            raise ValueError(f"plan_sync: one row of tensor {name!r} {shape} is {row} bytes, more than the bucket "
                             f"bound of {max_bytes} bytes; raise the bound (sync_bucket_bytes)")
        per = max_bytes // row
        for r in range(0, shape[0], per):
            rows = min(per, shape[0] - r)
            buckets.append([Piece(name, dtype, (rows, *shape[1:]), 0, r)])
    staging = max((p.offset + p.nbytes for b in buckets for p in b), default=0)
    return SyncPlan(buckets=buckets, staging_bytes=staging, largest_layer_bytes=largest,
                    chunked=tuple(name for name, _, _ in big))


def bucket_views(buffer, pieces: Sequence[Piece]) -> list[tuple[Piece, object]]:
    """(replica and parent side) Each piece as a torch tensor view into `buffer`: no copy.

    `buffer` is the staging buffer, a 1-D uint8 torch tensor."""
    import torch

    return [(p, buffer[p.offset:p.offset + p.nbytes].view(getattr(torch, p.dtype)).view(p.shape)) for p in pieces]


class TorchAllocationPeak:
    """Context: the peak of torch's CPU allocator above its level at entry, in bytes (`peak`).

    It counts allocations made on the entering thread (the profiler's memory events, ``total_allocated``; device
    allocations are not counted). Used to measure what a sync holds on a CPU machine (tests/test_vllm_memory_sync.py).
    """

    def __enter__(self) -> "TorchAllocationPeak":
        from torch.profiler import ProfilerActivity, profile

        self.peak: int | None = None
        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        from torch._C._profiler import _EventType

        self._prof.__exit__(*exc)
        peak, stack = 0, list(self._prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            event = stack.pop()
            if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
                peak = max(peak, int(event.extra_fields.total_allocated))
            stack.extend(event.children)
        self.peak = peak


class TorchCuda:
    """The CUDA calls of a sync through CUDA IPC staging buffers (torch's; a test passes a double with these methods)."""

    def buffer(self, nbytes: int, ordinal: int):
        """(parent) A 1-D uint8 tensor of `nbytes` on ``cuda:<ordinal>``."""
        import torch

        return torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{ordinal}")

    def export(self, buffer):
        """(parent) The CUDA IPC handle of `buffer` a replica opens (`open`)."""
        from torch.multiprocessing.reductions import reduce_tensor

        return reduce_tensor(buffer)

    def open(self, handle):
        """(replica) The parent's buffer from its handle, on this process's one visible GPU."""
        import torch

        rebuild, args = handle  # the handle names the parent's device ordinal; this process sees one GPU
        args = list(args)
        args[6] = torch.cuda.current_device()
        return rebuild(*args)

    def synchronize(self, ordinal: int | None = None) -> None:
        """Waits for every stream of device `ordinal` (None: the current device)."""
        import torch

        torch.cuda.synchronize(ordinal)

    def release(self, ordinals=(None,)) -> None:
        """Synchronises `ordinals`, then frees the IPC cache and the allocator's cached blocks."""
        import torch

        for ordinal in ordinals:
            torch.cuda.synchronize(ordinal)
        torch.cuda.ipc_collect()
        torch.cuda.empty_cache()


class StagingBuffers:
    """(parent side) Context: the staging buffers of one sync of `nbytes`.

    On GPUs one torch CUDA tensor per replica device (`gpus`: a `gpus.Gpu` per replica), exported once by CUDA IPC; on
    CPU one shared-memory segment for every replica. `payloads[i]` is what replica i opens; `fill` writes one bucket
    into every buffer. On exit the buffers are freed (CUDA: ``ipc_collect`` + ``empty_cache``; CPU: the segment
    unlinked). `cuda`: the CUDA calls (default `TorchCuda`)."""

    def __init__(self, nbytes: int, gpus: Sequence[Any] | None, num_replicas: int, *, cuda: Any = None):
        self.nbytes, self.gpus, self.num_replicas = max(1, int(nbytes)), gpus, num_replicas
        self.cuda = cuda if cuda is not None else TorchCuda()
        self.buffers: list[Any] = []  # per replica (GPU) or one (CPU)
        self.payloads: dict[int, Any] = {}
        self._shm = None

    def __enter__(self) -> "StagingBuffers":
        try:
            if self.gpus is not None:
                for i, gpu in enumerate(self.gpus):
                    buffer = self.cuda.buffer(self.nbytes, gpu.ordinal)
                    self.buffers.append(buffer)
                    self.payloads[i] = ("cuda", self.cuda.export(buffer))
            else:
                import torch
                from multiprocessing import shared_memory

                self._shm = shared_memory.SharedMemory(create=True, size=self.nbytes)
                self.buffers.append(torch.frombuffer(self._shm.buf, dtype=torch.uint8))
                self.payloads = {i: ("shm", self._shm.name) for i in range(self.num_replicas)}
        except BaseException:
            self.__exit__()
            raise
        return self

    def fill(self, pieces, values, to_tensor) -> None:
        """Writes one bucket into every staging buffer, each from the copy on its own device.

        The bucket is `weight_sync.stream_pieces`' pieces and values. ``to_tensor(value, device ordinal or None,
        dtype)`` gives that copy as a torch tensor (the caller's: it knows JAX arrays). On GPUs it returns after
        every device it copied to is synchronised, so the replicas may read."""
        for i, buffer in enumerate(self.buffers):
            ordinal = None if self.gpus is None else self.gpus[i].ordinal
            for (piece, view), value in zip(bucket_views(buffer, pieces), values):
                view.copy_(to_tensor(value, ordinal, piece.dtype).reshape(piece.shape))
        for ordinal in self._ordinals():
            self.cuda.synchronize(ordinal)

    def _ordinals(self) -> list[int]:
        """The distinct CUDA ordinals of the buffers ([] on CPU)."""
        return [] if self.gpus is None else list(dict.fromkeys(g.ordinal for g in self.gpus))

    def __exit__(self, *exc) -> None:
        self.buffers.clear()
        self.payloads.clear()
        if self._shm is not None:
            self._shm.close()
            self._shm.unlink()
            self._shm = None
        if self.gpus is not None:
            self.cuda.release(self._ordinals())
