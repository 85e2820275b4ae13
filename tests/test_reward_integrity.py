"""Reward integrity: rubric evidence is what a call executed, a sandbox the agent brings down is the
agent's failure (scored), and evidence collection is bounded whatever the workspace holds."""

import json
import resource
import threading
import time

import pytest

from bat_jax.benchmark.stages import E2E
from bat_jax.benchmarks.imaging.stages import Stage
from bat_jax.sandbox.evidence import EvidenceLimits, gather_files
from bat_jax.sandbox.types import SandboxState
from bat_jax.sandbox.tools import Action
from bat_jax.rollout.play import play
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.registry import get_track
from bat_jax.benchmarks.imaging.teacher import DoNothingPolicy

IMAGING = ImagingBenchmark()
SEG = get_track("segmentation")


class _Script:
    """A policy that plays fixed actions, then stops."""

    def __init__(self, actions):
        self.actions = list(actions)

    def __call__(self, conv):
        return self.actions[len(conv.turns)] if len(conv.turns) < len(self.actions) else None


def _py(code, stage=None):
    return Action("", "execute_code", {"language": "python", "code": code}, stage)


def _bash(code, stage=None):
    return Action("", "execute_code", {"language": "bash", "code": code}, stage)


def test_comment_string_and_dead_code_earn_no_receipt_evidence(factory):
    inst = SEG.generate(5, "success")
    L = inst.layout
    talk = [
        "# import numpy\n# import model\n# model.load_config()",
        f"# predict( {L.validation_dir}\nimport json, os\nos.makedirs('{L.outputs_dir}', exist_ok=True)\n"
        f"open('{L.validation_json}', 'w').write('')",
        f"# predict( {L.pred_dir}\n'import model; model.predict(model.load_input(\"{L.images_dir}/x\"))'",
        f"if False:\n    import model\n    model.predict(model.load_input('{L.images_dir}/x'), {{}}, {{}})\n"
        f"s = '''model.predict( {L.pred_dir} {L.cases_csv} task.md'''",
    ]
    result = play(IMAGING, inst, _Script([_py(c) for c in talk]), make_sandbox=factory)
    v = result.score.verdicts
    assert all(r.exit_code == 0 for r in result.evidence.receipts)
    assert v[Stage.SETUP].items["setup.env_checked"] is False
    assert v[Stage.VALIDATE].items["validate.smoke_run"] is False
    assert v[Stage.INFERENCE].items["inference.ran"] is False
    # S3 evidence: smoke run ✗, validation file ✓ (the empty one), input check ✗ → η = 1/3, every item ✗
    assert v[Stage.VALIDATE].eta == pytest.approx(1 / 3) and v[Stage.VALIDATE].reward == 0.0
    assert result.score.reward == pytest.approx(0.0)


def test_a_call_that_really_runs_the_method_earns_the_receipts(factory):
    inst = SEG.generate(5, "success")
    L = inst.layout
    case = inst.cases[0]
    run = (f"import csv, sys\nsys.path.insert(0, '{L.method_dir}')\nimport model\n"
           f"rows = {{r['case_id']: r for r in csv.DictReader(open('{L.cases_csv}'))}}\n"
           f"row = rows['{case.case_id}']\n"
           f"pred = model.predict(model.load_input(row['file']), row, model.load_config())\n"
           f"model.save_prediction(pred, '{L.validation_dir}', '{case.case_id}')\nprint('ok')")
    result = play(IMAGING, inst, _Script([_py(run)]), make_sandbox=factory)
    r = result.evidence.receipts[0]
    assert r.trace_complete and f"{L.method_dir}/model.py" in r.reads and case.file in r.reads
    assert any(p.startswith(L.validation_dir + "/") for p in r.writes)
    ev = result.score.verdicts[Stage.VALIDATE].evidence
    assert ev["receipt.smoke_run"] is True and ev["receipt.input_check"] is True


def _forgeries(inst):
    """Calls that read the method and a case input and write a case entry into the validation dir, without
    that entry being the method's output (each must earn no 'the method ran' evidence)."""
    L, case = inst.layout, inst.cases[0]
    cid, out = case.case_id, f"{L.validation_dir}/{case.case_id}"
    head = (f"import csv, json, os, shutil, sys\nsys.path.insert(0, '{L.method_dir}')\nos.makedirs('{L.validation_dir}',"
            f" exist_ok=True)\nopen('{L.method_dir}/model.py').read(); open('{L.method_dir}/config.json').read()\n"
            f"data = open('{case.file}', 'rb').read()\n")
    return {
        "bash_cat": _bash(f"mkdir -p {L.validation_dir}; cat {L.method_dir}/model.py {case.file} > {out}.nii.gz; "
                          f"echo '{{\"mask\": \"{out}.nii.gz\"}}' > {out}.json"),
        "copy_of_input": _py(head + f"shutil.copy('{case.file}', '{out}.nii.gz')\n"
                             f"json.dump({{'mask': '{out}.nii.gz'}}, open('{out}.json', 'w'))"),
        "imported_but_forged_mask": _py(
            head + "import model, numpy as np, nibabel as nib\nx = model.load_input('" + case.file + "')\n"
            f"nib.save(nib.Nifti1Image((x > x.mean()).astype(np.int16), np.eye(4)), '{out}.nii.gz')\n"
            f"json.dump({{'mask': '{out}.nii.gz'}}, open('{out}.json', 'w'))"),
        "method_output_off_by_one_voxel": _py(
            head + "import model, numpy as np, nibabel as nib\n"
            f"row = {{r['case_id']: r for r in csv.DictReader(open('{L.cases_csv}'))}}['{cid}']\n"
            "pred = model.predict(model.load_input(row['file']), row, model.load_config())\n"
            "pred.flat[0] = 2 - pred.flat[0]\n"
            f"model.save_prediction(pred, '{L.validation_dir}', '{cid}')"),
        "tampered_method_copy": _py(
            head + f"os.makedirs('{L.outputs_dir}/m', exist_ok=True)\n"
            f"shutil.copy('{L.method_dir}/config.json', '{L.outputs_dir}/m/config.json')\n"
            f"src = open('{L.method_dir}/model.py').read().replace('def predict(x, row, cfg):',"
            " 'def predict(x, row, cfg):\\n    return (x > x.mean()).astype(np.int16)\\n\\ndef _real(x, row, cfg):')\n"
            f"open('{L.outputs_dir}/m/model.py', 'w').write(src)\nsys.path.insert(0, '{L.outputs_dir}/m')\n"
            "import model\n"
            f"row = {{r['case_id']: r for r in csv.DictReader(open('{L.cases_csv}'))}}['{cid}']\n"
            "pred = model.predict(model.load_input(row['file']), row, model.load_config())\n"
            f"model.save_prediction(pred, '{L.validation_dir}', '{cid}')"),
        "another_cases_output": _py(
            head + "import model\n"
            f"row = {{r['case_id']: r for r in csv.DictReader(open('{L.cases_csv}'))}}['{inst.cases[1].case_id}']\n"
            "pred = model.predict(model.load_input(row['file']), row, model.load_config())\n"
            f"model.save_prediction(pred, '{L.validation_dir}', '{cid}')"),
    }


@pytest.mark.parametrize("forgery", ["bash_cat", "copy_of_input", "imported_but_forged_mask",
                                     "method_output_off_by_one_voxel", "another_cases_output",
                                     "tampered_method_copy"])
def test_reading_the_method_and_writing_anything_else_is_not_a_method_run(factory, forgery):
    """Kernel traces show what a call touched, not that it ran the method: a call that reads model.py, the
    config and a case input and writes a case entry earns 'the method ran' only when the entry equals the host's
    replay of the method (benchmarks/imaging/method_replay.py)."""
    inst = SEG.generate(5, "success")
    L = inst.layout
    result = play(IMAGING, inst, _Script([_forgeries(inst)[forgery]]), make_sandbox=factory)
    r = result.evidence.receipts[0]
    assert r.exit_code == 0 and f"{L.method_dir}/model.py" in r.reads and inst.cases[0].file in r.reads, r
    assert any(p.startswith(L.validation_dir + "/") for p in r.writes)
    verdict = result.score.verdicts[Stage.VALIDATE]
    assert verdict.evidence["receipt.smoke_run"] is False
    assert verdict.items["validate.smoke_run"] is False and verdict.items["validate.nondegenerate"] is False


def test_method_replay_equals_the_method_run_in_the_sandbox_on_every_track(factory):
    """The host's replay matches what the method writes inside the sandbox, for every track and every
    replayable case (restored archive copies included); a 'spacing' fault's case run without repairing its
    header matches the replay on the input as given, not the correct one (on the repaired input)."""
    from bat_jax.benchmarks.imaging.method_replay import case_matches, is_method_output
    from bat_jax.benchmarks.imaging.registry import TRACKS

    for name in TRACKS:
        track = get_track(name)
        inst = track.generate(11, "recovery")
        L = inst.layout
        code = (f"import csv, gzip, os, sys\nsys.path.insert(0, '{L.method_dir}')\nimport model\n"
                f"for r in csv.DictReader(open('{L.cases_csv}')):\n"
                f"    a = os.path.join('{L.archive_dir}', os.path.basename(r['file']) + '.gz')\n"
                f"    try:\n        x = model.load_input(r['file'])\n    except Exception:\n"
                f"        os.makedirs(os.path.dirname(r['file']), exist_ok=True)\n"
                f"        open(r['file'], 'wb').write(gzip.decompress(open(a, 'rb').read()))\n"
                f"        x = model.load_input(r['file'])\n"
                f"    model.save_prediction(model.predict(x, r, model.load_config()), '{L.pred_dir}', r['case_id'])\n")
        result = play(IMAGING, inst, _Script([_py(code)]), make_sandbox=factory)
        assert result.evidence.receipts[0].exit_code == 0, result.evidence.receipts[0]
        files = result.evidence.files
        spacing = inst.fault.case_id if inst.fault is not None and inst.fault.kind == "spacing" else None
        for cid in inst.case_ids:
            entry = json.loads(files[f"{L.pred_dir}/{cid}.json"])
            assert is_method_output(inst, cid, entry, files), (name, cid)
            assert case_matches(inst, cid, entry, files, correct_only=True) is (cid != spacing), (name, cid)
        assert result.score.verdicts[Stage.INFERENCE].evidence["receipt.inference"] is True, name


@pytest.mark.docker
@pytest.mark.parametrize("attack", ["kill -9 $PPID", "kill -TERM 1", "kill -9 -1", "kill -STOP $PPID"])
def test_killing_the_executor_is_refused_and_scores_like_an_idle_agent(attack):
    from bat_jax.sandbox.backends import backend_factory

    factory = backend_factory("docker")
    inst = SEG.generate(5, "success")
    idle = play(IMAGING, inst, DoNothingPolicy(), make_sandbox=factory).score
    hit = play(IMAGING, inst, _Script([_bash(attack), _py("print(1)")]), make_sandbox=factory)
    assert hit.score.reward is not None and hit.score.reward == idle.reward == 0.0
    assert hit.evidence.receipts[1].stdout == "1\n" and not hit.evidence.agent_error


@pytest.mark.docker
def test_a_sandbox_that_dies_during_an_agent_call_is_scored_as_the_agents_failure():
    from bat_jax.sandbox.docker import DockerSandbox, connect

    client = connect()
    boxes = []

    def make(state):
        boxes.append(DockerSandbox(client, state=state))
        return boxes[-1]

    inst = SEG.generate(5, "success")

    def kill_during_the_call():  # once the agent's `sleep 6` runs (not a fixed delay: container start varies with load)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if boxes and getattr(boxes[0], "container_id", None):
                try:
                    top = client.api.top(boxes[0].container_id)
                except Exception:  # noqa: BLE001 - not started yet
                    top = {}
                if any("sleep 6" in " ".join(map(str, row)) for row in top.get("Processes") or []):
                    client.api.kill(boxes[0].container_id)
                    return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_during_the_call)
    killer.start()
    result = play(IMAGING, inst, _Script([_bash(f"cat task.md; sleep 6"), _py("print(1)")]), make_sandbox=make)
    killer.join()
    assert boxes[0].fault == "agent"
    assert result.evidence.agent_error and not result.evidence.infra_error
    assert result.score.reward is not None  # scored (0 here), never "unscored"
    assert result.evidence.files == dict(inst.state().files)  # the start state the host kept


@pytest.mark.docker
def test_engine_failure_before_any_agent_action_is_unscored():
    from bat_jax.sandbox.docker import DockerSandbox, DockerSandboxConfig, SandboxError, connect

    with pytest.raises(SandboxError, match="'bat-sandbox:does-not-exist' is missing; build it with"):
        DockerSandbox(connect(), DockerSandboxConfig(image="bat-sandbox:does-not-exist"))

    def make(state):
        return DockerSandbox(connect(), DockerSandboxConfig(image="bat-sandbox:does-not-exist"), state=state)

    result = play(IMAGING, SEG.generate(5, "success"), _Script([_bash("echo 1")]), make_sandbox=make)
    assert result.score.reward is None and result.evidence.infra_error


class _HugeSandbox:
    """A sandbox double whose workspace lists more and larger files than any cap."""

    def __init__(self, n=10, size=1 << 40):
        self.n, self.size, self.reads = n, size, []

    def list_files(self):
        return [f"f{i}" for i in range(self.n)]

    def read_file(self, path, max_bytes=None):
        from bat_jax.sandbox.types import FileTooLarge

        self.reads.append(path)
        if path == "small":
            return b"x"
        if max_bytes is not None and self.size > max_bytes:
            raise FileTooLarge(path)
        raise AssertionError("read a file over the cap")


def test_gather_files_enforces_count_byte_and_time_caps():
    files, skipped = gather_files(_HugeSandbox(n=5), EvidenceLimits(max_files=3, max_file_bytes=10))
    assert files == {} and skipped == ["f0", "f1", "f2", "f3", "f4"]

    class Slow(_HugeSandbox):
        def read_file(self, path, max_bytes=None):
            from bat_jax.sandbox.types import FileTooLarge

            time.sleep(0.05)
            if max_bytes is not None and max_bytes < 2:
                raise FileTooLarge(path)
            return b"ab"

    box = Slow(n=1000)
    t = time.monotonic()
    files, skipped = gather_files(box, EvidenceLimits(max_seconds=0.2))
    assert time.monotonic() - t < 1.0 and 1 <= len(files) <= 6 and len(files) + len(skipped) == 1000
    files, skipped = gather_files(Slow(n=4), EvidenceLimits(max_total_bytes=5))
    assert list(files) == ["f0", "f1"] and skipped == ["f2", "f3"]  # 1 byte of budget left for each
    with pytest.raises(ValueError, match="max_seconds"):
        EvidenceLimits(max_seconds=0)


@pytest.mark.parametrize("backend", ["local", pytest.param("docker", marks=pytest.mark.docker)])
def test_sparse_file_costs_the_host_nothing_at_evidence_time(backend):
    from bat_jax.sandbox.backends import backend_factory

    box = backend_factory(backend)(SandboxState(files={"task.md": b"T"}))
    try:
        assert box.execute_code("bash", "truncate -s 768M big.bin && echo ok").stdout == "ok\n"
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t = time.monotonic()
        files, skipped = gather_files(box, EvidenceLimits(max_file_bytes=1 << 20))
        assert time.monotonic() - t < 5.0
        assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) < 100_000  # KiB
        assert files == {"task.md": b"T"} and skipped == ["big.bin"]
    finally:
        box.close()


def test_skipped_artefacts_are_absent_not_stale():
    import numpy as np

    from bat_jax.bicurl.reward import evidence_of
    from bat_jax.rollout.trajectory import Trajectory

    start = SandboxState(files={"a.txt": b"old", "b.txt": b"keep"})
    z = np.zeros(0, np.int32)
    traj = Trajectory("s", 0, E2E, z, z, np.zeros(0, np.float32), 0, "submitted", False, 0, 0, 0,
                      artefacts={"c.txt": b"new"}, skipped_artefacts=("a.txt",))
    ev = evidence_of(traj, start)
    assert ev.files == {"b.txt": b"keep", "c.txt": b"new"} and ev.skipped == ("a.txt",)
