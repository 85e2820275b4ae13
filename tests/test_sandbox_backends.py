"""Sandbox protocol tests, parametrised over backends (local always; docker when available)."""

import pytest

from bat_jax.sandbox.types import SandboxState, fault_of, sha256_hex
from bat_jax.sandbox.backends import BackendUnavailable, backend_factory


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def make_box(request):
    try:
        factory = backend_factory(request.param)
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    boxes = []

    def make(files=None, env=None):
        box = factory(SandboxState(files=files or {}, env=env or {}))
        boxes.append(box)
        return box

    yield make
    for box in boxes:
        box.close()


def test_python_and_bash_run_in_workspace_with_receipts(make_box):
    box = make_box({"data/a.txt": b"hello"})
    obs = box.execute_code("python", "print(open('data/a.txt').read().upper())")
    assert obs.exit_code == 0 and obs.stdout == "HELLO\n" and not obs.timed_out
    obs2 = box.execute_code("bash", "echo oops >&2; exit 3")
    assert obs2.exit_code == 3 and obs2.stderr == "oops\n"
    rec = box.receipts()
    assert [r.index for r in rec] == [0, 1]
    assert rec[0].tool == "execute_code" and rec[0].language == "python" and rec[0].exit_code == 0
    assert rec[0].stdout_sha256 == sha256_hex("HELLO\n") and rec[1].stderr_sha256 == sha256_hex("oops\n")
    assert rec[0].stdout == "HELLO\n" and rec[1].exit_code == 3


def test_files_written_by_code_are_visible_host_side(make_box):
    box = make_box()
    box.execute_code("bash", "mkdir -p out && printf 'x1' > out/r.txt")
    assert box.list_files() == ["out/r.txt"]
    assert box.read_file("out/r.txt") == b"x1"
    with pytest.raises(FileNotFoundError):
        box.read_file("out/none.txt")


def test_unknown_language_is_an_error_observation_not_an_exception(make_box):
    box = make_box()
    obs = box.execute_code("ruby", "puts 1")
    assert obs.exit_code is None and "unknown language" in obs.error


def test_timeout_kills_the_call(make_box):
    box = make_box()
    obs = box.execute_code("bash", "sleep 5; echo late", timeout_s=0.5)
    assert obs.timed_out and obs.exit_code is None and "late" not in obs.stdout
    assert obs.duration_s < 4.0
    assert box.receipts()[-1].timed_out


def test_output_is_truncated_but_digest_covers_everything(make_box):
    box = make_box()
    obs = box.execute_code("python", "print('a' * 5000)")
    assert obs.truncated and 2000 <= len(obs.stdout) <= 2200 and obs.stdout.startswith("a" * 500)
    assert box.receipts()[-1].stdout_sha256 == sha256_hex("a" * 5000 + "\n")


def test_submit_records_path_and_rejects_bad_paths(make_box):
    box = make_box({"out/sub.json": b"{}"})
    for bad in ("out/none.json", "../etc/passwd"):
        obs = box.submit(bad)
        assert obs.exit_code != 0 and "cannot submit" in obs.error and box.submitted() is None
    obs = box.submit("out/sub.json")
    assert obs.exit_code == 0 and box.submitted() == "out/sub.json"
    subs = [r for r in box.receipts() if r.tool == "submit"]
    assert [r.exit_code == 0 for r in subs] == [False, False, True] and subs[-1].code == "out/sub.json"


def test_env_is_passed_and_close_is_idempotent(make_box):
    box = make_box(env={"BAT_FLAG": "42"})
    assert box.execute_code("bash", "echo $BAT_FLAG").stdout == "42\n"
    box.close()
    box.close()


def test_a_call_after_close_is_the_hosts_failure_on_both_backends(make_box):
    """`fault_of`, the one rule for blame: a working sandbox is ('', ''); one the host closed and then called is
    'infra' (unscored), on the local and the Docker backend alike; a double without accounting is ('', '')."""
    box = make_box()
    assert box.execute_code("bash", "true").exit_code == 0 and fault_of(box) == ("", "")
    box.close()
    assert box.execute_code("bash", "true").error == "sandbox is closed"
    assert fault_of(box) == ("infra", "sandbox is closed")
    assert box.submit("x.json").exit_code is None and fault_of(box)[0] == "infra"
    assert fault_of(object()) == ("", "")


def test_environment_versions_names_the_sandbox_python_and_numpy():
    """The local backend runs this interpreter: its versions; a factory that cannot start a sandbox gives {}."""
    import platform

    import numpy

    from bat_jax.sandbox.backends import environment_versions, local_sandbox

    assert environment_versions(local_sandbox) == {"python": platform.python_version(), "numpy": numpy.__version__}

    def broken(state):
        raise RuntimeError("no engine")

    assert environment_versions(broken) == {}
