"""In-sandbox executor: one long-lived process per container that runs tool calls.

Protocol (one JSON object per line, both ways): the host writes a request line on this process's stdin (the
container's attached stdin) and reads exactly one response line from its stdout. Requests:

  {"op": "ping"}                                   -> {"ok": true, "pid": int, "preloaded": [str]}
  {"op": "exec", "language": "python" | "bash", "code": str, "timeout_s": float, "max_chars": int,
   "env": {str: str}}                              -> {"ok": true, "stdout", "stderr", "stdout_sha256",
                                                       "stderr_sha256", "stdout_bytes", "stderr_bytes",
                                                       "exit_code", "timed_out", "truncated", "duration_s",
                                                       "error"}
  {"op": "wipe"}                                   -> {"ok": true, "removed": int}
  {"op": "load", "tar_b64": str}                   -> {"ok": true, "removed": int, "written": int}
      wipe, then write the regular files of the (host-built) tar into /workspace; names that are absolute or
      leave the workspace are refused.

Every call forks a child from this warm process (numpy, scipy, nibabel and PIL are imported once at start, so a
Python call pays neither interpreter start nor imports). The child runs in its own process group, with stdin
from /dev/null, cwd /workspace, and the call's environment. Python code runs in a fresh `__main__` namespace
in the child: variables do NOT persist across calls; files in /workspace do. Bash code runs under `bash -c`.

The deadline is wall-clock from the start of the call and is never extended by output. At the deadline, or
when the call ends, every other process of the container (except PID 1 and this executor) is killed with
SIGKILL, so nothing started by a call survives it (no background jobs, no fork bomb). Outputs are streamed
through SHA-256 in full; only a head and a tail are kept, cut to `max_chars` characters with a marker.
Children raise their own oom_score_adj to 1000 so the kernel's OOM killer picks them, not this executor; a call
killed that way is reported as "out of memory" (the cgroup's oom_kill counter rose during the call).
"""

import base64
import builtins
import ctypes
import hashlib
import io
import json
import linecache
import os
import select
import signal
import sys
import tarfile
import time
import traceback

WORKSPACE = "/workspace"
PRELOAD = ("numpy", "scipy", "scipy.ndimage", "nibabel", "PIL.Image")
_READ = 65536


def _preload():
    done = []
    for name in PRELOAD:
        try:
            __import__(name)
            done.append(name)
        except Exception:  # noqa: BLE001 - a missing optional module only costs latency
            pass
    return done


class _Stream:
    """Collects one output pipe: full SHA-256 and byte count, a head and a tail of at most `cap` bytes."""

    def __init__(self, cap):
        self.cap = cap
        self.sha = hashlib.sha256()
        self.total = 0
        self.head = bytearray()
        self.tail = bytearray()

    def feed(self, data):
        self.sha.update(data)
        self.total += len(data)
        room = self.cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.cap:
                del self.tail[: len(self.tail) - self.cap]

    def text(self, max_chars):
        """(text, truncated): everything when it fits in `max_chars`, else head + marker + tail."""
        if self.total <= len(self.head):
            full = self.head.decode("utf-8", "replace")
            if len(full) <= max_chars:
                return full, False
        marker = "\n[... output truncated: %d bytes in total, showing the first and last characters ...]\n" % (
            self.total)
        keep = max(0, max_chars - len(marker))
        head = self.head.decode("utf-8", "replace")[: keep - keep // 2]
        tail_src = self.tail if self.tail else self.head[len(head.encode("utf-8", "replace")):]
        tail = bytes(tail_src).decode("utf-8", "replace")
        tail = tail[len(tail) - keep // 2:] if keep // 2 else ""
        return head + marker + tail, True


class _Zygote:
    """A child forked ahead of time (off the critical path) that waits for one request on a pipe.

    Pipes: `req` (executor -> child: the request, then EOF), `ctl` (child -> executor: "<pid> <status>" once the
    Python code finished and its output is flushed and closed), `out` / `err` (the call's stdout / stderr).
    """

    def __init__(self):
        req_r, self.req_w = os.pipe()
        self.ctl_r, ctl_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            for fd in (self.req_w, self.ctl_r, self.out_r, self.err_r):
                os.close(fd)
            _child(req_r, ctl_w, out_w, err_w)
        try:
            os.setpgid(self.pid, self.pid)
        except OSError:
            pass
        for fd in (req_r, ctl_w, out_w, err_w):
            os.close(fd)

    def close_fds(self):
        for fd in (self.req_w, self.ctl_r, self.out_r, self.err_r):
            try:
                os.close(fd)
            except OSError:
                pass


def _child(req_r, ctl_w, out_w, err_w):
    """Runs in the forked child: prepares the process, waits for the request, runs it; never returns."""
    try:
        os.setpgid(0, 0)
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        for fd in (devnull, out_w, err_w):
            os.close(fd)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        _set_dumpable(1)  # the call's own processes are ordinary (their /proc entries stay theirs)
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")
        except OSError:
            pass
        chunks = []
        while True:
            data = os.read(req_r, _READ)
            if not data:
                break
            chunks.append(data)
        os.close(req_r)
        if not chunks:  # the executor dropped this zygote
            os._exit(0)
        req = json.loads(b"".join(chunks))
        os.set_inheritable(ctl_w, False)
        os.chdir(WORKSPACE)
        env = dict(os.environ)
        env.update(req.get("env") or {})
        code = req["code"]
        if req["language"] == "bash":
            os.execve("/bin/bash", ["bash", "-c", code], env)
        os.environ.clear()
        os.environ.update(env)
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False, errors="backslashreplace")
        sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")
        sys.argv = ["<code>"]
        sys.path[0:0] = [WORKSPACE]
        sys.dont_write_bytecode = True  # no __pycache__ in the workspace
        linecache.cache["<code>"] = (len(code), None, code.splitlines(True), "<code>")
        me = os.getpid()
        status = 0
        try:
            exec(compile(code, "<code>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
        except SystemExit as e:
            if e.code is None:
                status = 0
            elif isinstance(e.code, int):
                status = e.code & 0xFF
            else:
                print(e.code, file=sys.stderr)
                status = 1
        except BaseException:  # noqa: BLE001 - the agent sees its own traceback, without this frame
            etype, value, tb = sys.exc_info()
            traceback.print_exception(etype, value, tb.tb_next)
            status = 1
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        if os.getpid() == me:  # not a process the code forked
            os.close(1)
            os.close(2)
            os.write(ctl_w, b"%d %d\n" % (me, status))
        os._exit(status)
    except BaseException:  # noqa: BLE001
        try:
            os.write(2, traceback.format_exc().encode())
        finally:
            os._exit(127)


def _other_pids(keep):
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            pid = int(name)
            if pid not in keep:
                pids.append(pid)
    return pids


def _sweep(keep=(), limit_s=5.0):
    """SIGKILLs every process of the container except PID 1, this one and `keep`, until none is left."""
    keep = {1, os.getpid(), *keep}
    end = time.monotonic() + limit_s
    while True:
        pids = _other_pids(keep)
        if not pids:
            return True
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _reap()
        if time.monotonic() > end:
            return False
        time.sleep(0.002)


_OOM_FILES = ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events")


def _oom_kills():
    """The container cgroup's count of OOM kills (cgroup v1 or v2), or -1 when unreadable."""
    for path in _OOM_FILES:
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return -1


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class Executor:
    """Serves requests; keeps one zygote ready so a call does not wait for a fork."""

    def __init__(self):
        self.zygote = None

    def spawn(self):
        if self.zygote is None:
            try:
                self.zygote = _Zygote()
            except OSError:
                self.zygote = None

    def drop_zygote(self):
        z, self.zygote = self.zygote, None
        if z is not None:
            z.close_fds()
            try:
                os.kill(z.pid, signal.SIGKILL)
                os.waitpid(z.pid, 0)
            except (OSError, ChildProcessError):
                pass

    def cleanup(self, pid):
        """After a call (and after its reply was sent): kill its process group and every stray process."""
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        _sweep()
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
        _reap()
        self.spawn()

    def exec(self, req):
        """Returns (reply, pid of the call or None)."""
        start = time.monotonic()
        timeout = float(req.get("timeout_s", 120.0))
        max_chars = int(req.get("max_chars", 2048))
        deadline = start + timeout
        if req.get("language") not in ("python", "bash"):
            return {"error": "unknown language %r (use 'python' or 'bash')" % (req.get("language"),),
                    "exit_code": None, "duration_s": 0.0}, None
        if self.zygote is None:
            _sweep()
            self.spawn()
            if self.zygote is None:
                return {"error": "could not start the call: fork failed", "exit_code": None,
                        "duration_s": time.monotonic() - start}, None
        z, self.zygote = self.zygote, None
        pid = z.pid
        ooms = _oom_kills()
        payload = json.dumps({"language": req["language"], "code": req["code"], "env": req.get("env") or {}})
        view = memoryview(payload.encode())
        try:
            while view:  # the zygote reads while we write, so requests larger than a pipe buffer pass too
                view = view[os.write(z.req_w, view):]
        except OSError:  # the zygote died; its status is reported below
            pass
        os.close(z.req_w)
        z.req_w = -1
        streams = {z.out_r: _Stream(max_chars * 4), z.err_r: _Stream(max_chars * 4)}
        open_fds = {z.out_r, z.err_r}
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = None
        status = None  # ("exit", code) | ("wait", waitpid status)
        timed_out = False
        done_at = None
        ctl_buf = b""
        watch_ctl = True
        while True:
            now = time.monotonic()
            if now >= deadline:
                timed_out = status is None
                break
            if status is None and (pidfd is None or done_at is not None):
                got, st = os.waitpid(pid, os.WNOHANG)
                if got:
                    status, done_at = ("wait", st), now
            if status is not None and (not open_fds or now - done_at > 0.05):
                break
            watch = list(open_fds)
            if watch_ctl:
                watch.append(z.ctl_r)
            if pidfd is not None and status is None:
                watch.append(pidfd)
            wait = deadline - now
            if status is not None or pidfd is None:
                wait = min(wait, 0.01)
            ready, _, _ = select.select(watch, [], [], wait)
            for fd in ready:
                if fd == pidfd:
                    got, st = os.waitpid(pid, os.WNOHANG)
                    if got:
                        status, done_at = ("wait", st), time.monotonic()
                elif fd == z.ctl_r:
                    data = os.read(fd, 256)
                    if not data:
                        watch_ctl = False
                        continue
                    ctl_buf += data
                    for line in ctl_buf.split(b"\n")[:-1]:
                        parts = line.split()
                        if len(parts) == 2 and int(parts[0]) == pid and status is None:
                            status, done_at = ("exit", int(parts[1])), time.monotonic()
                    ctl_buf = ctl_buf.rsplit(b"\n", 1)[-1]
                else:
                    data = os.read(fd, _READ)
                    if data:
                        streams[fd].feed(data)
                    else:
                        open_fds.discard(fd)
        if timed_out:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        for fd in list(open_fds):  # drain what is already buffered, without blocking
            while select.select([fd], [], [], 0)[0]:
                data = os.read(fd, _READ)
                if not data:
                    break
                streams[fd].feed(data)
        error = ""
        exit_code = None
        if not timed_out and status is not None:
            kind, value = status
            if kind == "exit":
                exit_code = value
            elif os.WIFSIGNALED(value):
                sig = os.WTERMSIG(value)
                exit_code = 128 + sig
                error = "killed by signal %s" % signal.Signals(sig).name
                if sig == signal.SIGKILL and _oom_kills() > ooms >= 0:
                    error = "out of memory: the call exceeded the sandbox memory limit and was killed (SIGKILL)"
            else:
                exit_code = os.WEXITSTATUS(value)
        out, err = streams[z.out_r], streams[z.err_r]
        out_text, out_cut = out.text(max_chars)
        err_text, err_cut = err.text(max_chars)
        z.close_fds()
        if pidfd is not None:
            os.close(pidfd)
        return {
            "stdout": out_text, "stderr": err_text,
            "stdout_sha256": out.sha.hexdigest(), "stderr_sha256": err.sha.hexdigest(),
            "stdout_bytes": out.total, "stderr_bytes": err.total,
            "exit_code": exit_code, "timed_out": timed_out, "truncated": out_cut or err_cut,
            "duration_s": time.monotonic() - start, "error": error,
        }, pid


def _set_dumpable(flag):
    """prctl(PR_SET_DUMPABLE): 0 keeps processes of the same uid from ptrace-ing or reading /proc/<pid>/mem."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, int(flag), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _load(tar_b64):
    """Wipes the workspace, then writes the tar's directories and regular files (nothing else) into it."""
    removed = _wipe()["removed"]
    written = 0
    root = os.path.realpath(WORKSPACE)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(tar_b64)), mode="r") as tar:
        for member in tar:
            target = os.path.realpath(os.path.join(root, member.name))
            if member.name.startswith("/") or not target.startswith(root + os.sep):
                raise ValueError("refusing tar member %r outside the workspace" % member.name)
            if member.isdir():
                os.makedirs(target, mode=0o755, exist_ok=True)
            elif member.isfile():
                os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
                with open(target, "wb") as f:
                    f.write(tar.extractfile(member).read())
                os.chmod(target, member.mode & 0o755)
                written += 1
    return {"removed": removed, "written": written}


def _wipe():
    """Removes everything under /workspace, first making every directory writable (the agent may chmod)."""
    for root, dirs, _ in os.walk(WORKSPACE):
        for name in dirs:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, 0o700)
    removed = 0
    for root, dirs, files in os.walk(WORKSPACE, topdown=False):
        for name in files:
            os.unlink(os.path.join(root, name))
            removed += 1
        for name in dirs:
            path = os.path.join(root, name)
            if os.path.islink(path):
                os.unlink(path)
            else:
                os.rmdir(path)
            removed += 1
    return {"removed": removed}


def main():
    out = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open("/dev/null", os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    _set_dumpable(0)  # agent code (same uid) cannot ptrace this process or read its memory
    preloaded = _preload()
    executor = Executor()
    executor.spawn()
    for line in sys.stdin:
        if not line.strip():
            continue
        pid = None
        try:
            req = json.loads(line)
            op = req.get("op")
            if op == "ping":
                resp = {"pid": os.getpid(), "preloaded": preloaded}
            elif op == "exec":
                resp, pid = executor.exec(req)
            elif op in ("wipe", "load"):
                executor.drop_zygote()
                _sweep()
                resp = _wipe() if op == "wipe" else _load(req["tar_b64"])
                executor.spawn()
            else:
                raise ValueError("unknown op %r" % (op,))
            resp["ok"] = True
        except Exception:  # noqa: BLE001 - report, keep serving
            resp = {"ok": False, "error": traceback.format_exc()}
        out.write(json.dumps(resp) + "\n")
        if pid is not None:
            executor.cleanup(pid)  # after the reply: off the critical path of the call


if __name__ == "__main__":
    main()
