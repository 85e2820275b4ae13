"""Stage-boundary snapshot files (bat_jax/sandbox/snapshot.py): saved atomically, loaded back to the same state,
tampering and junk refused naming the file."""

import io
import tarfile

import pytest

from bat_jax.sandbox import snapshot
from bat_jax.sandbox.types import SandboxState


def test_snapshot_save_load_and_tampering(tmp_path):
    state = SandboxState(files={"a": b"x", "out/m.npy": bytes(range(200))}, env={"SEED": "3"})
    path = tmp_path / "snaps" / "s.tar"
    assert snapshot.save(state, path) == state.digest()
    assert list(path.parent.iterdir()) == [path]  # no temp file left behind
    loaded = snapshot.load(path)
    assert dict(loaded.files) == dict(state.files) and loaded.env == {"SEED": "3"}
    assert loaded.digest() == state.digest()
    with tarfile.open(path) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(path, "w") as tar:
        for member, data in members:
            tar.addfile(member, io.BytesIO(b"y" if member.name == "files/a" else data))
    with pytest.raises(ValueError, match="s.tar: content digest"):
        snapshot.load(path)
    (tmp_path / "junk.tar").write_bytes(b"not a tar")
    with pytest.raises(ValueError, match="junk.tar: not a snapshot"):
        snapshot.load(tmp_path / "junk.tar")
    with pytest.raises(FileNotFoundError):
        snapshot.load(tmp_path / "absent.tar")
