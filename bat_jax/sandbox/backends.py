"""Sandbox backends by name: where an episode gets its sandbox and where it gives it back.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from bat_jax.errors import ConfigError
from bat_jax.sandbox.types import Sandbox, SandboxState

if TYPE_CHECKING:  # the pool module imports docker-py; backends stay importable without it
    from bat_jax.sandbox.pool import SandboxPool

#: `state -> Sandbox`: a new sandbox restored from `state`.
SandboxFactory = Callable[[SandboxState], Sandbox]


class BackendUnavailable(ConfigError, RuntimeError):
    """The requested sandbox backend cannot be used here (module, engine or image missing).

    The message says what to start or build, or which binding chooses another backend."""


def local_sandbox(state: SandboxState) -> Sandbox:
    """The non-isolated local backend (tests/development only; see bat_jax.sandbox.local), 60 s per call."""
    from bat_jax.sandbox.local import LocalSandbox

    return LocalSandbox(state, timeout_s=60.0)


#: What `environment_versions` runs in a sandbox (stdout: one JSON object).
ENV_PROBE = ("import json, platform, numpy\n"
             "print(json.dumps({'python': platform.python_version(), 'numpy': numpy.__version__}))")


def environment_versions(make_sandbox: SandboxFactory) -> dict[str, str]:
    """The Python and numpy versions the sandboxes of `make_sandbox` run ({} when the probe fails).

    Task code that records them (the imaging suite's Setup stage writes the numpy version) puts them into rows: a
    Stage Bank's digest depends on them (`stage_bank.factory.BuildReport.sandbox`)."""
    try:
        box = make_sandbox(SandboxState(files={}))
    except Exception:  # noqa: BLE001 — no sandbox, no versions; the build reports its own failures
        return {}
    try:
        obs = box.execute_code("python", ENV_PROBE)
        found = json.loads(obs.stdout.strip().splitlines()[-1])
        return {k: str(found[k]) for k in ("python", "numpy")}
    except Exception:  # noqa: BLE001 — as above
        return {}
    finally:
        box.close()


def backend_factory(name: str, concurrency: int = 16, image: str | None = None) -> SandboxFactory:
    """A sandbox factory by backend name: 'local' (non-isolated, tests only) or 'docker'.

    `concurrency`: most threads using sandboxes at once (the agent loop's `max_workers`); the Docker client's connection
    pool is sized to it plus a margin, so no 'connection pool is full' warnings. `image`: the Docker image tag (a
    benchmark's own, `StagedBenchmark.sandbox_image`); None: the shared task image.

    Raises:
      BackendUnavailable: Docker backend module, engine or task image missing (the message says which).
      ValueError: unknown name.
    """
    if name == "local":
        return local_sandbox
    if name != "docker":
        raise ValueError(f"unknown sandbox backend {name!r}; expected 'local' or 'docker'")
    try:
        from bat_jax.sandbox import docker as docker_backend

        pool = max(docker_backend.DockerSandboxConfig.max_pool_size, int(concurrency) + 4)
        config = docker_backend.DockerSandboxConfig(max_pool_size=pool, image=image)
        client = docker_backend.connect(config)
        probe = docker_backend.DockerSandbox(client, config, state=SandboxState(files={}))
        probe.close()
    except Exception as exc:  # noqa: BLE001 — any failure here means the backend is not usable
        raise BackendUnavailable(f"docker backend unavailable: {type(exc).__name__}: {exc}") from None
    return lambda state: docker_backend.DockerSandbox(client, config, state=state)


@dataclasses.dataclass
class SandboxBackend:
    """Where episodes get their sandboxes.

    `make(state)` gives one restored from `state`, `release(sandbox)` hands it back when the episode ends (None =
    `sandbox.close()`), `close()` ends whatever the backend keeps (idempotent). With a warm Docker pool (`pool`, a
    `bat_jax.sandbox.pool.SandboxPool`) `make` is the pool's `acquire` and `release` its `release`: the same containers
    serve every episode, reset to a fresh state in between. A context manager (closes on exit, also on exceptions and
    Ctrl-C)."""

    name: str
    make: SandboxFactory
    release: Callable[[Sandbox], None] | None = None
    pool: SandboxPool | None = None

    def close(self) -> None:
        """Removes the pool's containers, if any (never raises)."""
        if self.pool is not None:
            self.pool.close()

    def __enter__(self) -> SandboxBackend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_backend(name: str, concurrency: int = 16, warm: int = 0, acquire_timeout_s: float = 60.0,
                 image: str | None = None) -> SandboxBackend:
    """A sandbox backend by name, fresh per episode or a warm Docker pool.

    Fresh sandboxes come from `backend_factory`; for 'docker' with `warm` > 0 it is a warm pool of `warm` started
    containers reset between episodes. 'local' sandboxes are host directories and are always made fresh (`warm` is
    ignored). `concurrency`: threads calling sandboxes at once (sizes the Docker client's connection pool).
    `acquire_timeout_s`: longest wait, seconds, for an idle pooled sandbox (an episode that gets none is unscored, as
    for a container that cannot start). `image`: as in `backend_factory`.

    Raises:
      BackendUnavailable: Docker backend module, engine or task image missing, or the pool failed to start.
      ValueError: unknown name, or `warm` < 0.
    """
    if warm < 0:
        raise ValueError(f"open_backend: warm (pool size) must be >= 0, got {warm}")
    if name != "docker" or warm == 0:
        return SandboxBackend(name, backend_factory(name, concurrency, image))
    try:
        from bat_jax.sandbox import docker as docker_backend
        from bat_jax.sandbox.pool import SandboxPool

        config = docker_backend.DockerSandboxConfig(
            max_pool_size=max(docker_backend.DockerSandboxConfig.max_pool_size, int(concurrency) + 4), image=image)
        pool = SandboxPool(warm, config)
    except Exception as exc:  # noqa: BLE001 — any failure here means the backend is not usable
        raise BackendUnavailable(f"docker backend unavailable: {type(exc).__name__}: {exc}") from None
    return SandboxBackend(name, lambda state: pool.acquire(state, acquire_timeout_s), pool.release, pool)
