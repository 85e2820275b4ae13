"""A local subprocess sandbox backend — FOR TESTS AND DEVELOPMENT ONLY.

!!! WARNING: THIS IS NOT A SECURITY BOUNDARY. !!!
Code runs as the calling user, on the host, with the host's network, file system and Python. A temporary
directory is the working directory and nothing more: agent code can read and write anything the user can.
Never run untrusted model output through it; use the Docker backend (`bat_jax.sandbox.docker`) for that.

It implements the `bat_jax.sandbox.types.Sandbox` protocol so the task families, the scripted teacher and
the rubric verifier can be exercised quickly without Docker. Receipts are kept host-side in this object.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path, PurePosixPath

from bat_jax.sandbox.types import (
    DEFAULT_MAX_OUTPUT_CHARS,
    DEFAULT_TIMEOUT_S,
    LANGUAGES,
    Observation,
    Receipt,
    SandboxState,
    sha256_hex,
)


def _safe_relpath(path: str) -> PurePosixPath:
    """Validates a workspace-relative POSIX path; raises ValueError on absolute paths or '..'."""
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts or str(rel) == ".":
        raise ValueError(f"path {path!r} must be a relative path inside the workspace (no '..')")
    return rel


class LocalSandbox:
    """Non-isolated sandbox: a temp-dir workspace and `python3 -c` / `bash -c` subprocesses.

    Args:
      state: initial workspace files and environment variables (paper Eq. 2 state p).
      timeout_s: default hard wall-clock limit per call, seconds (REFERENCE.md: 120 s).
      max_output_chars: characters of stdout/stderr returned to the agent (REFERENCE.md: 2,048).
      python: interpreter for 'python' calls; defaults to the host interpreter (`sys.executable`), which
        must provide numpy, scipy, nibabel and PIL like the Docker task image.
    """

    def __init__(
        self,
        state: SandboxState,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        python: str | None = None,
    ):
        self._root = Path(tempfile.mkdtemp(prefix="bat_local_sandbox_"))
        self._timeout_s = float(timeout_s)
        self._max_chars = int(max_output_chars)
        self._python = python or sys.executable
        self._receipts: list[Receipt] = []
        self._submitted: str | None = None
        self._closed = False
        for rel, data in state.files.items():
            target = self._root / _safe_relpath(rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(bytes(data))
        self._env = dict(state.env)

    @property
    def root(self) -> Path:
        """Host path of the workspace (for debugging only)."""
        return self._root

    def _cut(self, text: str) -> tuple[str, bool]:
        if len(text) <= self._max_chars:
            return text, False
        return text[: self._max_chars] + f"\n...[truncated {len(text) - self._max_chars} chars]", True

    def _record(self, tool, language, code, exit_code, out, err, t0, t1, timed_out, shown) -> None:
        self._receipts.append(
            Receipt(
                index=len(self._receipts),
                tool=tool,
                language=language,
                code=code,
                exit_code=exit_code,
                stdout_sha256=sha256_hex(out),
                stderr_sha256=sha256_hex(err),
                started_at=t0,
                finished_at=t1,
                timed_out=timed_out,
                stdout=shown,
            )
        )

    def execute_code(self, language: str, code: str, timeout_s: float | None = None) -> Observation:
        """Runs `code` with cwd = workspace. Never raises for agent mistakes (bad language → error text)."""
        t0 = time.time()
        if self._closed:
            return Observation("", "", None, 0.0, error="sandbox is closed")
        if language not in LANGUAGES:
            err = f"unknown language {language!r}; expected one of {LANGUAGES}"
            self._record("execute_code", str(language), str(code), None, "", "", t0, time.time(), False, "")
            return Observation("", "", None, 0.0, error=err)
        argv = [self._python, "-c", code] if language == "python" else ["bash", "-c", code]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self._root), "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", **self._env}
        limit = self._timeout_s if timeout_s is None else float(timeout_s)
        proc = subprocess.Popen(argv, cwd=self._root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        timed_out = False
        try:
            out_b, err_b = proc.communicate(timeout=limit)
            exit_code: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            out_b, err_b = proc.communicate()
            exit_code = None
        t1 = time.time()
        out = out_b.decode("utf-8", errors="replace")
        err = err_b.decode("utf-8", errors="replace")
        shown_out, cut1 = self._cut(out)
        shown_err, cut2 = self._cut(err)
        self._record("execute_code", language, code, exit_code, out, err, t0, t1, timed_out, shown_out)
        return Observation(shown_out, shown_err, exit_code, t1 - t0, timed_out=timed_out, truncated=cut1 or cut2)

    def submit(self, path: str) -> Observation:
        """Marks a workspace file as the final artefact; a missing/invalid path is an error observation
        (exit_code None, `error` set), as in the Docker backend."""
        t0 = time.time()
        try:
            rel = _safe_relpath(path)
            ok = (self._root / rel).is_file()
            error = "" if ok else f"no such file in workspace: {path!r}"
        except ValueError as exc:
            ok, error = False, str(exc)
        if ok:
            self._submitted = str(rel)
        text = f"submitted {rel}" if ok else ""
        code = 0 if ok else None  # like the Docker backend: a refused submit "never ran"
        self._record("submit", "", str(path), code, text, "", t0, time.time(), False, text)
        return Observation(text, "", code, time.time() - t0, error=f"cannot submit {path!r}: {error}" if error else "")

    def receipts(self) -> list[Receipt]:
        return list(self._receipts)

    def read_file(self, path: str) -> bytes:
        """Host-side read. Raises FileNotFoundError (missing file) or ValueError (path outside workspace)."""
        target = self._root / _safe_relpath(path)
        if not target.is_file():
            raise FileNotFoundError(f"no such file in workspace: {path!r}")
        return target.read_bytes()

    def list_files(self) -> list[str]:
        if self._closed:
            return []
        return sorted(p.relative_to(self._root).as_posix() for p in self._root.rglob("*") if p.is_file())

    def submitted(self) -> str | None:
        return self._submitted

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> "LocalSandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
