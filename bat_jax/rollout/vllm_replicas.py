"""vLLM data-parallel replicas: one engine process per device beside the learner's shard, weights pushed to all.

Details: docs/design.md.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from bat_jax.rollout.engine import Completion, SamplingParams
from bat_jax.rollout.gpus import Gpu, installed_vllm, pin_env, visible_gpus
from bat_jax.rollout.replica_router import ReplicaRouter
from bat_jax.rollout.sync_staging import StagingBuffers
from bat_jax.rollout.vllm_engine import (VLLMEngineConfig, adapter_root, check_adapter_model, check_request,
                                         checkpoint_tensor_shapes, remove_older_adapters, write_adapter,
                                         write_checkpoint)
from bat_jax.rollout.weight_sync import (SYNC_BUCKET_BYTES, device_copy, named_weights, stream_pieces, sync_plan,
                                         to_torch)

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def replica_env(index: int, num_replicas: int, gpus: Sequence[Gpu] | None, vllm_version: str | None = None
                ) -> dict[str, str]:
    """Environment of replica `index`, set before its interpreter starts.

    With `gpus`, ``CUDA_VISIBLE_DEVICES`` names its GPU's physical device, whatever this process's own
    ``CUDA_VISIBLE_DEVICES``, in the form `vllm_version` (default: the installed vLLM's) parses: the UUID, or the NVML
    index with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` before vLLM 0.24 (`gpus.pin_env`). Without (CPU), an equal share of
    this process's cores for vLLM's OpenMP threads (all of them when there are fewer cores than replicas).
    ``JAX_PLATFORMS=cpu`` in case anything it loads ever imports JAX (the replica itself does not)."""
    if gpus is not None:
        return {**pin_env(gpus[index], vllm_version or installed_vllm()), "JAX_PLATFORMS": "cpu"}
    cores = sorted(os.sched_getaffinity(0))
    per = len(cores) // num_replicas
    mine = cores[index * per:(index + 1) * per] if per else cores
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, mine)), "JAX_PLATFORMS": "cpu"}


def pin_gpus(num_replicas: int, gpus: Sequence[Gpu | int] | None) -> list[Gpu] | None:
    """The GPU of each replica.

    `gpus` (`Gpu`s, or this process's CUDA ordinals), by default this process's visible GPUs in order
    (`gpus.visible_gpus`); None on a machine without CUDA.

    Raises: ValueError when there are fewer GPUs than replicas or an ordinal is not visible."""
    if gpus is not None and all(isinstance(g, Gpu) for g in gpus):
        out = list(gpus)
    else:
        visible = visible_gpus()
        if gpus is None and not visible:
            return None
        out = []
        for g in (range(len(visible)) if gpus is None else gpus):
            if not 0 <= int(g) < len(visible):
                raise ValueError(f"VLLMReplicaPool: GPU {g} is not one of this process's {len(visible)} visible "
                                 f"GPUs")
            out.append(visible[int(g)])
    if len(out) < num_replicas:
        raise ValueError(f"VLLMReplicaPool: {num_replicas} replicas but only GPUs {[g.ordinal for g in out]}")
    return out[:num_replicas]


class _Process:
    """A replica's interpreter (`subprocess.Popen`) with the calls the pool makes on it."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.pid = popen.pid

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        self.popen.kill()


def start_replica(index: int, env: dict[str, str]) -> tuple[_Process, Connection]:
    """Starts ``python -m bat_jax.rollout.vllm_replica_worker`` with `env` over this process's environment.

    The worker is joined to this process by a socket pair; returns its process and this end of the socket."""
    mine, theirs = socket.socketpair()
    path = os.pathsep.join(p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    popen = subprocess.Popen([sys.executable, "-m", "bat_jax.rollout.vllm_replica_worker", str(theirs.fileno()),
                              str(index)], env={**os.environ, **env, "PYTHONPATH": path},
                             pass_fds=(theirs.fileno(),))
    theirs.close()
    return _Process(popen), Connection(mine.detach())


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
      gpus: GPU per replica: `gpus.Gpu`s or this process's CUDA ordinals (default: replica i on this process's
        ordinal i when CUDA is available; None on CPU); each replica is pinned by the GPU's UUID
        (its NVML index for a vLLM before 0.24).
      start_timeout_s: seconds to wait for every replica to start (they start at once).
      call_timeout_s: seconds to wait for one bucket's acknowledgement or one replica's sync result.
      sync_bucket_bytes: largest bucket of a weight sync (bytes in the engine dtype): the staging buffer's size.
      measure_sync: record the peak of torch's CPU allocator during each sync, here and in every replica
        (`last_sync`; for tests/test_vllm_memory_sync.py).
      cuda: the parent's CUDA calls of a sync (`sync_staging.TorchCuda`; a test's double).
    Raises:
      ValueError: `num_replicas` < 1, fewer `gpus` than replicas, or an ordinal that is not visible.
      RuntimeError: a replica that fails to start (naming it and its error); the others are shut down.
    """

    def __init__(self, config: VLLMEngineConfig, num_replicas: int, *, gpus: Sequence[int] | None = None,
                 start_timeout_s: float = 900.0, call_timeout_s: float = 600.0,
                 sync_bucket_bytes: int = SYNC_BUCKET_BYTES, measure_sync: bool = False, cuda: Any = None):
        if num_replicas < 1:
            raise ValueError(f"VLLMReplicaPool: num_replicas must be >= 1, got {num_replicas}")
        gpus = pin_gpus(int(num_replicas), gpus)
        self.config, self.num_replicas, self.gpus = config, int(num_replicas), gpus
        self.measure_sync, self.cuda = bool(measure_sync), cuda
        self.last_sync: dict[str, Any] = {}  # the latest sync's plan and measurements (diagnostics)
        self.started: list[dict] = []  # each replica's start reply: pid, jax_imported, cuda_visible_devices
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
        self._replicas: list[_Replica] = []
        started = []  # each replica's start reply (its reader pops it from `pending` when it comes)
        fields = dataclasses.asdict(config)
        envs = [replica_env(i, self.num_replicas, gpus) for i in range(self.num_replicas)]  # refused before any starts
        for i in range(self.num_replicas):
            process, conn = start_replica(i, envs[i])
            replica = _Replica(i, process, conn)
            started.append(concurrent.futures.Future())
            replica.pending["start"] = started[-1]
            threading.Thread(target=self._read, args=(replica,), name=f"vllm-replica-{i}-reader", daemon=True).start()
            self._replicas.append(replica)
            conn.send(("config", fields))
        try:
            for replica, future in zip(self._replicas, started):
                self.started.append(self._wait(replica, future, "start", start_timeout_s))
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_model(cls, model: Any, work_dir: str | os.PathLike, num_replicas: int, *, tokenizer: Any = None,
                   gpus: Sequence[Gpu | int] | None = None, sync_bucket_bytes: int = SYNC_BUCKET_BYTES,
                   measure_sync: bool = False, **config_overrides: Any) -> "VLLMReplicaPool":
        """Writes `model` once to ``work_dir/checkpoint`` and starts `num_replicas` replicas on it.

        The checkpoint comes from `vllm_engine.write_checkpoint` (for a model with a LoRA adapter: the frozen base,
        every replica then serving the model's adapter as version 0). `config_overrides`: `VLLMEngineConfig` fields;
        the rest: the constructor's."""
        pool = cls(write_checkpoint(model, work_dir, tokenizer=tokenizer, **config_overrides), num_replicas,
                   gpus=gpus, sync_bucket_bytes=sync_bucket_bytes, measure_sync=measure_sync)
        if pool.config.max_lora_rank:
            try:
                pool._load_adapter(pool._write_adapter(model, 0), 0)
            except BaseException:
                pool.close()
                raise
        return pool

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
        """Sends one message (`call_id`: default a new one) and returns the future of its reply.

        Raises RuntimeError naming a dead replica."""
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
        """`RolloutEngine.generate`: each row on the replica the router picks; safe from many threads.

        The module docstring describes the routing. Raises ValueError naming the row (`VLLMEngine.generate`'s checks),
        RuntimeError naming a replica that failed or died, or while the pool is inconsistent after a failed sync."""
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

        A LoRA pool (`VLLMEngineConfig.max_lora_rank`) takes the model instead: its adapter is written once and every
        replica loads it in place (`_load_adapter`).

        Raises: ValueError naming missing / unknown tensors or a shape mismatch (nothing sent); for a LoRA pool, as
        `vllm_engine.check_adapter_model`; RuntimeError while calls are in flight (nothing sent), or naming the
        replica that failed or died during the sync (the pool then refuses rollouts until a sync succeeds)."""
        lora = bool(self.config.max_lora_rank)
        if lora:
            check_adapter_model(self.config, params)
        else:
            named = named_weights(params, self._shapes, self.config.model_dir)
        with self._state:
            if self._in_flight or self._syncing:
                busy = "another sync is running" if self._syncing else f"{self._in_flight} calls are in flight"
                raise RuntimeError(f"VLLMReplicaPool.update_weights while {busy}; wait for the rollouts first")
            self._syncing = True
        sent = False  # a failed adapter write sends nothing: the replicas still agree
        try:
            path = self._write_adapter(params, self._version + 1) if lora else None
            sent = True
            if lora:
                self._load_adapter(path, self._version + 1)
            else:
                self._sync(named)
            with self._state:
                self._inconsistent = None
                self._version += 1
            self.router.forget()
            return self._version
        except BaseException as exc:
            if sent:
                with self._state:
                    self._inconsistent = (f"replicas may hold different weights after a failed sync ({exc}); "
                                          "sync again")
            raise
        finally:
            with self._state:
                self._syncing = False
                self._state.notify_all()

    def _write_adapter(self, model: Any, version: int) -> Path:
        """Writes `model`'s adapter to a directory no replica has read and returns it.

        ``v<version>``, or a new name when a failed sync left that one (a replica may still be reading it)."""
        root = adapter_root(self.config.model_dir)
        directory = root / f"v{version}"
        if directory.exists():
            directory = root / f"v{version}-{next(self._ids)}"
        return write_adapter(model, directory, self.config.model_dir)

    def _load_adapter(self, path: Path, version: int) -> None:
        """Has every replica load the adapter at `path` in place, then removes the older directories.

        Waits for every replica's answer, also after a failure, and raises RuntimeError naming each replica that
        failed or did not answer within `call_timeout_s`."""
        loads = {r.index: self._send(r, "adapter", str(path), int(version)) for r in self._replicas}
        concurrent.futures.wait(list(loads.values()), timeout=self.call_timeout_s)
        failed = []
        for r in self._replicas:
            future = loads[r.index]
            if not future.done():
                failed.append(f"vLLM replica {r.index} (pid {r.process.pid}): no answer to the adapter load within "
                              f"{self.call_timeout_s:.0f} s")
            elif future.exception() is not None:
                failed.append(str(future.exception()))
        if failed:
            raise RuntimeError("adapter load failed: " + "; ".join(failed))
        remove_older_adapters(path)  # no replica reads them any more

    def _sync(self, named: list[tuple[str, Any]]) -> None:
        sync_id = f"sync-{next(self._ids)}"
        plan = sync_plan(named, self.config.dtype, self.sync_bucket_bytes)
        values = dict(named)
        whole = sum(p.row0 is None for b in plan.buckets for p in b)
        chunk_buckets = sum(b[0].row0 is not None for b in plan.buckets)
        done = {}
        measured = None
        try:
            with StagingBuffers(plan.staging_bytes, self.gpus, self.num_replicas, cuda=self.cuda) as staging:
                for r in self._replicas:
                    done[r.index] = self._send(r, "sync", {"whole": whole, "chunk_buckets": chunk_buckets,
                                                          "staging": staging.payloads[r.index],
                                                          "measure": self.measure_sync}, call_id=sync_id)
                if self.measure_sync:
                    from bat_jax.rollout.sync_staging import TorchAllocationPeak

                    with TorchAllocationPeak() as measured:
                        self._send_buckets(plan, values, staging, sync_id)
                else:
                    self._send_buckets(plan, values, staging, sync_id)
                results = [self._wait(r, done[r.index], "the weight sync", self.call_timeout_s)
                           for r in self._replicas]
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
        self.last_sync = {"buckets": len(plan.buckets), "staging_bytes": plan.staging_bytes,
                          "largest_layer_bytes": plan.largest_layer_bytes, "chunked": plan.chunked,
                          "parent_torch_peak_bytes": None if measured is None else measured.peak,
                          "replicas": results}

    def _send_buckets(self, plan, values, staging, sync_id: str) -> None:
        """Each bucket into every device's staging buffer, then to every replica; waits for all their acks."""
        for pieces, bucket in stream_pieces(values, plan):
            staging.fill(pieces, bucket, lambda x, ordinal, dtype: to_torch(device_copy(x, ordinal), dtype))
            del bucket
            acks = [(r, self._send(r, "bucket", sync_id, pieces)) for r in self._replicas]
            for r, ack in acks:
                self._wait(r, ack, "a weight-sync bucket", self.call_timeout_s)
            self.sync_buckets += 1

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
