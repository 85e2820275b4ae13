"""One BiCuRL run over several processes (``jax.distributed``).

Who writes, what every process agrees on, how a batch's rollouts are split over the hosts: `ManyHosts`, what
`hosts.current()` gives a run of several processes, over the exchanges below.

Details: docs/design.md.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import pickle
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from flax import nnx

from bat_jax.errors import ConfigError
from bat_jax.learn import distributed

WAIT_TIMEOUT_S = 24 * 3600  # a peer may be evaluating or rolling out for hours; deaths are caught by heartbeats


class PeerError(RuntimeError):
    """Another process of the run failed, or did not answer in time; the message names it."""


class HostUnready(ConfigError):
    """A host cannot take part in the run (no Docker engine, no sandbox image, ...); the message names it."""


_sequence = itertools.count()


def process_index() -> int:
    return jax.process_index()


def process_count() -> int:
    return jax.process_count()


def is_primary() -> bool:
    """True on process 0 (the one that writes the run's records)."""
    return jax.process_index() == 0


def host_label(index: int | None = None, hostname: str | None = None) -> str:
    """'process <i> (<hostname>)': how errors name a process (default: this one)."""
    return f"process {jax.process_index() if index is None else index} ({hostname or socket.gethostname()})"


def _client():
    from jax._src import distributed as jax_distributed  # the client jax.distributed.initialize connected

    client = jax_distributed.global_state.client
    if client is None:
        raise RuntimeError(f"{jax.process_count()} processes but jax.distributed is not initialised")
    return client


def _key(name: str) -> str:
    return f"bat_jax/{next(_sequence)}/{name}"


def _get(client, key: str, what: str, source: int, timeout_s: float) -> Any:
    try:
        return pickle.loads(client.blocking_key_value_get_bytes(key, int(timeout_s * 1000)))
    except Exception as e:  # noqa: BLE001 - JAX raises XlaRuntimeError (deadline, peer gone)
        raise PeerError(f"{host_label()} waited {timeout_s:.0f} s for {what} from process {source} and got none: "
                        f"{type(e).__name__}: {str(e)[:300]}") from e


def barrier(name: str, timeout_s: float = WAIT_TIMEOUT_S) -> None:
    """Returns when every process has reached barrier `name` (one process: at once).

    Raises:
      PeerError: not every process arrived within `timeout_s`.
    """
    if jax.process_count() == 1:
        return
    key = _key(name)
    try:
        _client().wait_at_barrier(key, int(timeout_s * 1000))
    except Exception as e:  # noqa: BLE001
        raise PeerError(f"{host_label()}: not every process reached {name!r} within {timeout_s:.0f} s: "
                        f"{type(e).__name__}: {str(e)[:300]}") from e


def broadcast(value: Any, name: str, timeout_s: float = WAIT_TIMEOUT_S) -> Any:
    """Process 0's `value` on every process (the others' own `value` is ignored)."""
    return on_primary(lambda: value, name, timeout_s)


def on_primary(fn: Callable[[], Any], name: str, timeout_s: float = WAIT_TIMEOUT_S) -> Any:
    """`fn()` run on process 0 alone; its result (pickled) returned on every process.

    Raises:
      PeerError: on the other processes, when `fn` raised on process 0 (its error named), or no result came within
        `timeout_s`. On process 0, what `fn` raised (after the others have been told).
    """
    if jax.process_count() == 1:
        return fn()
    client, key = _client(), _key(name)
    if is_primary():
        try:
            result = fn()
        except BaseException as e:
            client.key_value_set_bytes(key, pickle.dumps(("error", f"{type(e).__name__}: {e}", host_label())))
            raise
        client.key_value_set_bytes(key, pickle.dumps(("ok", result, host_label())))
        return result
    status, payload, who = _get(client, key, name, 0, timeout_s)
    if status == "error":
        raise PeerError(f"{name} failed on {who}: {payload}")
    return payload


def agree(value: Any, name: str, timeout_s: float = WAIT_TIMEOUT_S) -> Any:
    """Process 0's `value`, after checking that this process computed the same (`==`).

    Raises:
      PeerError: this process's `value` differs from process 0's (both shown).
    """
    primary = broadcast(value, name, timeout_s)
    if primary != value:
        raise PeerError(f"{name}: {host_label()} has {value!r} but process 0 has {primary!r}; the processes of one "
                        "run must agree")
    return primary


def allgather(value: Any, name: str, timeout_s: float = WAIT_TIMEOUT_S) -> list[Any]:
    """Every process's `value`, in process order, on every process (one process: ``[value]``).

    The coordinator drops the entries once all have read them.

    Raises:
      PeerError: a process's value did not come within `timeout_s` (naming it).
    """
    if jax.process_count() == 1:
        return [value]
    client, key = _client(), _key(name)
    mine = jax.process_index()
    client.key_value_set_bytes(f"{key}/{mine}", pickle.dumps(value))
    values = [value if p == mine else _get(client, f"{key}/{p}", name, p, timeout_s)
              for p in range(jax.process_count())]
    barrier(f"{name}/read", timeout_s)
    client.key_value_delete(f"{key}/{mine}")
    return values


def all_ok(fn: Callable[[], Any], name: str, release: Callable[[Any], Any] | None = None,
           timeout_s: float = WAIT_TIMEOUT_S) -> Any:
    """`fn()` on every process; returns this process's result once every process has succeeded.

    When another failed, `release(result)` first frees what this process opened.

    Raises:
      HostUnready: on every process, when `fn` raised a `ConfigError` (e.g. `BackendUnavailable`: no Docker engine,
        no image) on one or more processes, naming each failing process, its host and its error.
      PeerError: the same for any other exception.
    """
    error: BaseException | None = None
    try:
        result = fn()
    except Exception as e:  # noqa: BLE001 - reported to every process below
        error, result = e, None
    if jax.process_count() == 1:
        if error is not None:
            raise error
        return result
    failures = allgather(None if error is None else (host_label(), type(error).__name__, str(error),
                                                     isinstance(error, ConfigError)), name, timeout_s)
    failed = [f for f in failures if f is not None]
    if failed:
        if result is not None and release is not None:
            release(result)
        text = "; ".join(f"{who}: {kind}: {message}" for who, kind, message, _ in failed)
        kind = HostUnready if all(config for *_, config in failed) else PeerError
        raise kind(f"{name} failed on {len(failed)} of {len(failures)} processes — {text}") from error
    return result


class Elsewhere:
    """What a writer is on processes other than 0: every method does nothing and returns None."""

    def __init__(self, name: str):
        self.name = name

    def __getattr__(self, attribute: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def primary_only(make: Callable[[], Any]) -> Any:
    """`make()` on process 0 (a writer: the ledger, the TensorBoard writer); a no-op elsewhere.

    On the others it is an :class:`Elsewhere` whose methods do nothing (`make` is not called: no file is opened there).
    """
    return make() if is_primary() else Elsewhere(getattr(make, "__name__", "writer"))


def share(n: int, index: int | None = None, count: int | None = None) -> range:
    """The contiguous positions of `n` items that process `index` of `count` takes.

    The first ``n % count`` processes take one more: ``share(10, 1, 4) == range(3, 6)``."""
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
    base, extra = divmod(n, count)
    start = index * base + min(index, extra)
    return range(start, start + base + (index < extra))


def scored_rollouts(loop, requests: Sequence[Any], seed: int, scorer) -> tuple[list, list]:
    """(trajectories, rewards) of `loop.run(requests, seed=seed)` scored by `scorer`, split over processes.

    `scorer` is a `reward.RolloutScorer` over every position. Each process rolls out and scores its :func:`share` of
    the episodes (``loop.run_episodes``: the same seeds as the whole batch) and both lists are gathered, in position
    order, on every process (one process: `hosts.OneHost.scored_rollouts`)."""
    k = loop.config.sampling.group_size
    episodes = [(request, i, j) for i, request in enumerate(requests) for j in range(k)]
    mine = share(len(episodes))
    trajectories = loop.run_episodes([episodes[p] for p in mine], seed=seed,
                                     on_trajectory=lambda p, t: scorer.submit(mine.start + p, t))
    rewards = scorer.results(positions=mine)
    parts = allgather((trajectories, rewards), "rollouts")
    return [t for ts, _ in parts for t in ts], [r for _, rs in parts for r in rs]


def finished(futures: Mapping[Any, concurrent.futures.Future], name: str,
             timeout_s: float = WAIT_TIMEOUT_S) -> dict[Any, Any]:
    """Results of finished work by key, the same on every process.

    Every future of this process's `futures` (its share of the work, possibly none) waited for, and the results of
    every process gathered into one dict (the processes' keys must be distinct). Every process calls it the same
    number of times (the keys of the exchange are numbered by call order); one process: `hosts.OneHost.finished`.

    Raises:
      whatever a future of this process raised (after the other processes have been told);
      PeerError: on the other processes, naming the process whose work failed and its error.
    """
    concurrent.futures.wait(futures.values())
    mine: dict[Any, Any] = {}
    error: BaseException | None = None
    for key, future in futures.items():
        try:
            mine[key] = future.result()
        except Exception as e:  # noqa: BLE001 - reported to every process below
            error = e
            break
    parts = allgather(("ok", mine) if error is None else ("error", f"{type(error).__name__}: {error}", host_label()),
                      name, timeout_s)
    if error is not None:
        raise error
    failed = [part for part in parts if part[0] == "error"]
    if failed:
        raise PeerError(f"{name} failed on {failed[0][2]}: {failed[0][1]}")
    return {key: value for _, part in parts for key, value in part.items()}


class HostWeights:
    """A rollout engine on this process's own devices, fed the learner's weights gathered to the host.

    The learner's parameters span every process, the engine's copy must be whole and local. `update_weights` is then a
    collective (every process calls it, as the loop does); everything else is the engine's. A vLLM engine (its
    `VLLMEngineConfig`) gets each tensor cast to its dtype on the learner's mesh before the gather
    (`weight_sync.host_weights`: bf16 through host memory, no float32 cast on the CPU per replica), a LoRA vLLM engine
    the model itself (it writes the adapter, gathered by every process); the JAX sampler gets the parameters as they
    are."""

    def __init__(self, engine: Any):
        self.engine = engine

    def update_weights(self, params: Any, **options: Any) -> int:
        """The engine's `update_weights` on the whole value of `params`, gathered from every process.

        `options` (e.g. ``in_flight``) are passed on.
        """
        from bat_jax.rollout.vllm_engine import VLLMEngineConfig
        from bat_jax.rollout.weight_sync import host_weights

        config = getattr(self.engine, "config", None)
        if isinstance(config, VLLMEngineConfig) and config.max_lora_rank:
            # a LoRA engine takes the model: every process joins its adapter's gathers (`peft_io.save_adapter`)
            return self.engine.update_weights(params, **options)
        if isinstance(config, VLLMEngineConfig):
            return self.engine.update_weights(host_weights(params, config.dtype), **options)
        state = nnx.state(params) if isinstance(params, nnx.Module) else params
        return self.engine.update_weights(distributed.host_gather(state), **options)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)


def engine_policy(policy: Any) -> Any:
    """`policy`, or with several processes a copy holding its own model for the rollout engine.

    With one process `policy` itself; with several, `policy` holding its own copy of the model, its parameters gathered
    to this host tensor by tensor (numpy): the learner's model holds arrays that span every process (a checkpoint is
    loaded onto the learner's mesh; the learner's weight sync writes such arrays too), and an engine that kept them
    would run on the global mesh (a program only process 0 runs, waiting forever for the others). The JAX sampler
    places its copy on this host's first device; vLLM writes it to its checkpoint."""
    if jax.process_count() == 1:
        return policy
    model = nnx.clone(policy.model)
    nnx.update(model, distributed.host_gather(nnx.state(model, nnx.Param)))
    return dataclasses.replace(policy, model=model)


def local_engine(engine: Any) -> Any:
    """`engine` with one process; else wrapped in :class:`HostWeights`."""
    return engine if jax.process_count() == 1 else HostWeights(engine)


def host_dir(run_dir: Any) -> Any:
    """Where this process's engine writes its files (vLLM's checkpoint).

    `run_dir` with one process, else ``run_dir/hosts/process-<i>`` (the run directory is shared; every host writes
    its own copy).
    """
    if jax.process_count() == 1:
        return run_dir
    return run_dir / "hosts" / f"process-{jax.process_index()}"


def check_config(*, sampler_mesh: bool) -> None:
    """Refuses, with several processes, what this module does not split over hosts.

    That is the sampler on the global mesh (`EngineConfig.sampler_mesh`): each host's engine must use its own
    devices. Ray rollout workers are each host's own (every process drives its own `RayRollouts`).

    Raises:
      errors.ConfigError: naming the binding to change.
    """
    if jax.process_count() > 1 and sampler_mesh:
        raise ConfigError(f"{jax.process_count()} processes: engines.EngineConfig.sampler_mesh: unset it; each "
                          "host's sampler runs on its own devices")


class ManyHosts:
    """The processes of a run under ``jax.distributed`` (`hosts.OneHost`'s methods, across processes).

    Process 0 writes the records and decides what all agree on; each process rolls out its share of a batch on its
    own engine and sandboxes, and the results are gathered on every process."""

    def __init__(self):
        self.count, self.index = jax.process_count(), jax.process_index()
        self.is_primary = self.index == 0

    def on_primary(self, fn: Callable[[], Any], name: str) -> Any:
        return on_primary(fn, name)

    def agree(self, value: Any, name: str) -> Any:
        return agree(value, name)

    def all_ok(self, fn: Callable[[], Any], name: str, release: Callable[[Any], Any] | None = None) -> Any:
        return all_ok(fn, name, release)

    def primary_only(self, make: Callable[[], Any]) -> Any:
        return primary_only(make)

    def share(self, n: int) -> range:
        return share(n)

    def scored_rollouts(self, loop, requests: Sequence[Any], seed: int, scorer) -> tuple[list, list]:
        return scored_rollouts(loop, requests, seed, scorer)

    def finished(self, futures: Mapping[Any, concurrent.futures.Future], name: str) -> dict[Any, Any]:
        return finished(futures, name)

    def local_engine(self, build: Callable[[Any, Any], Any], policy: Any, run_dir: Any, *,
                     sampler_mesh: bool) -> Any:
        """`build(policy copy, host directory)` wrapped in :class:`HostWeights` (see :func:`engine_policy`).

        Raises:
          errors.ConfigError: the sampler on the global mesh (:func:`check_config`).
        """
        check_config(sampler_mesh=sampler_mesh)
        return local_engine(build(engine_policy(policy), host_dir(run_dir)))
