"""A local subprocess sandbox backend — FOR TESTS AND DEVELOPMENT ONLY.

Details: docs/design.md.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from bat_jax.sandbox.file_trace import FileTrace, TraceUnavailable, digest_files
from bat_jax.sandbox.types import (
    DEFAULT_MAX_OUTPUT_CHARS,
    DEFAULT_TIMEOUT_S,
    LANGUAGES,
    FileTooLarge,
    Observation,
    Receipt,
    SandboxState,
    sha256_hex,
    workspace_relpath,
)

#: Bytes of a written file hashed into its receipt's `write_digests` at most (the evidence cap's default).
DIGEST_MAX_BYTES = 64 << 20


def _safe_relpath(path: str) -> PurePosixPath:
    """A workspace-relative POSIX path (`types.workspace_relpath`).

    Raises ValueError on absolute paths, '..' parts, NUL bytes or non-strings."""
    return PurePosixPath(workspace_relpath(path))


#: The supervisor of one call (`call_supervisor.py` beside this module), run as a script by `run_with_deadline`.
SUPERVISOR = str(Path(__file__).with_name("call_supervisor.py"))

#: unshare forms tried, in order, for the "pidns" mode (the first is only tried as root).
_UNSHARE_FORMS = (("--pid",), ("--user", "--map-current-user", "--pid"), ("--user", "--map-root-user", "--pid"))
_MODE_LOCK = threading.Lock()
_MODE: list[tuple[str, tuple[str, ...]]] = []


def isolation_mode() -> tuple[str, tuple[str, ...]]:
    """("pidns", unshare argv prefix) when a fresh PID namespace can be made here, else ("reaper", ()).

    Probed once per process by running `unshare <form> --fork --kill-child true` for each form of
    `_UNSHARE_FORMS` (5 s limit each); the result is cached.
    """
    with _MODE_LOCK:
        if not _MODE:
            mode: tuple[str, tuple[str, ...]] = ("reaper", ())
            forms = _UNSHARE_FORMS if os.geteuid() == 0 else _UNSHARE_FORMS[1:]
            for form in forms:
                argv = ("unshare", *form, "--fork", "--kill-child")
                try:
                    ok = subprocess.run([*argv, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, timeout=5).returncode == 0
                except (OSError, subprocess.SubprocessError):
                    ok = False
                if ok:
                    mode = ("pidns", argv)
                    break
            _MODE.append(mode)
        return _MODE[0]


class Completed(NamedTuple):
    """What one supervised call left.

    Exit code (None when it timed out or its status was lost), raw stdout and stderr bytes (all of them, up to the main
    process's exit or the deadline), timed_out, and an error text ('' normally; set when the supervisor died without
    reporting a status)."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool
    error: str = ""


#: Seconds the host waits for the supervisor to finish its clean-up after the deadline, and for the output
#: pipes to close after the supervisor exits, before it kills the supervisor's process group itself.
_GRACE_S = 2.0


def _group_members(pgid: int) -> list[int]:
    """Host PIDs of the live (not zombie) processes of process group `pgid`, from /proc."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            state, _ppid, pgrp = stat[stat.rindex(b")") + 2:].split()[:3]
            if int(pgrp) == pgid and state not in (b"Z", b"X"):
                found.append(int(name))
    return found


def _wait_group_dead(pgid: int, timeout_s: float) -> None:
    """Waits (at most `timeout_s` seconds) until no live process is left in group `pgid`, re-sending SIGKILL."""
    end = time.monotonic() + timeout_s
    while _group_members(pgid) and time.monotonic() < end:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            return
        time.sleep(0.005)


def run_with_deadline(argv: list[str], *, cwd: str | os.PathLike, env: dict[str, str], timeout_s: float,
                      mode: str | None = None) -> Completed:
    """Runs `argv` (stdin /dev/null) under the call supervisor until its main process exits or the deadline.

    It returns when the main process exits or at `timeout_s` seconds (wall clock), with every other process of the call
    killed either way.

    Args:
      argv: the command; cwd, env: its working directory and complete environment.
      timeout_s: wall-clock limit, seconds; at the limit the call is killed and `timed_out` is True.
      mode: "pidns" or "reaper" (see the module docstring); None = `isolation_mode()`.
    Raises:
      ValueError: `mode` is "pidns" but no `unshare` form works here, or an unknown mode.
    """
    found, prefix = isolation_mode()
    if mode is None:
        mode = found
    elif mode not in ("pidns", "reaper") or (mode == "pidns" and found != "pidns"):
        raise ValueError(f"mode {mode!r}: expected 'reaper' or, where unshare works (here: {found!r}), 'pidns'")
    deadline = limit = time.monotonic() + float(timeout_s)
    status_r, status_w = os.pipe()
    cmd = [sys.executable, "-I", "-S", SUPERVISOR, str(status_w), *argv]
    if mode == "pidns":
        cmd = [*prefix, *cmd]
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, pass_fds=(status_w,), start_new_session=True)
    except BaseException:
        os.close(status_r)
        raise
    finally:
        os.close(status_w)
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs = {out_fd: bytearray(), err_fd: bytearray(), status_r: bytearray()}
    open_fds = set(bufs)
    poller = select.poll()  # not select(): fds of a large host process may be past FD_SETSIZE
    for fd in open_fds:
        poller.register(fd, select.POLLIN)
    timed_out = stopped = False  # stopped: the host asked the supervisor to kill the call
    try:
        while open_fds:
            now = time.monotonic()
            if now >= limit:
                if status_r not in open_fds or stopped:
                    # the supervisor is gone (killed, by the agent's code in "reaper" mode) or stuck, and stray
                    # writers hold the pipes: stop reading; the process group is killed below
                    timed_out = timed_out or (now >= deadline and bufs[status_r].count(b"\n") < 2)
                    break
                timed_out = stopped = True  # the main process has not ended: the supervisor kills the call
                head = bytes(bufs[status_r])
                try:
                    os.kill(int(head[:head.index(b"\n")]), signal.SIGTERM)
                except (ValueError, OSError):  # no PID reported yet, so nothing started: kill it outright
                    proc.kill()  # (in "pidns" mode unshare --kill-child then kills the namespace init)
                limit = now + _GRACE_S
                continue
            for fd, _ in poller.poll(max(1, int(1000 * (limit - now)))):
                data = os.read(fd, 65536)
                bufs[fd] += data
                if not data:
                    open_fds.discard(fd)
                    poller.unregister(fd)
                    if fd == status_r:  # the supervisor (and unshare) exited: its clean-up is done
                        limit = min(limit, time.monotonic() + _GRACE_S)
    finally:
        if open_fds:  # last resort (the supervisor is stuck or was killed): kill it and its process group
            for kill in (proc.kill, lambda: os.killpg(proc.pid, signal.SIGKILL)):
                try:
                    kill()
                except OSError:
                    pass
            _wait_group_dead(proc.pid, _GRACE_S)  # SIGKILL is asynchronous: return only once they have exited
        proc.wait()
        os.close(status_r)
        proc.stdout.close()
        proc.stderr.close()
    status = bytes(bufs[status_r]).split(b"\n")[1].strip() if bufs[status_r].count(b"\n") >= 2 else b""
    error = ""
    if not stopped and not status:
        error = (f"the call's supervisor ended without reporting the exit status (returncode {proc.returncode}); "
                 "see stderr")
    return Completed(None if timed_out or not status else int(status), bytes(bufs[out_fd]), bytes(bufs[err_fd]),
                     timed_out, error)


def open_trace(root: Path, wait_s: float = 60.0) -> FileTrace:
    """A `FileTrace` of `root` for one call: an inotify instance is held only while a call runs.

    The kernel allows `fs.inotify.max_user_instances` (often 128) per user: a warm pool of idle sandboxes, or several
    runs side by side, would exhaust them if each sandbox held one. Exhausted, it waits (up to `wait_s` seconds) for a
    running call to release one. Raises TraceUnavailable after that.
    """
    deadline = time.monotonic() + wait_s
    delay = 0.05
    while True:
        try:
            return FileTrace(str(root))
        except TraceUnavailable:
            if time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(1.0, 2 * delay)


class LocalSandbox:
    """Non-isolated sandbox: a temp-dir workspace and `python3 -c` / `bash -c` subprocesses.

    Args:
      state: initial workspace files and environment variables (paper Eq. 2 state p).
      timeout_s: default hard wall-clock limit per call, seconds (120 s, the released code's).
      max_output_chars: characters of stdout/stderr returned to the agent (2,048, the released code's).
      python: interpreter for 'python' calls; defaults to the host interpreter (`sys.executable`), which
        must provide numpy, scipy, nibabel and PIL like the Docker task image.
    """

    def __init__(
        self,
        state: SandboxState,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        python: str | None = None,
    ):
        self._root = Path(tempfile.mkdtemp(prefix="bat_local_sandbox_"))
        self._timeout_s = float(timeout_s)
        self._max_chars = int(max_output_chars)
        self._python = python or sys.executable
        self._receipts: list[Receipt] = []
        self._submitted: str | None = None
        self._closed = False
        self._failure = ""  # set once a call came after `close` (`fault`)
        for rel, data in state.files.items():
            target = self._root / _safe_relpath(rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(bytes(data))
        self._env = dict(state.env)

    @property
    def fault(self) -> str:
        """'infra' once a call came after `close` (the host's doing), else '' (`types.fault_of`).

        The local backend has no executor the agent's code could bring down."""
        return "infra" if self._failure else ""

    @property
    def failure(self) -> str:
        """Text of the failure ('' when none)."""
        return self._failure

    @property
    def root(self) -> Path:
        """Host path of the workspace (for debugging only)."""
        return self._root

    def _cut(self, text: str) -> tuple[str, bool]:
        if len(text) <= self._max_chars:
            return text, False
        return text[: self._max_chars] + f"\n...[truncated {len(text) - self._max_chars} chars]", True

    def _record(self, tool, language, code, exit_code, out, err, t0, t1, timed_out, shown, trace=((), (), False)
                ) -> None:
        self._receipts.append(
            Receipt(
                index=len(self._receipts),
                tool=tool,
                language=language,
                code=code,
                exit_code=exit_code,
                stdout_sha256=sha256_hex(out),
                stderr_sha256=sha256_hex(err),
                started_at=t0,
                finished_at=t1,
                timed_out=timed_out,
                stdout=shown,
                reads=tuple(trace[0]),
                writes=tuple(trace[1]),
                trace_complete=bool(trace[2]),
                write_digests=tuple(tuple(pair) for pair in digest_files(str(self._root), trace[1],
                                                                         DIGEST_MAX_BYTES)),
            )
        )

    def execute_code(self, language: str, code: str, timeout_s: float | None = None) -> Observation:
        """Runs `code` with cwd = workspace under `run_with_deadline`.

        It returns when the code's main process exits or after the limit (`timeout_s`, default the sandbox's, seconds;
        then `timed_out`), with every process the call started killed either way. Never raises for agent mistakes (bad
        language → error text)."""
        t0 = time.time()
        if self._closed:
            self._failure = "sandbox is closed"
            return Observation("", "", None, 0.0, error=self._failure)
        if language not in LANGUAGES:
            err = f"unknown language {language!r}; expected one of {LANGUAGES}"
            self._record("execute_code", str(language), str(code), None, "", "", t0, time.time(), False, "")
            return Observation("", "", None, 0.0, error=err)
        argv = [self._python, "-c", code] if language == "python" else ["bash", "-c", code]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self._root), "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", **self._env}
        limit = self._timeout_s if timeout_s is None else float(timeout_s)
        tracer = open_trace(self._root)  # kernel-observed reads/writes of this call, as in the Docker backend
        try:
            tracer.begin()
            try:
                done = run_with_deadline(argv, cwd=self._root, env=env, timeout_s=limit)
            except (ValueError, OSError) as exc:  # the code cannot be an argument (NUL byte, lone surrogate, E2BIG)
                done = Completed(None, b"", b"", False, f"cannot run the code: {type(exc).__name__}: {exc}")
            t1 = time.time()
            trace = tracer.end()
        finally:
            tracer.close()
        out = done.stdout.decode("utf-8", errors="replace")
        err = done.stderr.decode("utf-8", errors="replace")
        shown_out, cut1 = self._cut(out)
        shown_err, cut2 = self._cut(err)
        self._record("execute_code", language, code, done.exit_code, out, err, t0, t1, done.timed_out, shown_out,
                     trace)
        return Observation(shown_out, shown_err, done.exit_code, t1 - t0, timed_out=done.timed_out,
                           truncated=cut1 or cut2, error=done.error)

    def submit(self, path: str) -> Observation:
        """Marks a workspace file as the final artefact.

        A missing/invalid path is an error observation (exit_code None, `error` set), as in the Docker backend."""
        t0 = time.time()
        if self._closed:
            self._failure = "sandbox is closed"
            return Observation("", "", None, 0.0, error=self._failure)
        try:
            rel = _safe_relpath(path)
            ok = (self._root / rel).is_file()
            error = "" if ok else f"no such file in workspace: {path!r}"
        except ValueError as exc:
            ok, error = False, str(exc)
        if ok:
            self._submitted = str(rel)
        text = f"submitted {rel}" if ok else ""
        code = 0 if ok else None  # like the Docker backend: a refused submit "never ran"
        self._record("submit", "", str(path), code, text, "", t0, time.time(), False, text)
        return Observation(text, "", code, time.time() - t0, error=f"cannot submit {path!r}: {error}" if error else "")

    def receipts(self) -> list[Receipt]:
        return list(self._receipts)

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Host-side read.

        Raises FileNotFoundError (missing file or a symlink), FileTooLarge (more than `max_bytes` bytes, checked before
        reading) or ValueError (path outside workspace)."""
        target = self._root / _safe_relpath(path)
        if target.is_symlink() or not target.is_file():
            raise FileNotFoundError(f"no such file in workspace: {path!r}")
        size = target.stat().st_size
        if max_bytes is not None and size > max_bytes:
            raise FileTooLarge(f"{path}: {size} bytes, over the {max_bytes}-byte evidence cap")
        return target.read_bytes()

    def list_files(self) -> list[str]:
        """Regular files (symlinks not followed), sorted."""
        if self._closed:
            return []
        out = []
        for root, dirs, names in os.walk(self._root):
            for name in names:
                path = Path(root) / name
                if path.is_file() and not path.is_symlink():
                    out.append(path.relative_to(self._root).as_posix())
        return sorted(out)

    def submitted(self) -> str | None:
        return self._submitted

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> "LocalSandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NullSandbox:
    """A sandbox that runs nothing — FOR TESTS AND BENCHMARKS of the episode loop's scheduling only.

    Every `execute_code` returns exit code 0 with no output, after `delay_s()` seconds when a `delay_s`
    callable is given (e.g. a random tool time). It has no receipts, files or submission, so a rollout in it
    earns nothing. Accepts (and ignores) the start state, like a sandbox factory's product.
    """

    def __init__(self, state: SandboxState | None = None, delay_s=None):
        self.delay_s = delay_s

    def execute_code(self, language: str, code: str, timeout_s: float | None = None) -> Observation:
        if self.delay_s is not None:
            time.sleep(self.delay_s())
        return Observation("ok", "", 0, 0.0)

    def receipts(self) -> list:
        return []

    def submitted(self) -> None:
        return None

    def list_files(self) -> list[str]:
        return []

    def close(self) -> None:
        pass
