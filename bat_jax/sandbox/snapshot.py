"""Snapshots: the sandbox state at a stage boundary, as a reusable artefact with a digest (paper Eq. 11).

Details: docs/design.md.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import tarfile
from collections.abc import Sequence
from typing import Protocol

from bat_jax.atomic_io import atomic_file
from bat_jax.sandbox.tools import Action, dispatch
from bat_jax.sandbox.types import Observation, Sandbox, SandboxState


class Restorable(Sandbox, Protocol):
    """A sandbox that can be reset to a state and export its state (DockerSandbox implements it)."""

    def reset(self, state: SandboxState | None = None) -> None:
        """New episode: receipts and submission cleared, workspace and env replaced by `state`."""

    def export_state(self) -> SandboxState:
        """The current workspace (regular files) and env."""

_META = "state.json"
_FILES = "files/"


def replay_prefix(sandbox: Restorable, initial: SandboxState, calls: Sequence[Action],
                  timeout_s: float | None = None) -> tuple[SandboxState, list[Observation]]:
    """Resets `sandbox` to `initial`, replays `calls` in order and returns (state reached, observations)."""
    sandbox.reset(initial)
    observations = [dispatch(sandbox, call, timeout_s) for call in calls]
    return sandbox.export_state(), observations


def save(state: SandboxState, path: str | os.PathLike) -> str:
    """Writes `state` to the tar file `path` all or nothing (`atomic_io.atomic_file`); returns its digest."""
    path = pathlib.Path(path)
    digest = state.digest()
    meta = json.dumps({"digest": digest, "env": dict(state.env), "num_files": len(state.files)},
                      sort_keys=True).encode()
    with atomic_file(path) as f, tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [(_META, meta)] + [(_FILES + p, state.files[p]) for p in sorted(state.files)]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return digest


def load(path: str | os.PathLike) -> SandboxState:
    """Reads a state written by `save`.

    Raises:
      FileNotFoundError: no such file.
      ValueError: not a snapshot, or its files do not match the recorded digest (names the file).
    """
    files: dict[str, bytes] = {}
    meta = None
    try:
        with tarfile.open(path, mode="r") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                data = tar.extractfile(member).read()
                if member.name == _META:
                    meta = json.loads(data)
                elif member.name.startswith(_FILES):
                    files[member.name[len(_FILES):]] = data
    except tarfile.TarError as e:
        raise ValueError(f"{path}: not a snapshot tar ({e})") from e
    if meta is None:
        raise ValueError(f"{path}: no {_META} in snapshot")
    state = SandboxState(files=files, env=dict(meta.get("env", {})))
    if state.digest() != meta.get("digest"):
        raise ValueError(f"{path}: content digest {state.digest()} != recorded {meta.get('digest')}")
    return state
