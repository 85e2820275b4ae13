"""Stage Bank Data Factory (bat_jax/stage_bank/factory.py): grid, Accept, builds, resume, rejections.

Builds use the local (non-isolated) backend and tiny grids (1–2 sources of the scripted expert); the full
126-source build is in launch/bench/bench_factory.py. The Docker path has one @pytest.mark.docker test.
"""

import dataclasses
import http.server
import json
import os
import platform
import socket
import threading

import numpy
import pytest

from bat_jax.benchmark.stages import E2E
from bat_jax.benchmarks.imaging.stages import Stage
from bat_jax.sandbox.local import LocalSandbox
from bat_jax.stage_bank import e2e_surrogate as e2e
from bat_jax.staged_benchmark.contract import Reduction
from bat_jax.stage_bank.bank import StageBank
from bat_jax.stage_bank.factory import (FACTORY_VERSION, FactoryConfig, build_bank, check_recipe, load_manifest,
                                        recipe, sources)
from bat_jax.stage_bank.leakage import preflight
from bat_jax.stage_bank.row import content_digest
from bat_jax.clients.chat_endpoint import ChatEndpointConfig
from bat_jax.staged_benchmark.episode import Conversation
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.heldout import HELDOUT_SEED_BASE, training_task
from bat_jax.benchmarks.imaging.registry import TRACKS
from bat_jax.benchmarks.imaging.stages import STAGES
from bat_jax.benchmarks.imaging.teacher import ChatTeacher

IMAGING = ImagingBenchmark()

# ------------------------------------------------------------------------------------------- pure parts


def test_default_grid_is_126_distinct_training_sources():
    grid = sources(FactoryConfig(), IMAGING)
    assert len(grid) == 6 * 7 * 3
    assert len({(s.focus, s.track, s.outcome) for s in grid}) == 126
    assert len({s.task_seed for s in grid}) == 126
    assert all(0 <= s.task_seed < HELDOUT_SEED_BASE and s.template in (0, 1) for s in grid)
    assert [s.index for s in grid] == list(range(126))
    assert grid == sources(FactoryConfig(), IMAGING)  # deterministic
    assert sources(FactoryConfig(seed=1), IMAGING)[0].task_seed != grid[0].task_seed


@pytest.mark.parametrize("field,value,match", [
    ("foci", ("S9",), "foci"), ("tracks", ("radiology",), "tracks"), ("outcomes", ("win",), "outcomes"),
    ("backend", "k8s", "backend"), ("teacher", "human", "teacher"), ("e2e_cases", 0, "cases"),
    ("e2e_input_fraction", 1.5, "input_fraction"), ("e2e_validation_passes", 0, "validation_passes"),
    ("foci", ("S1", "S1"), "foci")])
def test_config_validation_names_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(FactoryConfig(), **{field: value}).validate(IMAGING)


def test_imaging_task_settings_are_validated_naming_the_field():
    with pytest.raises(ValueError, match="cases_per_task"):
        ImagingBenchmark(cases_per_task=1)
    with pytest.raises(ValueError, match="layouts"):
        ImagingBenchmark(layouts="grid")


def test_openai_teacher_without_an_endpoint_is_a_config_error():
    with pytest.raises(ValueError, match="teacher_endpoint"):
        FactoryConfig(teacher="openai").validate(IMAGING)


class _FirstNote:
    """A bank as `check_recipe` reads it: one version and that version's note."""

    def __init__(self, note: str):
        self._note = note

    def versions(self) -> list[int]:
        return [1]

    def note(self, version: int) -> str:
        return self._note


def test_a_bank_whose_note_names_no_benchmark_is_refused_not_taken_for_imaging(tmp_path):
    cfg = FactoryConfig(bank_dir=str(tmp_path / "bank"))
    assert recipe(cfg, IMAGING) == "benchmark=imaging teacher=scripted layouts=fixed"
    check_recipe(_FirstNote(f"{FACTORY_VERSION} seed=0 benchmark=imaging teacher=scripted layouts=fixed digest=ab"),
                 cfg, IMAGING)
    check_recipe(_FirstNote("a custom note"), cfg, IMAGING)  # custom notes are not checked
    with pytest.raises(ValueError, match=r"built with no benchmark named \(an older factory\); this run asks for "
                                         r"benchmark=imaging teacher=scripted layouts=fixed"):
        check_recipe(_FirstNote(f"{FACTORY_VERSION} seed=0 teacher=scripted layouts=fixed digest=ab"), cfg, IMAGING)
    with pytest.raises(ValueError, match=r"built with benchmark=tabular teacher=scripted; this run asks for "
                                         r"benchmark=imaging"):
        check_recipe(_FirstNote(f"{FACTORY_VERSION} seed=0 benchmark=tabular teacher=scripted digest=ab"), cfg, IMAGING)


def test_accept_reports_first_failed_factor():
    lam = Reduction(2, 1.0, 1)
    ok = dict(booted=True, turns=12, horizon=24, failed_stages=[], passes=1, lam=lam, leak_hits=0)
    assert e2e.accept(**ok) == ""
    assert e2e.accept(**{**ok, "booted": False}) == "boot_failed"
    assert e2e.accept(**{**ok, "turns": 25}) == "too_long"
    assert e2e.accept(**{**ok, "failed_stages": ["S3", "S5"]}) == "check_failed:S3"
    assert e2e.accept(**{**ok, "passes": 2}) == "validation_budget"
    assert e2e.accept(**{**ok, "leak_hits": 1}) == "leak"


# ------------------------------------------------------------------------------------------------ builds

TINY = dict(tracks=("classification",), foci=("E2E", "S3"), outcomes=("recovery",), workers=2)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """A fresh 2-source build (classification, recovery; foci E2E and S3)."""
    root = tmp_path_factory.mktemp("fresh")
    cfg = FactoryConfig(bank_dir=str(root / "bank"), **TINY)
    return cfg, build_bank(cfg, IMAGING, progress=False)


def test_tiny_build_rows_states_and_leakage(fresh):
    cfg, report = fresh
    assert report.version == 1 and report.sources_accepted == 2 and report.rejected == {}
    # scripted expert on a recovery task: 13 responses (S1 3, S2 2, S3 4, S4 2, S5 2); the S3 source adds its
    # 4-response stage rollout, the E2E source its 13-response surrogate rollout.
    assert report.sft_rows == 13 + 4 + 13 + 13
    assert report.sft_by_focus == {"E2E": 13, "S1": 6, "S2": 4, "S3": 8 + 4, "S4": 4, "S5": 4}
    assert report.rl_by_focus == {"E2E": 1, "S3": 1}
    bank = StageBank(cfg.bank_dir)
    view = bank.read()
    assert len(view.rl_rows) == 2 and len(view.sft_rows) == report.sft_rows
    e2e_row = view.query(focus="E2E")[0]
    s3_row = view.query(focus="S3")[0]
    e2e_state = bank.load_state(e2e_row.state)
    assert len(e2e_state.files["data/cases.csv"].decode().splitlines()) == 1 + cfg.e2e_cases
    assert {i.item_id for i in e2e_row.rubric} >= {"plan.read_brief", "validate.issues", "submit.submitted"}
    assert [t.name for t in e2e_row.provenance.transformations] == [
        "task_synthesis", "teacher_trajectory", "e2e_reduce", "teacher_check"]
    s3_state = bank.load_state(s3_row.state)
    # Eq. 11: the S3 start state has the S1/S2 artefacts and nothing of S3 or later.
    assert "plan.md" in s3_state.files and "outputs/env.json" in s3_state.files
    assert "outputs/validation.json" not in s3_state.files and "outputs/submission.json" not in s3_state.files
    assert all(i.item_id.startswith("validate.") for i in s3_row.rubric)
    assert "Stage S3 Validate" in s3_row.skill and "boundary of stage S3" in s3_row.prompt
    assert s3_row.provenance.transformations[2].params["turns"] == 5  # S1 3 + S2 2 replayed calls
    leak = preflight(load_manifest(cfg, IMAGING), files=[bank.root / "versions", bank.root / "states"])
    assert leak.hits == [] and leak.rows_scanned == 2 + report.sft_rows
    saved = json.loads((bank.root / "work" / "build_report.json").read_text())
    assert saved["digest"] == report.digest and saved["version"] == 1
    # the one input besides the commit and the config its rows record: the sandboxes' numpy (the S2 env.json)
    assert report.sandbox == {"python": platform.python_version(), "numpy": numpy.__version__}
    assert json.loads(bank.load_state(s3_row.state).files["outputs/env.json"])["numpy"] == numpy.__version__


def test_resume_recomputes_a_missing_source_to_identical_rows(fresh):
    cfg, ref = fresh
    work = sorted((StageBank(cfg.bank_dir).root / "work" / "sources").glob("*.json"))
    assert len(work) == 2
    cached = {p: json.loads(p.read_text()) for p in work}
    victim = next(p for p, v in cached.items() if v["rl"][0]["focus"] == "S3")
    victim.unlink()
    again = build_bank(cfg, IMAGING, progress=False)  # recomputes the S3 source from scratch, same seed
    assert again.cached_sources == 1 and again.digest == ref.digest
    assert json.loads(victim.read_text()) == cached[victim]  # byte-identical rows and states
    assert again.version is None and StageBank(cfg.bank_dir).latest() == 1  # nothing new to admit


ONE = dict(tracks=("classification",), foci=("S1",), outcomes=("success",), workers=1)


def _assert_rejected(report, bank_dir, reason):
    assert report.rejected == {reason: 1} and report.sources_accepted == 0
    assert report.version is None and StageBank(bank_dir).latest() == 0
    assert not list((StageBank(bank_dir).root / "work" / "sources").glob("*.json"))  # transient: not cached
    assert not list((StageBank(bank_dir).root / "states").glob("*"))  # no state of a rejected source is stored


def test_killed_build_leaves_no_version_and_resumes_from_cache(tmp_path):
    cfg = FactoryConfig(bank_dir=str(tmp_path / "bank"), **ONE)

    def kill(src, reason):
        raise KeyboardInterrupt("killed after the source finished")

    with pytest.raises(KeyboardInterrupt):
        build_bank(cfg, IMAGING, progress=False, on_source=kill)
    assert StageBank(cfg.bank_dir).latest() == 0  # nothing half-written
    assert len(list((tmp_path / "bank" / "work" / "sources").glob("*.json"))) == 1
    resumed = build_bank(cfg, IMAGING, progress=False, make_sandbox=_no_sandbox)  # nothing left to run
    assert resumed.cached_sources == 1 and resumed.version == 1 and resumed.rl_rows == 1
    # success variant, S1 focus: 12 full-trajectory responses + the 3-response S1 stage rollout
    assert resumed.sft_rows == 12 + 3 and resumed.sft_by_focus["S1"] == 3 + 3


def _no_sandbox(state):
    raise AssertionError("a cached source must not start a sandbox")


def test_sandbox_dying_mid_trajectory_rejects_the_source(tmp_path):
    def dying(state):
        box = LocalSandbox(state, timeout_s=30.0)
        real = box.execute_code

        def execute_code(language, code, timeout_s=None):
            if len(box.receipts()) == 2:
                box.close()  # the workspace is gone: the next call raises
            return real(language, code, timeout_s)

        box.execute_code = execute_code
        return box

    cfg = FactoryConfig(bank_dir=str(tmp_path / "bank"), **ONE)
    # the workspace disappears after 2 calls; later calls return the backend's closed-sandbox error
    _assert_rejected(build_bank(cfg, IMAGING, progress=False, make_sandbox=dying), cfg.bank_dir, "sandbox_failure")

    def raising(state):
        box = LocalSandbox(state, timeout_s=30.0)
        real = box.execute_code

        def execute_code(language, code, timeout_s=None):
            if len(box.receipts()) == 2:
                raise ConnectionError("container died")
            return real(language, code, timeout_s)

        box.execute_code = execute_code
        return box

    cfg = FactoryConfig(bank_dir=str(tmp_path / "bank2"), **ONE)
    _assert_rejected(build_bank(cfg, IMAGING, progress=False, make_sandbox=raising), cfg.bank_dir,
                     "sandbox_failure")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_teacher_rejects_the_source(tmp_path):
    endpoint = ChatEndpointConfig(f"http://127.0.0.1:{_free_port()}/v1", "m", max_retries=0, timeout_s=2.0)
    cfg = FactoryConfig(bank_dir=str(tmp_path / "bank"), teacher="openai", teacher_endpoint=endpoint, **ONE)
    _assert_rejected(build_bank(cfg, IMAGING, progress=False), cfg.bank_dir, "teacher_unreachable")


class _Garbage(http.server.BaseHTTPRequestHandler):
    reply = "Sure! I will run the code now."

    def do_POST(self):  # noqa: N802
        self.server.requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        body = json.dumps({"choices": [{"message": {"content": self.reply}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _serve(handler):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.requests = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_chat_teacher_parses_the_stage_label():
    class Good(_Garbage):
        reply = ('OK: {"thought": "env", "tool": "execute_code", "stage": "S2", '
                 '"arguments": {"language": "python", "code": "import numpy"}}')

    server = _serve(Good)
    try:
        teacher = ChatTeacher(ChatEndpointConfig(f"http://127.0.0.1:{server.server_address[1]}/v1", "m",
                                                 max_retries=0))
        action = teacher(Conversation("# Task tr-x", E2E, IMAGING.row_skill(E2E), STAGES))
        assert action.stage == Stage.SETUP and action.arguments["code"] == "import numpy"
        system = server.requests[0]["messages"][0]["content"]
        assert system.endswith(ChatTeacher.NOTE) and server.requests[0]["model"] == "m"
    finally:
        server.shutdown()


def test_malformed_teacher_output_rejects_the_source(tmp_path):
    server = _serve(_Garbage)
    try:
        endpoint = ChatEndpointConfig(f"http://127.0.0.1:{server.server_address[1]}/v1", "m", max_retries=0)
        cfg = FactoryConfig(bank_dir=str(tmp_path / "bank"), teacher="openai", teacher_endpoint=endpoint, **ONE)
        _assert_rejected(build_bank(cfg, IMAGING, progress=False), cfg.bank_dir, "teacher_bad_reply")
    finally:
        server.shutdown()


def test_leaky_source_is_rejected_and_nothing_is_admitted(tmp_path):
    cfg = FactoryConfig(bank_dir=str(tmp_path / "bank"), **ONE)
    (src,) = sources(cfg, IMAGING)
    task_id = training_task(TRACKS["classification"], src.task_seed, "success", src.template).task_id
    man = tmp_path / "heldout.json"
    man.write_text(json.dumps({"task_ids": [task_id]}))
    report = build_bank(dataclasses.replace(cfg, heldout_manifest=str(man)), IMAGING, progress=False)
    assert report.rejected == {"leak": 1} and report.version is None and StageBank(cfg.bank_dir).latest() == 0
    assert not list((StageBank(cfg.bank_dir).root / "states").glob("*"))


@pytest.mark.docker
def test_docker_backend_builds_two_sources(tmp_path):
    from bat_jax.sandbox.backends import BackendUnavailable, backend_factory

    try:
        backend_factory("docker")
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    cfg = FactoryConfig(bank_dir=str(tmp_path / "bank"), backend="docker", tracks=("vqa",), foci=("E2E", "S4"),
                        outcomes=("failure",), workers=2)
    report = build_bank(cfg, IMAGING, progress=False)
    assert report.rejected == {} and report.version == 1
    # failure variant: 12 responses (S1 3, S2 2, S3 3, S4 2, S5 2); S4 stage rollout 2; surrogate 12.
    assert report.sft_rows == 12 + 2 + 12 + 12
    assert report.rl_by_focus == {"E2E": 1, "S4": 1}
    assert content_digest(report.to_dict()["rl_by_focus"]) == content_digest({"E2E": 1, "S4": 1})


@pytest.mark.docker
def test_docker_container_killed_mid_trajectory_rejects_the_source(tmp_path):
    from bat_jax.sandbox import docker as docker_backend
    from bat_jax.sandbox.backends import BackendUnavailable, backend_factory

    try:
        backend_factory("docker")
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    client = docker_backend.connect()

    def killed(state):
        box = docker_backend.DockerSandbox(client, state=state)
        real = box.execute_code

        def execute_code(language, code, timeout_s=None):
            if len(box.receipts()) == 2:
                client.api.kill(box.container_id)  # the container dies between two calls
            return real(language, code, timeout_s)

        box.execute_code = execute_code
        return box

    cfg = FactoryConfig(bank_dir=str(tmp_path / "bank"), backend="docker", **ONE)
    _assert_rejected(build_bank(cfg, IMAGING, progress=False, make_sandbox=killed), cfg.bank_dir,
                     "sandbox_failure")


def _tabular_digest(bank_dir, backend="local", workers=2):
    from bat_jax.benchmarks.tabular.benchmark import TabularBenchmark

    cfg = FactoryConfig(bank_dir=str(bank_dir), backend=backend, teacher="scripted", tracks=("group_mean",),
                        outcomes=("missing",), workers=workers)
    report = build_bank(cfg, TabularBenchmark(), progress=False)
    assert report.sources_total == 5 and report.cached_sources == 0
    # every focus is accepted: a stage row's checks credit the files its start state holds (analyse, report)
    assert report.rejected == {} and report.rl_by_focus == {f: 1 for f in ("E2E", *TabularBenchmark().stages.ids)}
    return report.digest


@pytest.mark.slow
def test_the_tabular_digest_does_not_depend_on_path_cwd_timezone_or_workers(tmp_path, monkeypatch):
    """The tabular tiny bank's grid narrowed to one family and variant (5 sources), built twice: another bank
    directory, working directory, TZ and worker count give the same digest."""
    first = _tabular_digest(tmp_path / "a" / "bank", workers=2)
    other = tmp_path / "elsewhere" / "deeper"
    other.mkdir(parents=True)
    monkeypatch.chdir(other)
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    assert _tabular_digest(other / "bank", workers=1) == first
    assert os.getcwd() == str(other)


@pytest.mark.docker
def test_the_tabular_digest_is_the_same_on_docker_and_local(tmp_path):
    """Docker sandboxes (the image's Python and numpy 1.24) and local ones (the host's) write the same tabular rows."""
    from bat_jax.sandbox.backends import BackendUnavailable

    try:
        docker = _tabular_digest(tmp_path / "docker" / "bank", backend="docker")
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    assert _tabular_digest(tmp_path / "local" / "bank") == docker
