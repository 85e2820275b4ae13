"""In-sandbox executor: one long-lived process per container that runs tool calls.

Protocol (one JSON object per line, both ways): the host writes a request line on this process's stdin (the
container's attached stdin) and reads exactly one response line from its stdout. Every request carries an
"id" that its reply echoes; the host accepts only the reply with the id it sent. Requests:

  {"op": "ping"}                                   -> {"ok": true, "pid": int, "preloaded": [str],
                                                       "separated": bool, "trace": str}
  {"op": "exec", "language": "python" | "bash", "code": str, "timeout_s": float, "max_chars": int,
   "env": {str: str}, "digest_max_bytes": int}     -> {"ok": true, "stdout", "stderr", "stdout_sha256",
                                                       "stderr_sha256", "stdout_bytes", "stderr_bytes",
                                                       "exit_code", "timed_out", "truncated", "duration_s",
                                                       "error", "reads", "writes", "trace_complete",
                                                       "write_digests": [[path, sha256]]}
  {"op": "wipe"}                                   -> {"ok": true, "removed": int}
  {"op": "load", "tar_b64": str}                   -> {"ok": true, "removed": int, "written": int}
      reset, then write the regular files of the (host-built) tar into /workspace; names that are absolute or
      leave the workspace are refused.
  {"op": "list", "max_files": int, "max_seconds": float}
                                                   -> {"ok": true, "files": [[path, bytes]], "complete": bool}
      regular files under /workspace (symlinks are never followed), at most max_files of them.
  {"op": "read", "paths": [str], "max_file_bytes": int, "max_total_bytes": int}
                                                   -> {"ok": true, "files": {path: ["ok", b64] | ["too_large",
                                                       bytes] | ["missing", reason]}}
      files opened component by component with O_NOFOLLOW (no symlink anywhere in a path is followed), the size
      checked before any byte is read.
  {"op": "fingerprint"}                            -> {"ok": true, "mounts", "files", "procs", "ipc"}
      everything an episode could leave behind (see `_fingerprint`); a reset sandbox and a fresh one give
      the same fingerprint.

Privilege separation: this executor runs as root inside the container with a handful of capabilities (CHOWN,
DAC_OVERRIDE, FOWNER, KILL, SETUID, SETGID; everything else dropped by the host). Every call runs as the
agent uid (65534) with no capabilities, no file descriptor but 0/1/2, and cannot signal, ptrace or read this
process or PID 1. `wipe` / `load` reset every writable mount (/workspace, /tmp, /dev/shm, /dev/mqueue), remove
SysV IPC objects and kill every process, so a pooled sandbox after a reset equals a fresh one.

File evidence: `reads` / `writes` are the workspace files the call's processes read / wrote, observed by the
kernel (inotify, `file_trace.py`), never taken from the code text; `write_digests` are the SHA-256 of the
written regular files (up to `digest_max_bytes` each) when the call ended.

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
import subprocess
import sys
import tarfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import file_trace  # noqa: E402 - copied next to this file into the image (bat_jax/sandbox/file_trace.py)

WORKSPACE = "/workspace"
AGENT_UID = int(os.environ.get("BAT_AGENT_UID", "65534"))
AGENT_GID = int(os.environ.get("BAT_AGENT_GID", "65534"))
#: Writable mounts an episode can leave files in; a reset empties each of them.
RESET_DIRS = (WORKSPACE, "/tmp", "/dev/shm", "/dev/mqueue")
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


def _drop_privileges():
    """Becomes the agent uid/gid with no supplementary groups (and so no capabilities). A no-op when this
    executor is not root (an image run without privilege separation; the ping reply says so)."""
    if os.geteuid() != 0:
        return
    os.setgroups([])
    os.setgid(AGENT_GID)
    os.setuid(AGENT_UID)


class _Zygote:
    """A child forked ahead of time (off the critical path) that waits for one request on a pipe.

    Pipes: `req` (executor -> child: the request, then EOF), `out` / `err` (the call's stdout / stderr). The
    child keeps no other descriptor of this process: the reply channel, the inotify descriptor and the
    executor's stdin are closed before any agent code runs.
    """

    def __init__(self):
        req_r, self.req_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            _child(req_r, out_w, err_w)
        try:
            os.setpgid(self.pid, self.pid)
        except OSError:
            pass
        for fd in (req_r, out_w, err_w):
            os.close(fd)

    def close_fds(self):
        for fd in (self.req_w, self.out_r, self.err_r):
            try:
                os.close(fd)
            except OSError:
                pass


def _child(req_r, out_w, err_w):
    """Runs in the forked child: drops to the agent uid, waits for the request, runs it; never returns."""
    try:
        os.setpgid(0, 0)
        try:
            with open("/proc/self/oom_score_adj", "w") as f:  # before the uid change: the file is root's then
                f.write("1000")
        except OSError:
            pass
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.dup2(req_r, 3)
        os.closerange(4, _max_fd())  # every descriptor of the executor: reply channel, inotify, pipes
        os.set_inheritable(3, False)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        _drop_privileges()
        _set_dumpable(1)  # the call's own processes are ordinary (their /proc entries stay theirs)
        chunks = []
        while True:
            data = os.read(3, _READ)
            if not data:
                break
            chunks.append(data)
        os.close(3)
        if not chunks:  # the executor dropped this zygote
            os._exit(0)
        req = json.loads(b"".join(chunks))
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
        os._exit(status)
    except BaseException:  # noqa: BLE001
        try:
            os.write(2, traceback.format_exc().encode())
        finally:
            os._exit(127)


def _max_fd():
    try:
        return max(64, min(os.sysconf("SC_OPEN_MAX"), 1 << 20))
    except (ValueError, OSError):
        return 1 << 16


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
        self.trace = None
        self.trace_error = ""
        self.new_trace()

    def new_trace(self):
        """A fresh inotify watch over the workspace (after every reset: the old tree is gone)."""
        if self.trace is not None:
            self.trace.close()
            self.trace = None
        try:
            self.trace = file_trace.FileTrace(WORKSPACE)
            self.trace_error = ""
        except OSError as e:
            self.trace_error = "file tracing unavailable: %s" % (e,)

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
        trace = self.trace
        if trace is not None:
            trace.begin()
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
        status = None  # waitpid status of the call's main process
        timed_out = False
        done_at = None
        while True:
            now = time.monotonic()
            if now >= deadline:
                timed_out = status is None
                break
            if status is None and pidfd is None:
                got, st = os.waitpid(pid, os.WNOHANG)
                if got:
                    status, done_at = st, now
            if status is not None and (not open_fds or now - done_at > 0.05):
                break
            watch = list(open_fds)
            if trace is not None:
                watch.append(trace.fd)
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
                        status, done_at = st, time.monotonic()
                elif trace is not None and fd == trace.fd:
                    trace.drain()
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
            if os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                exit_code = 128 + sig
                error = "killed by signal %s" % signal.Signals(sig).name
                if sig == signal.SIGKILL and _oom_kills() > ooms >= 0:
                    error = "out of memory: the call exceeded the sandbox memory limit and was killed (SIGKILL)"
            else:
                exit_code = os.WEXITSTATUS(status)
        reads, writes, complete = trace.end() if trace is not None else ([], [], False)
        digests = file_trace.digest_files(WORKSPACE, writes, int(req.get("digest_max_bytes", 64 << 20)))
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
            "reads": reads, "writes": writes, "trace_complete": complete and trace is not None,
            "write_digests": digests,
        }, pid

    def reset(self, tar_b64=None):
        """Kills every process, empties every writable mount, removes SysV IPC objects, then loads the tar.
        Fails closed: processes that survive the kill passes make it raise (the reply is an error and the host
        pool replaces the container) instead of handing them to the next episode."""
        self.drop_zygote()
        if not _sweep():
            raise RuntimeError("reset: processes survived 5 s of SIGKILL passes: %r" % _other_pids({1, os.getpid()}))
        _remove_ipc()
        removed = _wipe()
        written = _load(tar_b64) if tar_b64 else 0
        self.new_trace()
        self.spawn()
        return {"removed": removed, "written": written}


def _set_dumpable(flag):
    """prctl(PR_SET_DUMPABLE): 0 keeps processes of the same uid from ptrace-ing or reading /proc/<pid>/mem."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, int(flag), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _load(tar_b64):
    """Writes the tar's directories and regular files (nothing else) into the workspace, owned by the agent."""
    written = 0
    root = os.path.realpath(WORKSPACE)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(tar_b64)), mode="r") as tar:
        for member in tar:
            target = os.path.realpath(os.path.join(root, member.name))
            if member.name.startswith("/") or not target.startswith(root + os.sep):
                raise ValueError("refusing tar member %r outside the workspace" % member.name)
            if member.isdir():
                _makedirs(target, root)
            elif member.isfile():
                _makedirs(os.path.dirname(target), root)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, member.mode & 0o755)
                with os.fdopen(fd, "wb") as f:
                    f.write(tar.extractfile(member).read())
                os.chown(target, AGENT_UID, AGENT_GID)
                os.chmod(target, member.mode & 0o755)
                written += 1
    return written


def _makedirs(path, root):
    """Creates `path` and its missing parents below `root`, each 0755 and owned by the agent."""
    missing = []
    while path != root and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for d in reversed(missing):
        os.mkdir(d, 0o755)
        os.chown(d, AGENT_UID, AGENT_GID)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _tree(top, stop=lambda: False):
    """Yields (rel, kind, st, dir_fd, name) for every entry below `top`, each directory before its entries.

    Iterative and fd-relative: no recursion limit, no PATH_MAX (a tree 3,000 levels deep is walked), symlinks
    never followed (kind 'l'), other mounts not entered. `dir_fd` / `name` address the entry for openat-style
    calls while the generator holds that directory open. Stops early when `stop()` is true.
    """
    try:
        root = os.open(top, _DIR_FLAGS)
    except OSError:
        return
    dev = os.fstat(root).st_dev
    stack = [(root, "")]
    try:
        while stack:
            fd, rel = stack.pop()
            subdirs = []
            try:
                with os.scandir(fd) as it:
                    for entry in it:
                        if stop():
                            return
                        path = rel + "/" + entry.name if rel else entry.name
                        try:
                            st = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
                        except OSError:
                            continue
                        kind = "d" if _S_ISDIR(st.st_mode) else "l" if _S_ISLNK(st.st_mode) else \
                            "f" if _S_ISREG(st.st_mode) else "o"
                        yield path, kind, st, fd, entry.name
                        if kind == "d" and st.st_dev == dev:
                            subdirs.append((entry.name, path))
            except OSError:
                pass
            for name, path in reversed(subdirs):
                try:
                    stack.append((os.open(name, _DIR_FLAGS, dir_fd=fd), path))
                except OSError:
                    continue
            os.close(fd)
    finally:
        for fd, _ in stack:
            os.close(fd)


def _S_ISDIR(mode):
    return (mode & 0o170000) == 0o040000


def _S_ISLNK(mode):
    return (mode & 0o170000) == 0o120000


def _S_ISREG(mode):
    return (mode & 0o170000) == 0o100000


def _empty(top):
    """Removes everything below `top` (`rm -rf` per top-level entry: openat-based, so trees deeper than
    PATH_MAX go too; never follows symlinks or crosses mounts). Returns how many top-level entries went.

    Raises:
      RuntimeError: something is left (the host then replaces the sandbox rather than reuse it).
    """
    try:
        names = os.listdir(top)
    except OSError:
        return 0
    if names:
        subprocess.run(["rm", "-rf", "--one-file-system", "--"] + [os.path.join(top, n) for n in names],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       close_fds=True, check=False)
    left = os.listdir(top)
    if left:
        raise RuntimeError("reset left %d entries in %s: %r" % (len(left), top, sorted(left)[:5]))
    return len(names)


def _wipe():
    """Empties every writable mount of `RESET_DIRS` and restores the workspace root (mode, owner, xattrs)."""
    removed = sum(_empty(d) for d in RESET_DIRS)
    try:
        if os.geteuid() == 0:
            os.chown(WORKSPACE, AGENT_UID, AGENT_GID)
        os.chmod(WORKSPACE, 0o755)
        for name in os.listxattr(WORKSPACE, follow_symlinks=False):
            os.removexattr(WORKSPACE, name, follow_symlinks=False)
    except OSError:
        pass
    return removed


def _ipc_objects():
    """[(kind, id)] of every SysV IPC object in this IPC namespace, from /proc/sysvipc."""
    out = []
    for kind in ("shm", "sem", "msg"):
        try:
            with open("/proc/sysvipc/" + kind) as f:
                next(f, None)
                for line in f:
                    parts = line.split()
                    if len(parts) > 1:
                        out.append((kind, int(parts[1])))
        except (OSError, ValueError):
            continue
    return out


def _remove_ipc():
    """Removes every SysV IPC object. Removal needs the owner's uid (no CAP_SYS_ADMIN here), so a short-lived
    child at the agent uid does it."""
    objects = _ipc_objects()
    if not objects:
        return
    pid = os.fork()
    if pid == 0:
        try:
            os.closerange(3, _max_fd())
            _drop_privileges()
            libc = ctypes.CDLL(None, use_errno=True)
            for kind, ident in objects:  # IPC_RMID = 0
                if kind == "shm":
                    libc.shmctl(ident, 0, None)
                elif kind == "sem":
                    libc.semctl(ident, 0, 0)
                else:
                    libc.msgctl(ident, 0, None)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _list(max_files, max_seconds):
    """Regular files under the workspace as [path, bytes], symlinks never followed; stops at `max_files` files
    or `max_seconds` (then complete is False) without reading the rest of a directory."""
    files = []
    end = time.monotonic() + max_seconds
    over = []

    def stop():
        if len(files) >= max_files or time.monotonic() > end:
            over.append(True)
            return True
        return False

    for rel, kind, st, _, _ in _tree(WORKSPACE, stop):
        if kind == "f":
            files.append([rel, st.st_size])
    return sorted(files), not over


def _open_in_workspace(rel):
    """An fd of the regular workspace file `rel`, opened component by component with O_NOFOLLOW, so no
    symlink anywhere in the path is followed. Raises FileNotFoundError (missing, a directory, a symlink, a
    special file) or ValueError (a path leaving the workspace)."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or ".." in parts or rel.startswith("/"):
        raise ValueError("path %r is outside the workspace" % (rel,))
    fd = os.open(WORKSPACE, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        out = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
    except OSError as e:
        raise FileNotFoundError("%s: %s" % (rel, e.strerror)) from None
    finally:
        os.close(fd)
    if not _S_ISREG(os.fstat(out).st_mode):
        os.close(out)
        raise FileNotFoundError("%s is not a regular file" % (rel,))
    return out


def _read(paths, max_file_bytes, max_total_bytes):
    """{path: ["ok", base64] | ["too_large", bytes] | ["missing", reason]} for workspace files, sizes checked
    (fstat) before any byte is read; stops reading once `max_total_bytes` are used (later files: too_large)."""
    out, total = {}, 0
    for rel in paths:
        try:
            fd = _open_in_workspace(rel)
        except (FileNotFoundError, ValueError) as e:
            out[rel] = ["missing", str(e)]
            continue
        try:
            size = os.fstat(fd).st_size
            if size > max_file_bytes or total + size > max_total_bytes:
                out[rel] = ["too_large", size]
                continue
            chunks, got = [], 0
            while got <= size:
                data = os.read(fd, min(_READ * 16, size + 1 - got))
                if not data:
                    break
                chunks.append(data)
                got += len(data)
            if got > size:  # grew while read: nothing runs now, but never trust a size twice
                out[rel] = ["too_large", got]
                continue
            total += got
            out[rel] = ["ok", base64.b64encode(b"".join(chunks)).decode("ascii")]
        finally:
            os.close(fd)
    return out


_DOCKER_FILES = ("/etc/hostname", "/etc/hosts", "/etc/resolv.conf")  # per-container content by design


def _writable_mounts():
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, fstype = left.split(), right.split()[0]
            if fstype in ("proc", "sysfs", "cgroup", "cgroup2", "devpts"):
                continue
            point = fields[4].replace("\\040", " ")
            if point.split("/")[1:2] in (["proc"], ["sys"]):  # kernel views, not storage
                continue
            if "rw" in fields[5].split(","):
                mounts.append(point)
    return sorted(set(mounts))


def _fingerprint(zygote_pid=None):
    """Everything an episode could leave behind, free of per-container noise (ids, times): every entry of every
    writable mount (type, mode, owner, size, content digest, xattrs), every process but PID 1, this one and
    its ready zygote (uid and command line), SysV IPC objects. Equal for a fresh sandbox and a reset one."""
    files = {}
    for mount in _writable_mounts():
        if os.path.isdir(mount) and not os.path.islink(mount):
            entries = [_entry(mount, ".", os.lstat(mount), None, mount, digest=False)]
            for rel, kind, st, dir_fd, name in _tree(mount):
                entries.append(_entry(mount, rel, st, dir_fd, name, digest=kind == "f"))
        else:
            entries = [_entry(mount, ".", os.lstat(mount), None, mount, digest=mount not in _DOCKER_FILES)]
        files[mount] = sorted(entries)
    procs = []
    me = os.getpid()
    for pid in _other_pids({1, me, zygote_pid}):
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
            procs.append([os.stat("/proc/%d" % pid).st_uid, cmd])
        except OSError:
            continue
    return {"mounts": _writable_mounts(), "files": files, "procs": sorted(procs),
            "ipc": sorted(kind for kind, _ in _ipc_objects())}


def _entry(mount, rel, st, dir_fd, name, digest=True):
    kind = "d" if _S_ISDIR(st.st_mode) else "l" if _S_ISLNK(st.st_mode) else "f" if _S_ISREG(st.st_mode) else "o"
    sha = ""
    if kind == "f" and digest:
        h = hashlib.sha256()
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
            try:
                for chunk in iter(lambda: os.read(fd, 1 << 20), b""):
                    h.update(chunk)
            finally:
                os.close(fd)
            sha = h.hexdigest()
        except OSError:
            sha = "unreadable"
    try:
        target = name if dir_fd is not None else mount
        xattrs = sorted(os.listxattr(target if dir_fd is None else "/proc/self/fd/%d/%s" % (dir_fd, name),
                                     follow_symlinks=False))
    except OSError:
        xattrs = []
    return [rel, kind, oct(st.st_mode & 0o7777), st.st_uid, st.st_gid, st.st_size if kind == "f" else 0, sha,
            xattrs]


def main():
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.set_inheritable(out.fileno(), False)
    devnull = os.open("/dev/null", os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    _set_dumpable(0)  # nothing of another uid may ptrace this process or read its memory
    separated = os.geteuid() == 0
    preloaded = _preload()
    executor = Executor()
    executor.spawn()
    for line in sys.stdin:
        if not line.strip():
            continue
        pid = None
        ident = None
        try:
            req = json.loads(line)
            ident = req.get("id")
            op = req.get("op")
            if op == "ping":
                resp = {"pid": os.getpid(), "preloaded": preloaded, "separated": separated,
                        "trace": executor.trace_error or "ok"}
            elif op == "exec":
                resp, pid = executor.exec(req)
            elif op in ("wipe", "load"):
                resp = executor.reset(req.get("tar_b64") if op == "load" else None)
            elif op == "list":
                files, complete = _list(int(req.get("max_files", 10000)), float(req.get("max_seconds", 10.0)))
                resp = {"files": files, "complete": complete}
            elif op == "read":
                resp = {"files": _read(list(req.get("paths", ())), int(req.get("max_file_bytes", 0)),
                                       int(req.get("max_total_bytes", 0)))}
            elif op == "fingerprint":
                resp = _fingerprint(executor.zygote.pid if executor.zygote is not None else None)
            else:
                raise ValueError("unknown op %r" % (op,))
            resp["ok"] = True
        except Exception:  # noqa: BLE001 - report, keep serving
            resp = {"ok": False, "error": traceback.format_exc()}
        resp["id"] = ident
        out.write(json.dumps(resp) + "\n")
        if pid is not None:
            executor.cleanup(pid)  # after the reply: off the critical path of the call


if __name__ == "__main__":
    main()
