"""The sandbox contract (bat_jax/sandbox/types.py): workspace paths, state digests and the one rule for blame."""

import hashlib
import types

import pytest

from bat_jax.sandbox.types import SandboxState, fault_of, sha256_hex, workspace_relpath


def test_workspace_paths_are_normalised_and_must_stay_inside():
    assert [workspace_relpath(p) for p in ("a/./b/", "..x/...", " /x")] == ["a/b", "..x/...", " /x"]
    for bad in ("/etc/passwd", "a/../../x", "..", "", ".", "a\0b", 3):
        with pytest.raises(ValueError, match="must be"):
            workspace_relpath(bad)


def test_state_digest_is_over_sorted_paths_file_digests_and_env():
    # by hand: sha256 of "a/x\0<sha256(b'1')>\n" + "b.txt\0<sha256(b'2')>\n" + "env:K=v\n"
    expected = hashlib.sha256(b"a/x\0" + hashlib.sha256(b"1").hexdigest().encode() + b"\n"
                              + b"b.txt\0" + hashlib.sha256(b"2").hexdigest().encode() + b"\n"
                              + b"env:K=v\n").hexdigest()
    state = SandboxState({"b.txt": b"2", "a/x": b"1"}, {"K": "v"})
    assert state.digest() == expected == "e27ee92ae493b2cc305e6c81b9e1187ecb775bbd37968c8bb660ff7a4dac44ac"
    assert SandboxState({"a/x": b"1", "b.txt": b"2"}, {"K": "v"}).digest() == expected  # insertion order is not read
    assert SandboxState({"a/x": b"1", "b.txt": b"2"}).digest() != expected  # the environment is
    assert sha256_hex("é") == hashlib.sha256("é".encode("utf-8")).hexdigest()


def test_blame_reads_the_backends_fault_and_failure():
    assert fault_of(types.SimpleNamespace(fault="agent", failure="executor hung")) == ("agent", "executor hung")
    assert fault_of(types.SimpleNamespace(fault="infra", failure="image missing")) == ("infra", "image missing")
    assert fault_of(types.SimpleNamespace(fault=None, failure=None)) == ("", "")
    assert fault_of(object()) == ("", "")  # a test double without them: no failure
