"""Warm sandboxes by default for GRPO rollouts and held-out evaluation (bat_jax/bicurl/run_loops.py).

Against the real engine: an agent-loop rollout served by the warm pool after a dirty episode in the same container
sees exactly what a fresh container shows (files, environment, processes, /tmp, /dev/shm, IPC: the executor's
fingerprint and the agent's own view); the experiment's loops take their sandboxes from one pool by default, sized
to the rollout concurrency, and `experiment.run` removes its containers when it raises."""

import dataclasses
import json

import numpy as np
import pytest

from bat_jax.bicurl import experiment as ex
from bat_jax.rollout.agent_loop import AgentLoop, AgentLoopConfig, RolloutRequest
from bat_jax.rollout.sampling import SamplingConfig
from bat_jax.rollout.engine import Completion
from bat_jax.bicurl.run_loops import eval_cells, open_run_loops, warm_pool_size
from bat_jax.sandbox.docker import DockerSandbox, connect
from bat_jax.sandbox.types import SandboxState
from bat_jax.sandbox.backends import open_backend

import micro_config
from doubles import EOT, StubBuilder, WordTokenizer

pytestmark = pytest.mark.docker

DIRTY = r"""
echo secret > leak.txt && mkdir -p out && echo 1 > out/x && rm a.txt
echo "$K" > /tmp/note && mkdir -p /tmp/.cache/x && echo 1 > /tmp/.cache/x/y && echo shm > /dev/shm/blob
python3 -c 'import ctypes; assert ctypes.CDLL(None).shmget(4242, 4096, 0o1666) >= 0'
nohup sleep 300 >/dev/null 2>&1 &
echo planted
"""
# what the next episode's agent looks at first: environment, workspace, /tmp, /dev/shm, processes
PROBE = r"""echo "[$K][$SEED]"; ls -A; cat b.txt; ls -A /tmp /dev/shm
python3 - <<'PY'
import os
names = []
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        try:
            names.append(open(f"/proc/{pid}/comm").read().strip())
        except OSError:
            pass
print("processes:", sorted(names))
PY
"""


def _call(code: str) -> str:
    return '<tool_call>\n' + json.dumps({"name": "execute_code", "arguments": {"language": "bash", "code": code}}) \
        + '\n</tool_call>'


class OneCallEngine:
    """Samples one turn per episode: the tool call of its request's first prompt word ('dirty' or 'probe')."""

    weight_version = 0

    def __init__(self, tokenizer):
        self.tok = tokenizer
        tokenizer.pieces.update({20: _call(DIRTY), 21: _call(PROBE)})

    def generate(self, prompts, params, *, max_new_tokens=None, seeds=None):
        dirty = self.tok.encode("dirty")[0]
        return [Completion(np.asarray([20 if p[0] == dirty else 21, EOT], np.int32), np.zeros(2, np.float32),
                           "stop", 0) for p in prompts]


def _request(name: str, state: SandboxState) -> RolloutRequest:
    return RolloutRequest(state_id=name, state=state, system_prompt=name, user_message="brief")


def test_a_pooled_rollout_after_a_dirty_episode_sees_exactly_a_fresh_state():
    state_a = SandboxState(files={"a.txt": b"A"}, env={"K": "secret-of-A"})
    state_b = SandboxState(files={"b.txt": b"B"}, env={"SEED": "7"})
    tok = WordTokenizer()
    engine = OneCallEngine(tok)
    config = AgentLoopConfig(sampling=SamplingConfig(group_size=1),
                             max_assistant_turns=1, max_tool_calls=1, progress=False)
    held, prints = [], []
    with open_backend("docker", concurrency=2, warm=1) as backend:  # one container: B runs where A ran

        def make(state):
            sb = backend.make(state)
            held.append(sb.container_id)
            prints.append(sb.fingerprint())  # before the episode's first call
            return sb

        loop = AgentLoop(engine, lambda: StubBuilder(tok), make, config, sandbox_release=backend.release)
        (dirty,) = loop.run([_request("dirty", state_a)])
        (probe,) = loop.run([_request("probe", state_b)])
        pool = backend.pool
        assert pool.size == 1 and pool.replaced == 0 and held[0] == held[1]
        fresh = DockerSandbox(connect(), state=state_b)
        try:
            fresh_print = fresh.fingerprint()
            fresh_view = fresh.execute_code("bash", PROBE).stdout
        finally:
            fresh.close()
    assert dirty.receipts[0].stdout == "planted\n" and dirty.scored
    assert sorted(dirty.artefacts) == ["leak.txt", "out/x"]
    assert prints[1] == fresh_print and prints[1]["ipc"] == []
    seen = probe.receipts[0].stdout  # what the agent of episode B saw
    assert seen == fresh_view and seen.startswith("[][7]\nb.txt\nB")
    assert not {"leak.txt", "out", "note", ".cache", "blob", "sleep"} & set(seen.split())
    assert probe.receipts[0].index == 0 and probe.artefacts == {}
    assert pool._closed and pool._members == set()


def _docker_count(owner):
    return len(connect().api.containers(all=True, quiet=True, filters={"label": [f"bat_jax.owner={owner}"]}))


def test_the_experiment_loops_share_one_warm_pool_by_default(tmp_path):
    from bat_jax.policy import build_policy

    c = micro_config.components(micro_config.seeded(tmp_path / "bank"))
    assert ex.BiCuRLConfig().sandbox_pool is True
    cells = eval_cells(c.evaluation, c.benchmark)
    assert warm_pool_size(c.pools.batch_size * c.sampling.group_size, cells) == 8  # 4 rows x K=2 > 1 cell
    assert warm_pool_size(1 * c.sampling.group_size, cells) == 2
    assert warm_pool_size(0, cells) == 1  # rollouts on Ray workers: the evaluation's one cell
    policy = build_policy(c.policy)
    loops = open_run_loops(policy, None, c.agent, c.evaluation, c.benchmark, c.pools.batch_size, "docker")
    pool = loops.sandboxes.pool
    try:
        assert pool.size == 8 and _docker_count(pool.owner) == 8
        for loop in (loops.rollouts, loops.evaluation):
            assert loop.sandbox_release == pool.release
            sb = loop.sandbox_factory(SandboxState(files={"x": b"1"}))
            assert sb in pool._members and sb.list_files() == ["x"]
            loop.sandbox_release(sb)
    finally:
        loops.close()
    assert _docker_count(pool.owner) == 0
    fresh = open_run_loops(policy, None, c.agent, c.evaluation, c.benchmark, c.pools.batch_size, "docker",
                           warm_pool=False)
    assert fresh.sandboxes.pool is None and fresh.rollouts.sandbox_release is None
    fresh.close()


def test_run_removes_the_pool_when_it_raises(tmp_path, monkeypatch):
    """`experiment.run` on Docker with the default config opens the warm pool; an error later in the run (here:
    the checkpointer) still removes every container of it."""
    opened = []
    real = ex.open_run_loops

    def recording(*args, **kwargs):
        opened.append(real(*args, **kwargs))
        return opened[-1]

    def failing_checkpointer(config):
        raise RuntimeError("checkpoint directory unwritable")

    monkeypatch.setattr(ex, "open_run_loops", recording)
    monkeypatch.setattr(ex, "Checkpointer", failing_checkpointer)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(RuntimeError, match="unwritable"):
        ex.run(run_dir, ex.BiCuRLConfig(rounds=1, grpo_steps_per_round=1), micro_config.components(micro_config.seeded(tmp_path / "bank")))
    (loops,) = opened
    assert loops.sandboxes.pool.size == 8 and loops.sandboxes.pool._closed
    assert _docker_count(loops.sandboxes.pool.owner) == 0


def test_a_rollout_worker_keeps_its_own_warm_pool_and_removes_it_on_close():
    """A Ray rollout worker (here the same class in-process) serves its episodes from a warm pool of its share
    (2 concurrent episodes): two calls of 2 episodes on the same 2 containers, none replaced; `close` removes
    the containers."""
    from bat_jax.policy import PolicyConfig
    from bat_jax.bicurl.engines import EngineConfig
    from bat_jax.bicurl.ray_workers import RolloutWorker, WorkerSpec

    agent = AgentLoopConfig(sampling=SamplingConfig(group_size=4), max_assistant_turns=2, max_tokens_per_turn=8,
                            max_context_tokens=1024, progress=False)
    tiny = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "max_position_embeddings": 1024}
    worker = RolloutWorker(WorkerSpec(PolicyConfig(architecture="qwen3", tiny=tiny, prompt_style="compact"), agent,
                                      "docker", EngineConfig(max_batch=4), warm_pool=2))
    pool = worker.sandboxes.pool
    try:
        assert pool.size == 2 and _docker_count(pool.owner) == 2
        used = []
        real_acquire = pool.acquire

        def recording(*args, **kwargs):
            sandbox = real_acquire(*args, **kwargs)
            used.append(sandbox.container_id)
            return sandbox

        pool.acquire = recording  # the worker's sandbox factory calls `pool.acquire`
        request = _request("probe", SandboxState(files={"b.txt": b"B"}))
        got = worker.run([(request, 0, k) for k in range(2)], 7) + worker.run([(request, 0, k) for k in (2, 3)], 7)
        assert [t.episode for t in got] == [0, 1, 2, 3] and [t.infra_error for t in got] == [""] * 4
        assert len(used) == 4 and len(set(used[:2])) == 2 and set(used[2:]) == set(used[:2]) and pool.replaced == 0
    finally:
        assert worker.close() == 2
    assert _docker_count(pool.owner) == 0 and pool._closed


def test_a_benchmarks_own_sandbox_image_is_used_and_a_failed_build_names_the_benchmark_and_command(monkeypatch):
    """The shared package list is the shared image: found, nothing built. Another list whose image is missing is built;
    a build that fails (here: debootstrap missing) is one BackendUnavailable naming the benchmark, its packages and the
    command that builds the image, and opening its sandboxes fails the same way."""
    from bat_jax.benchmarks.tabular.benchmark import TabularBenchmark
    from bat_jax.bicurl.run_loops import ensure_sandbox_image
    from bat_jax.sandbox import images
    from bat_jax.sandbox.backends import BackendUnavailable

    class Shared(TabularBenchmark):
        sandbox_packages = tuple(images.packages())

    assert ensure_sandbox_image(Shared()) == images.task_tag()
    with open_backend("docker", image=Shared().sandbox_image()) as backend:
        box = backend.make(SandboxState(files={"a.txt": b"hi"}))
        assert box.execute_code("python", "print(open('a.txt').read())").stdout.strip() == "hi"
        box.close()  # fresh sandboxes: no release hook

    class Own(TabularBenchmark):
        sandbox_packages = ("python3", "python3-bat-jax-test-no-such-package")

    def no_debootstrap(*args, **kw):
        raise RuntimeError("debootstrap is not installed (apt-get install -y debootstrap)")

    monkeypatch.setattr(images, "ensure_images", no_debootstrap)
    with pytest.raises(BackendUnavailable, match=r"benchmark 'tabular': its sandbox image bat-sandbox:\w{12} "
                                                 r"\(sandbox_packages python3,python3-bat-jax-test-no-such-package\) "
                                                 r"could not be built: RuntimeError: debootstrap is not installed.*"
                                                 r"python -m bat_jax.sandbox.images --packages python3,"):
        ensure_sandbox_image(Own())
    with pytest.raises(BackendUnavailable, match="docker backend unavailable"):
        open_backend("docker", image=Own().sandbox_image())
