"""Multi-host learner: start ``jax.distributed``, assemble global batches, read sharded results back.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from bat_jax.models import mesh as mesh_lib

_COORDINATOR_VARS = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS")
CPU_COLLECTIVES = ("gloo", "mpi")


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """How this process joins a multi-process JAX job.

    Attributes:
      coordinator_address: ``host:port`` of the coordinator (process 0 serves it); ``''`` = single process.
      num_processes: processes in the job (>= 1).
      process_id: this process, ``0 <= process_id < num_processes``.
      local_device_ids: devices this process uses (None = all it sees).
      cpu_collectives: cross-process collectives of the CPU backend, ``'gloo'`` or ``'mpi'``.
      initialization_timeout_s: seconds ``jax.distributed.initialize`` waits for all processes.
      heartbeat_timeout_s: seconds without a heartbeat after which the coordination service declares a process
        dead and ends every other one with an error naming it (JAX's ``heartbeat_timeout_seconds``; env
        ``BAT_JAX_HEARTBEAT_TIMEOUT_S``): the bound on how long a run outlives one of its processes.
      auto: let JAX detect everything (Cloud TPU / SLURM / Open MPI); the other fields are then ignored.
    Raises:
      ValueError: a process count < 1, a process id out of range, more than one process without a
        coordinator address, or an unknown CPU collectives implementation.
    """

    coordinator_address: str = ""
    num_processes: int = 1
    process_id: int = 0
    local_device_ids: tuple[int, ...] | None = None
    cpu_collectives: str = "gloo"
    initialization_timeout_s: int = 300
    heartbeat_timeout_s: int = 100
    auto: bool = False

    def __post_init__(self):
        if self.num_processes < 1 or not 0 <= self.process_id < self.num_processes:
            raise ValueError(f"DistributedConfig: process_id {self.process_id} of {self.num_processes} processes")
        if self.num_processes > 1 and not self.coordinator_address and not self.auto:
            raise ValueError(f"DistributedConfig: {self.num_processes} processes need a coordinator_address")
        if self.cpu_collectives not in CPU_COLLECTIVES:
            raise ValueError(f"DistributedConfig.cpu_collectives must be one of {CPU_COLLECTIVES}, "
                             f"got {self.cpu_collectives!r}")

    @property
    def multi_process(self) -> bool:
        """True when :func:`initialize` would start ``jax.distributed``."""
        return self.auto or self.num_processes > 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **defaults: Any) -> "DistributedConfig":
        """The config the environment describes (variables in the module docstring).

        ``defaults`` fill the fields the environment leaves unset. Without a coordinator address: one process.

        Raises:
          ValueError: the address is set but ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` is missing or not an
            integer, or ``JAX_LOCAL_DEVICE_IDS`` is not a comma-separated list of integers.
        """
        env = os.environ if env is None else env
        fields = dict(defaults)
        if env.get("BAT_JAX_HEARTBEAT_TIMEOUT_S"):
            try:
                fields["heartbeat_timeout_s"] = int(env["BAT_JAX_HEARTBEAT_TIMEOUT_S"])
            except ValueError as e:
                raise ValueError(f"BAT_JAX_HEARTBEAT_TIMEOUT_S={env['BAT_JAX_HEARTBEAT_TIMEOUT_S']!r}: expected an "
                                 "integer number of seconds") from e
        if env.get("JAX_CPU_COLLECTIVES"):
            fields["cpu_collectives"] = env["JAX_CPU_COLLECTIVES"]
        if env.get("JAX_AUTO_DISTRIBUTED") == "1":
            return cls(**dict(fields, auto=True))
        address = next((env[v] for v in _COORDINATOR_VARS if env.get(v)), None)
        if not address:
            return cls(**fields)
        try:
            num, pid = int(env["JAX_NUM_PROCESSES"]), int(env["JAX_PROCESS_ID"])
        except (KeyError, ValueError) as e:
            raise ValueError(
                "JAX_COORDINATOR_ADDRESS is set, so JAX_NUM_PROCESSES and JAX_PROCESS_ID must be integers") from e
        if env.get("JAX_LOCAL_DEVICE_IDS"):
            try:
                fields["local_device_ids"] = tuple(int(x) for x in env["JAX_LOCAL_DEVICE_IDS"].split(","))
            except ValueError as e:
                raise ValueError(f"JAX_LOCAL_DEVICE_IDS={env['JAX_LOCAL_DEVICE_IDS']!r}: "
                                 "expected comma-separated integers") from e
        return cls(**dict(fields, coordinator_address=address, num_processes=num, process_id=pid))


def initialize(config: DistributedConfig) -> bool:
    """Starts ``jax.distributed`` for ``config`` (nothing for one process); True when it initialised.

    Call it before any other JAX call (it sets ``jax_cpu_collectives_implementation`` too).

    Raises:
      RuntimeError: from JAX, e.g. when the other processes do not join within the timeout.
    """
    if not config.multi_process:
        return False
    jax.config.update("jax_cpu_collectives_implementation", config.cpu_collectives)
    if config.auto:
        jax.distributed.initialize(initialization_timeout=config.initialization_timeout_s,
                                   heartbeat_timeout_seconds=config.heartbeat_timeout_s)
        return True
    jax.distributed.initialize(
        coordinator_address=config.coordinator_address,
        num_processes=config.num_processes,
        process_id=config.process_id,
        local_device_ids=None if config.local_device_ids is None else list(config.local_device_ids),
        initialization_timeout=config.initialization_timeout_s,
        heartbeat_timeout_seconds=config.heartbeat_timeout_s,
    )
    return True


def process_rows(sharding: NamedSharding, global_rows: int) -> np.ndarray:
    """Sorted indices of the rows of a global ``[global_rows, ...]`` array that live on this process's devices.

    The rows follow ``sharding`` (dim 0 split over the batch axes; rows replicated on several devices of the process are
    listed once). This is the order ``jax.make_array_from_process_local_data`` expects the local rows in.

    Raises:
      ValueError: ``global_rows`` does not divide over the sharding's dim-0 shards.
    """
    axes = sharding.spec[0] if len(sharding.spec) else None
    axes = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
    ways = int(np.prod([sharding.mesh.shape[a] for a in axes]))
    if global_rows % ways:
        raise ValueError(f"{global_rows} rows do not split evenly over the {ways} shards of {sharding.spec}")
    rows: set[int] = set()
    for (sl,) in sharding.addressable_devices_indices_map((global_rows,)).values():
        start, stop, _ = sl.indices(global_rows)
        rows.update(range(start, stop))
    return np.asarray(sorted(rows), np.int64)


def local_rows(batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, np.ndarray]:
    """This process's rows of a global host batch that every process holds whole.

    Every field of the batch is ``[B, ...]``, B a multiple of the batch devices. Use it when every process holds the
    whole batch (e.g. the same deterministic rollouts); a process that produces only its own rows passes them to
    :func:`global_batch` directly."""
    out = {}
    for k, v in batch.items():
        v = np.asarray(v)
        out[k] = v[process_rows(mesh_lib.batch_sharding(mesh, v.ndim), len(v))]
    return out


def global_batch(local: Mapping[str, np.ndarray], mesh: Mesh, global_rows: int) -> dict[str, jax.Array]:
    """Global arrays, dim 0 sharded over the mesh's batch axes, from this process's rows.

    The arrays are ``[global_rows, ...]`` with the learner's batch shardings; ``local[k]`` is ``[len(process_rows),
    ...]``, in :func:`process_rows` order. Every process calls it with its own rows.

    Raises:
      ValueError: a field's local row count is not this process's share of ``global_rows``.
    """
    out = {}
    for k, v in local.items():
        v = np.asarray(v)
        sharding = mesh_lib.batch_sharding(mesh, v.ndim)
        want = len(process_rows(sharding, global_rows))
        if len(v) != want:
            raise ValueError(f"batch field {k!r}: {len(v)} local rows, this process holds {want} of {global_rows}")
        out[k] = jax.make_array_from_process_local_data(sharding, v, (global_rows,) + v.shape[1:])
    return out


def host_gather(tree: Any) -> Any:
    """The whole value of every array in ``tree`` as numpy, on every process.

    With arrays sharded over several processes it is a collective: every process must call it with the same tree. Fully
    addressable trees are read with one ``jax.device_get``."""
    leaves = jax.tree.leaves(tree)
    if all(not isinstance(x, jax.Array) or x.is_fully_addressable for x in leaves):
        return jax.tree.map(np.asarray, jax.device_get(tree))
    from jax.experimental import multihost_utils

    def one(x: Any) -> np.ndarray:
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(jax.device_get(x))

    return jax.tree.map(one, tree)


def process_summary() -> dict[str, Any]:
    """``{'process_index', 'process_count', 'local_devices', 'global_devices'}`` of this process (for logs)."""
    return {"process_index": jax.process_index(), "process_count": jax.process_count(),
            "local_devices": jax.local_device_count(), "global_devices": jax.device_count()}
