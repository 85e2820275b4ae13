"""The supervisor of one local-sandbox call (bat_jax/sandbox/call_supervisor.py), run as the script it is.

Its protocol on the status fd: its host PID and a newline first, then (when the command ended by itself) the command's
`Popen.returncode`-style status and a newline; it kills and reaps every other process of the call before it writes
the status.
"""

import os
import signal
import subprocess
import sys
import time

import bat_jax.sandbox.call_supervisor as call_supervisor

SCRIPT = call_supervisor.__file__


def _start(*argv):
    """(supervisor process, read end of its status pipe) for the command `argv`."""
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-I", "-S", SCRIPT, str(w), *argv], pass_fds=(w,),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.close(w)
    return proc, r


def _status_lines(proc, r):
    """The supervisor's stderr and the lines it wrote to the status fd, once it has exited."""
    _, err = proc.communicate(timeout=30)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    return err.decode(), data.decode().split("\n")


def test_status_is_the_pid_then_the_commands_exit_code():
    proc, r = _start("bash", "-c", "exit 3")
    err, lines = _status_lines(proc, r)
    assert lines == [str(proc.pid), "3", ""] and proc.returncode == 0 and err == ""


def test_a_command_killed_by_a_signal_reports_minus_the_signal():
    proc, r = _start("bash", "-c", "kill -KILL $$")
    assert _status_lines(proc, r)[1] == [str(proc.pid), "-9", ""]


def test_a_command_that_cannot_run_exits_127_and_says_why():
    proc, r = _start("/nonexistent/command")
    err, lines = _status_lines(proc, r)
    assert lines == [str(proc.pid), "127", ""] and err.startswith("cannot run /nonexistent/command:")


def test_background_processes_are_killed_before_the_status(tmp_path):
    pid_file = tmp_path / "stray"
    t0 = time.monotonic()
    proc, r = _start("bash", "-c", f"setsid sleep 30 & echo $! > {pid_file}; exit 0")
    _, lines = _status_lines(proc, r)
    stray = int(pid_file.read_text())
    assert lines == [str(proc.pid), "0", ""] and time.monotonic() - t0 < 10
    assert not os.path.exists(f"/proc/{stray}")  # killed and reaped by the supervisor, not left to init


def test_sigterm_ends_the_call_without_a_status(tmp_path):
    proc, r = _start("bash", "-c", f"touch {tmp_path / 'started'}; sleep 30")
    deadline = time.monotonic() + 10
    while not (tmp_path / "started").exists():
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, lines = _status_lines(proc, r)
    assert lines == [str(proc.pid), ""] and proc.returncode == 0


def test_descendants_lists_children_and_grandchildren():
    child = subprocess.Popen(["bash", "-c", "sleep 30 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    grandchild = int(child.stdout.readline())
    try:
        assert {child.pid, grandchild} <= set(call_supervisor.descendants())
    finally:
        os.kill(grandchild, signal.SIGKILL)
        child.wait(timeout=10)
