"""The supervisor of one local-sandbox call.

A script, run as `python -I -S call_supervisor.py STATUS_FD CMD...` by `bat_jax.sandbox.local.run_with_deadline`
(standard library only; `-I` keeps this directory off `sys.path`).

Details: docs/design.md.
"""

import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


class Stop(Exception):
    """The host asked the supervisor to end the call."""


def _stop(signum, frame):
    raise Stop


def descendants() -> list[int]:
    """PIDs of every descendant of this process, from /proc (parents read from each /proc/PID/stat)."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name, "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            kids.setdefault(int(stat[stat.rindex(b")") + 2:].split()[1]), []).append(int(name))
    found, todo = [], [os.getpid()]
    while todo:
        more = kids.get(todo.pop(), [])
        found += more
        todo += more
    return found


def kill_all(init: bool) -> None:
    """Kills and reaps every other process of the call until this process has no child left."""
    while True:
        if init:
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
        else:
            pids = descendants()
            for sig in (signal.SIGSTOP, signal.SIGKILL):  # stopped first, so none forks meanwhile
                for pid in pids:
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return
        time.sleep(0.002)


def main() -> None:
    status_fd, argv = int(sys.argv[1]), sys.argv[2:]
    os.set_inheritable(status_fd, False)
    init = os.getpid() == 1
    if not init:
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _stop)
    os.write(status_fd, os.readlink("/proc/self").encode() + b"\n")
    status = None
    try:
        child = os.fork()
        if child == 0:
            try:
                for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ):
                    signal.signal(sig, signal.SIG_DFL)
                os.execvp(argv[0], argv)
            except BaseException as exc:
                os.write(2, ("cannot run %s: %s\n" % (argv[0], exc)).encode())
            os._exit(127)
        while status is None:
            pid, st = os.waitpid(-1, 0)
            if pid == child:
                status = os.waitstatus_to_exitcode(st)
    except Stop:
        pass
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP, signal.SIGINT})
    kill_all(init)
    if status is not None:
        os.write(status_fd, str(status).encode() + b"\n")
    os._exit(0)


if __name__ == "__main__":
    main()
