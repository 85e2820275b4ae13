"""A warm pool of pre-started Docker sandboxes, reset between rollouts, safe under concurrency.

    with SandboxPool(size=8) as pool:
        with pool.sandbox(state) as sb:          # a warm sandbox, workspace = state, receipts empty
            sb.execute_code("python", "print(1)")

Details: docs/design.md.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Iterator

import docker

from bat_jax.sandbox.docker import (DockerSandbox, DockerSandboxConfig, SandboxError, connect, new_owner,
                                    remove_labelled)
from bat_jax.sandbox.types import SandboxState


def resolve_image(client: docker.DockerClient, config: DockerSandboxConfig) -> str:
    """The image tag to run (config.image or the content-addressed task tag), checked to exist.

    Raises:
      SandboxError: the image is missing (names the build command).
    """
    from bat_jax.sandbox import images  # local import keeps `docker.py` free of the build machinery

    tag = config.image or images.task_tag()
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound as e:
        raise SandboxError(f"sandbox image {tag} is missing; build it with launch/build_images.sh") from e
    return tag


class SandboxPool:
    """`size` warm sandboxes shared by threads. Thread-safe.

    Args:
      size: number of sandboxes kept started (≥ 1).
      config: isolation and limits of every sandbox.
      client: a docker-py client; default `connect(config)` (raises SandboxError when the engine is down).
    Raises:
      SandboxError: engine unreachable, image missing, or a sandbox failed to start.
      ValueError: size < 1.
    """

    def __init__(self, size: int, config: DockerSandboxConfig | None = None,
                 client: docker.DockerClient | None = None):
        if size < 1:
            raise ValueError(f"SandboxPool: size must be >= 1, got {size}")
        self.config = config or DockerSandboxConfig()
        self.size = size
        self._client = client or connect(self.config)
        self.image = resolve_image(self._client, self.config)
        self.owner = new_owner()
        self._idle: queue.Queue[DockerSandbox] = queue.Queue()
        self._members: set[DockerSandbox] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.replaced = 0
        atexit.register(self.close)
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=min(size, 8)) as ex:
                for sb in ex.map(lambda _: self._new(), range(size)):
                    self._idle.put(sb)
        except BaseException:
            self.close()
            raise

    def _new(self) -> DockerSandbox:
        sb = DockerSandbox(self._client, self.config, owner=self.owner, image=self.image)
        with self._lock:
            if self._closed:
                sb.close()
                raise SandboxError("sandbox pool is closed")
            self._members.add(sb)
        return sb

    def _discard(self, sb: DockerSandbox) -> None:
        with self._lock:
            self._members.discard(sb)
        sb.close()

    def acquire(self, state: SandboxState | None = None, timeout_s: float | None = None) -> DockerSandbox:
        """An idle sandbox reset to `state` (empty workspace when None), with empty receipts.

        Blocks until one is idle (at most `timeout_s` seconds; None = forever).
        Raises:
          SandboxError: the pool is closed, no sandbox became idle in time, or a replacement failed to start.
        """
        if self._closed:
            raise SandboxError("sandbox pool is closed")
        try:
            sb = self._idle.get(timeout=timeout_s)
        except queue.Empty as e:
            raise SandboxError(f"no idle sandbox within {timeout_s} s (pool size {self.size})") from e
        for attempt in range(2):
            try:
                if not sb.alive:
                    raise SandboxError("dead sandbox")
                sb.reset(state)
                return sb
            except SandboxError:
                self._discard(sb)
                self.replaced += 1
                try:
                    sb = self._new()
                except SandboxError:
                    if attempt:
                        raise
        self._idle.put(sb)  # two resets failed: keep the fresh replacement for the next caller
        raise SandboxError("could not reset a sandbox twice in a row")

    def release(self, sb: DockerSandbox) -> None:
        """Returns `sb` to the pool with a wiped workspace; a dead or unresettable one is replaced."""
        if self._closed:
            self._discard(sb)
            return
        try:
            if not sb.alive:
                raise SandboxError("dead sandbox")
            sb.reset()
        except SandboxError:
            self._discard(sb)
            self.replaced += 1
            try:
                sb = self._new()
            except SandboxError:
                return  # the pool shrinks by one; acquire still serves the others
        self._idle.put(sb)

    @contextlib.contextmanager
    def sandbox(self, state: SandboxState | None = None, timeout_s: float | None = None) -> Iterator[DockerSandbox]:
        """Context manager: `acquire(state)` then `release` (also on exceptions)."""
        sb = self.acquire(state, timeout_s)
        try:
            yield sb
        finally:
            self.release(sb)

    def close(self) -> None:
        """Removes every container of this pool (idempotent; never raises)."""
        with self._lock:
            self._closed = True
            members, self._members = list(self._members), set()
        for sb in members:
            sb.close()
        try:
            remove_labelled(self._client, self.owner)
        except Exception:  # noqa: BLE001 - best effort at shutdown; containers also auto-remove
            pass
        atexit.unregister(self.close)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
