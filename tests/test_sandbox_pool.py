"""Warm pool and snapshots against the real engine: reset between rollouts, concurrency, recovery, cleanup."""

import concurrent.futures
import io
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from bat_jax.sandbox import images, snapshot
from bat_jax.sandbox.docker import DockerSandboxConfig, SandboxError, connect
from bat_jax.sandbox.pool import SandboxPool
from bat_jax.sandbox.tools import Action
from bat_jax.sandbox.types import SandboxState, sha256_hex

pytestmark = pytest.mark.docker
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _count(client, owner=None):
    labels = ["bat_jax=1"] + ([f"bat_jax.owner={owner}"] if owner else [])
    return len(client.api.containers(all=True, quiet=True, filters={"label": labels}))


@pytest.fixture(scope="module")
def client():
    """The Docker client; afterwards, no container of a pool this module made may remain. Only this module's
    owners are counted, so a run beside other bat_jax jobs (sweeps, a main job) is not mistaken for a leak."""
    from bat_jax.sandbox import pool as pool_module

    c = connect()
    images.ensure_images(c)
    owners, real = [], pool_module.new_owner

    def recording_new_owner():
        owners.append(real())
        return owners[-1]

    pool_module.new_owner = recording_new_owner
    try:
        yield c
    finally:
        pool_module.new_owner = real
    assert owners and sum(_count(c, o) for o in owners) == 0, "bat_jax containers left behind by this module"


@pytest.fixture(scope="module")
def pool(client):
    with SandboxPool(size=3, config=DockerSandboxConfig(timeout_s=10.0), client=client) as p:
        yield p
    assert _count(client, p.owner) == 0


def test_pool_resets_between_rollouts(pool):
    with pool.sandbox(SandboxState(files={"in.txt": b"1"}, env={"K": "v"})) as sb:
        sb.execute_code("bash", "echo secret > leak.txt; echo $K > k.txt")
        sb.submit("k.txt")
        assert sb.list_files() == ["in.txt", "k.txt", "leak.txt"] and sb.read_file("k.txt") == b"v\n"
        first = sb
    with pool.sandbox(SandboxState(files={"other.txt": b"2"})) as sb:
        assert sb.list_files() == ["other.txt"]
        assert sb.receipts() == [] and sb.submitted() is None
        assert sb.execute_code("bash", "echo \"[$K]\"; ls -A").stdout == "[]\nother.txt\n"
    assert first.alive and pool.replaced == 0


def test_pool_concurrency_is_safe(pool):
    def rollout(i):
        with pool.sandbox(SandboxState(files={"id.txt": str(i).encode()})) as sb:
            out = sb.execute_code("python", "import time; time.sleep(0.05); print(open('id.txt').read())").stdout
            return out, [r.index for r in sb.receipts()]

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(rollout, range(12)))
    assert results == [(f"{i}\n", [0]) for i in range(12)]


def test_pool_recovers_from_fork_bomb_and_killed_executor(pool):
    with pool.sandbox() as sb:
        sb.execute_code("bash", ":(){ :|:& };:", timeout_s=3)
    replaced = pool.replaced
    with pool.sandbox() as sb:  # a sandbox killed from outside (the agent cannot kill its executor)
        sb._client.api.kill(sb.container_id)
        obs = sb.execute_code("bash", "echo 1")
        assert "died" in obs.error
    assert pool.replaced == replaced + 1
    outs = []
    for _ in range(pool.size):  # every member answers again
        with pool.sandbox() as sb:
            outs.append(sb.execute_code("python", "print(5)").stdout)
    assert outs == ["5\n"] * pool.size


def test_snapshot_replay_save_load_restore(pool, tmp_path):
    initial = SandboxState(files={"data/scan.raw": np.arange(64, dtype=np.int16).tobytes()}, env={"SEED": "3"})
    calls = [
        Action("", "execute_code", {"language": "python", "code": textwrap.dedent("""
            import numpy as np, os
            a = np.frombuffer(open('data/scan.raw', 'rb').read(), dtype=np.int16).reshape(8, 8)
            os.makedirs('out/masks', exist_ok=True)
            np.save('out/masks/m.npy', (a > int(os.environ['SEED'])).astype(np.uint8))
            """)}),
        Action("", "execute_code", {"language": "bash", "code": "echo stage1 > notes.md; rm data/scan.raw"}),
    ]
    with pool.sandbox() as sb:
        state, obs = snapshot.replay_prefix(sb, initial, calls)
    assert [o.exit_code for o in obs] == [0, 0]
    assert sorted(state.files) == ["notes.md", "out/masks/m.npy"] and state.env == {"SEED": "3"}
    mask = np.load(io.BytesIO(state.files["out/masks/m.npy"]))
    np.testing.assert_array_equal(mask, (np.arange(64).reshape(8, 8) > 3).astype(np.uint8))
    digest = snapshot.save(state, tmp_path / "snap.tar")
    assert digest == state.digest()
    loaded = snapshot.load(tmp_path / "snap.tar")
    assert loaded.digest() == digest and dict(loaded.files) == dict(state.files)
    with pool.sandbox(loaded) as fresh:
        again = fresh.export_state()
        sums = fresh.execute_code("bash", "sha256sum notes.md out/masks/m.npy").stdout.split()
    assert again.digest() == digest and dict(again.files) == dict(state.files) and again.env == {"SEED": "3"}
    assert sums[0::2] == [sha256_hex(state.files["notes.md"]), sha256_hex(state.files["out/masks/m.npy"])]


def _child_pool_script():
    return textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {ROOT!r})
        from bat_jax.sandbox.pool import SandboxPool
        pool = SandboxPool(size=2)
        print(pool.owner, flush=True)
        time.sleep(60)
    """)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_containers_removed_on_ctrl_c_and_on_kill(client, sig):
    proc = subprocess.Popen([sys.executable, "-c", _child_pool_script()], stdout=subprocess.PIPE, text=True)
    owner = proc.stdout.readline().strip()
    assert owner and _count(client, owner) == 2
    proc.send_signal(sig)
    proc.wait(90)  # Ctrl-C: the child removes its containers before exiting (slow on a loaded 2-core machine)
    deadline = time.monotonic() + 30
    while _count(client, owner) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _count(client, owner) == 0


def test_pool_errors_are_clear(client, monkeypatch):
    with pytest.raises(ValueError, match="size must be"):
        SandboxPool(size=0, client=client)
    with pytest.raises(SandboxError, match="is missing; build it"):
        SandboxPool(size=1, config=DockerSandboxConfig(image="bat-sandbox:doesnotexist"), client=client)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(SandboxError, match="Docker engine not reachable"):
        SandboxPool(size=1)


_PLANT = r"""
set -e
site=$(python3 -c 'import site; print(site.getusersitepackages())')
mkdir -p "$site" && echo 'import os; open("/workspace/leak.txt", "w").write(os.getcwd())' > "$site/evil.pth"
echo secret > /tmp/note && mkdir -p /tmp/.cache/x && echo 1 > /tmp/.cache/x/y
echo shm > /dev/shm/blob
python3 - <<'PY'
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
assert libc.shmget(4242, 4096, 0o1666) >= 0 and libc.msgget(4343, 0o1666) >= 0 and libc.semget(4444, 1, 0o1666) >= 0
fd = os.open("/dev/mqueue/q1", os.O_CREAT | os.O_WRONLY, 0o666) if os.path.isdir("/dev/mqueue") else -1
os.setxattr("/workspace", "user.mark", b"1")
PY
chmod 700 /workspace/sub || true
mkdir -p /workspace/sub && chmod 000 /workspace/sub && chmod 711 /workspace
nohup sleep 300 >/dev/null 2>&1 &
echo planted
"""


def test_reset_sandbox_is_indistinguishable_from_a_fresh_one(client):
    state = SandboxState(files={"task.md": b"T-1", "data/a.bin": bytes(range(256))}, env={"SEED": "1"})
    with SandboxPool(1, client=client) as pool:
        with pool.sandbox(state) as sb:
            fresh_print = sb.fingerprint()
            assert sb.execute_code("bash", _PLANT).stdout.endswith("planted\n")
            dirty = sb.fingerprint()
            assert dirty != fresh_print and {"shm", "msg", "sem"} <= set(dirty["ipc"])
        with pool.sandbox(state) as sb:  # the same container, reset
            reset = sb.fingerprint()
            obs = sb.execute_code("bash", "python3 -c 'print(1)'; ls -a /tmp /dev/shm; cat leak.txt 2>&1 | head -1")
        fresh = pool._new()
        try:
            fresh.reset(state)
            assert reset == fresh.fingerprint()
        finally:
            pool._discard(fresh)
    assert reset["ipc"] == [] and reset["procs"] == fresh_print["procs"]
    assert obs.stdout.startswith("1\n") and "secret" not in obs.stdout and "blob" not in obs.stdout
    assert "No such file" in obs.stdout  # the planted .pth never ran in episode B


# A daemon that changes its PID all the time (fork, parent exits) so that a kill pass over a snapshot of PIDs
# always misses the newest one, and that keeps writing forged evidence into the workspace: if it outlived the
# pool's reset it would plant results in the next episode, which the verifier would credit to that episode.
_HOPPER = r"""
python3 - <<'PY'
import os, time
if os.fork() == 0:
    os.setsid()
    while True:
        if os.fork():
            os._exit(0)
        for path in ("/workspace/results.json", "/tmp/results.json"):
            try:
                with open(path, "w") as f:
                    f.write('{"dice": 0.99, "forged": true}')
            except OSError:
                pass
PY
sleep 0.3; ls /workspace; echo planted
"""


def test_a_pid_hopping_daemon_does_not_outlive_the_reset_to_forge_the_next_episode(client):
    state = SandboxState(files={"task.md": b"T-2"})
    with SandboxPool(1, client=client) as pool:
        with pool.sandbox(state) as sb:
            first = sb.execute_code("bash", _HOPPER, timeout_s=10)
        with pool.sandbox(state) as sb:  # the same container, reset
            time.sleep(1.0)  # a surviving daemon would have rewritten its file by now
            files = sorted(sb.list_files())
            view = sb.execute_code("bash", "sleep 0.5; ls -A /workspace /tmp; ps -e -o comm= | sort | uniq -c")
            reset_print = sb.fingerprint()
        fresh = pool._new()
        try:
            fresh.reset(state)
            fresh_print = fresh.fingerprint()
        finally:
            pool._discard(fresh)
        assert pool.replaced == 0  # the reset itself cleared it (no replacement needed)
    assert "results.json" in first.stdout and first.stdout.endswith("planted\n")
    assert files == ["task.md"] and "results.json" not in view.stdout and "python3" not in view.stdout
    assert reset_print == fresh_print


def test_executor_reset_fails_closed_when_processes_survive(monkeypatch):
    """The in-container executor's reset raises (its reply is an error, so the pool replaces the container)
    when its kill passes leave a process alive, before it wipes or loads anything. Run on the host with every
    destructive step replaced by a recorder (no container needed)."""
    import importlib.util

    from bat_jax.sandbox import file_trace

    monkeypatch.setitem(sys.modules, "file_trace", file_trace)
    spec = importlib.util.spec_from_file_location("bat_executor", os.path.join(ROOT, "sandboxes", "task", "executor.py"))
    executor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(executor)
    calls = []
    for name in ("_remove_ipc", "_wipe", "_load"):
        monkeypatch.setattr(executor, name, lambda *a, name=name: calls.append(name) or 0)
    monkeypatch.setattr(executor, "_other_pids", lambda keep: [4242])
    monkeypatch.setattr(executor.Executor, "new_trace", lambda self: calls.append("new_trace"))
    monkeypatch.setattr(executor.Executor, "spawn", lambda self: calls.append("spawn"))
    monkeypatch.setattr(executor, "_sweep", lambda keep=(), limit_s=5.0: False)
    ex = executor.Executor()
    calls.clear()
    with pytest.raises(RuntimeError, match=r"survived .*\[4242\]"):
        ex.reset()
    assert calls == []
    monkeypatch.setattr(executor, "_sweep", lambda keep=(), limit_s=5.0: True)
    assert ex.reset() == {"removed": 0, "written": 0}
    assert calls == ["_remove_ipc", "_wipe", "new_trace", "spawn"]
