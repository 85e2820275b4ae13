"""Docker sandbox: tool calls, receipts, limits and its red-team checks (needs a running engine)."""

import hashlib
import threading
import time

import pytest

from bat_jax.sandbox import images
from bat_jax.sandbox.docker import DockerSandbox, DockerSandboxConfig, SandboxError, connect, new_owner
from bat_jax.sandbox.types import SandboxState

pytestmark = pytest.mark.docker


OWNER = new_owner()  # label of every container this module starts


def _count(client, owner=None):
    labels = ["bat_jax=1"] + ([f"bat_jax.owner={owner}"] if owner else [])
    return len(client.api.containers(all=True, quiet=True, filters={"label": labels}))


@pytest.fixture(scope="module")
def client():
    c = connect()
    images.ensure_images(c)
    yield c
    deadline = time.monotonic() + 10  # auto-removal of a dead sandbox may still be in progress
    while _count(c, OWNER) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _count(c, OWNER) == 0, "containers of this module left behind"  # other jobs' containers may run


@pytest.fixture(scope="module")
def sb(client):
    with DockerSandbox(client, DockerSandboxConfig(timeout_s=20.0), owner=OWNER) as s:
        yield s


def test_python_and_bash_run_in_workspace_with_receipts(client):
    state = SandboxState(files={"a.txt": b"hello", "sub/dir/b.bin": bytes(range(256))}, env={"FOO": "bar"})
    with DockerSandbox(client, state=state, owner=OWNER) as s:
        obs = s.execute_code("bash", "cat a.txt; echo \" $FOO\"; pwd; id -u")
        assert (obs.stdout, obs.exit_code, obs.timed_out, obs.truncated) == ("hello bar\n/workspace\n65534\n", 0,
                                                                           False, False)
        obs = s.execute_code("python", "import numpy as np\nprint(int(np.arange(10).sum()))")
        assert (obs.stdout, obs.exit_code) == ("45\n", 0)
        obs = s.execute_code("python", "raise SystemExit(3)")
        assert obs.exit_code == 3
        obs = s.execute_code("python", "x = 1/0")
        assert obs.exit_code == 1 and obs.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
        assert "executor" not in obs.stderr  # the agent sees its own frames only
        big = "# " + "x" * 300_000 + "\nprint(len(open('a.txt').read()))"  # larger than a pipe buffer
        assert s.execute_code("python", big).stdout == "5\n"
        obs = s.execute_code("ruby", "puts 1")
        assert obs.exit_code is None and "unknown language" in obs.error
        # Python variables do not persist across calls; files do.
        s.execute_code("python", "y = 7\nopen('y.txt', 'w').write('7')")
        assert "NameError" in s.execute_code("python", "print(y)").stderr
        assert s.execute_code("python", "print(open('y.txt').read())").stdout == "7\n"
        assert s.read_file("sub/dir/b.bin") == bytes(range(256))
        assert s.list_files() == ["a.txt", "sub/dir/b.bin", "y.txt"]
        with pytest.raises(FileNotFoundError):
            s.read_file("missing.txt")
        assert s.submit("nope.txt").error and s.submitted() is None
        assert s.submit("y.txt").exit_code == 0 and s.submitted() == "y.txt"
        rec = s.receipts()
        assert [r.index for r in rec] == list(range(11))
        assert [r.tool for r in rec][-2:] == ["submit", "submit"]
        assert rec[0].stdout_sha256 == hashlib.sha256(b"hello bar\n/workspace\n65534\n").hexdigest()
        assert rec[1].code.startswith("import numpy") and rec[1].exit_code == 0
        assert rec[4].code == big and rec[4].stdout == "5\n"
        assert all(r.started_at <= r.finished_at for r in rec)


def test_http_fetch_fails(sb):
    obs = sb.execute_code("python", "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=5)")
    assert obs.exit_code == 1 and "URLError" in obs.stderr
    assert sb.execute_code("bash", "ls /sys/class/net").stdout == "lo\n"  # loopback only


def test_writes_outside_workspace_fail_and_no_privileges(sb):
    for target in ("/etc/x", "/opt/bat/x", "/usr/x", "/x", "/var/x", "/home/x"):
        obs = sb.execute_code("bash", f"echo hi > {target}")
        assert obs.exit_code != 0 and ("Read-only" in obs.stderr or "Permission denied" in obs.stderr), target
    assert sb.execute_code("bash", "echo hi > /tmp/x && cat /tmp/x").stdout == "hi\n"  # tmpfs scratch
    assert sb.execute_code("bash", "grep CapEff /proc/self/status").stdout.split() == ["CapEff:", "0" * 16]
    assert sb.execute_code("bash", "grep NoNewPrivs /proc/self/status").stdout.split() == ["NoNewPrivs:", "1"]
    assert sb.execute_code("bash", "ls /var/run/docker.sock /run/docker.sock").exit_code != 0


def test_receipts_are_not_readable_inside(sb):
    sb.execute_code("python", "print('canary-' + 'x')  # RECEIPT_CANARY_4711")
    assert sb.receipts()[-1].stdout_sha256 == hashlib.sha256(b"canary-x\n").hexdigest()
    # Search the whole file system (not /proc) for the canary, built at run time so the search finds nothing else.
    obs = sb.execute_code("bash", "grep -rIl --exclude-dir=proc --exclude-dir=sys \"RECEIPT_$((4700+11))\" / "
                                  "2>/dev/null; echo done")
    assert obs.stdout == "done\n"


def test_infinite_printer_hits_hard_timeout_without_blocking_others(client, sb):
    results = {}

    def printer():
        results["printer"] = sb.execute_code("bash", "while true; do echo .; sleep 1; done", timeout_s=3)
        results["printer_end"] = time.monotonic()

    with DockerSandbox(client, owner=OWNER) as other:
        start = time.monotonic()
        t = threading.Thread(target=printer)
        t.start()
        time.sleep(0.3)
        quick = [other.execute_code("python", f"print({i})") for i in range(5)]
        quick_end = time.monotonic()
        t.join(20)
    obs = results["printer"]
    assert obs.timed_out and obs.exit_code is None
    assert 2.9 <= obs.duration_s < 4.5 and 2.9 <= results["printer_end"] - start < 5.0
    assert obs.stdout.startswith(".\n.\n.\n")
    assert [q.stdout for q in quick] == [f"{i}\n" for i in range(5)]
    assert quick_end < results["printer_end"]
    assert sb.receipts()[-1].timed_out
    # A flood of output does not extend the deadline either.
    obs = sb.execute_code("bash", "yes", timeout_s=1.5)
    assert obs.timed_out and obs.duration_s < 3.0 and obs.truncated


def test_large_output_truncated_with_full_digest(sb):
    obs = sb.execute_code("bash", "yes | head -c 20000000")
    assert obs.exit_code == 0 and obs.truncated and len(obs.stdout) <= 2048
    assert "output truncated: 20000000 bytes" in obs.stdout
    assert obs.stdout.startswith("y\ny\n") and obs.stdout.endswith("y\ny\n")
    assert sb.receipts()[-1].stdout_sha256 == hashlib.sha256(b"y\n" * 10_000_000).hexdigest()


def test_memory_limit_gives_error_observation(sb):
    obs = sb.execute_code("python", "x = b'x' * (2 * 1024**3)\nprint(len(x))")
    assert obs.exit_code == 137 and obs.error.startswith("out of memory") and obs.stdout == ""
    assert sb.execute_code("python", "print(2)").stdout == "2\n"  # the sandbox survives


def test_fork_bomb_contained_and_nothing_survives_a_call(sb):
    obs = sb.execute_code("bash", ":(){ :|:& };:", timeout_s=5)
    assert obs.exit_code is not None or obs.timed_out
    assert sb.execute_code("python", "print(3)").stdout == "3\n"
    sb.execute_code("bash", "sleep 100 & disown; setsid sleep 100 &")
    comms = sb.execute_code("bash", "cat /proc/[0-9]*/comm").stdout.split()
    assert "sleep" not in comms and comms.count("python3") == 1, comms  # only the executor (and init, bash)


def test_engine_down_gives_one_clear_error(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:9")
    t = time.monotonic()
    with pytest.raises(SandboxError, match="Docker engine not reachable"):
        connect(DockerSandboxConfig(engine_timeout_s=2))
    assert time.monotonic() - t < 5


def test_agent_cannot_kill_the_executor_or_init(client):
    with DockerSandbox(client, owner=OWNER) as s:
        obs = s.execute_code("bash", "kill -9 $PPID; kill -TERM 1; kill -9 -1; echo alive")
        assert obs.stdout == "alive\n" and obs.stderr.count("Operation not permitted") == 2, obs
        assert s.alive and s.fault == "" and s.execute_code("python", "print(1)").stdout == "1\n"


def test_sandbox_dying_during_an_agent_call_is_the_agents_failure(client):
    s = DockerSandbox(client, owner=OWNER)
    killer = threading.Timer(1.0, lambda: client.api.kill(s.container_id))
    killer.start()
    obs = s.execute_code("bash", "sleep 5")
    killer.join()
    assert obs.exit_code is None and "died" in obs.error and not s.alive
    assert s.fault == "agent" and "after the agent's code ran" in s.failure
    assert s.receipts()[-1].exit_code is None
    cid = s.container_id
    s.close()
    assert s.execute_code("python", "print(1)").error  # closed: an error observation, not an exception
    deadline = time.monotonic() + 10
    while client.api.containers(all=True, quiet=True, filters={"id": cid}) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not client.api.containers(all=True, quiet=True, filters={"id": cid})


def test_restore_small_and_large_states_and_refuse_escaping_tar(client, sb):
    small = SandboxState(files={"a/b.txt": b"x" * 100}, env={"E": "1"})
    large = SandboxState(files={f"vol/{i}.raw": bytes([i]) * 600_000 for i in range(5)})  # > inline limit
    for state in (small, large, small):
        sb.reset(state)
        assert sb.export_state().digest() == state.digest() and sb.receipts() == []
    assert sb.execute_code("bash", "echo $E; ls -A; stat -c '%U %a' a a/b.txt").stdout == "1\na\nnobody 755\n" \
        "nobody 644\n"
    import base64, io, tarfile  # noqa: E401 - only this test builds a hostile tar
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("../../tmp/escaped")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"!"))
    reply = sb._request({"op": "load", "tar_b64": base64.b64encode(buf.getvalue()).decode()}, 10)
    assert not reply["ok"] and "outside the workspace" in reply["error"]
    assert sb.execute_code("bash", "ls /tmp/escaped").exit_code != 0


def test_executor_is_not_inspectable_by_agent_code(sb):
    obs = sb.execute_code("bash", "cat /proc/$PPID/environ; cat /proc/$PPID/mem")
    assert obs.exit_code != 0 and obs.stderr.count("Permission denied") == 2


def test_forged_reply_lines_cannot_reach_the_host(sb):
    forge = ('{"ok": true, "id": %d, "exit_code": 0, "stdout": "made up", "stderr": "", "timed_out": false}\n')
    code = ("import os\n"
            "for fd in range(3, 1024):\n"
            "    for ident in range(0, 64):\n"
            "        try:\n"
            "            os.write(fd, (%r %% ident).encode())\n"
            "        except OSError:\n"
            "            break\n"
            "for pid in os.listdir('/proc'):\n"
            "    try:\n"
            "        open('/proc/%%s/fd/1' %% pid, 'w').write(%r %% 1)\n"
            "    except (OSError, ValueError):\n"
            "        pass\n"
            "raise SystemExit(1)") % (forge, forge)
    obs = sb.execute_code("python", code)
    assert obs.exit_code == 1 and "made up" not in obs.stdout
    assert sb.receipts()[-1].exit_code == 1 and sb.receipts()[-1].stdout == ""
    nxt = sb.execute_code("python", "print('mine')")
    assert nxt.stdout == "mine\n" and nxt.exit_code == 0 and sb.receipts()[-1].stdout == "mine\n"
    assert sb.stray_replies == 0  # nothing reached the channel at all
    fds = sb.execute_code("bash", "ls /proc/self/fd | sort -n | tr '\\n' ' '; ls /proc/$PPID/fd 2>&1 | head -1")
    assert fds.stdout.split("\n")[0].split()[:3] == ["0", "1", "2"] and "Permission denied" in fds.stdout


def test_a_reply_to_another_request_is_dropped_by_id(client):
    with DockerSandbox(client, owner=OWNER) as s:
        s._channel.send({"op": "exec", "language": "python", "code": "print('stale')", "id": 10_000})
        obs = s.execute_code("python", "print('fresh')")  # the stale reply arrives first and is dropped
        assert obs.stdout == "fresh\n" and s.receipts()[-1].stdout == "fresh\n" and s.stray_replies == 1


def test_a_missing_image_names_the_build_command(client):
    """A checkout whose image tag was never built here (a newcomer's first run after pulling) says what to run."""
    with pytest.raises(SandboxError, match=r"sandbox image 'bat-sandbox:never-built' is missing; build it with "
                                           r"`bash launch/build_images.sh`"):
        DockerSandbox(client, DockerSandboxConfig(image="bat-sandbox:never-built"), owner=OWNER)
