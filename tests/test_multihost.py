"""bat_jax/bicurl/multihost.py: with one process each primitive is the local computation; (slow) two processes joined
by jax.distributed on CPU agree on process 0's values, see its errors, gather each other's rollouts, write only on
process 0, stop together when one host has no Docker, and a dead process ends the other within a bounded time."""

import json
import pathlib
import socket
import subprocess
import sys
import time

import pytest

from bat_jax.bicurl import multihost
from bat_jax.errors import ConfigError
from doubles import cpu_process_env

REPO = pathlib.Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "multihost_pieces_worker.py"


def test_share_splits_positions_contiguously():
    assert [multihost.share(10, i, 4) for i in range(4)] == [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    assert [multihost.share(3, i, 2) for i in range(2)] == [range(0, 2), range(2, 3)]
    assert [multihost.share(1, i, 3) for i in range(3)] == [range(0, 1), range(1, 1), range(1, 1)]
    assert multihost.share(5) == range(0, 5)  # one process: everything


def test_one_process_is_the_local_computation(tmp_path):
    assert multihost.is_primary() and multihost.process_count() == 1
    assert multihost.broadcast(3, "x") == 3
    assert multihost.on_primary(lambda: [1, 2], "y") == [1, 2]
    assert multihost.agree({"a": 1}, "z") == {"a": 1}
    assert multihost.allgather("v", "w") == ["v"]
    multihost.barrier("nothing to wait for")
    with pytest.raises(KeyError):
        multihost.on_primary(lambda: {}["missing"], "lookup")
    released = []
    with pytest.raises(ConfigError, match="no docker"):
        multihost.all_ok(lambda: (_ for _ in ()).throw(ConfigError("no docker")), "open", release=released.append)
    assert multihost.all_ok(lambda: "pool", "open") == "pool" and released == []
    made = multihost.primary_only(lambda: open(tmp_path / "ledger.jsonl", "w"))
    made.write("x")
    made.close()
    assert (tmp_path / "ledger.jsonl").read_text() == "x"
    engine = object()
    assert multihost.local_engine(engine) is engine
    multihost.check_config(sampler_mesh=True)  # nothing to refuse with one process
    assert multihost.host_label(2, "node-b") == "process 2 (node-b)"
    assert multihost.host_dir(tmp_path) == tmp_path


def test_elsewhere_writer_does_nothing():
    writer = multihost.Elsewhere("ScalarWriter")
    assert writer.scalar("grpo/reward", 0.5, 1) is None and writer.append(object()) is None


def test_several_processes_refuse_what_is_not_split_and_write_on_process_0_only(monkeypatch, tmp_path):
    """With 2 processes (process 1 here, faked) the sampler on the global mesh is refused.

    The error names the binding; a writer is not even made on process 1; its engine writes under hosts/process-1.
    """
    monkeypatch.setattr(multihost.jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost.jax, "process_index", lambda: 1)
    with pytest.raises(ConfigError) as e:
        multihost.check_config(sampler_mesh=True)
    assert str(e.value) == ("2 processes: engines.EngineConfig.sampler_mesh: unset it; each host's sampler runs on "
                            "its own devices")
    multihost.check_config(sampler_mesh=False)  # vLLM, Ray workers and bounded staleness run per host
    assert multihost.host_dir(tmp_path) == tmp_path / "hosts" / "process-1"
    made = []
    writer = multihost.primary_only(lambda: made.append("ledger"))
    assert isinstance(writer, multihost.Elsewhere) and made == [] and writer.append("line") is None
    assert multihost.share(5) == range(3, 5)


def test_host_weights_feed_a_vllm_engine_bf16_and_the_jax_sampler_its_state():
    """`HostWeights`: a vLLM engine (its `VLLMEngineConfig` in bf16) gets ``{HF name: bf16 numpy}``, cast on the mesh
    (`weight_sync.host_weights`); a LoRA vLLM engine the model itself; another engine gets the model's state gathered
    as it is (float32)."""
    import jax
    from flax import nnx

    from bat_jax.rollout.vllm_engine import VLLMEngineConfig
    from doubles import tiny_model

    class Recording:
        def __init__(self, config=None):
            self.config, self.got = config, None

        def update_weights(self, params, **options):
            self.got = params
            return 7

    model = tiny_model("qwen3")
    vllm, sampler = Recording(VLLMEngineConfig(model_dir="x", dtype="bfloat16")), Recording()
    assert multihost.HostWeights(vllm).update_weights(model) == 7
    assert multihost.HostWeights(sampler).update_weights(model) == 7
    want = {".".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    assert set(vllm.got) == set(want) and "model.embed_tokens.weight" in want
    assert {v.dtype.name for v in vllm.got.values()} == {"bfloat16"}
    emb = vllm.got["model.embed_tokens.weight"]
    assert emb.astype("float32").tolist() == jax.numpy.asarray(want["model.embed_tokens.weight"], "bfloat16"
                                                                ).astype("float32").tolist()
    assert isinstance(sampler.got, nnx.State)
    assert {str(v.get_value().dtype) for _, v in nnx.to_flat_state(sampler.got)} == {"float32"}
    lora_engine = Recording(VLLMEngineConfig(model_dir="x", dtype="bfloat16", max_lora_rank=8))
    assert multihost.HostWeights(lora_engine).update_weights(model, in_flight=True) == 7
    assert lora_engine.got is model  # its adapter is written from the model (every process joins the gathers)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_pair(tmp_path, scenario, timeout_s=240, heartbeat_s=100):
    """Both processes of `scenario`; returns ({index: output or None}, {index: rc}, {index: log}, seconds)."""
    address = f"127.0.0.1:{_free_port()}"
    procs, logs = {}, {}
    t0 = time.monotonic()
    for index in (0, 1):
        env = cpu_process_env(1, JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(index),
                              BAT_JAX_HEARTBEAT_TIMEOUT_S=str(heartbeat_s))
        logs[index] = tmp_path / f"{scenario}.{index}.log"
        with open(logs[index], "w") as log:
            procs[index] = subprocess.Popen([sys.executable, str(WORKER), str(tmp_path / f"{scenario}.{index}.json"),
                                             scenario], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        for p in procs.values():
            p.wait(timeout=max(1.0, t0 + timeout_s - time.monotonic()))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    seconds = time.monotonic() - t0
    outputs = {i: json.loads((tmp_path / f"{scenario}.{i}.json").read_text())
               if (tmp_path / f"{scenario}.{i}.json").exists() else None for i in procs}
    return outputs, {i: p.returncode for i, p in procs.items()}, {i: logs[i].read_text() for i in procs}, seconds


@pytest.mark.slow
def test_two_processes_agree_gather_and_write_once(tmp_path):
    out, rc, logs, _ = _run_pair(tmp_path, "pieces")
    assert rc == {0: 0, 1: 0}, logs
    p0, p1 = out[0], out[1]
    assert (p0["index"], p0["count"], p0["primary"]) == (0, 2, True) and (p1["index"], p1["primary"]) == (1, False)
    for p in (p0, p1):
        assert p["broadcast"] == {"from": 0}
        assert p["on_primary"] == ["made by", 0]
        assert p["agree_same"] == ["ok", ["accept", "ckpt-1"]]
        assert p["allgather"] == [0, 10]
        assert p["files"] == ["written_by_0.txt"]  # the writer exists on process 0 only
        # 3 requests × K=2 = 6 episodes: process 0 runs positions 0-2, process 1 positions 3-5, seeds unchanged
        assert p["trajectories"] == ["a/0@7", "a/1@7", "b/0@7", "b/1@7", "c/0@7", "c/1@7"]
        assert p["rewards"] == [5, 5, 5, 1005, 1005, 1005]  # each scored where it ran, then gathered
    assert p0["ran"] == [[0, 0], [0, 1], [1, 0]] and p1["ran"] == [[1, 1], [2, 0], [2, 1]]
    for p in (p0, p1):  # each process's groups, finished where they ran, on both
        assert p["finished"] == [[0, ["group 0", 0]], [1, ["group 1", 0]], [2, ["group 2", 1]]]
    assert p1["finished_error"] == ["RuntimeError", "sandbox of group 2 gone"]
    kind, message = p0["finished_error"]
    assert kind == "PeerError" and message.startswith("step 1's groups failed on process 1 (")
    assert message.endswith("): RuntimeError: sandbox of group 2 gone")
    assert (tmp_path / "written_by_0.txt").read_text() == "ledger line\n"
    assert p0["on_primary_error"] == ["ValueError", "the bank is broken"]
    kind, message = p1["on_primary_error"]
    assert kind == "PeerError" and "bank check failed on process 0 (" in message and "the bank is broken" in message
    assert p0["agree_different"] == ["ok", ["accept", "ckpt-0"]]
    kind, message = p1["agree_different"]
    assert kind == "PeerError" and "round 3 decision: process 1 (" in message
    assert "('fallback', 'ckpt-0') but process 0 has ('accept', 'ckpt-0')" in message


@pytest.mark.slow
def test_a_host_without_docker_stops_every_process_naming_it(tmp_path):
    out, rc, logs, _ = _run_pair(tmp_path, "no_docker")
    assert rc == {0: 0, 1: 0}, logs
    host = socket.gethostname()
    for p in (out[0], out[1]):
        kind, message = p["all_ok"]
        assert kind == "HostUnready"
        assert message == (f"opening the sandboxes failed on 1 of 2 processes — process 1 ({host}): "
                           "BackendUnavailable: "
                           "Docker engine not reachable (unix:///var/run/docker.sock)")
    assert out[0]["released"] == ["pool"] and out[1]["released"] == []  # process 0 closed what it had opened


@pytest.mark.slow
def test_a_dead_process_ends_the_other_within_the_heartbeat_timeout(tmp_path):
    out, rc, logs, seconds = _run_pair(tmp_path, "die", timeout_s=180, heartbeat_s=5)
    assert rc[1] == 3
    assert rc[0] != 0 or out[0]["waited"][0] != "ok", logs[0]
    assert seconds < 90, f"process 0 took {seconds:.0f} s to stop"
    # JAX's coordination service ends process 0 naming the task that stopped: "… (stopped sending heartbeats):\n1"
    assert rc[0] != 0 and out[0] is None, logs[0][-3000:]
    assert "The following tasks are unhealthy (stopped sending heartbeats):\n1\n" in logs[0], logs[0][-3000:]


@pytest.mark.slow
def test_a_process_whose_run_raises_exits_and_ends_the_other_within_the_heartbeat_timeout(tmp_path):
    """An error on one process prints its traceback and exits 1 at once; its waiting peer stops, naming it."""
    out, rc, logs, seconds = _run_pair(tmp_path, "raises", timeout_s=180, heartbeat_s=5)
    assert rc[1] == 1 and out[1] is None, logs[1][-3000:]
    assert "RuntimeError: sandbox pool lost" in logs[1]
    assert seconds < 90, f"the pair took {seconds:.0f} s to stop"
    assert rc[0] != 0 and out[0] is None, logs[0][-3000:]
    assert "The following tasks are unhealthy (stopped sending heartbeats):\n1\n" in logs[0], logs[0][-3000:]


@pytest.mark.slow
def test_two_processes_run_the_bounded_staleness_block_of_one(tmp_path):
    """The bounded-staleness block (s = 1, stand-in rollouts) as 2 processes trains what one process trains.

    Each process rolls out its share of every step's groups (row 0 of a batch on process 0, row 1 on process 1, a
    refill where its slot's row ran) and settles every group from the gathered results: the batches and counts of
    one process, s1 dropped as stale and refilled by r0 (on process 1), s2 evicted and refilled by r1 (on process
    0). The staleness trained on (0 or 1: whether a later step's group began before or after the next sync) depends
    on thread timing, in one process too.
    """
    out, rc, logs, _ = _run_pair(tmp_path, "async")
    assert rc == {0: 0, 1: 0}, logs
    env = cpu_process_env(1)
    subprocess.run([sys.executable, str(WORKER), str(tmp_path / "solo.json"), "async"], env=env, cwd=REPO,
                   check=True, timeout=240)
    solo = json.loads((tmp_path / "solo.json").read_text())
    timing = ("staleness_mean", "staleness_max")
    for p in (out[0], out[1]):
        assert p["steps"] == solo["steps"] and len(p["steps"]) == 3
        assert {k: v for k, v in p["stats"].items() if k not in timing} == \
               {k: v for k, v in solo["stats"].items() if k not in timing}
        assert p["stats"]["staleness_max"] <= 1
    assert (solo["stats"]["groups_dropped_stale"], solo["stats"]["groups_evicted"],
            solo["stats"]["groups_refilled"], solo["stats"]["groups_trained"]) == (1, 1, 2, 6)
    assert out[0]["ran"] == ["r1", "s0", "s2", "s4"] and out[1]["ran"] == ["r0", "s1", "s3", "s5"]
    # the groups trained at step 0: s0 and, in s1's slot, r0 (rewards 1,0 and 0,1: advantages ±1/√2)
    assert solo["steps"][0]["advantages"] == pytest.approx([0.707106, -0.707106, -0.707106, 0.707106], abs=1e-5)


# ------------------------------------------------------------------------------ the whole run, 2 × 2 vs 1 × 4

_MESH_IMPORT = "import bat_jax.models.mesh as mesh\n"
_SHORTER = """\
experiment.Components.mesh = @mesh.MeshConfig()
mesh.MeshConfig:
  data = 1
  fsdp = 4
  tensor = 1
experiment.BiCuRLConfig.rounds = 1
sft.SFTConfig.global_batch_size = 4
"""


def _micro_run_file(root: pathlib.Path, rounds: int = 1, extra: str = "") -> pathlib.Path:
    """The micro run file with `rounds` rounds of one GRPO step, over a Stage Bank built here once.

    The micro run is tests/micro_config.py's, with learner mesh fsdp = 4 (one mesh for 4 devices of one process or
    2 of each of two); `extra`: more gin lines (imports included) appended.
    """
    import dataclasses

    import micro_config
    from bat_jax.bicurl import evaluation as ev
    from bat_jax.stage_bank.factory import build_bank

    components = micro_config.components(micro_config.seeded(root / "bank"))
    manifest = ev.heldout_manifest(components.evaluation, components.benchmark)
    (root / "heldout_manifest.json").write_text(json.dumps(manifest))
    build_bank(dataclasses.replace(components.bank, heldout_manifest=str(root / "heldout_manifest.json")),
               components.benchmark)
    text = micro_config.gin_text(root / "bank")
    head, rest = text.split("\n", 1)  # after `from __gin__ import dynamic_registration`
    path = root / "micro_multihost.gin"
    if "policy.PolicyConfig.tiny" in extra:  # the extra lines choose another tiny model
        rest = rest.replace(f"policy.PolicyConfig.tiny = {micro_config.MODEL}\n", "")
    path.write_text(head + "\n" + _MESH_IMPORT + rest + _SHORTER.replace("rounds = 1", f"rounds = {rounds}") + extra)
    return path


def _launch(gin_file, run_dir, devices, process=None, extra_env=None, log_suffix=""):
    env = cpu_process_env(devices, **(extra_env or {}))
    name = "ref"
    if process is not None:
        address, index = process
        env.update(JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(index))
        name = f"p{index}"
    log = open(run_dir.parent / f"{run_dir.name}.{name}{'.' + log_suffix if log_suffix else ''}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "bat_jax.launch", f"--gin_file={gin_file}",
                             f"--run_dir={run_dir}"], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


def _export_params(run_dir):
    from safetensors.numpy import load_file

    out = {}
    for path in sorted((run_dir / "export").glob("*.safetensors")):
        out.update(load_file(path))
    return out


_STALENESS = """\
import bat_jax.learn.staleness as staleness
experiment.BiCuRLConfig.grpo_steps_per_round = 2
grpo_round.GRPOBlockConfig.staleness = @staleness.StalenessConfig()
staleness.StalenessConfig.max_staleness = 1
grpo.GRPOConfig.tis_cap = 2.0
pools.PoolConfig.refill = True
"""


def _run_both(gin_file, tmp_path, seconds=2400) -> dict[str, int]:
    """The run of `gin_file` as 1 process × 4 devices (run dir 'ref') and as 2 × 2 ('multi').

    Returns the return codes by name ('ref', 'p0', 'p1').
    """
    address = f"127.0.0.1:{_free_port()}"
    procs = {"ref": _launch(gin_file, tmp_path / "ref", 4),
             "p0": _launch(gin_file, tmp_path / "multi", 2, (address, 0)),
             "p1": _launch(gin_file, tmp_path / "multi", 2, (address, 1))}
    deadline = time.monotonic() + seconds
    try:
        for p in procs.values():
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return {n: p.returncode for n, p in procs.items()}


_LORA = """\
import bat_jax.models.lora as lora
policy.PolicyConfig.lora = @lora.LoRAConfig()
lora.LoRAConfig.rank = 4
"""


_VLLM = """\
import bat_jax.bicurl.engines as engines
policy.PolicyConfig.architecture = 'qwen3'
policy.PolicyConfig.tiny = {'hidden_size': 64, 'intermediate_size': 128, 'num_hidden_layers': 2, \
'num_attention_heads': 2, 'num_key_value_heads': 1, 'head_dim': 32, 'max_position_embeddings': 8192}
experiment.Components.engine = @engines.EngineConfig()
engines.EngineConfig.kind = 'vllm'
engines.EngineConfig.vllm_options = {'kv_cache_memory_bytes': 67108864, 'max_num_seqs': 16}
"""


@pytest.mark.slow
@pytest.mark.vllm
def test_two_processes_run_vllm_rollouts_bounded_staleness_and_lora_as_one(tmp_path):
    """The micro run with vLLM rollouts, max_staleness = 1 and a LoRA adapter as 2 processes × 2 devices ends as
    1 process × 4 devices.

    A tiny Qwen3 (vLLM's CPU build loads Qwen3 dense); each host its own vLLM engine serving the adapter over its own
    copy of the frozen base, against one engine in the reference. Two GRPO steps (step 1's groups roll out while step
    0 trains): the same ledger, the same groups drawn and trained (none dropped), a staleness of at most 1, each vLLM
    logprob within float round-off of the learner's, and the same exported merged weights and adapter (to 1e-5) and
    recorded base digest. One run for the three features: each is a two-process run of its own otherwise (CI time).
    """
    pytest.importorskip("vllm")
    import numpy as np
    from safetensors.numpy import load_file

    from bat_jax.ledger import Ledger

    gin_file = _micro_run_file(tmp_path, extra=_STALENESS + _LORA + _VLLM)
    rc = _run_both(gin_file, tmp_path)
    logs = {n: (tmp_path / f"{'ref' if n == 'ref' else 'multi'}.{n}.log").read_text()[-4000:] for n in rc}
    assert rc == {"ref": 0, "p0": 0, "p1": 0}, logs
    (a,), (b,) = (Ledger(tmp_path / name / "ledger.jsonl").read() for name in ("ref", "multi"))
    assert (a.selected_stage, a.decision, a.retained_checkpoint, a.state_ids, a.controller_state) == \
           (b.selected_stage, b.decision, b.retained_checkpoint, b.state_ids, b.controller_state)
    assert a.controller_scores == b.controller_scores and a.kl == pytest.approx(b.kl, abs=1e-5)
    assert a.reward_version.startswith("bat_rubric/")
    counts = ("rollouts", "groups_drawn", "groups_trained", "groups_dropped_stale", "groups_evicted",
              "groups_refilled")
    assert [getattr(a.grpo, c) for c in counts] == [getattr(b.grpo, c) for c in counts] == [16, 8, 8, 0, 0, 0]
    assert a.grpo.reward_mean == pytest.approx(b.grpo.reward_mean)
    assert a.grpo.staleness_max == b.grpo.staleness_max == 1 and 0 <= a.grpo.staleness_mean <= 1
    assert "Bounded-staleness GRPO per round" in (tmp_path / "ref" / "report.md").read_text()
    # the same number of sampled tokens, each vLLM logprob within float round-off of the learner's
    assert a.grpo.rollout_mismatch["tokens"] == b.grpo.rollout_mismatch["tokens"]
    assert max(a.grpo.rollout_mismatch["mismatch_max_abs"], b.grpo.rollout_mismatch["mismatch_max_abs"]) < 1e-5
    for config_dir in (tmp_path / "ref" / "vllm", *(tmp_path / "multi" / "hosts" / f"process-{i}" / "vllm"
                                                    for i in (0, 1))):
        config = json.loads((config_dir / "checkpoint" / "config.json").read_text())
        assert config["model_type"] == "qwen3" and config["head_dim"] == 32
    p_ref, p_multi = _export_params(tmp_path / "ref"), _export_params(tmp_path / "multi")
    assert sorted(p_ref) == sorted(p_multi) and len(p_ref) > 10
    for k in p_ref:
        np.testing.assert_allclose(p_multi[k].astype(np.float32), p_ref[k].astype(np.float32), atol=1e-5, rtol=0,
                                   err_msg=k)
    a_ref, a_multi = (load_file(tmp_path / n / "export_adapter" / "adapter_model.safetensors") for n in ("ref", "multi"))
    assert sorted(a_ref) == sorted(a_multi) and any(k.endswith("lora_B.weight") for k in a_ref)
    assert any(np.abs(v).max() > 0 for k, v in a_ref.items() if k.endswith("lora_B.weight"))  # GRPO moved B off 0
    for k in a_ref:
        np.testing.assert_allclose(a_multi[k], a_ref[k], atol=1e-5, rtol=0, err_msg=k)
    base = [json.loads((tmp_path / n / "checkpoints" / "lora_base.json").read_text()) for n in ("ref", "multi")]
    assert base[0] == base[1] and base[0]["digest"].startswith("sha256:")


def _ray_run_file(tmp_path, address: str, rounds: int) -> pathlib.Path:
    """The micro run file with Ray rollout workers: every process of a run drives its own worker in the Ray cluster
    at `address` (one cluster here; each host would have its own), which rolls out that process's share."""
    return _micro_run_file(tmp_path, rounds=rounds, extra=f"""\
import bat_jax.bicurl.ray_workers as ray_workers
experiment.Components.ray = @ray_workers.RayRolloutConfig()
ray_workers.RayRolloutConfig.num_workers = 1
ray_workers.RayRolloutConfig.address = '{address}'
ray_workers.RayRolloutConfig.worker_env = {{'JAX_PLATFORMS': 'cpu'}}
""")


@pytest.mark.slow
def test_a_killed_process_ends_the_run_and_a_restart_resumes_to_the_same_ledger(tmp_path):
    """The micro run of two rounds on Ray rollout workers as 2 processes × 2 devices: process 1 is killed (SIGKILL)
    once round 1 is in the ledger; process 0 stops within the heartbeat timeout (10 s here) naming the task; the
    same two commands again resume from the ledger and end as an uninterrupted 1 process × 4 devices run, whose one
    worker rolls out the whole batch: its ledger, round-0 evaluation and exported parameters (to 1e-5); process 0
    alone wrote the records (one TensorBoard event file per launch). One run for both features (CI time)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        _killed_and_resumed(tmp_path, _ray_run_file(tmp_path, ray.get_runtime_context().gcs_address, rounds=2))
    finally:
        ray.shutdown()


def _killed_and_resumed(tmp_path, gin_file):
    import numpy as np

    from bat_jax.ledger import Ledger

    ref = _launch(gin_file, tmp_path / "ref", 4)
    address = f"127.0.0.1:{_free_port()}"
    env = {"BAT_JAX_HEARTBEAT_TIMEOUT_S": "10"}
    first = [_launch(gin_file, tmp_path / "multi", 2, (address, i), env) for i in (0, 1)]
    ledger = tmp_path / "multi" / "ledger.jsonl"
    deadline = time.monotonic() + 2400
    while not (ledger.exists() and ledger.read_text().count("\n") >= 1):
        assert time.monotonic() < deadline and all(p.poll() is None for p in first), "round 1 never reached the ledger"
        time.sleep(2)
    first[1].kill()
    killed_at = time.monotonic()
    rc0 = first[0].wait(timeout=300)
    stopped_s = time.monotonic() - killed_at
    first[1].wait()
    log0 = (tmp_path / "multi.p0.log").read_text()
    assert rc0 != 0 and stopped_s < 120, (rc0, stopped_s)
    # the coordination service names the dead task; a gloo collective in flight may fail first, naming its peer
    assert ("The following tasks are unhealthy (stopped sending heartbeats):\n1\n" in log0
            or "gloo" in log0.lower()), log0[-3000:]
    assert [r.round for r in Ledger(ledger).read()] == [1]
    address = f"127.0.0.1:{_free_port()}"
    second = [_launch(gin_file, tmp_path / "multi", 2, (address, i), env, log_suffix="again") for i in (0, 1)]
    for p in second + [ref]:
        p.wait(timeout=max(1.0, deadline - time.monotonic()))
    assert [p.returncode for p in second + [ref]] == [0, 0, 0], (tmp_path / "multi.p0.again.log").read_text()[-4000:]
    a, b = Ledger(tmp_path / "ref" / "ledger.jsonl").read(), Ledger(ledger).read()
    assert [r.round for r in a] == [r.round for r in b] == [1, 2]
    for x, y in zip(a, b):
        assert (x.selected_stage, x.decision, x.retained_checkpoint, x.state_ids, x.controller_state,
                x.bank_version) == \
               (y.selected_stage, y.decision, y.retained_checkpoint, y.state_ids, y.controller_state, y.bank_version)
        assert x.controller_scores == y.controller_scores and x.kl == pytest.approx(y.kl, abs=1e-5)
        assert x.grpo.rollouts == y.grpo.rollouts == 8  # 4 rows x K = 2, each process's share on its own worker
        assert x.grpo.rollout_mismatch["tokens"] == y.grpo.rollout_mismatch["tokens"]
        assert x.grpo.reward_mean == pytest.approx(y.grpo.reward_mean, abs=1e-6)
    assert json.loads((tmp_path / "ref" / "round0_eval.json").read_text()) == \
           json.loads((tmp_path / "multi" / "round0_eval.json").read_text())
    p_ref, p_multi = _export_params(tmp_path / "ref"), _export_params(tmp_path / "multi")
    assert sorted(p_ref) == sorted(p_multi) and len(p_ref) > 10
    for k in p_ref:
        np.testing.assert_allclose(p_multi[k].astype(np.float32), p_ref[k].astype(np.float32), atol=1e-5, rtol=0,
                                   err_msg=k)
    events = sorted((tmp_path / "multi" / "tensorboard").rglob("events.out.tfevents*"))
    assert len(events) == 2, events  # process 0's first launch and its restart
    assert (tmp_path / "multi" / "report.md").exists()
