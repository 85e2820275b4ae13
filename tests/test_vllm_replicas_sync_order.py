"""A weight sync's CUDA ordering across `VLLMReplicaPool` (bat_jax/rollout/vllm_replicas.py), its staging buffers
(bat_jax/rollout/sync_staging.py) and the replica's message loop (bat_jax/rollout/vllm_replica_worker.py).

No GPU and no vLLM: the pool runs its real sync against two replicas served in threads (`vllm_replica_worker.serve`
with an engine double), pinned to two pretend GPUs, with the CUDA calls replaced by a recording double
(`sync_staging.TorchCuda`'s methods) and the parent's copies into the staging buffers recorded by a torch function
mode. Per bucket the order must be: copy into device d → synchronize(d) → notify replica → replica reads → replica
synchronizes → ack, and every ack before the next bucket's first copy. A LoRA pool's sync (an adapter directory
per version, loaded by every replica) is checked on the same threads.
"""

from __future__ import annotations

import threading
from multiprocessing import Pipe
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from torch.overrides import TorchFunctionMode

from bat_jax.rollout import vllm_replica_worker, vllm_replicas
from bat_jax.rollout.engine import SamplingParams
from bat_jax.rollout.gpus import Gpu
from bat_jax.rollout.vllm_engine import VLLMEngineConfig

TENSORS = {"model.layers.0.mlp.up_proj.weight": np.arange(32, dtype=np.float32).reshape(4, 8),
           "model.layers.1.mlp.up_proj.weight": -np.arange(32, dtype=np.float32).reshape(4, 8),
           "model.embed_tokens.weight": np.arange(128, dtype=np.float32).reshape(16, 8) / 7}
# with a 256-byte bound: one bucket per layer (128 B each: the second would start at 256), the 512-byte embedding in
# two row chunks of 8 rows -> 4 buckets, 1 piece each


class RecordingCuda:
    """`sync_staging.TorchCuda` on CPU tensors, recording each synchronize (parent: by ordinal; replica r: its own)."""

    def __init__(self, events, replica=None):
        self.events, self.replica, self.buffers = events, replica, {}

    def buffer(self, nbytes, ordinal):
        out = torch.zeros(nbytes, dtype=torch.uint8)
        self.buffers[ordinal] = out
        return out

    def export(self, buffer):
        return buffer  # in-process: the replica opens the tensor itself

    def open(self, handle):
        return handle

    def synchronize(self, ordinal=None):
        self.events.append(("synchronize", ordinal) if self.replica is None else ("replica_synchronize", self.replica))

    def release(self, ordinals=(None,)):
        pass


class CopyRecorder(TorchFunctionMode):
    """Records ``("copy", ordinal)`` for every ``Tensor.copy_`` into one of the parent's staging buffers."""

    def __init__(self, events, cuda):
        super().__init__()
        self.events, self.cuda = events, cuda

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.copy_:
            ptr = args[0].data_ptr()
            for ordinal, buf in self.cuda.buffers.items():
                if buf.data_ptr() <= ptr < buf.data_ptr() + buf.numel():
                    self.events.append(("copy", ordinal))
        return func(*args, **(kwargs or {}))


class RecordingConn:
    """One end of the pool ↔ replica pipe; records the parent's bucket notices and the replica's bucket acks."""

    def __init__(self, conn, events, replica):
        self.conn, self.events, self.replica = conn, events, replica

    def send(self, msg):
        if msg[0] == "bucket":
            self.events.append(("notify", self.replica))
        elif msg[0] == "ok" and str(msg[1]).startswith("bucket-"):
            self.events.append(("ack", self.replica))
        self.conn.send(msg)

    def recv(self):
        return self.conn.recv()

    def close(self):
        self.conn.close()


class ThreadProcess:
    """The replica "process": a thread running `serve`."""

    def __init__(self, thread):
        self.thread, self.pid = thread, 10_000 + len(thread.name)

    @property
    def exitcode(self):
        return None if self.thread.is_alive() else 0

    def is_alive(self):
        return self.thread.is_alive()

    def join(self, timeout=None):
        self.thread.join(timeout)

    def kill(self):
        pass


class ReadingEngine:
    """The replica's engine: reads (clones) each view it is given, recording ``("read", replica)``."""

    def __init__(self, index, events):
        self.index, self.events, self.params, self.version = index, events, {}, 0

    def install_weights(self, weights, rows=None):
        for name, view in weights:
            self.events.append(("read", self.index))
            self.params[name] = view.clone().numpy()
        for name, row0, view in rows or ():
            self.events.append(("read", self.index))
            self.params.setdefault(name, np.zeros(TENSORS[name].shape, np.float32))[row0:row0 + view.shape[0]] = (
                view.numpy())
        self.version += 1
        return self.version

    def close(self):
        pass


def _chunks(events, kinds, who, sizes):
    """Positions in `events` of the events of `kinds` concerning `who`, split into groups of `sizes`."""
    at = [i for i, e in enumerate(events) if e[0] in kinds and e[1] == who]
    out, k = [], 0
    for n in sizes:
        out.append(at[k:k + n])
        k += n
    assert k == len(at), (who, kinds, len(at), sizes)
    return out


def test_bucket_is_copied_synchronised_notified_read_synchronised_then_acknowledged(tmp_path, monkeypatch):
    save_file(TENSORS, str(tmp_path / "model.safetensors"))
    events: list[tuple] = []
    parent_cuda = RecordingCuda(events)
    engines = {}

    def start_replica(index, env):
        ours, theirs = Pipe()
        engines[index] = ReadingEngine(index, events)
        thread = threading.Thread(target=vllm_replica_worker.serve, name=f"replica-{index}", daemon=True,
                                  args=(RecordingConn(theirs, events, index), index),
                                  kwargs={"make_engine": lambda fields: engines[index],
                                          "cuda": RecordingCuda(events, replica=index)})
        thread.start()
        return ThreadProcess(thread), RecordingConn(ours, events, index)

    monkeypatch.setattr(vllm_replicas, "start_replica", start_replica)
    monkeypatch.setattr(vllm_replica_worker, "clone_pending", lambda lo, hi: 0)  # vLLM's layer-wise state: none
    gpus = [Gpu(0, "GPU-aaaa"), Gpu(1, "GPU-bbbb")]
    pool = vllm_replicas.VLLMReplicaPool(VLLMEngineConfig(model_dir=str(tmp_path), dtype="float32"), 2, gpus=gpus,
                                         start_timeout_s=30, call_timeout_s=30, sync_bucket_bytes=256,
                                         cuda=parent_cuda)
    try:
        with CopyRecorder(events, parent_cuda):
            assert pool.update_weights({k: v * 2 for k, v in TENSORS.items()}) == 1
    finally:
        pool.close()
    assert pool.last_sync["buckets"] == 4 and pool.sync_buckets == 4
    for r in (0, 1):  # each replica read its own device's buffer, every byte
        assert engines[r].params.keys() == TENSORS.keys()
        for name, value in TENSORS.items():
            np.testing.assert_array_equal(engines[r].params[name], value * 2, err_msg=f"replica {r} {name}")

    buckets = 4  # one piece each
    copies = {d: _chunks(events, {"copy"}, d, [1] * buckets) for d in (0, 1)}
    syncs = {d: _chunks(events, {"synchronize"}, d, [1] * buckets) for d in (0, 1)}
    assert not [e for e in events if e[0] == "synchronize" and e[1] not in (0, 1)]  # never "the current device"
    notices = {r: _chunks(events, {"notify"}, r, [1] * buckets) for r in (0, 1)}
    reads = {r: _chunks(events, {"read"}, r, [1] * buckets) for r in (0, 1)}
    settled = {r: _chunks(events, {"replica_synchronize"}, r, [1] * buckets) for r in (0, 1)}
    acks = {r: _chunks(events, {"ack"}, r, [1] * buckets) for r in (0, 1)}
    for k in range(buckets):
        first_notice = min(notices[r][k][0] for r in (0, 1))
        for d in (0, 1):  # copy into d -> synchronize(d) -> any replica told
            assert max(copies[d][k]) < syncs[d][k][0] < first_notice, (k, d, events)
        for r in (0, 1):  # told -> reads -> synchronizes its device -> acknowledges
            assert notices[r][k][0] < min(reads[r][k]) and max(reads[r][k]) < settled[r][k][0] < acks[r][k][0], (
                k, r, events)
        if k + 1 < buckets:  # the next bucket overwrites the buffers only after every ack
            assert max(acks[r][k][0] for r in (0, 1)) < min(copies[d][k + 1][0] for d in (0, 1)), (k, events)


class AdapterEngine(ReadingEngine):
    """A LoRA replica's engine: records each adapter directory it loads, whether its PEFT config was there and the
    adapter directories beside it at that moment; raises while `fail_at` is the version asked for."""

    def __init__(self, index, events, fail_at=None):
        super().__init__(index, events)
        self.loaded, self.fail_at = [], fail_at

    def load_adapter(self, path, version):
        if version == self.fail_at:
            raise RuntimeError("adapter rank 16 > max_lora_rank 8")
        path = Path(path)
        self.loaded.append((path.name, version, (path / "adapter_config.json").exists(),
                            sorted(p.name for p in path.parent.iterdir())))
        self.version = version
        return version


def test_an_adapter_is_written_once_loaded_by_every_replica_and_a_failed_load_names_the_replica(tmp_path,
                                                                                                 monkeypatch):
    """A LoRA pool (two replicas in threads): version 0 at start and one sync reach both replicas from one
    directory each, the older removed only after both loaded the new one. A sync that replica 1 fails names it and
    leaves the pool refusing rollouts with both directories on disk (replica 0 serves v2, replica 1 still v1); the
    next sync writes a directory of a new name (a replica may still read the failed one), reaches both, and leaves
    only it."""
    from bat_jax.models import lora
    from doubles import tiny_model

    model = tiny_model("qwen3")
    lora.add_lora(model, lora.LoRAConfig(rank=4, alpha=8.0), seed=0)
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    save_file(TENSORS, str(ckpt / "model.safetensors"))
    engines = {0: AdapterEngine(0, []), 1: AdapterEngine(1, [], fail_at=2)}

    def start_replica(index, env):
        ours, theirs = Pipe()
        thread = threading.Thread(target=vllm_replica_worker.serve, name=f"replica-{index}", daemon=True,
                                  args=(theirs, index), kwargs={"make_engine": lambda fields: engines[index]})
        thread.start()
        return ThreadProcess(thread), ours

    monkeypatch.setattr(vllm_replicas, "start_replica", start_replica)
    pool = vllm_replicas.VLLMReplicaPool(VLLMEngineConfig(model_dir=str(ckpt), dtype="float32", max_lora_rank=8), 2,
                                         start_timeout_s=30, call_timeout_s=30)
    adapters = tmp_path / "adapters"
    try:
        pool._load_adapter(pool._write_adapter(model, 0), 0)  # what `from_model` does at start
        assert pool.update_weights(model) == 1 == pool.weight_version
        for e in engines.values():  # v1 was loaded while v0 was still on disk
            assert e.loaded == [("v0", 0, True, ["v0"]), ("v1", 1, True, ["v0", "v1"])]
        assert sorted(p.name for p in adapters.iterdir()) == ["v1"]
        with pytest.raises(RuntimeError, match=r"adapter load failed: vLLM replica 1: RuntimeError: adapter rank 16"):
            pool.update_weights(model)
        with pytest.raises(RuntimeError, match="may hold different weights"):
            pool.generate([[1, 2]], SamplingParams(temperature=0.0, max_new_tokens=2))
        assert pool.weight_version == 1 and sorted(p.name for p in adapters.iterdir()) == ["v1", "v2"]
        assert engines[0].loaded[-1][:2] == ("v2", 2) and engines[1].loaded[-1][:2] == ("v1", 1)
        engines[1].fail_at = None
        assert pool.update_weights(model) == 2 == pool.weight_version
        (again,) = [p.name for p in adapters.iterdir()]
        assert again.startswith("v2-") and [e.loaded[-1][0] for e in engines.values()] == [again, again]
        with pytest.raises(TypeError, match="nnx.Module"):
            pool.update_weights(TENSORS)  # a LoRA pool takes the model, not tensors
    finally:
        pool.close()
