"""Docker sandbox backend (docker-py against the real engine), implementing `bat_jax.sandbox.types.Sandbox`.

Details: docs/design.md.
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

from bat_jax.sandbox.evidence import EvidenceLimits, gather_files
from bat_jax.sandbox.types import (DEFAULT_MAX_OUTPUT_CHARS, DEFAULT_TIMEOUT_S, LANGUAGES, FileTooLarge, Observation,
                                   Receipt, SandboxState, sha256_hex, workspace_relpath)

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
      user: 'uid:gid' of the executor (root inside the container, with only `cap_add`); agent code always runs
        as `agent_uid`.
      cap_add: the capabilities the executor keeps (it needs them to run calls as another uid, kill them and
        reset the writable mounts); agent calls have none.
      agent_uid: uid = gid every agent call runs as (65534 = nobody).
      require_separation: refuse to start unless the executor reports that agent calls run as another uid
        (an executor started as `agent_uid` could be killed or impersonated by agent code).
      mem_limit: memory limit incl. the tmpfs workspace (Docker size string). 512m is enough for the task
        families' volumes; the paper runs with 4g (`mem_limit='4g'`).
      memswap_limit: memory + swap; equal to mem_limit = no swap.
      pids_limit: max processes/threads in the container (contains fork bombs).
      cpus: CPU limit in cores.
      tmp_size, workspace_size: sizes of the tmpfs /tmp (and /dev/shm) and the tmpfs workspace volume.
      max_inodes: files + directories each of /workspace, /tmp and /dev/shm may hold (tmpfs `nr_inodes`): the
        kernel memory of a million empty files would otherwise be pinned in the container's memory limit.
      timeout_s: default hard wall-clock limit of one tool call, seconds (120 s, the released code's).
      max_output_chars: characters of stdout/stderr returned per call (2,048, the released code's).
      start_timeout_s: limit for a container to start and answer its first ping, seconds.
      engine_timeout_s: timeout of engine API calls and of the connection check at start, seconds.
      max_pool_size: HTTP connections the docker-py client keeps to the engine; at least the number of threads
        that call sandboxes at once (rollout concurrency), else urllib3 warns 'connection pool is full' and
        drops connections.
      grace_s: extra seconds the host waits beyond a call's timeout before declaring the sandbox dead.
      inline_restore_max_bytes: states whose tar is at most this many bytes are restored through the executor;
        larger ones through the engine's `put_archive` (measured crossover ~2-3 MB).
      labels: extra container labels (the label `bat_jax=1` is always set).
      evidence: caps on reading the workspace back to the host (`list_files`, `export_state`).
    """

    image: str | None = None
    network_mode: str = "none"
    cap_drop: tuple[str, ...] = ("ALL",)
    read_only_root: bool = True
    no_new_privileges: bool = True
    user: str = "0:0"
    cap_add: tuple[str, ...] = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETUID", "SETGID")
    agent_uid: int = 65534
    require_separation: bool = True
    mem_limit: str = "512m"
    memswap_limit: str = "512m"
    pids_limit: int = 256
    cpus: float = 1.0
    tmp_size: str = "64m"
    workspace_size: str = "256m"
    max_inodes: int = 32768
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    start_timeout_s: float = 30.0
    engine_timeout_s: float = 10.0
    max_pool_size: int = 32
    grace_s: float = 10.0
    inline_restore_max_bytes: int = 2_000_000
    labels: tuple[tuple[str, str], ...] = ()
    evidence: EvidenceLimits = EvidenceLimits()


def connect(config: DockerSandboxConfig | None = None) -> docker.DockerClient:
    """A docker-py client for DOCKER_HOST (default: the local socket), checked with one ping.

    Raises:
      SandboxError: the engine does not answer within `engine_timeout_s` (one clear message, no hang).
    """
    config = config or DockerSandboxConfig()
    try:
        client = docker.from_env(timeout=int(max(1, config.engine_timeout_s)), max_pool_size=config.max_pool_size)
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
            try:
                norm = workspace_relpath(path)
            except ValueError as exc:
                raise ValueError(f"SandboxState.files: {exc}") from None
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


class _Channel:
    """The attached stdin/stdout stream of a container: write a request line, read its reply line.

    Lines use Docker's 8-byte framing. Requests get increasing ids; `request` returns only the reply carrying its id and
    drops (and counts in `stray`) any other line — a stale reply of a request the host gave up on, or garbage."""

    def __init__(self, sock):
        self._io = sock
        self._sock = sock._sock if hasattr(sock, "_sock") else sock
        self._buf = bytearray()
        self._line = bytearray()
        self._next_id = 0
        self.stray = 0

    def send(self, obj: dict) -> None:
        self._sock.sendall(json.dumps(obj).encode() + b"\n")

    def request(self, obj: dict, timeout_s: float) -> dict:
        """Sends `obj` with a fresh id and returns the reply with that id (waits at most `timeout_s`)."""
        self._next_id += 1
        ident = self._next_id
        self.send({**obj, "id": ident})
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                reply = self.recv(max(0.0, deadline - time.monotonic()))
            except ValueError:  # not JSON: not a reply of ours
                self.stray += 1
                continue
            if isinstance(reply, dict) and reply.get("id") == ident:
                return reply
            self.stray += 1

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
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def recv(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        scanned = 0
        while (end := self._line.find(b"\n", scanned)) < 0:
            scanned = len(self._line)
            kind, size = struct.unpack(">BxxxL", self._read_exact(8, deadline))
            payload = self._read_exact(size, deadline)
            if kind == 1:
                self._line += payload
        line = bytes(self._line[:end])
        del self._line[:end + 1]
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
        self._fault = ""
        self._agent_ran = False
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
            network_mode=cfg.network_mode, cap_drop=list(cfg.cap_drop), cap_add=list(cfg.cap_add) or None,
            read_only=cfg.read_only_root,
            security_opt=["no-new-privileges"] if cfg.no_new_privileges else None,
            mem_limit=cfg.mem_limit, memswap_limit=cfg.memswap_limit, pids_limit=cfg.pids_limit,
            nano_cpus=int(cfg.cpus * 1e9), init=True, auto_remove=True,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={cfg.tmp_size},nr_inodes={cfg.max_inodes},mode=1777",
                   "/dev/shm": f"rw,nosuid,nodev,noexec,size={cfg.tmp_size},nr_inodes={cfg.max_inodes},mode=1777"},
            mounts=[docker.types.Mount(
                WORKSPACE, None, type="volume",
                driver_config=docker.types.DriverConfig("local", {
                    "type": "tmpfs", "device": "tmpfs",
                    "o": f"size={cfg.workspace_size},nr_inodes={cfg.max_inodes},uid=65534,gid=65534,mode=0755,"
                         "nosuid,nodev"}))],
            log_config=docker.types.LogConfig(type="none"))
        labels = {LABEL: "1", f"{LABEL}.owner": owner or "none", **dict(cfg.labels)}
        try:
            created = api.create_container(
                image, user=cfg.user, stdin_open=True, detach=False, tty=False, labels=labels,
                environment={"BAT_AGENT_UID": str(cfg.agent_uid), "BAT_AGENT_GID": str(cfg.agent_uid)},
                working_dir=WORKSPACE, host_config=host_config, network_disabled=cfg.network_mode == "none")
            self.container_id = created["Id"]
            sock = api.attach_socket(self.container_id, params={"stdin": 1, "stdout": 1, "stderr": 1,
                                                                "stream": 1})
            self._channel = _Channel(sock)
            api.start(self.container_id)
            reply = self._channel.request({"op": "ping"}, cfg.start_timeout_s)
            if not reply.get("ok"):
                raise SandboxError(f"sandbox executor failed to start: {reply.get('error')}")
            if reply.get("trace", "ok") != "ok":  # no file evidence would make every receipt item fail
                raise SandboxError(f"sandbox executor cannot observe file events: {reply.get('trace')}")
            if cfg.require_separation and not reply.get("separated"):
                raise SandboxError(f"image {image!r}: the executor does not run agent calls as another uid "
                                   "(rebuild the image with launch/build_images.sh, or run it as root)")
        except (docker.errors.DockerException, requests.exceptions.RequestException, OSError, EOFError,
                TimeoutError, ValueError) as e:
            self._fault = "infra"
            self.close()
            if isinstance(e, docker.errors.ImageNotFound):  # a checkout whose image tag was never built here
                raise SandboxError(f"sandbox image {image!r} is missing; build it with `bash launch/build_images.sh` "
                                   "(its tag follows the image's contents, so a new checkout may need a new one)") from e
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

    @property
    def fault(self) -> str:
        """Who a failure of this sandbox is charged to: '' (none), 'agent' or 'infra'.

        'agent': it died, hung or stopped answering after the agent's code ran: scored as the agent's failure. 'infra':
        it could not start, the engine is unreachable, it failed before any agent code ran, or it was called after it
        was closed: unscored. Read it through `types.fault_of`."""
        return self._fault

    @property
    def failure(self) -> str:
        """Text of the failure ('' when none)."""
        return self._dead

    @property
    def stray_replies(self) -> int:
        """Lines on the reply channel that answered no pending request (dropped)."""
        return self._channel.stray if self._channel is not None else 0

    def _engine_ok(self) -> bool:
        try:
            self._client.api.ping()
            return True
        except (docker.errors.DockerException, requests.exceptions.RequestException, OSError):
            return False

    def _request(self, req: dict, timeout_s: float) -> dict:
        if not self.alive:
            if not self._dead:  # used after the host closed it: the host's doing, never the agent's
                self._dead, self._fault = "sandbox is closed", "infra"
            raise SandboxError(self._dead)
        if req.get("op") == "exec":
            self._agent_ran = True
        try:
            return self._channel.request(req, timeout_s)
        except (OSError, EOFError, TimeoutError, ValueError) as e:
            self._dead = f"sandbox executor died or stopped answering ({type(e).__name__}: {e})"
            self._fault = "agent" if self._agent_ran and self._engine_ok() else "infra"
            if self._fault == "agent":
                self._dead += " after the agent's code ran"
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
                       "max_chars": self.config.max_output_chars, "env": self._env,
                       "digest_max_bytes": self.config.evidence.max_file_bytes}
                try:
                    reply = self._request(req, timeout + self.config.grace_s)
                except SandboxError as e:
                    reply = {"error": str(e), "exit_code": None}
            obs = Observation(
                stdout=reply.get("stdout", ""), stderr=reply.get("stderr", ""), exit_code=reply.get("exit_code"),
                duration_s=time.monotonic() - t0, timed_out=bool(reply.get("timed_out", False)),
                truncated=bool(reply.get("truncated", False)), error=reply.get("error", ""))
            self._record("execute_code", language, code, obs, started,
                         reply.get("stdout_sha256", _EMPTY_SHA), reply.get("stderr_sha256", _EMPTY_SHA),
                         tuple(reply.get("reads", ())), tuple(reply.get("writes", ())),
                         bool(reply.get("trace_complete", False)),
                         tuple((str(p), str(d)) for p, d in reply.get("write_digests", ())))
            return obs

    def submit(self, path: str) -> Observation:
        """Marks workspace-relative `path` (an existing regular file) as the final artefact."""
        with self._lock:
            started = time.time()
            t0 = time.monotonic()
            try:
                rel = workspace_relpath(path.removeprefix(WORKSPACE + "/"))
                self._stat_file(rel)
                self._submitted = rel
                obs = Observation(stdout=f"submitted {rel}", stderr="", exit_code=0,
                                  duration_s=time.monotonic() - t0)
            except (FileNotFoundError, ValueError, SandboxError) as e:
                obs = Observation(stdout="", stderr="", exit_code=None, duration_s=time.monotonic() - t0,
                                  error=f"cannot submit {path!r}: {e}")
            self._record("submit", "", path, obs, started, sha256_hex(obs.stdout), _EMPTY_SHA)
            return obs

    def _record(self, tool, language, code, obs, started, out_sha, err_sha, reads=(), writes=(),
                trace_complete=False, write_digests=()) -> None:
        self._receipts.append(Receipt(
            index=len(self._receipts), tool=tool, language=language, code=code, exit_code=obs.exit_code,
            stdout_sha256=out_sha, stderr_sha256=err_sha, started_at=started, finished_at=time.time(),
            timed_out=obs.timed_out, stdout=obs.stdout, reads=reads, writes=writes,
            trace_complete=trace_complete, write_digests=write_digests))

    def receipts(self) -> list[Receipt]:
        """Host-side copies of every call's receipt, in order."""
        with self._lock:
            return list(self._receipts)

    def submitted(self) -> str | None:
        return self._submitted

    # -- files ---------------------------------------------------------------------------------------------
    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Workspace file bytes, read by the executor with no symlink followed anywhere in the path.

        Raises:
          FileNotFoundError: missing, a directory, a special file, or a symlink in any component.
          FileTooLarge: more than `max_bytes` (default `config.evidence.max_file_bytes`) bytes; checked before
            any content is read.
          ValueError: a path outside the workspace.
          SandboxError: the sandbox is dead.
        """
        limit = self.config.evidence.max_file_bytes if max_bytes is None else int(max_bytes)
        workspace_relpath(path)
        files, too_large = self.read_files([path], limit, limit)
        if path in too_large:
            raise FileTooLarge(f"{path}: {too_large[path]} bytes, over the {limit}-byte evidence cap")
        if path not in files:
            raise FileNotFoundError(f"no such regular file in the workspace: {path!r}")
        return files[path]

    def read_files(self, paths: list[str], max_file_bytes: int, max_total_bytes: int
                   ) -> tuple[dict[str, bytes], dict[str, int]]:
        """Several workspace files in few round trips (batches of at most `_READ_BATCH_BYTES`).

        Returns:
          (files: path → bytes, too_large: path → size in bytes); paths that are missing, not regular files, or
          not workspace-relative (`types.workspace_relpath`) are in neither.
        Raises:
          SandboxError: the sandbox is dead.
        """
        files: dict[str, bytes] = {}
        too_large: dict[str, int] = {}
        pending, left, retried = [p for p in paths if _inside(p)], int(max_total_bytes), set()
        with self._lock:
            while pending:
                batch, pending = pending[:_READ_BATCH_FILES], pending[_READ_BATCH_FILES:]
                budget = min(left, max(_READ_BATCH_BYTES, int(max_file_bytes)))
                req = {"op": "read", "paths": batch, "max_file_bytes": int(max_file_bytes),
                       "max_total_bytes": budget}
                reply = self._request(req, self.config.evidence.max_seconds + self.config.grace_s)
                if not reply.get("ok"):
                    raise SandboxError(f"reading workspace files failed: {reply.get('error')}")
                for path in batch:
                    status, value = reply["files"].get(path, ["missing", ""])
                    if status == "ok":
                        files[path] = base64.b64decode(value)
                        left -= len(files[path])
                    elif status == "too_large":
                        size = int(value)
                        if size <= min(max_file_bytes, left) and path not in retried:
                            retried.add(path)  # over this request's share only: once more, in a later one
                            pending.append(path)
                        else:
                            too_large[path] = size
        return files, too_large

    def _stat_file(self, rel: str) -> int:
        """Size of a regular workspace file (no symlink followed). Raises FileNotFoundError, ValueError."""
        files, too_large = self.read_files([rel], 0, 0)
        if rel in too_large:
            return too_large[rel]
        if rel in files:
            return 0
        raise FileNotFoundError(f"no such regular file in the workspace: {rel!r}")

    def export_state(self) -> SandboxState:
        """The current workspace (regular files within `config.evidence`) and environment as a SandboxState."""
        with self._lock:
            files, _ = gather_files(self, self.config.evidence)
            return SandboxState(files=files, env=dict(self._env))

    def list_files(self) -> list[str]:
        """Regular workspace files (symlinks never followed), sorted, at most `config.evidence.max_files`.

        They are listed by the executor within `config.evidence.max_seconds`."""
        lim = self.config.evidence
        reply = self._request({"op": "list", "max_files": lim.max_files, "max_seconds": lim.max_seconds},
                              lim.max_seconds + self.config.grace_s)
        if not reply.get("ok"):
            raise SandboxError(f"listing the workspace failed: {reply.get('error')}")
        return sorted(path for path, _ in reply.get("files", []))

    def fingerprint(self) -> dict:
        """Everything an episode could leave behind (writable mounts, processes, IPC objects).

        A reset sandbox and a fresh one give equal fingerprints (see sandboxes/task/executor.py)."""
        with self._lock:
            reply = self._request({"op": "fingerprint"}, self.config.start_timeout_s)
            if not reply.get("ok"):
                raise SandboxError(f"fingerprint failed: {reply.get('error')}")
            return {k: v for k, v in reply.items() if k not in ("ok", "id")}

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
        """Starts a new episode as in a fresh container.

        It kills every process, empties every writable mount, removes IPC objects, clears receipts, the submission and
        the failure accounting, then loads `state` (or an empty workspace). Raises SandboxError when the sandbox is
        dead."""
        with self._lock:
            self._receipts = []
            self._submitted = None
            self._agent_ran = False
            self.load_state(state or SandboxState(files={}))


def _inside(path) -> bool:
    try:
        workspace_relpath(path)
        return True
    except ValueError:
        return False


#: Files and bytes of one `read` request to the executor (bounded reply lines on the channel).
_READ_BATCH_FILES = 256
_READ_BATCH_BYTES = 16 * 2**20


def new_owner() -> str:
    """A fresh owner id for the `bat_jax.owner` label (one per pool / process)."""
    return uuid.uuid4().hex[:12]
