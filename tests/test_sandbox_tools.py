"""Tool dispatch, actions and workspace tars (bat_jax/sandbox/tools.py; no engine needed)."""

import io
import tarfile

import pytest

from bat_jax.benchmarks.imaging.stages import Stage
from bat_jax.sandbox import tools
from bat_jax.sandbox.docker import state_to_tar
from bat_jax.sandbox.types import Observation, SandboxState


class _Recorder:
    def __init__(self):
        self.calls = []

    def execute_code(self, language, code, timeout_s=None):
        self.calls.append(("execute_code", language, code, timeout_s))
        return Observation("ok", "", 0, 0.0)

    def submit(self, path):
        self.calls.append(("submit", path))
        return Observation("submitted", "", 0, 0.0)


def test_tool_dispatch_and_specs():
    assert tools.TOOL_NAMES == ("execute_code", "submit")
    sb = _Recorder()
    assert tools.dispatch(sb, tools.Action("", "execute_code", {"language": "bash", "code": "ls"}), 3.0).stdout == "ok"
    assert tools.dispatch(sb, tools.Action("", "submit", {"path": "out.nii.gz"})).stdout == "submitted"
    assert sb.calls == [("execute_code", "bash", "ls", 3.0), ("submit", "out.nii.gz")]
    assert "'path'" in tools.dispatch(sb, tools.Action("", "submit", {"path": ""})).error
    assert "not a tool call" in tools.dispatch(sb, tools.Action("done", tools.STOP)).error
    assert len(sb.calls) == 2  # bad calls never reach the sandbox


def test_state_tar_round_trip_and_bad_paths():
    state = SandboxState(files={"a.txt": b"A", "d/e/f.bin": b"\x00\x01", "d/g": b""})
    data = state_to_tar(state)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: (m.type, m.mode, m.uid) for m in tar.getmembers()}
    assert members == {"a.txt": (tarfile.REGTYPE, 0o644, 65534), "d": (tarfile.DIRTYPE, 0o755, 65534),
                       "d/e": (tarfile.DIRTYPE, 0o755, 65534), "d/e/f.bin": (tarfile.REGTYPE, 0o644, 65534),
                       "d/g": (tarfile.REGTYPE, 0o644, 65534)}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()} == dict(state.files)
    for bad in ("/etc/passwd", "../x", "a/../../x", "."):
        with pytest.raises(ValueError, match="must be relative"):
            state_to_tar(SandboxState(files={bad: b"x"}))


def test_action_is_validated_when_built_and_round_trips():
    with pytest.raises(ValueError, match="unknown tool 'rm'"):
        tools.Action("", "rm", {})
    with pytest.raises(ValueError, match="missing: language"):
        tools.Action("", "execute_code", {"code": "ls"})
    with pytest.raises(ValueError, match="must be strings: code"):
        tools.Action("", "execute_code", {"language": "bash", "code": 1})
    with pytest.raises(ValueError, match="field 'thought'"):
        tools.Action(None, "submit", {"path": "a"})
    with pytest.raises(ValueError, match="lacks field 'tool'"):
        tools.Action.from_dict({"thought": "t"})
    action = tools.Action.from_dict({"thought": "t", "tool": "submit", "arguments": {"path": "a"}}, Stage.SUBMIT)
    assert action == tools.Action("t", "submit", {"path": "a"}, Stage.SUBMIT)
    assert action.to_dict() == {"thought": "t", "tool": "submit", "arguments": {"path": "a"}}
    assert tools.Action.from_dict({"tool": "stop"}) == tools.Action("", tools.STOP, {})
