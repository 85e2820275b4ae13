"""The vLLM replica process: ``python -m bat_jax.rollout.vllm_replica_worker <socket fd> <index>``.

Details: docs/design.md.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import sys
import threading
from typing import Any

_ABORT = "abort"


def open_staging(staging: tuple, cuda: Any = None) -> tuple[Any, Any]:
    """The parent's staging buffer in this process: ``(1-D uint8 torch tensor, handle to close or None)``.

    `cuda`: the CUDA calls (default `sync_staging.TorchCuda`)."""
    import torch

    kind, body = staging
    if kind == "shm":
        from multiprocessing import shared_memory

        shm = shared_memory.SharedMemory(name=body)
        return torch.frombuffer(shm.buf, dtype=torch.uint8), shm
    from bat_jax.rollout.sync_staging import TorchCuda

    return (cuda or TorchCuda()).open(body), None


def close_staging(handle: Any, cuda: Any = None) -> None:
    """Unmaps the staging tensor after the last reference to it is gone.

    CPU: closes the shared-memory segment; CUDA (`cuda`, default `sync_staging.TorchCuda` where CUDA is available):
    frees the IPC cache and the allocator's cached blocks."""
    import torch

    if handle is not None:
        handle.close()
    if cuda is None and torch.cuda.is_available():
        from bat_jax.rollout.sync_staging import TorchCuda

        cuda = TorchCuda()
    if cuda is not None:
        cuda.release()


def clone_pending(lo: int, hi: int) -> int | None:
    """Clones every tensor vLLM's layer-wise reload still holds whose memory lies in the staging buffer.

    The buffer is ``[lo, hi)``. Returns the bytes cloned, or None when this vLLM has no layer-wise reload state to
    inspect."""
    import torch

    try:
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    except ImportError:
        return None
    cloned = 0
    for info in list(LAYERWISE_INFO.values()):
        for _, bound in getattr(info, "loaded_weights", None) or ():
            for key, value in list(bound.arguments.items()):
                if isinstance(value, torch.Tensor) and value.numel() and lo <= value.data_ptr() < hi:
                    bound.arguments[key] = value.clone()
                    cloned += value.numel() * value.element_size()
    return cloned


class _Sync:
    """One sync on this replica: its staging buffer, its bucket queue, its counters.

    `cuda`: the CUDA calls (default `sync_staging.TorchCuda` for a CUDA IPC buffer; none for shared memory)."""

    def __init__(self, info: dict, send, cuda: Any = None):
        if cuda is None and info["staging"][0] == "cuda":
            from bat_jax.rollout.sync_staging import TorchCuda

            cuda = TorchCuda()
        self.cuda = cuda
        self.buffer, self.handle = open_staging(info["staging"], cuda)
        self.whole, self.chunk_buckets = int(info["whole"]), int(info["chunk_buckets"])
        self.measure = bool(info.get("measure"))
        self.queue: queue.Queue = queue.Queue()
        self.send = send
        self.cloned = 0
        lo = self.buffer.data_ptr()
        self.span = (lo, lo + self.buffer.numel())

    def _next(self):
        item = self.queue.get()
        if item == _ABORT:
            raise RuntimeError("the pool abandoned this weight sync")
        return item

    def weights(self):
        """(name, view) pairs for vLLM's loader; each bucket acknowledged once vLLM has taken all of it."""
        from bat_jax.rollout.sync_staging import bucket_views

        left = self.whole
        while left:
            call_id, pieces = self._next()
            for piece, view in bucket_views(self.buffer, pieces):
                yield piece.name, view
            del view
            cloned = clone_pending(*self.span)
            if cloned is None:
                raise RuntimeError("this vLLM has no layer-wise reload state (vllm.model_executor.model_loader."
                                   "reload.layerwise.LAYERWISE_INFO) to keep the staging buffer safe")
            self.cloned += cloned
            left -= len(pieces)
            self._settle()
            self.send("ok", call_id, None)

    def rows(self):
        """(name, first row, view) blocks for `vllm_engine.write_rows`, each bucket acknowledged after its write."""
        from bat_jax.rollout.sync_staging import bucket_views

        for _ in range(self.chunk_buckets):
            call_id, pieces = self._next()
            for piece, view in bucket_views(self.buffer, pieces):
                yield piece.name, piece.row0, view
            del view
            self._settle()
            self.send("ok", call_id, None)

    def _settle(self) -> None:
        """Waits until this device's streams have finished reading the bucket (CUDA copies only queue)."""
        if self.cuda is not None:
            self.cuda.synchronize()

    def run(self, engine) -> dict:
        peak = None
        try:
            if self.measure:
                from bat_jax.rollout.sync_staging import TorchAllocationPeak

                with TorchAllocationPeak() as measured:
                    version = engine.install_weights(self.weights(), self.rows())
                peak = measured.peak
            else:
                version = engine.install_weights(self.weights(), self.rows())
        finally:
            self.buffer = None
            close_staging(self.handle, self.cuda)
        return {"version": version, "cloned_bytes": self.cloned, "torch_peak_bytes": peak}


def serve(conn, index: int, *, make_engine: Any = None, cuda: Any = None) -> None:
    """Starts the engine from the first message, then serves messages until "close" or a closed socket.

    `make_engine(config fields)` (default: a `VLLMEngine`) and `cuda` (`_Sync`'s) let a test serve a double in a
    thread."""
    send_lock = threading.Lock()

    def send(*msg):
        with send_lock:
            conn.send(msg)

    try:
        kind, fields = conn.recv()
        if make_engine is None:
            from bat_jax.rollout.vllm_engine import VLLMEngine, VLLMEngineConfig

            engine = VLLMEngine(VLLMEngineConfig(**fields))
        else:
            engine = make_engine(fields)
    except BaseException as exc:  # noqa: BLE001 — the parent reports it with the replica's index
        send("error", "start", type(exc).__name__, str(exc))
        return
    send("ok", "start", {"pid": os.getpid(), "jax_imported": "jax" in sys.modules,
                         "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
    calls = concurrent.futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix=f"replica{index}")
    syncs: dict[str, _Sync] = {}

    def reply(call_id, fn, *args):
        try:
            send("ok", call_id, fn(*args))
        except BaseException as exc:  # noqa: BLE001
            send("error", call_id, type(exc).__name__, str(exc))

    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        op, call_id = msg[0], msg[1]
        if op == "generate":
            calls.submit(reply, call_id, lambda a: engine.generate(a[0], a[1], max_new_tokens=a[2], seeds=a[3]),
                         msg[2])
        elif op == "score":
            calls.submit(reply, call_id, engine.score, *msg[2])
        elif op == "adapter":  # (path, version): the pool holds no call in flight meanwhile
            calls.submit(reply, call_id, engine.load_adapter, msg[2], msg[3])
        elif op == "sync":
            try:
                syncs[call_id] = _Sync(msg[2], send, cuda)
            except BaseException as exc:  # noqa: BLE001
                send("error", call_id, type(exc).__name__, f"cannot open the staging buffer: {exc}")
                continue
            def run_sync(call_id=call_id, sync=syncs[call_id]):
                try:
                    reply(call_id, sync.run, engine)
                finally:
                    syncs.pop(call_id, None)

            threading.Thread(target=run_sync, daemon=True).start()
        elif op == "bucket":
            sync = syncs.get(msg[2])
            if sync is None:
                send("error", call_id, "RuntimeError", f"no sync {msg[2]} is running")
            else:
                sync.queue.put((call_id, msg[3]))
        elif op == "abort":
            if call_id in syncs:
                syncs.pop(call_id).queue.put(_ABORT)
        elif op == "close":
            break
    calls.shutdown(wait=False, cancel_futures=True)
    engine.close()


def main(argv: list[str] | None = None) -> None:
    from multiprocessing.connection import Connection

    fd, index = (argv or sys.argv[1:])[:2]
    conn = Connection(int(fd))
    try:
        serve(conn, int(index))
    finally:
        conn.close()


if __name__ == "__main__":
    main()
