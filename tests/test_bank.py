"""Versioned Stage Bank: append-only versions, immutability, index, atomic publish under SIGKILL."""

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bat_jax.sandbox.types import SandboxState
from bat_jax.stage_bank.bank import BankError, StageBank
from bat_jax.sandbox.tools import STOP, Action
from bat_jax.stage_bank.row import (Message, Provenance, RLRow, RubricSpec, SFTRow, StateRef)
from doubles import make_rows

REPO = Path(__file__).resolve().parents[1]
H = "ab" * 32


def sft(i):
    return SFTRow((Message("user", f"task {i}"),), Action(f"answer {i}", STOP), "S1", Provenance(f"src-{i}", H, "vqa",
                                                                                         "success"))


def test_state_archive_roundtrip_and_tamper_detection(tmp_path):
    state = SandboxState({"b.txt": b"2", "a/x.bin": bytes(range(256))}, {"K": "v"})
    bank = StageBank(tmp_path)
    ref = bank.put_state(state)
    assert ref == StateRef(state.digest(), f"states/{state.digest()}.tar")
    assert bank.put_state(state) == ref  # idempotent
    assert bank.load_state(ref) == state
    with pytest.raises(BankError, match="missing"):
        bank.load_state(StateRef("cd" * 32, "states/none.tar"))
    other = StageBank(tmp_path / "other").put_state(SandboxState({"b.txt": b"3"}))
    os.replace(tmp_path / "other" / other.path, bank.state_path(ref))  # a valid archive of different content
    with pytest.raises(BankError, match="does not match"):
        bank.load_state(ref)


def test_versions_are_append_only_and_indexed(tmp_path):
    bank = StageBank(tmp_path)
    assert bank.latest() == 0 and bank.read().rl_rows == ()
    first = make_rows(bank, 6)
    assert bank.admit(first, [sft(0)], note="first") == 1
    v1_bytes = {p.name: p.read_bytes() for p in (tmp_path / "versions" / "v000001").iterdir()}
    second = make_rows(bank, 3, start=6)
    assert bank.admit(second) == 2
    assert bank.versions() == [1, 2]
    # Version 1 is unchanged by the later admission and still reads as the first six rows.
    assert {p.name: p.read_bytes() for p in (tmp_path / "versions" / "v000001").iterdir()} == v1_bytes
    v1, v2 = bank.read(1), bank.read()
    assert v1.rl_rows == tuple(first) and len(v1.sft_rows) == 1
    assert v2.version == 2 and v2.rl_rows == tuple(first + second)
    # Index: rows i = 0..8; track alternates vqa/segmentation, focus cycles S1/S3/E2E, outcome cycles.
    assert [r.provenance.source_id for r in v2.query(track="vqa", focus="S1")] == ["src-0", "src-6"]
    assert [r.provenance.source_id for r in v2.query(outcome="failure")] == ["src-2", "src-5", "src-8"]
    assert len(v2.query(reward_source="task_metric")) == 4
    assert v2.counts("focus") == {"E2E": 3, "S1": 3, "S3": 3}
    assert v2.row(second[0].state_id) == second[0]
    with pytest.raises(KeyError):
        v2.query(colour="red")


def test_admitted_rows_are_immutable(tmp_path):
    bank = StageBank(tmp_path)
    rows = make_rows(bank, 2)
    bank.admit(rows)
    with pytest.raises(BankError, match="already admitted"):
        bank.admit([rows[0]])
    with pytest.raises(BankError, match="already admitted"):
        bank.admit([], [sft(1), sft(1)])
    missing = RLRow(StateRef("cd" * 32, "states/none.tar"), "S1", "p", (RubricSpec("a", "b"),), (), "k",
                    Provenance("zz", H, "vqa", "success"))
    with pytest.raises(BankError, match="not stored"):
        bank.admit([missing])
    assert bank.latest() == 1


def test_corrupt_segment_is_detected(tmp_path):
    bank = StageBank(tmp_path)
    bank.admit(make_rows(bank, 3))
    path = tmp_path / "versions" / "v000001" / "rl.jsonl"
    path.write_bytes(path.read_bytes().replace(b"task 1", b"task X"))
    with pytest.raises(BankError, match="SHA-256"):
        bank.read()


def _bank_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted((root / "versions").rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(root)).encode() + p.read_bytes())
    return h.hexdigest()


def test_injected_sigkill_between_staging_and_rename_keeps_previous_version(tmp_path):
    bank = StageBank(tmp_path)
    first = make_rows(bank, 4)
    bank.admit(first)
    before = _bank_digest(tmp_path)
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r}); sys.path.insert(0, {str(Path(__file__).parent)!r})
        from doubles import make_rows
        from bat_jax.stage_bank.bank import StageBank
        bank = StageBank({str(tmp_path)!r})
        rows = make_rows(bank, 50, start=100)
        bank.admit(rows, on_staged=lambda d: os.kill(os.getpid(), signal.SIGKILL))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    staged = list((tmp_path / ".staging").iterdir())
    assert len(staged) == 1 and (staged[0] / "manifest.json").exists()  # fully staged, never published
    assert bank.versions() == [1] and _bank_digest(tmp_path) == before
    assert bank.read().rl_rows == tuple(first)
    assert bank.clean_staging() == 1
    assert bank.admit(make_rows(bank, 2, start=200)) == 2


def test_external_sigkill_during_continuous_writes_leaves_only_whole_versions(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r}); sys.path.insert(0, {str(Path(__file__).parent)!r})
        from doubles import make_rows
        from bat_jax.stage_bank.bank import StageBank
        bank = StageBank({str(tmp_path)!r})
        i = 0
        while True:
            bank.admit(make_rows(bank, 100, start=i))
            i += 100
            print(i, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-u", "-c", script], cwd=REPO, stdout=subprocess.PIPE)
    try:
        for _ in range(2):  # wait until two versions are published, then kill at an arbitrary point
            proc.stdout.readline()
        time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    bank = StageBank(tmp_path)
    published = bank.versions()
    assert published[:2] == [1, 2]
    for v in published:  # every published version is whole: manifest digests and row counts check out
        view = bank.read(v)
        assert len(view.rl_rows) == 100 * v
        assert [r.provenance.source_id for r in view.rl_rows[-3:]] == [f"src-{100 * v - k}" for k in (3, 2, 1)]


def test_a_second_writer_is_refused_naming_the_holder_and_a_dead_holders_lock_is_reclaimed(tmp_path):
    import json
    import socket

    from bat_jax.stage_bank.bank import BankLocked

    bank = StageBank(tmp_path / "bank")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = tmp_path / "bank" / "writer.lock"
        with bank.writer("factory A") as path:
            assert path == lock
            held = json.loads(lock.read_text())
            assert held["pid"] == os.getpid() and held["owner"] == "factory A"
            with pytest.raises(BankLocked, match=rf"pid {os.getpid()} on host {socket.gethostname()} \(factory A\)"):
                with bank.writer("factory B"):
                    pass
        assert not lock.exists()  # released
        # a live process on this host holds it: refused, naming that pid
        lock.write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(), "owner": "other run"}))
        with pytest.raises(BankLocked, match=rf"pid {holder.pid} .*\(other run\)"):
            with bank.writer():
                pass
        holder.kill()
        holder.wait()
        # the holder died (SIGKILL, no clean-up): its lock is stale and reclaimed
        with bank.writer("factory C"):
            assert json.loads(lock.read_text())["owner"] == "factory C"
        assert not lock.exists()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_a_build_is_refused_while_another_writer_holds_the_bank(tmp_path):
    from bat_jax.stage_bank.bank import BankLocked
    from bat_jax.stage_bank.factory import FactoryConfig, build_bank
    from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark

    config = FactoryConfig(bank_dir=str(tmp_path / "bank"), tracks=("vqa",), foci=("S1",), outcomes=("success",))
    with StageBank(config.bank_dir).writer("the running factory"):
        with pytest.raises(BankLocked, match=r"\(the running factory\)"):
            build_bank(config, ImagingBenchmark(), progress=False)
    assert StageBank(config.bank_dir).versions() == []
