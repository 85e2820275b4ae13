"""The sandbox contract shared by the Docker backend, the task families, the teacher and the verifier.

An agent acts only through two tools: `execute_code(language, code)` and `submit(path)`. Every call leaves a
`Receipt` outside the agent's reach; the verifier checks rubric evidence against receipts and artefacts.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Protocol

#: Languages accepted by `execute_code`.
LANGUAGES = ("python", "bash")
#: Default characters of stdout/stderr returned to the agent (2,048 per observation, the released code's).
DEFAULT_MAX_OUTPUT_CHARS = 2048
#: Default hard wall-clock limit of one tool call, seconds (120 s, the released code's).
DEFAULT_TIMEOUT_S = 120.0


def workspace_relpath(path: str) -> str:
    """`path` as a normalised workspace-relative POSIX path ('a/./b/' -> 'a/b').

    It is checked part by part: any name is legal ('..x', '...', ' '), only a '..' part leaves the workspace.

    Raises:
      ValueError: not a string, empty, absolute, holding a NUL byte, or with a '..' part.
    """
    if not isinstance(path, str):
        raise ValueError(f"path {path!r} must be a string")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if path.startswith("/") or "\0" in path or ".." in parts or not parts:
        raise ValueError(f"path {path!r} must be relative and inside the workspace (no '..' part)")
    return "/".join(parts)


def sha256_hex(data: bytes | str) -> str:
    """SHA-256 hex digest of bytes (str is UTF-8 encoded)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


@dataclasses.dataclass(frozen=True)
class Observation:
    """What a tool call returns to the agent.

    Attributes:
      stdout, stderr: captured text, each cut to the configured limit (`truncated` says whether it was).
      exit_code: process exit status; None when the call was killed (timeout) or never ran.
      duration_s: wall-clock seconds of the call.
      timed_out: True when the hard timeout killed the work.
      truncated: True when stdout or stderr was cut.
      error: infrastructure / tool error text (e.g. 'unknown language'), '' when none.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    duration_s: float
    timed_out: bool = False
    truncated: bool = False
    error: str = ""

    def render(self) -> str:
        """The observation text the agent sees as the tool response."""
        parts = []
        if self.stdout:
            parts.append(self.stdout)
        if self.stderr:
            parts.append(f"[stderr]\n{self.stderr}")
        if self.error:
            parts.append(f"[error] {self.error}")
        if self.timed_out:
            parts.append(f"[timed out after {self.duration_s:.1f} s]")
        parts.append(f"[exit code {self.exit_code}]")
        return "\n".join(parts)


@dataclasses.dataclass(frozen=True)
class Receipt:
    """Execution record of one tool call, kept by the host (never writable by the agent).

    Attributes:
      index: 0-based call index within the episode.
      tool: 'execute_code' or 'submit'.
      language: 'python' | 'bash' for execute_code, '' for submit.
      code: the code (or the submitted path).
      exit_code: as in Observation.
      stdout_sha256, stderr_sha256: digests of the *full* (untruncated) outputs.
      started_at, finished_at: Unix timestamps, seconds.
      timed_out: as in Observation.
      stdout: the (truncated) stdout the agent saw, kept for evidence predicates.
      reads, writes: workspace-relative paths the call's processes read / wrote, as the kernel reported them
        (`bat_jax.sandbox.file_trace`), sorted. Evidence predicates rest on these, never on `code`.
      trace_complete: False when the backend could not observe every file event of the call (no tracing, a
        kernel queue overflow, a directory tree past the watch cap): reads / writes may then miss paths.
      write_digests: sorted (path, SHA-256 hex) of the written regular files as they were when the call ended
        (`file_trace.digest_files`); a written path without one was gone, not a regular file or over the size
        cap then. Evidence uses them to tell what this call wrote from what was there before it.
    """

    index: int
    tool: str
    language: str
    code: str
    exit_code: int | None
    stdout_sha256: str
    stderr_sha256: str
    started_at: float
    finished_at: float
    timed_out: bool
    stdout: str = ""
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    trace_complete: bool = False
    write_digests: tuple[tuple[str, str], ...] = ()

    def written_digest(self, path: str) -> str | None:
        """SHA-256 hex of `path` as this call left it, or None when the call did not record one."""
        return dict(self.write_digests).get(path)


@dataclasses.dataclass(frozen=True)
class SandboxState:
    """An executable sandbox state p (paper Eq. 2): the workspace files and environment a sandbox starts from.

    Attributes:
      files: workspace-relative POSIX path → file bytes.
      env: environment variables for tool calls.
    """

    files: Mapping[str, bytes]
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def digest(self) -> str:
        """SHA-256 over sorted (path, file digest) pairs and env; stable across processes."""
        h = hashlib.sha256()
        for path in sorted(self.files):
            h.update(path.encode("utf-8") + b"\0" + sha256_hex(self.files[path]).encode() + b"\n")
        for key in sorted(self.env):
            h.update(f"env:{key}={self.env[key]}\n".encode("utf-8"))
        return h.hexdigest()


def fault_of(sandbox: object) -> tuple[str, str]:
    """Whose failure a sandbox's failure is, and its text.

    It is the one rule for blame every episode loop applies. ('', '') while it works. ('agent', text) when it died, hung
    or stopped answering after the agent's code ran (the episode is scored from what was gathered until then: the
    agent's failure). ('infra', text) when it could not start, its engine is unreachable, it failed before any agent
    code ran, or it was called after the host closed it (unscored: null is not zero). Reads the backend's `fault` /
    `failure` (both backends keep them); a sandbox without them (a test double) reports ('', '')."""
    return getattr(sandbox, "fault", "") or "", getattr(sandbox, "failure", "") or ""


class FileTooLarge(ValueError):
    """A workspace file is larger than the byte budget the caller gave `Sandbox.read_file`."""


class Sandbox(Protocol):
    """One live sandbox holding one episode's workspace."""

    def execute_code(self, language: str, code: str, timeout_s: float | None = None) -> Observation:
        """Runs code ('python' or 'bash') in the workspace; never raises for agent mistakes."""

    def submit(self, path: str) -> Observation:
        """Marks a workspace-relative file as the final artefact."""

    def receipts(self) -> list[Receipt]:
        """Receipts of every call so far, in order (host-side copy)."""

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Host-side read of a workspace file, for the verifier.

        Raises FileNotFoundError, and FileTooLarge (before reading anything) when the file holds more than `max_bytes`
        bytes."""

    def list_files(self) -> list[str]:
        """Workspace-relative paths of the regular files (symlinks not followed), sorted.

        A backend may cap how many it lists."""

    def submitted(self) -> str | None:
        """The submitted workspace-relative path, or None."""

    def close(self) -> None:
        """Releases the sandbox (idempotent)."""
