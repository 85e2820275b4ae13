"""vLLM data-parallel replicas: one engine process per device beside the learner's shard, weights pushed to all.

`VLLMReplicaPool` is a `RolloutEngine` over `num_replicas` vLLM engines, each a `VLLMEngine` (in-process vLLM,
tensor parallel 1) in its own spawned process, pinned to its device: ``CUDA_VISIBLE_DEVICES`` = its GPU (replica i
on GPU i by default, beside the learner's fsdp shard there), or on CPU its share of this process's cores
(``VLLM_CPU_OMP_THREADS_BIND``). The parent talks to each over a pipe; every replica serves many calls at once
through its own in-flight driver (`bat_jax.rollout.inflight`).

Routing (`bat_jax.rollout.replica_router`): each row goes to one replica; a turn that continues an episode goes to
the replica that served the episode so far (its prefix cache holds the conversation), a new episode to the replica
with the fewest live tokens. A row's tokens depend only on its prompt, seed and the weights, so the replica count
does not change what is sampled (tests/test_vllm_replicas.py).

Weight sync (`update_weights`): refused while any call is in flight on the pool (as `VLLMEngine` refuses); calls
made during a sync wait for it. The learner's tensors are checked by name and shape, then streamed one bucket
(≤ 1 GB in the engine dtype) at a time by `weight_sync.stream_buckets` — cast and all-gathered on the learner's
mesh, so every device holds the bucket — and every replica loads each bucket before the next is made:

* GPU: replica i reads the copy on its own device: the parent copies it into a torch CUDA tensor on that device
  (device to device; XLA's allocations cannot be exported) and sends a CUDA IPC handle
  (``torch.multiprocessing.reductions.reduce_tensor``); the replica opens it on its one visible device, copies it
  into its own memory and acknowledges; the parent then drops the bucket. No host round trip. **Not run here**
  (no GPU on the development machines); written to be checked by `launch/gpu_smoke.sh`.
* CPU: the bucket is written once into a POSIX shared-memory segment that every replica maps and copies from.

A replica that fails during a sync — an error, or its process gone — fails `update_weights` with its index named;
the other replicas are told to abandon the sync (their loads stop midway), so the pool is marked inconsistent and
refuses `generate` / `score` (naming the replica) until a later sync succeeds on every replica: never a silently
stale replica.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import multiprocessing
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from bat_jax.rollout.engine import Completion, SamplingParams
from bat_jax.rollout.replica_router import ReplicaRouter
from bat_jax.rollout.vllm_engine import VLLMEngineConfig, check_request, checkpoint_tensor_shapes, write_checkpoint
from bat_jax.rollout.weight_sync import SYNC_BUCKET_BYTES, device_copy, named_weights, stream_buckets, to_torch

_ABORT = "abort"


def replica_env(index: int, num_replicas: int, gpus: Sequence[int] | None) -> dict[str, str]:
    """Environment of replica `index`: with `gpus`, ``CUDA_VISIBLE_DEVICES`` = its GPU; without (CPU), an equal
    share of this process's cores for vLLM's OpenMP threads (all of them when there are fewer cores than
    replicas). JAX, which the replica imports but never uses, is kept off the accelerator (``JAX_PLATFORMS=cpu``:
    it would otherwise preallocate most of the GPU if anything initialised it)."""
    if gpus is not None:
        return {"CUDA_VISIBLE_DEVICES": str(gpus[index]), "JAX_PLATFORMS": "cpu"}
    cores = sorted(os.sched_getaffinity(0))
    per = len(cores) // num_replicas
    mine = cores[index * per:(index + 1) * per] if per else cores
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, mine)), "JAX_PLATFORMS": "cpu"}


def _open_bucket(payload) -> list[tuple[str, Any]]:
    """(replica side) A bucket's tensors copied into this process: from shared memory or CUDA IPC handles."""
    import torch

    kind, body = payload
    if kind == "shm":
        from multiprocessing import shared_memory

        name, metas = body
        shm = shared_memory.SharedMemory(name=name)
        try:
            out = []
            for tensor_name, dtype, shape, offset in metas:
                count = int(np.prod(shape))
                view = torch.frombuffer(shm.buf, dtype=getattr(torch, dtype), count=count, offset=offset)
                out.append((tensor_name, view.reshape(shape).clone()))
                del view
        finally:
            shm.close()
        return out
    out = []
    for tensor_name, (rebuild, args) in body:  # CUDA IPC: the handle names the parent's device index
        args = list(args)
        args[6] = torch.cuda.current_device()  # storage_device: this replica sees only its own GPU
        out.append((tensor_name, rebuild(*args).clone()))
    torch.cuda.synchronize()
    return out


def _replica_main(index: int, config: VLLMEngineConfig, conn, env: dict[str, str]) -> None:
    """(replica process) Starts the engine, then serves messages until "close" or a closed pipe."""
    import queue

    os.environ.update(env)
    send_lock = threading.Lock()

    def send(*msg):
        with send_lock:
            conn.send(msg)

    try:
        from bat_jax.rollout.vllm_engine import VLLMEngine

        engine = VLLMEngine(config)
    except BaseException as exc:  # noqa: BLE001 — the parent reports it with the replica's index
        send("error", "start", type(exc).__name__, str(exc))
        return
    send("ok", "start", os.getpid())
    calls = concurrent.futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix=f"replica{index}")
    syncs: dict[str, queue.Queue] = {}

    def serve(call_id, fn, *args):
        try:
            send("ok", call_id, fn(*args))
        except BaseException as exc:  # noqa: BLE001
            send("error", call_id, type(exc).__name__, str(exc))

    def sync(call_id, count, q):
        def weights():
            left = count
            while left:
                item = q.get()
                if item == _ABORT:
                    raise RuntimeError("the pool abandoned this weight sync")
                for pair in item:
                    yield pair
                    left -= 1

        serve(call_id, engine.install_weights, weights())

    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        op, call_id = msg[0], msg[1]
        if op == "generate":
            calls.submit(serve, call_id, lambda a: engine.generate(a[0], a[1], max_new_tokens=a[2], seeds=a[3]),
                         msg[2])
        elif op == "score":
            calls.submit(serve, call_id, engine.score, *msg[2])
        elif op == "sync":
            syncs[call_id] = queue.Queue()
            threading.Thread(target=sync, args=(call_id, msg[2], syncs[call_id]), daemon=True).start()
        elif op == "bucket":
            try:
                tensors = _open_bucket(msg[3])
            except BaseException as exc:  # noqa: BLE001
                syncs[msg[2]].put(_ABORT)
                send("error", call_id, type(exc).__name__, str(exc))
                continue
            syncs[msg[2]].put(tensors)
            send("ok", call_id, None)
        elif op == "abort":
            if call_id in syncs:
                syncs.pop(call_id).put(_ABORT)
        elif op == "close":
            break
    calls.shutdown(wait=False, cancel_futures=True)
    engine.close()


@dataclasses.dataclass
class _Replica:
    index: int
    process: Any
    conn: Any
    send_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    pending: dict = dataclasses.field(default_factory=dict)  # call id -> Future
    dead: str | None = None  # why the replica is gone (None: alive)


class VLLMReplicaPool:
    """`RolloutEngine` over `num_replicas` vLLM engine processes (module docstring).

    Args:
      config: the engine config every replica starts with (its checkpoint gives architecture and tensor names).
      num_replicas: >= 1.
      gpus: CUDA device per replica (default: replica i on GPU i when CUDA is available; None on CPU).
      start_timeout_s: seconds to wait for every replica to start (they start at once).
      call_timeout_s: seconds to wait for one bucket's acknowledgement or one replica's sync result.
      sync_bucket_bytes: largest bucket of a weight sync (bytes in the engine dtype).
    Raises:
      ValueError: `num_replicas` < 1 or fewer `gpus` than replicas.
      RuntimeError: a replica that fails to start (naming it and its error); the others are shut down.
    """

    def __init__(self, config: VLLMEngineConfig, num_replicas: int, *, gpus: Sequence[int] | None = None,
                 start_timeout_s: float = 900.0, call_timeout_s: float = 600.0,
                 sync_bucket_bytes: int = SYNC_BUCKET_BYTES):
        if num_replicas < 1:
            raise ValueError(f"VLLMReplicaPool: num_replicas must be >= 1, got {num_replicas}")
        if gpus is None and _cuda_available():
            gpus = list(range(num_replicas))
        if gpus is not None and len(gpus) < num_replicas:
            raise ValueError(f"VLLMReplicaPool: {num_replicas} replicas but only GPUs {list(gpus)}")
        self.config, self.num_replicas, self.gpus = config, int(num_replicas), gpus
        self.call_timeout_s, self.sync_bucket_bytes = float(call_timeout_s), int(sync_bucket_bytes)
        self._shapes = checkpoint_tensor_shapes(config.model_dir)
        self.router = ReplicaRouter(self.num_replicas)
        self._ids = itertools.count()
        self._state = threading.Condition()
        self._in_flight = 0  # generate / score calls running on the pool
        self._syncing = False
        self._inconsistent: str | None = None  # why the replicas may hold different weights
        self._version = 0
        self.sync_buckets = 0  # buckets every replica has loaded, over all syncs (diagnostics)
        ctx = multiprocessing.get_context("spawn")
        self._replicas: list[_Replica] = []
        started = []  # each replica's start reply (its reader pops it from `pending` when it comes)
        for i in range(self.num_replicas):
            parent, child = ctx.Pipe()
            process = ctx.Process(target=_replica_main, name=f"vllm-replica-{i}", daemon=True,
                                  args=(i, config, child, replica_env(i, self.num_replicas, gpus)))
            process.start()
            child.close()
            replica = _Replica(i, process, parent)
            started.append(concurrent.futures.Future())
            replica.pending["start"] = started[-1]
            threading.Thread(target=self._read, args=(replica,), name=f"vllm-replica-{i}-reader", daemon=True).start()
            self._replicas.append(replica)
        try:
            for replica, future in zip(self._replicas, started):
                self._wait(replica, future, "start", start_timeout_s)
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_model(cls, model: Any, work_dir: str | os.PathLike, num_replicas: int, *, tokenizer: Any = None,
                   gpus: Sequence[int] | None = None, **config_overrides: Any) -> "VLLMReplicaPool":
        """Writes `model` once to ``work_dir/checkpoint`` (`vllm_engine.write_checkpoint`) and starts
        `num_replicas` replicas on it."""
        return cls(write_checkpoint(model, work_dir, tokenizer=tokenizer, **config_overrides), num_replicas, gpus=gpus)

    @property
    def weight_version(self) -> int:
        """0 for the checkpoint, +1 per weight sync that reached every replica."""
        return self._version

    def pids(self) -> list[int]:
        """The replicas' process ids, by replica index."""
        return [r.process.pid for r in self._replicas]

    # -- messages ------------------------------------------------------------------------------------------
    def _read(self, replica: _Replica) -> None:
        """(reader thread) Hands each reply to its call; when the pipe closes, fails every pending call."""
        while True:
            try:
                status, call_id, *body = replica.conn.recv()
            except (EOFError, OSError):
                break
            future = replica.pending.pop(call_id, None)
            if future is None:
                continue
            if status == "ok":
                future.set_result(body[0])
            else:
                kind, message = body
                exc_type = ValueError if kind == "ValueError" else RuntimeError
                future.set_exception(exc_type(f"vLLM replica {replica.index}: {kind}: {message}"))
        replica.dead = "its pipe closed"  # before the sweep: `_send` checks it after sending
        replica.process.join(timeout=5)
        replica.dead = f"its process exited (exit code {replica.process.exitcode})"
        for future in list(replica.pending.values()):
            if not future.done():
                future.set_exception(RuntimeError(f"vLLM replica {replica.index} (pid {replica.process.pid}): "
                                                  f"{replica.dead}"))
        replica.pending.clear()

    def _send(self, replica: _Replica, op: str, *body, call_id: str | None = None) -> concurrent.futures.Future:
        """Sends one message (`call_id`: default a new one) and returns the future of its reply. Raises RuntimeError
        naming a dead replica."""
        call_id = call_id or f"{op}-{next(self._ids)}"
        future: concurrent.futures.Future = concurrent.futures.Future()
        if replica.dead is not None:
            raise RuntimeError(f"vLLM replica {replica.index} (pid {replica.process.pid}): {replica.dead}")
        replica.pending[call_id] = future
        try:
            with replica.send_lock:
                replica.conn.send((op, call_id, *body))
        except (OSError, ValueError) as exc:
            replica.pending.pop(call_id, None)
            raise RuntimeError(f"vLLM replica {replica.index} (pid {replica.process.pid}) cannot be reached: "
                               f"{exc}") from exc
        if replica.dead is not None and replica.pending.pop(call_id, None) is not None:  # died meanwhile
            raise RuntimeError(f"vLLM replica {replica.index} (pid {replica.process.pid}): {replica.dead}")
        return future

    def _wait(self, replica: _Replica, future: concurrent.futures.Future, what: str, timeout: float | None = None):
        """The reply of `future`; raises RuntimeError naming the replica on a timeout."""
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise RuntimeError(f"vLLM replica {replica.index} (pid {replica.process.pid}): no answer to {what} "
                               f"within {timeout:.0f} s") from None

    # -- rollouts ------------------------------------------------------------------------------------------
    def _enter(self) -> None:
        with self._state:
            self._state.wait_for(lambda: not self._syncing)
            if self._inconsistent is not None:
                raise RuntimeError(f"VLLMReplicaPool: {self._inconsistent}")
            self._in_flight += 1

    def _leave(self) -> None:
        with self._state:
            self._in_flight -= 1
            self._state.notify_all()

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
                 max_new_tokens: Sequence[int] | None = None,
                 seeds: Sequence[int] | None = None) -> list[Completion]:
        """`RolloutEngine.generate`: each row on the replica the router picks (module docstring); safe from many
        threads. Raises ValueError naming the row (`VLLMEngine.generate`'s checks), RuntimeError naming a replica
        that failed or died, or while the pool is inconsistent after a failed sync."""
        budgets, row_seeds = check_request(prompts, params, max_new_tokens, seeds, self.config.max_model_len)
        if not prompts:
            return []
        self._enter()
        try:
            routed = [self.router.route(p, b) for p, b in zip(prompts, budgets)]
            results: list[Completion | None] = [None] * len(prompts)
            try:
                rows_of = {r: [i for i, x in enumerate(routed) if x == r] for r in sorted(set(routed))}
                futures = {r: self._send(self._replicas[r], "generate", (
                    [list(map(int, prompts[i])) for i in rows], params, [budgets[i] for i in rows],
                    [row_seeds[i] for i in rows])) for r, rows in rows_of.items()}
                for r, rows in rows_of.items():
                    for i, c in zip(rows, self._wait(self._replicas[r], futures[r], "generate")):
                        results[i] = dataclasses.replace(c, weight_version=self._version)
            finally:
                for i, (r, p, b) in enumerate(zip(routed, prompts, budgets)):
                    self.router.finish(r, p, b, None if results[i] is None else results[i].token_ids)
            return results
        finally:
            self._leave()

    def score(self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], *,
              replica: int | None = None) -> list[np.ndarray]:
        """`VLLMEngine.score` on one replica: `replica`, or the one with the fewest live tokens."""
        self._enter()
        try:
            if replica is None:
                live = self.router.live_tokens()
                replica = min(range(self.num_replicas), key=lambda r: (live[r], r))
            target = self._replicas[replica]
            return self._wait(target, self._send(target, "score", ([list(map(int, p)) for p in prompts],
                                                                   [list(map(int, c)) for c in completions])),
                              "score")
        finally:
            self._leave()

    # -- weight sync ---------------------------------------------------------------------------------------
    def update_weights(self, params: Any) -> int:
        """Installs `params` on every replica (module docstring) and returns the new weight version.

        Raises: ValueError naming missing / unknown tensors or a shape mismatch (nothing sent); RuntimeError while
        calls are in flight (nothing sent), or naming the replica that failed or died during the sync (the pool
        then refuses rollouts until a sync succeeds)."""
        named = named_weights(params, self._shapes, self.config.model_dir)
        with self._state:
            if self._in_flight or self._syncing:
                busy = "another sync is running" if self._syncing else f"{self._in_flight} calls are in flight"
                raise RuntimeError(f"VLLMReplicaPool.update_weights while {busy}; wait for the rollouts first")
            self._syncing = True
        try:
            self._sync(named)
            with self._state:
                self._inconsistent = None
                self._version += 1
            self.router.forget()
            return self._version
        except BaseException as exc:
            with self._state:
                self._inconsistent = f"replicas may hold different weights after a failed sync ({exc}); sync again"
            raise
        finally:
            with self._state:
                self._syncing = False
                self._state.notify_all()

    def _sync(self, named: list[tuple[str, Any]]) -> None:
        sync_id = f"sync-{next(self._ids)}"
        done = {}
        try:
            for r in self._replicas:
                done[r.index] = self._send(r, "sync", len(named), call_id=sync_id)
            for group in stream_buckets(named, self.config.dtype, self.sync_bucket_bytes):
                with _published(group, self._replicas, self.gpus) as payloads:
                    acks = [(r, self._send(r, "bucket", sync_id, payloads[r.index])) for r in self._replicas]
                    for r, ack in acks:
                        self._wait(r, ack, "a weight-sync bucket", self.call_timeout_s)
                self.sync_buckets += 1
            for r in self._replicas:
                self._wait(r, done[r.index], "the weight sync", self.call_timeout_s)
        except BaseException as exc:
            for r in self._replicas:  # the others stop waiting for buckets that will not come
                if r.dead is None and r.index in done and not done[r.index].done():
                    try:
                        with r.send_lock:
                            r.conn.send(("abort", sync_id))
                    except (OSError, ValueError):
                        pass
            failed = next((r for r in self._replicas if r.dead is not None), None)
            if failed is not None and f"replica {failed.index}" not in str(exc):
                raise RuntimeError(f"weight sync failed: vLLM replica {failed.index} (pid {failed.process.pid}): "
                                   f"{failed.dead}") from exc
            raise

    def close(self) -> None:
        """Stops every replica (idempotent)."""
        for r in getattr(self, "_replicas", []):
            if r.dead is None:
                try:
                    with r.send_lock:
                        r.conn.send(("close", "close"))
                except (OSError, ValueError):
                    pass
        for r in getattr(self, "_replicas", []):
            r.process.join(timeout=30)
            if r.process.is_alive():
                r.process.kill()
                r.process.join(timeout=5)
            r.conn.close()


def replica_count(requested: int) -> int:
    """Replicas of a run: `requested` when > 0, else one per local CUDA device (1 without CUDA)."""
    if requested > 0:
        return int(requested)
    if _cuda_available():
        import torch

        return max(1, torch.cuda.device_count())
    return 1


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


class _published:
    """Context: one bucket made readable by every replica (module docstring) — per replica a payload; the
    shared-memory segment or the CUDA copies live until the context ends (after every replica acknowledged)."""

    def __init__(self, group, replicas, gpus):
        self.group, self.replicas, self.gpus = group, replicas, gpus
        self._shm, self._keep = None, []

    def __enter__(self) -> dict[int, Any]:
        import torch

        if self.gpus is not None:
            from torch.multiprocessing.reductions import reduce_tensor

            payloads = {}
            for r in self.replicas:
                body = []
                for name, x, dtype in self.group:
                    t = to_torch(device_copy(x, self.gpus[r.index]), dtype)
                    t = t.to(f"cuda:{self.gpus[r.index]}").clone()  # torch-owned: exportable by CUDA IPC
                    self._keep.append(t)
                    body.append((name, reduce_tensor(t)))
                payloads[r.index] = ("cuda", body)
            torch.cuda.synchronize()
            return payloads
        from multiprocessing import shared_memory

        tensors = [(name, to_torch(device_copy(x), dtype).contiguous()) for name, x, dtype in self.group]
        size = max(1, sum(t.numel() * t.element_size() for _, t in tensors))
        self._shm = shared_memory.SharedMemory(create=True, size=size)
        metas, offset = [], 0
        for name, t in tensors:
            view = torch.frombuffer(self._shm.buf, dtype=t.dtype, count=t.numel(), offset=offset)
            view.copy_(t.reshape(-1))
            del view
            metas.append((name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset))
            offset += t.numel() * t.element_size()
        payload = ("shm", (self._shm.name, metas))
        return {r.index: payload for r in self.replicas}

    def __exit__(self, *exc) -> None:
        self._keep.clear()
        if self._shm is not None:
            self._shm.close()
            self._shm.unlink()
