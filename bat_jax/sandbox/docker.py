"""Docker sandbox backend (docker-py against the real engine), implementing `bat_jax.sandbox.types.Sandbox`.

One sandbox = one container from the task image (bat_jax/sandbox/images.py) whose main process is the
in-sandbox executor (sandboxes/task/executor.py). The host keeps one attached stdin/stdout connection to it and
exchanges one JSON line per request, so a tool call costs a round trip plus a fork from a warm Python process
that has already imported numpy/scipy/nibabel/PIL — no `docker exec`, no interpreter start.

Python state: every call runs in a fresh process forked from the warm executor, so Python variables do NOT
persist across calls (files under /workspace do). This keeps the hard timeout exact (the whole process group
is killed) and a crashed or OOM-killed call leaves the sandbox usable. No process started by a call outlives it.

Lifetime: the container is created with StdinOnce, `auto_remove` and an anonymous tmpfs volume at /workspace.
When the host connection closes — `close()`, or the host process dying for any reason, even SIGKILL — the
executor reads EOF and exits, and the engine removes the container and its volume. `close()` also removes it
explicitly. Every container carries the label `bat_jax=1` (see `remove_labelled`).

Trust: receipts are built and kept host-side from the executor's replies; workspace files are read through the
engine (`get_archive`), not through the executor. Agent code runs as the same uid as the executor; the
executor is marked non-dumpable, so agent code cannot ptrace it or read its memory, but it can kill it (the
sandbox then reports itself dead and the pool replaces it).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import posixpath
import socket
import struct
import tarfile
import threading
import time
import uuid

import docker
import docker.errors
import docker.types
import requests

from bat_jax.sandbox.types import (DEFAULT_MAX_OUTPUT_CHARS, DEFAULT_TIMEOUT_S, LANGUAGES, Observation, Receipt,
                                   SandboxState, sha256_hex)

LABEL = "bat_jax"
WORKSPACE = "/workspace"
_EMPTY_SHA = sha256_hex(b"")


class SandboxError(RuntimeError):
    """Infrastructure failure: the engine is unreachable, or a sandbox could not start or died."""


@dataclasses.dataclass(frozen=True)
class DockerSandboxConfig:
    """Isolation and limits of one sandbox container. Every protection is on by default.

    Attributes:
      image: task image tag; None = the content-addressed tag of `images.task_tag()`.
      network_mode: Docker network; 'none' = no network at all.
      cap_drop: Linux capabilities dropped ('ALL').
      read_only_root: mount the image's root file system read-only.
      no_new_privileges: forbid privilege gain through setuid binaries.
      user: 'uid:gid' of the executor and all agent code (65534 = nobody).
      mem_limit: memory limit incl. the tmpfs workspace (Docker size string). 512m is enough for the task
        families' volumes; the paper runs with 4g (`mem_limit='4g'`).
      memswap_limit: memory + swap; equal to mem_limit = no swap.
      pids_limit: max processes/threads in the container (contains fork bombs).
      cpus: CPU limit in cores.
      tmp_size, workspace_size: sizes of the tmpfs /tmp and the tmpfs workspace volume.
      timeout_s: default hard wall-clock limit of one tool call, seconds (REFERENCE.md: 120 s).
      max_output_chars: characters of stdout/stderr returned per call (REFERENCE.md: 2,048).
      start_timeout_s: limit for a container to start and answer its first ping, seconds.
      engine_timeout_s: timeout of engine API calls and of the connection check at start, seconds.
      grace_s: extra seconds the host waits beyond a call's timeout before declaring the sandbox dead.
      inline_restore_max_bytes: states whose tar is at most this many bytes are restored through the executor;
        larger ones through the engine's `put_archive` (measured crossover ~2-3 MB).
      labels: extra container labels (the label `bat_jax=1` is always set).
    """

    image: str | None = None
    network_mode: str = "none"
    cap_drop: tuple[str, ...] = ("ALL",)
    read_only_root: bool = True
    no_new_privileges: bool = True
    user: str = "65534:65534"
    mem_limit: str = "512m"
    memswap_limit: str = "512m"
    pids_limit: int = 256
    cpus: float = 1.0
    tmp_size: str = "64m"
    workspace_size: str = "256m"
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    start_timeout_s: float = 30.0
    engine_timeout_s: float = 10.0
    grace_s: float = 10.0
    inline_restore_max_bytes: int = 2_000_000
    labels: tuple[tuple[str, str], ...] = ()


def connect(config: DockerSandboxConfig | None = None) -> docker.DockerClient:
    """A docker-py client for DOCKER_HOST (default: the local socket), checked with one ping.

    Raises:
      SandboxError: the engine does not answer within `engine_timeout_s` (one clear message, no hang).
    """
    config = config or DockerSandboxConfig()
    try:
        client = docker.from_env(timeout=int(max(1, config.engine_timeout_s)))
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as e:
        raise SandboxError(
            f"Docker engine not reachable ({type(e).__name__}: {e}). Start it with launch/start_dockerd.sh "
            "or point DOCKER_HOST at a running engine.") from e
    return client


def remove_labelled(client: docker.DockerClient, owner: str | None = None) -> int:
    """Force-removes every container labelled `bat_jax=1` (only `owner`'s when given); returns how many."""
    filters = {"label": [f"{LABEL}=1"] + ([f"{LABEL}.owner={owner}"] if owner else [])}
    count = 0
    for c in client.api.containers(all=True, quiet=True, filters=filters):  # no inspect: no race with removal
        try:
            client.api.remove_container(c["Id"], force=True, v=True)
            count += 1
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            if e.status_code != 409:  # 409: the engine is already removing it (auto_remove)
                raise
    return count


def state_to_tar(state: SandboxState) -> bytes:
    """A tar of the state's files (owner 65534, mode 0644, parent dirs 0755), for `put_archive`.

    Raises:
      ValueError: a path that is absolute or leaves the workspace.
    """
    buf = io.BytesIO()
    dirs: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(state.files):
            norm = posixpath.normpath(path)
            if path.startswith("/") or norm.startswith("..") or norm in (".", ""):
                raise ValueError(f"SandboxState.files: path {path!r} must be relative and inside the workspace")
            parent = posixpath.dirname(norm)
            chain = []
            while parent and parent not in dirs:
                chain.append(parent)
                parent = posixpath.dirname(parent)
            for d in reversed(chain):
                dirs.add(d)
                info = tarfile.TarInfo(d)
                info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, 65534, 65534
                tar.addfile(info)
            data = state.files[path]
            info = tarfile.TarInfo(norm)
            info.size, info.mode, info.uid, info.gid = len(data), 0o644, 65534, 65534
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tar_to_files(stream) -> dict[str, bytes]:
    """Regular files of a `get_archive` tar of a directory, keyed by path relative to that directory."""
    buf = io.BytesIO(b"".join(stream))
    files = {}
    with tarfile.open(fileobj=buf, mode="r") as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            parts = member.name.split("/", 1)  # first component is the archived directory's basename
            if len(parts) == 2 and parts[1]:
                files[parts[1]] = tar.extractfile(member).read()
    return files


class _Channel:
    """The attached stdin/stdout stream of a container: write a line, read one line (Docker's 8-byte framing)."""

    def __init__(self, sock):
        self._io = sock
        self._sock = sock._sock if hasattr(sock, "_sock") else sock
        self._buf = b""
        self._line = b""

    def send(self, obj: dict) -> None:
        self._sock.sendall(json.dumps(obj).encode() + b"\n")

    def _read_exact(self, n: int, deadline: float) -> bytes:
        while len(self._buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no reply from the sandbox executor")
            self._sock.settimeout(left)
            chunk = self._sock.recv(max(65536, n - len(self._buf)))
            if not chunk:
                raise EOFError("the sandbox executor closed its output")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def recv(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._line:
            kind, size = struct.unpack(">BxxxL", self._read_exact(8, deadline))
            payload = self._read_exact(size, deadline)
            if kind == 1:
                self._line += payload
        line, self._line = self._line.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        for closer in (lambda: self._sock.shutdown(socket.SHUT_RDWR), self._sock.close, self._io.close):
            try:
                closer()
            except OSError:
                pass


class DockerSandbox:
    """One live sandbox container holding one episode's workspace (implements `types.Sandbox`).

    Thread-safe: calls on one sandbox are serialised; different sandboxes run in parallel.

    Raises (constructor):
      SandboxError: the container did not start or its executor did not answer in `start_timeout_s`.
    """

    def __init__(self, client: docker.DockerClient, config: DockerSandboxConfig | None = None,
                 state: SandboxState | None = None, owner: str = "", image: str | None = None):
        self.config = config or DockerSandboxConfig()
        self._client = client
        self._lock = threading.RLock()
        self._receipts: list[Receipt] = []
        self._submitted: str | None = None
        self._env: dict[str, str] = {}
        self._dead = ""
        self._closed = False
        self._channel = None
        self.container_id = ""
        self._start(image or self.config.image, owner)
        if state is not None:
            self.load_state(state)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def _start(self, image: str | None, owner: str) -> None:
        cfg = self.config
        if image is None:
            from bat_jax.sandbox import images  # local import: only needed when no tag is given
            image = images.task_tag()
        api = self._client.api
        host_config = api.create_host_config(
            network_mode=cfg.network_mode, cap_drop=list(cfg.cap_drop), read_only=cfg.read_only_root,
            security_opt=["no-new-privileges"] if cfg.no_new_privileges else None,
            mem_limit=cfg.mem_limit, memswap_limit=cfg.memswap_limit, pids_limit=cfg.pids_limit,
            nano_cpus=int(cfg.cpus * 1e9), init=True, auto_remove=True,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={cfg.tmp_size},mode=1777"},
            mounts=[docker.types.Mount(
                WORKSPACE, None, type="volume",
                driver_config=docker.types.DriverConfig("local", {
                    "type": "tmpfs", "device": "tmpfs",
                    "o": f"size={cfg.workspace_size},uid=65534,gid=65534,mode=0755,nosuid,nodev"}))],
            log_config=docker.types.LogConfig(type="none"))
        labels = {LABEL: "1", f"{LABEL}.owner": owner or "none", **dict(cfg.labels)}
        try:
            created = api.create_container(
                image, user=cfg.user, stdin_open=True, detach=False, tty=False, labels=labels,
                working_dir=WORKSPACE, host_config=host_config, network_disabled=cfg.network_mode == "none")
            self.container_id = created["Id"]
            sock = api.attach_socket(self.container_id, params={"stdin": 1, "stdout": 1, "stderr": 1,
                                                                "stream": 1})
            self._channel = _Channel(sock)
            api.start(self.container_id)
            self._channel.send({"op": "ping"})
            reply = self._channel.recv(cfg.start_timeout_s)
            if not reply.get("ok"):
                raise SandboxError(f"sandbox executor failed to start: {reply.get('error')}")
        except (docker.errors.DockerException, requests.exceptions.RequestException, OSError, EOFError,
                TimeoutError, ValueError) as e:
            self.close()
            raise SandboxError(f"could not start a sandbox from image {image!r}: {type(e).__name__}: {e}") from e

    def close(self) -> None:
        """Stops and removes the container and its workspace volume (idempotent; never raises)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._channel is not None:
                self._channel.close()
            if self.container_id:
                try:
                    self._client.api.remove_container(self.container_id, force=True, v=True)
                except (docker.errors.DockerException, requests.exceptions.RequestException):
                    pass

    def __enter__(self) -> DockerSandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        """False once closed or once the executor died or stopped answering."""
        return not self._closed and not self._dead

    def _request(self, req: dict, timeout_s: float) -> dict:
        if not self.alive:
            raise SandboxError(self._dead or "sandbox is closed")
        try:
            self._channel.send(req)
            return self._channel.recv(timeout_s)
        except (OSError, EOFError, TimeoutError, ValueError) as e:
            self._dead = f"sandbox executor died or stopped answering ({type(e).__name__}: {e})"
            raise SandboxError(self._dead) from e

    # -- tools ---------------------------------------------------------------------------------------------
    def execute_code(self, language: str, code: str, timeout_s: float | None = None) -> Observation:
        """Runs `code` ('python' or 'bash') in /workspace; never raises for agent mistakes.

        Args:
          timeout_s: hard wall-clock limit in seconds (default `config.timeout_s`); output never extends it.
        Returns:
          Observation with stdout/stderr cut to `config.max_output_chars` (head + marker + tail), exit_code
          (128+signal when killed, None on timeout or infrastructure error), duration_s (host wall clock).
        """
        timeout = self.config.timeout_s if timeout_s is None else float(timeout_s)
        with self._lock:
            started = time.time()
            t0 = time.monotonic()
            if language not in LANGUAGES:
                reply = {"error": f"unknown language {language!r}; use one of {', '.join(LANGUAGES)}",
                         "exit_code": None}
            else:
                req = {"op": "exec", "language": language, "code": code, "timeout_s": timeout,
                       "max_chars": self.config.max_output_chars, "env": self._env}
                try:
                    reply = self._request(req, timeout + self.config.grace_s)
                except SandboxError as e:
                    reply = {"error": str(e), "exit_code": None}
            obs = Observation(
                stdout=reply.get("stdout", ""), stderr=reply.get("stderr", ""), exit_code=reply.get("exit_code"),
                duration_s=time.monotonic() - t0, timed_out=bool(reply.get("timed_out", False)),
                truncated=bool(reply.get("truncated", False)), error=reply.get("error", ""))
            self._record("execute_code", language, code, obs, started,
                         reply.get("stdout_sha256", _EMPTY_SHA), reply.get("stderr_sha256", _EMPTY_SHA))
            return obs

    def submit(self, path: str) -> Observation:
        """Marks workspace-relative `path` (an existing regular file) as the final artefact."""
        with self._lock:
            started = time.time()
            t0 = time.monotonic()
            rel = posixpath.normpath(path.removeprefix(WORKSPACE + "/")) if path else ""
            try:
                self.read_file(rel)
                self._submitted = rel
                obs = Observation(stdout=f"submitted {rel}", stderr="", exit_code=0,
                                  duration_s=time.monotonic() - t0)
            except (FileNotFoundError, ValueError, SandboxError) as e:
                obs = Observation(stdout="", stderr="", exit_code=None, duration_s=time.monotonic() - t0,
                                  error=f"cannot submit {path!r}: {e}")
            self._record("submit", "", path, obs, started, sha256_hex(obs.stdout), _EMPTY_SHA)
            return obs

    def _record(self, tool, language, code, obs, started, out_sha, err_sha) -> None:
        self._receipts.append(Receipt(
            index=len(self._receipts), tool=tool, language=language, code=code, exit_code=obs.exit_code,
            stdout_sha256=out_sha, stderr_sha256=err_sha, started_at=started, finished_at=time.time(),
            timed_out=obs.timed_out, stdout=obs.stdout))

    def receipts(self) -> list[Receipt]:
        """Host-side copies of every call's receipt, in order."""
        with self._lock:
            return list(self._receipts)

    def submitted(self) -> str | None:
        return self._submitted

    # -- files ---------------------------------------------------------------------------------------------
    def _archive(self, path: str) -> dict[str, bytes]:
        try:
            stream, _ = self._client.api.get_archive(self.container_id, path)
            return tar_to_files(stream)
        except docker.errors.NotFound as e:
            raise FileNotFoundError(path) from e
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise SandboxError(f"cannot read {path} from the sandbox: {e}") from e

    def read_file(self, path: str) -> bytes:
        """Workspace file bytes, read through the engine. Raises FileNotFoundError (also for directories)."""
        rel = posixpath.normpath(path)
        if rel.startswith("/") or rel.startswith(".."):
            raise ValueError(f"path {path!r} is outside the workspace")
        return self._single_file(rel)

    def _single_file(self, rel: str) -> bytes:
        try:
            stream, _ = self._client.api.get_archive(self.container_id, posixpath.join(WORKSPACE, rel))
            data = b"".join(stream)
        except docker.errors.NotFound as e:
            raise FileNotFoundError(rel) from e
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise SandboxError(f"cannot read {rel} from the sandbox: {e}") from e
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            member = tar.next()
            if member is None or not member.isfile():
                raise FileNotFoundError(f"{rel} is not a regular file")
            return tar.extractfile(member).read()

    def export_state(self) -> SandboxState:
        """The current workspace (regular files only) and environment as a SandboxState (a snapshot)."""
        with self._lock:
            return SandboxState(files=self._archive(WORKSPACE + "/."), env=dict(self._env))

    def list_files(self) -> list[str]:
        return sorted(self.export_state().files)

    def load_state(self, state: SandboxState) -> None:
        """Replaces the workspace and environment with `state`.

        The tar is built here from `state` (paths validated). Up to `config.inline_restore_max_bytes` it goes
        through the executor in the same round trip as the wipe (~15 ms for small states); larger states are
        written by the engine's `put_archive` after the wipe (a fixed ~0.1 s, then faster per byte).
        Raises:
          SandboxError: the sandbox is dead or the write failed (e.g. the workspace size limit).
          ValueError: a bad path in `state.files`.
        """
        data = state_to_tar(state) if state.files else b""
        inline = len(data) <= self.config.inline_restore_max_bytes
        with self._lock:
            if data and inline:
                req = {"op": "load", "tar_b64": base64.b64encode(data).decode("ascii")}
            else:
                req = {"op": "wipe"}
            reply = self._request(req, self.config.start_timeout_s)
            if not reply.get("ok"):
                raise SandboxError(f"workspace restore failed: {reply.get('error')}")
            if data and not inline:
                try:
                    self._client.api.put_archive(self.container_id, WORKSPACE, data)
                except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
                    raise SandboxError(f"cannot restore the workspace: {e}") from e
            self._env = dict(state.env)

    def reset(self, state: SandboxState | None = None) -> None:
        """Starts a new episode: clears receipts and the submission, then loads `state` (or an empty one)."""
        with self._lock:
            self._receipts = []
            self._submitted = None
            self.load_state(state or SandboxState(files={}))


def new_owner() -> str:
    """A fresh owner id for the `bat_jax.owner` label (one per pool / process)."""
    return uuid.uuid4().hex[:12]
