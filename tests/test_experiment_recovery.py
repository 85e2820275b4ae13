"""A killed BiCuRL run resumes to the same result, and a held-out leak in the Stage Bank stops the launch.

All runs use the micro configuration of tests/micro_config.py (local sandbox backend) through the command a
user reruns, `python -m bat_jax.launch --gin_file=<micro gin> --run_dir=<dir>`, in subprocesses:

* SIGKILL while round 2 runs, then the same command again: the ledger is byte-for-byte the uninterrupted run's
  (selected stages, state ids, scores, KL, decisions, retained checkpoints, controller state) and so are
  summary.json and round0_eval.json;
* a kill after round 2's checkpoint was saved but before its ledger line (the disk state is rebuilt from the
  uninterrupted run): the unrecorded checkpoint is dropped and the round redone, to the same ledger;
* SIGKILL in the middle of an Orbax save: the half-written step is invisible and removed on the next open;
* a held-out marker planted in the bank (a hand-admitted bank version whose SFT row copies a held-out scan, or a
  stored sandbox state holding a held-out file) stops the launch with a LeakageError naming file, row / field and
  the marker, before any checkpoint, round-0 evaluation or ledger line exists.

The Stage Bank is built once for the module and shared read-only; the leak tests plant into copies.
"""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from bat_jax.ledger import Ledger

import micro_config

RUN_TIMEOUT_S = 1800  # one micro run takes 2-5 minutes on a loaded 2-core machine


def _write_gin(path, bank_dir):
    """The micro run file (2 rounds of 1 GRPO step) with the Stage Bank at `bank_dir`."""
    path.write_text(micro_config.gin_text(bank_dir))
    return path


def _heldout_manifest():
    """The held-out task manifest `experiment.run` writes for the micro EvalConfig (every suite)."""
    from bat_jax.bicurl import evaluation as ev

    components = micro_config.components(bank_dir="bank")  # the bank is not read here
    return ev.heldout_manifest(components.evaluation, components.benchmark)


def _start(gin_file, run_dir):
    """`python -m bat_jax.launch` in a subprocess (inherits conftest's XLA_FLAGS / JAX_PLATFORMS); output appended
    to `<run_dir>.log`."""
    log = open(f"{run_dir}.log", "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "bat_jax.launch", f"--gin_file={gin_file}",
                                 f"--run_dir={run_dir}"], cwd=run_dir.parent, stdout=log, stderr=subprocess.STDOUT)
    finally:
        log.close()


def _log(run_dir):
    path = f"{run_dir}.log"
    return open(path, errors="replace").read() if os.path.exists(path) else "(no log)"


def _run_to_end(gin_file, run_dir):
    proc = _start(gin_file, run_dir)
    try:
        rc = proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, f"launch in {run_dir} exited {rc}:\n{_log(run_dir)[-4000:]}"


def _steps(run_dir):
    root = run_dir / "checkpoints"
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.is_dir() else []


def _assert_same_run(run_dir, reference):
    """Whole ledger records, then the bytes; summary.json finals; the round-0 evaluation."""
    assert Ledger(run_dir / "ledger.jsonl").read() == Ledger(reference / "ledger.jsonl").read()
    assert (run_dir / "ledger.jsonl").read_bytes() == (reference / "ledger.jsonl").read_bytes()
    for name in ("summary.json", "round0_eval.json"):
        assert json.loads((run_dir / name).read_text()) == json.loads((reference / name).read_text()), name


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    """(root, bank_dir, gin_file): a micro Stage Bank (12 RL / 192 SFT rows over two tracks) built once."""
    from bat_jax.stage_bank.factory import build_bank

    root = tmp_path_factory.mktemp("recovery")
    manifest_path = root / "heldout_manifest.json"
    manifest_path.write_text(json.dumps(_heldout_manifest()))
    bank_dir = root / "bank"
    components = micro_config.components(micro_config.seeded(bank_dir))
    bank = dataclasses.replace(components.bank, heldout_manifest=str(manifest_path))
    build_bank(bank, components.benchmark)
    return root, bank_dir, _write_gin(root / "micro.gin", bank_dir)


@pytest.fixture(scope="module")
def uninterrupted(micro):
    """Run directory of the micro run (2 rounds) that nobody interrupted."""
    root, _, gin_file = micro
    run_dir = root / "uninterrupted"
    _run_to_end(gin_file, run_dir)
    records = Ledger(run_dir / "ledger.jsonl").read()
    assert [r.round for r in records] == [1, 2] and _steps(run_dir) == [0, 1, 2]
    return run_dir


# ------------------------------------------------------------------------------------------- (a) recovery


@pytest.mark.slow
def test_sigkill_during_round_2_resumes_to_the_uninterrupted_ledger(micro, uninterrupted):
    root, _, gin_file = micro
    run_dir = root / "killed"
    proc = _start(gin_file, run_dir)
    ledger = Ledger(run_dir / "ledger.jsonl")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while not (run_dir / "ledger.jsonl").exists() or len(ledger.read()) < 1:  # round 1 recorded: round 2 runs
            assert proc.poll() is None, f"the run ended before round 2 (rc {proc.returncode}):\n{_log(run_dir)[-4000:]}"
            assert time.monotonic() < deadline, "round 1 did not finish in time"
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert [r.round for r in ledger.read()] == [1]
    assert not (run_dir / "summary.json").exists()
    assert _steps(run_dir) in ([0, 1], [0, 1, 2])  # round 2's save may have started, never its ledger line

    _run_to_end(gin_file, run_dir)  # the same command again
    _assert_same_run(run_dir, uninterrupted)
    assert _steps(run_dir) == [0, 1, 2]


@pytest.mark.slow
def test_a_version_admitted_while_the_run_was_down_leaves_the_round_on_its_recorded_version(micro, uninterrupted):
    """SIGKILL once round 2 has resolved its bank version, then a factory admits a new version before the rerun:
    round 2 is redone on the version it started on (run_dir/bank_versions.json), to the uninterrupted ledger."""
    from bat_jax.sandbox.types import SandboxState
    from bat_jax.stage_bank.bank import StageBank
    from bat_jax.stage_bank.row import Provenance, RLRow, RubricSpec

    root, bank_dir, _ = micro
    own_bank = root / "bank_versions"
    shutil.copytree(bank_dir, own_bank)
    gin_file = _write_gin(root / "micro_versions.gin", own_bank)
    run_dir = root / "killed_versions"
    proc = _start(gin_file, run_dir)
    versions = run_dir / "bank_versions.json"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while not versions.exists() or "2" not in json.loads(versions.read_text()):  # round 2 started
            assert proc.poll() is None, f"the run ended before round 2 (rc {proc.returncode}):\n{_log(run_dir)[-4000:]}"
            assert time.monotonic() < deadline, "round 2 did not start in time"
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert json.loads(versions.read_text()) == {"0": 1, "1": 1, "2": 1}
    bank = StageBank(own_bank)
    ref = bank.put_state(SandboxState({"task.md": b"a fictional task admitted while the run was down"}))
    assert bank.admit([RLRow(ref, "S3", "Do the S3 step.", (RubricSpec("a", "item a"),), (), "skill",
                             Provenance("src-late", "ab" * 32, "vqa", "success"), "rubric")]) == 2

    _run_to_end(gin_file, run_dir)  # the same command again
    _assert_same_run(run_dir, uninterrupted)
    assert [r.bank_version for r in Ledger(run_dir / "ledger.jsonl").read()] == [1, 1]
    assert json.loads(versions.read_text()) == {"0": 1, "1": 1, "2": 1}


@pytest.mark.slow
def test_kill_between_checkpoint_and_ledger_line_redoes_the_round(micro, uninterrupted, tmp_path):
    """The disk state of a kill after `checkpoints.save(2, ...)` and before `ledger.append(round 2)`: before the
    fix, every rerun died in Orbax with 'Checkpoint for step 2 already exists'."""
    root, _, gin_file = micro
    run_dir = tmp_path / "cut"
    shutil.copytree(uninterrupted, run_dir)
    lines = (run_dir / "ledger.jsonl").read_bytes().splitlines(keepends=True)
    (run_dir / "ledger.jsonl").write_bytes(lines[0])
    for name in ("summary.json", "report.md", "staircase.png"):
        (run_dir / name).unlink()
    assert _steps(run_dir) == [0, 1, 2]

    _run_to_end(gin_file, run_dir)
    assert "dropping checkpoint 2: its round is not in the ledger" in _log(run_dir)
    _assert_same_run(run_dir, uninterrupted)
    assert _steps(run_dir) == [0, 1, 2]


_SAVE_LOOP = textwrap.dedent("""
    import sys
    import jax.numpy as jnp
    from bat_jax.checkpoint import CheckpointConfig, Checkpointer
    ckpt = Checkpointer(CheckpointConfig(directory=sys.argv[1], keep_latest=2))
    state = {"w": jnp.arange(4 << 20, dtype=jnp.float32)}  # 16 MiB: a save takes a while
    first = max(ckpt.all_steps(), default=0) + 1  # a restarted loop goes on after the steps already saved
    for step in range(first, first + 10_000):
        ckpt.save(step, {"w": state["w"] + step}, metrics={"overall": 0.0})
""")


@pytest.mark.slow
def test_sigkill_during_a_checkpoint_save_leaves_no_half_step(tmp_path):
    """Orbax writes a step under a temporary name and renames it when complete: a SIGKILL mid-save leaves a
    temporary directory that is neither listed nor restored, and that the next Checkpointer removes."""
    import jax
    import numpy as np

    from bat_jax.checkpoint import CheckpointConfig, Checkpointer

    directory = tmp_path / "ck"
    err = open(tmp_path / "save_loop.err", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([sys.executable, "-c", _SAVE_LOOP, str(directory)], stdout=subprocess.DEVNULL,
                            stderr=err)
    deadline, caught = time.monotonic() + 600, False
    try:
        while not caught and time.monotonic() < deadline:
            assert proc.poll() is None, f"the save loop died: {(tmp_path / 'save_loop.err').read_text()[-2000:]}"
            partial = [p for p in directory.glob("*") if "tmp" in p.name] if directory.is_dir() else []
            done = [p for p in directory.glob("*") if p.name.isdigit()] if directory.is_dir() else []
            if partial and done:  # a save in progress after at least one complete step
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                caught = any("tmp" in p.name for p in directory.glob("*"))
                if not caught:  # the rename won the race: try again
                    proc = subprocess.Popen([sys.executable, "-c", _SAVE_LOOP, str(directory)],
                                            stdout=subprocess.DEVNULL, stderr=err)
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
    assert caught, "could not catch a save in progress"

    ckpt = Checkpointer(CheckpointConfig(directory=str(directory), keep_latest=2))
    steps = ckpt.all_steps()
    assert steps and not [p.name for p in directory.glob("*") if "tmp" in p.name]
    target = {"w": jax.ShapeDtypeStruct((4 << 20,), np.float32,
                                        sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))}
    restored = ckpt.restore(target)
    assert restored.step == steps[-1]
    np.testing.assert_array_equal(np.asarray(restored.state["w"])[:3], [steps[-1], steps[-1] + 1, steps[-1] + 2])
    ckpt.close()


def test_checkpointer_delete_removes_one_step(tmp_path):
    import jax.numpy as jnp

    from bat_jax.checkpoint import CheckpointConfig, Checkpointer

    ckpt = Checkpointer(CheckpointConfig(directory=str(tmp_path / "ck")))
    for step in (0, 1, 2):
        ckpt.save(step, {"w": jnp.full((2,), float(step))}, metrics={"overall": 0.1 * step})
    ckpt.delete(2)
    assert ckpt.all_steps() == [0, 1] and sorted(os.listdir(tmp_path / "ck")) == ["0", "1"]
    ckpt.save(2, {"w": jnp.full((2,), 5.0)}, metrics={"overall": 0.5})  # the step can be written again
    assert ckpt.all_steps() == [0, 1, 2]
    with pytest.raises(FileNotFoundError):
        ckpt.delete(7)
    ckpt.close()


# ------------------------------------------------------------------------------------- (b) held-out leak


def _plant_sft_row(bank, leaked):
    """A hand-curated bank version: an admitted SFT row whose target copies a held-out scan into the workspace."""
    from bat_jax.sandbox.tools import Action

    row = bank.read().sft_rows[0]
    planted = dataclasses.replace(row, target=Action(thought="Fetch the reference scan first.", tool="execute_code",
                                                     arguments={"language": "bash",
                                                                "code": f"cp /mnt/eval/{leaked} data/images/"}))
    version = bank.admit(sft_rows=[planted], note="hand-curated recovery example")
    return f"{bank.root}/versions/v{version:06d}/sft.jsonl row 0 field 'target.arguments.code'"


def _plant_state_file(bank, leaked):
    """A sandbox state snapshotted with a held-out scan lying in it, admitted with an RL row that starts there."""
    from bat_jax.sandbox.types import SandboxState

    row = bank.read().rl_rows[0]
    state = bank.load_state(row.state)
    dirty = SandboxState({**state.files, leaked: b"\x00" * 64}, dict(state.env))
    ref = bank.put_state(dirty)
    bank.admit(rl_rows=[dataclasses.replace(row, state=ref)], note="re-snapshotted start state")
    return f"{bank.root}/{ref.path} field 'state.files[{leaked}]<path>'"


@pytest.mark.slow
@pytest.mark.parametrize("plant", [_plant_sft_row, _plant_state_file], ids=["sft-row", "state-archive"])
def test_planted_leak_stops_the_launch_naming_the_hit(micro, tmp_path, plant):
    from bat_jax import launch
    from bat_jax.stage_bank.bank import StageBank
    from bat_jax.stage_bank.leakage import LeakageError

    _, bank_dir, _ = micro
    bank = StageBank(shutil.copytree(bank_dir, tmp_path / "bank"))
    leaked = _heldout_manifest()["tasks"][0]["cases"][0]["file"]  # e.g. 'study/scans/hx000a925.nii.gz'
    where = plant(bank, leaked)
    gin_file = _write_gin(tmp_path / "micro.gin", bank.root)
    run_dir = tmp_path / "run"

    with pytest.raises(LeakageError, match="refusing to start") as err:
        launch.launch([str(gin_file)], run_dir=str(run_dir))
    assert f"{where}: held-out path {leaked!r}" in str(err.value)
    # the marker planted is one the run itself declared held out
    assert leaked in json.loads((run_dir / "heldout_manifest.json").read_text())["tasks"][0]["paths"]
    for name in ("checkpoints", "round0_eval.json", "ledger.jsonl", "summary.json"):
        assert not (run_dir / name).exists(), name
    # the unplanted bank is clean: every hit is in the planted file and field
    hits = [line for line in str(err.value).splitlines() if ": held-out " in line]
    assert f"found {len(hits)} held-out markers" in str(err.value)
    assert all(where in line for line in hits), hits
