"""Multi-host learner (bat_jax/learn/distributed.py): configuration from the environment, which rows a process
feeds, and (slow) two processes joined by jax.distributed on CPU (gloo) computing the same GRPO steps as one."""

import pathlib
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from bat_jax.learn import distributed
from bat_jax.models import mesh as mesh_lib
from bat_jax.learn.distributed import DistributedConfig
from bat_jax.models.mesh import MeshConfig
from doubles import cpu_process_env

REPO = pathlib.Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "multihost_worker.py"
MESHES = ("fsdp", "fsdp_tensor")


def test_config_from_env():
    assert DistributedConfig.from_env({}) == DistributedConfig()
    assert not DistributedConfig.from_env({}).multi_process
    cfg = DistributedConfig.from_env({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4",
                                      "JAX_PROCESS_ID": "3", "JAX_LOCAL_DEVICE_IDS": "0,1",
                                      "JAX_CPU_COLLECTIVES": "mpi"}, initialization_timeout_s=60)
    assert cfg == DistributedConfig("10.0.0.1:1234", 4, 3, (0, 1), "mpi", 60)
    assert cfg.multi_process
    assert DistributedConfig.from_env({"JAX_AUTO_DISTRIBUTED": "1"}).auto
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES"):
        DistributedConfig.from_env({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "two",
                                    "JAX_PROCESS_ID": "0"})
    with pytest.raises(ValueError, match="JAX_LOCAL_DEVICE_IDS"):
        DistributedConfig.from_env({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0",
                                    "JAX_LOCAL_DEVICE_IDS": "0;1"})
    with pytest.raises(ValueError, match="process_id 2 of 2"):
        DistributedConfig("h:1", num_processes=2, process_id=2)
    with pytest.raises(ValueError, match="coordinator_address"):
        DistributedConfig(num_processes=2, process_id=1)
    with pytest.raises(ValueError, match="cpu_collectives"):
        DistributedConfig(cpu_collectives="nccl")
    assert distributed.initialize(DistributedConfig()) is False  # one process: nothing to start


def test_heartbeat_timeout_from_env():
    """How long a run outlives a dead process: JAX's heartbeat timeout, 100 s unless BAT_JAX_HEARTBEAT_TIMEOUT_S."""
    base = {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}
    assert DistributedConfig.from_env(base).heartbeat_timeout_s == 100
    assert DistributedConfig.from_env(dict(base, BAT_JAX_HEARTBEAT_TIMEOUT_S="15")).heartbeat_timeout_s == 15
    with pytest.raises(ValueError, match="BAT_JAX_HEARTBEAT_TIMEOUT_S='soon'"):
        DistributedConfig.from_env(dict(base, BAT_JAX_HEARTBEAT_TIMEOUT_S="soon"))


def test_initialize_from_the_environment_is_a_noop_for_one_process():
    """What `python -m bat_jax.launch` runs first: nothing without a coordinator or with one process."""
    assert distributed.initialize(DistributedConfig.from_env({})) is False
    one = {"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0"}
    assert distributed.initialize(DistributedConfig.from_env(one)) is False
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES"):
        distributed.initialize(DistributedConfig.from_env({"JAX_COORDINATOR_ADDRESS": "h:1"}))


def test_single_process_rows_and_global_batch():
    mesh = mesh_lib.build_mesh(MeshConfig(fsdp=4, tensor=2))
    sharding = mesh_lib.batch_sharding(mesh, 2)
    np.testing.assert_array_equal(distributed.process_rows(sharding, 8), np.arange(8))
    with pytest.raises(ValueError, match="do not split evenly"):
        distributed.process_rows(sharding, 6)
    batch = {"x": np.arange(16, dtype=np.float32).reshape(8, 2), "adv": np.linspace(-1, 1, 8, dtype=np.float32)}
    local = distributed.local_rows(batch, mesh)
    out = distributed.global_batch(local, mesh, 8)
    assert out["x"].sharding == sharding and out["adv"].sharding == mesh_lib.batch_sharding(mesh, 1)
    np.testing.assert_array_equal(np.asarray(out["x"]), batch["x"])
    np.testing.assert_array_equal(distributed.host_gather(out)["adv"], batch["adv"])
    with pytest.raises(ValueError, match="this process holds 8 of 8"):
        distributed.global_batch({"x": batch["x"][:4]}, mesh, 8)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(out_prefix: pathlib.Path, devices: int, process: tuple[str, int, int] | None) -> subprocess.Popen:
    env = cpu_process_env(devices)
    if process is not None:
        address, num, pid = process
        env.update(JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES=str(num), JAX_PROCESS_ID=str(pid))
    log = open(f"{out_prefix}log", "w")
    return subprocess.Popen([sys.executable, str(WORKER), str(out_prefix), ",".join(MESHES)], env=env, cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT)


def _wait_all(procs: dict[str, subprocess.Popen], prefixes: dict[str, pathlib.Path], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs.values():
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    failed = {n: p.returncode for n, p in procs.items() if p.returncode != 0}
    if failed:
        logs = "\n".join(f"--- {n} (rc {rc}):\n" + pathlib.Path(f"{prefixes[n]}log").read_text()[-3000:]
                         for n, rc in failed.items())
        pytest.fail(f"worker processes failed or timed out after {timeout_s:.0f} s:\n{logs}")


@pytest.mark.slow
def test_two_processes_over_jax_distributed_match_one_process(tmp_path):
    """2 processes × 2 CPU devices (gloo collectives) vs 1 process × 4 devices: same global batch, same mesh
    shape. Two GRPO steps (2 micro-batches each; step 1 with each process feeding only its half of the rows,
    step 2 with the Learner placing the whole host batch) give the same parameters, loss and (every-process)
    logprobs; the global batch really spans both processes."""
    address = f"127.0.0.1:{_free_port()}"
    prefixes = {name: tmp_path / f"{name}." for name in ("p0", "p1", "ref")}
    procs = {"p0": _spawn(prefixes["p0"], 2, (address, 2, 0)), "p1": _spawn(prefixes["p1"], 2, (address, 2, 1)),
             "ref": _spawn(prefixes["ref"], 4, None)}
    _wait_all(procs, prefixes, timeout_s=420)
    for mesh in MESHES:
        ref, p0, p1 = (np.load(f"{prefixes[n]}{mesh}.npz") for n in ("ref", "p0", "p1"))
        assert ref["summary"].tolist() == [0, 1, 4, 4]  # process 0 of 1, 4 local devices of 4
        assert p0["summary"].tolist() == [0, 2, 2, 4] and p1["summary"].tolist() == [1, 2, 2, 4]
        assert p0["rows"].tolist() == [0, 1, 2, 3] and p1["rows"].tolist() == [4, 5, 6, 7]
        assert bool(ref["addressable"]) and not bool(p0["addressable"]) and not bool(p1["addressable"])
        keys = sorted(k for k in ref.files if k.startswith("param/"))
        assert len(keys) == 24  # every parameter of the 2-layer Qwen3 came back
        moved = max(float(np.abs(ref[k] - ref["init/" + k[6:]]).max()) for k in keys)
        assert moved > 1e-3, "the steps must change the parameters"
        for worker in (p0, p1):
            np.testing.assert_allclose(float(worker["loss"]), float(ref["loss"]), rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(worker["logprobs"], ref["logprobs"], atol=1e-5, rtol=0)
            for k in keys:
                np.testing.assert_allclose(worker["init/" + k[6:]], ref["init/" + k[6:]], atol=0, rtol=0)
                np.testing.assert_allclose(worker[k], ref[k], atol=1e-5, rtol=0, err_msg=f"{mesh} {k}")
