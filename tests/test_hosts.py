"""bat_jax/bicurl/hosts.py: one process is the local computation; `current()` picks `multihost.ManyHosts` for several,
which refuses the sampler on the global mesh and gives each process its share and its own engine directory."""

import concurrent.futures
import threading

import pytest

from bat_jax.bicurl import hosts, multihost
from bat_jax.errors import ConfigError


def test_one_host_is_the_local_computation(tmp_path):
    one = hosts.current()
    assert isinstance(one, hosts.OneHost) and (one.count, one.index, one.is_primary) == (1, 0, True)
    assert one.on_primary(lambda: [1, 2], "y") == [1, 2]
    assert one.agree({"a": 1}, "z") == {"a": 1}
    with pytest.raises(KeyError):
        one.on_primary(lambda: {}["missing"], "lookup")
    with pytest.raises(ConfigError, match="no docker"):
        one.all_ok(lambda: (_ for _ in ()).throw(ConfigError("no docker")), "open")
    assert one.all_ok(lambda: "pool", "open") == "pool"
    made = one.primary_only(lambda: open(tmp_path / "ledger.jsonl", "w"))
    made.write("x")
    made.close()
    assert (tmp_path / "ledger.jsonl").read_text() == "x"
    assert one.share(5) == range(0, 5)
    built = one.local_engine(lambda policy, directory: (policy, directory), "policy", tmp_path, sampler_mesh=True)
    assert built == ("policy", tmp_path)  # the policy itself, the run directory, no wrapper; the mesh sampler allowed


def test_one_host_scored_rollouts_runs_the_whole_batch():
    class Loop:
        def run(self, requests, *, seed, on_trajectory):
            out = [f"{r}@{seed}" for r in requests]
            for i, t in enumerate(out):
                on_trajectory(i, t)
            return out

    class Scorer:
        def __init__(self):
            self.got = {}

        def submit(self, i, t):
            self.got[i] = len(t)

        def results(self):
            return [self.got[i] for i in sorted(self.got)]

    assert hosts.OneHost().scored_rollouts(Loop(), ["a", "bb"], 5, Scorer()) == (["a@5", "bb@5"], [3, 4])


def test_one_host_finished_returns_the_groups_done_once_one_is():
    gate = threading.Event()
    one = hosts.OneHost()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        slow = pool.submit(lambda: gate.wait(30) and "slow")
        fast = pool.submit(lambda: ("trajs", [1.0]))
        assert one.finished({0: slow, 3: fast}, "step 0's groups") == {3: ("trajs", [1.0])}
        gate.set()
        assert one.finished({0: slow}, "step 0's groups") == {0: "slow"}
        with pytest.raises(KeyError, match="sandbox"):
            one.finished({1: pool.submit(lambda: {}["sandbox"])}, "step 1's groups")
    assert one.finished({}, "nothing") == {}


def test_several_processes_get_many_hosts(monkeypatch, tmp_path):
    """Process 1 of 2 (faked): `current()` is a `ManyHosts`; `OneHost` is refused; the mesh sampler is refused with
    the binding named; the engine is built under hosts/process-1 and fed gathered weights; writers are no-ops."""
    monkeypatch.setattr(multihost.jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost.jax, "process_index", lambda: 1)
    many = hosts.current()
    assert isinstance(many, multihost.ManyHosts) and (many.count, many.index, many.is_primary) == (2, 1, False)
    with pytest.raises(RuntimeError, match="OneHost with 2 processes"):
        hosts.OneHost()
    with pytest.raises(ConfigError, match="engines.EngineConfig.sampler_mesh: unset it"):
        many.local_engine(lambda policy, directory: object(), None, tmp_path, sampler_mesh=True)
    monkeypatch.setattr(multihost, "engine_policy", lambda policy: ("copy of", policy))
    engine = many.local_engine(lambda policy, directory: (policy, directory), "policy", tmp_path, sampler_mesh=False)
    assert isinstance(engine, multihost.HostWeights)
    assert engine.engine == (("copy of", "policy"), tmp_path / "hosts" / "process-1")
    made = []
    assert isinstance(many.primary_only(lambda: made.append("ledger")), multihost.Elsewhere) and made == []
    assert many.share(5) == range(3, 5)
