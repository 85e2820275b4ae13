"""The processes of one run as one object the experiment receives: `OneHost` here, `multihost.ManyHosts` for several.

Every exchange between processes is a method; with one process each is the local computation, so a reader of a
one-host run never needs `multihost.py`.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from bat_jax.bicurl import multihost


class OneHost:
    """The run's one process: it writes every record, and every exchange returns the local result."""

    count = 1
    index = 0
    is_primary = True

    def __init__(self):
        if jax.process_count() > 1:
            raise RuntimeError(f"OneHost with {jax.process_count()} processes: use hosts.current() "
                               "(a multihost.ManyHosts)")

    def on_primary(self, fn: Callable[[], Any], name: str) -> Any:
        """`fn()` (on process 0, its result sent to every process)."""
        return fn()

    def agree(self, value: Any, name: str) -> Any:
        """`value` (process 0's, checked equal on every process)."""
        return value

    def all_ok(self, fn: Callable[[], Any], name: str, release: Callable[[Any], Any] | None = None) -> Any:
        """`fn()` (on every process; one that raises stops all, naming it)."""
        return fn()

    def primary_only(self, make: Callable[[], Any]) -> Any:
        """`make()`: a writer (on process 0; elsewhere one that does nothing)."""
        return make()

    def share(self, n: int) -> range:
        """The positions of `n` items this process takes: all of them."""
        return range(n)

    def scored_rollouts(self, loop, requests: Sequence[Any], seed: int, scorer) -> tuple[list, list]:
        """(trajectories, rewards) of `loop.run(requests, seed=seed)`, each scored by `scorer` as it ends."""
        trajectories = loop.run(requests, seed=seed, on_trajectory=scorer.submit)
        return trajectories, scorer.results()

    def finished(self, futures: Mapping[Any, concurrent.futures.Future], name: str) -> dict[Any, Any]:
        """Results by key of the futures done, once at least one is (``{}`` for none)."""
        if not futures:
            return {}
        concurrent.futures.wait(futures.values(), return_when=concurrent.futures.FIRST_COMPLETED)
        return {key: f.result() for key, f in futures.items() if f.done()}

    def local_engine(self, build: Callable[[Any, Any], Any], policy: Any, run_dir: Any, *,
                     sampler_mesh: bool) -> Any:
        """`build(policy, run_dir)`: the rollout engine (one per host, on its own devices)."""
        return build(policy, run_dir)


def current() -> OneHost | multihost.ManyHosts:
    """The processes of this run: `OneHost`, or `multihost.ManyHosts` under ``jax.distributed`` with several."""
    return OneHost() if jax.process_count() == 1 else multihost.ManyHosts()
