"""The only place that parses gin: resolve gin files, apply bindings, make the run directory, run the job.

    python -m bat_jax.launch --gin_file=bicurl_tiny.gin [--gin_file=...] [--gin_bindings=...]
                             [--gin_search_paths=...] [--run_dir=...]

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import gin
from absl import flags

from bat_jax.atomic_io import atomic_write
from bat_jax.errors import ConfigError
from bat_jax.learn import distributed

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_GIN_DIR = REPO_ROOT / "gin"

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "Gin file name or path (repeatable); names resolve on the search path.")
flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings applied after the files, e.g. 'experiment.Foo.x = 3'.")
flags.DEFINE_multi_string("gin_search_paths", [], "Extra folders searched for gin files (before gin/).")
flags.DEFINE_string("run_dir", None, "Run directory (default: <runs_root>/<run_name>).")
flags.DEFINE_string("runs_root", "runs", "Parent folder of run directories when --run_dir is not given.")
flags.DEFINE_bool("debug", False, "Show the traceback of a configuration error instead of one line (also: "
                  "BAT_JAX_DEBUG=1).")


class _GinProbeFilter(logging.Filter):
    """Drops gin's 'Path not found' error logged while it probes an include on the Python path.

    Gin logs it before the search path finds the file. A file that is really missing still fails the parse with an error
    naming it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "Path not found: %s" and record.pathname.endswith("resource_reader.py"))


logging.getLogger().addFilter(_GinProbeFilter())


class LaunchError(ConfigError):
    """A configuration problem the user must fix; the message says what and where."""


def search_paths(extra: Sequence[str] = ()) -> list[pathlib.Path]:
    """Gin search path, first match wins: extra paths, $BAT_JAX_GIN_PATH, then the repository's gin/."""
    paths = [pathlib.Path(p) for p in extra]
    env = os.environ.get("BAT_JAX_GIN_PATH", "")
    paths += [pathlib.Path(p) for p in env.split(os.pathsep) if p]
    paths.append(DEFAULT_GIN_DIR)
    return [p.resolve() for p in paths]


def available_gin_files(paths: Sequence[pathlib.Path]) -> list[str]:
    """Names (relative to their search folder) of every .gin file on the search path, sorted."""
    names = set()
    for root in paths:
        if root.is_dir():
            names.update(str(p.relative_to(root)) for p in root.rglob("*.gin"))
    return sorted(names)


def resolve_gin_file(name: str, paths: Sequence[pathlib.Path]) -> pathlib.Path:
    """Finds a gin file by path or by name on the search path.

    Raises:
      LaunchError: listing the available gin files when nothing matches.
    """
    candidate = pathlib.Path(name)
    if candidate.is_file():
        return candidate.resolve()
    for root in paths:
        if (root / name).is_file():
            return (root / name).resolve()
    listing = "\n  ".join(available_gin_files(paths)) or "(none)"
    where = ", ".join(str(p) for p in paths)
    raise LaunchError(f"gin file {name!r} not found on the search path ({where}). Available:\n  {listing}")


def parse_gin(files: Sequence[str], bindings: Sequence[str], extra_paths: Sequence[str] = ()) -> list[pathlib.Path]:
    """Clears gin, parses the files (includes resolve on the search path), then each binding.

    Returns:
      The resolved file paths, in order.

    Raises:
      LaunchError: no file given, an unknown file, a file that fails to parse (its path and gin's message),
        or a malformed binding (the binding text and gin's message).
    """
    if not files:
        raise LaunchError("no --gin_file given; try --gin_file=bicurl_tiny.gin")
    paths = search_paths(extra_paths)
    resolved = [resolve_gin_file(f, paths) for f in files]
    gin.clear_config(clear_constants=True)
    for root in paths:
        gin.add_config_file_search_path(str(root))
    for path in resolved:
        try:
            gin.parse_config_file(str(path))
        except Exception as e:  # gin raises several types; all mean "this file is wrong"
            raise LaunchError(f"gin file {path} failed to parse: {type(e).__name__}: {e}") from e
    for binding in bindings:
        try:
            gin.parse_config(binding)
        except Exception as e:
            raise LaunchError(f"bad gin binding {binding!r}: {type(e).__name__}: {e}") from e
    return resolved


@dataclasses.dataclass(frozen=True)
class Launched:
    run_dir: pathlib.Path
    result: object


def run(job: Callable[..., object] = gin.REQUIRED, run_name: str = gin.REQUIRED, run_dir: str | None = None,
        runs_root: str = "runs", xla_memory_fraction: float | None = None) -> Launched:
    """Runs the configured job in its run directory (gin-bound by every top-level gin file).

    Args:
      job: callable invoked as `job(run_dir=pathlib.Path)`.
      run_name: default run-directory name under `runs_root`.
      run_dir: explicit run directory (overrides runs_root/run_name).
      runs_root: parent of run directories.
      xla_memory_fraction: share (0–1) of each accelerator's memory JAX may preallocate
        (`XLA_PYTHON_CLIENT_MEM_FRACTION`), set before JAX touches a device; None leaves JAX's default. A run with
        vLLM beside the learner binds it so both fit (`bicurl_paper_base.gin`); an explicit environment variable
        wins.

    Raises:
      LaunchError: `xla_memory_fraction` outside (0, 1]; a run directory whose filesystem refuses to rename a
        directory (`check_renames`).
    """
    if xla_memory_fraction is not None:
        if not 0.0 < xla_memory_fraction <= 1.0:
            raise LaunchError(f"launch.run.xla_memory_fraction must be in (0, 1], got {xla_memory_fraction}")
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{xla_memory_fraction:.2f}")
    directory = pathlib.Path(run_dir) if run_dir else pathlib.Path(runs_root) / run_name
    directory.mkdir(parents=True, exist_ok=True)
    check_renames(directory)
    atomic_write(directory / "config.gin", gin.config_str().encode())
    logging.info("run directory: %s", directory.resolve())
    print(f"[bat_jax] run directory: {directory.resolve()}", flush=True)
    result = job(run_dir=directory)
    atomic_write(directory / "operative_config.gin", gin.operative_config_str().encode())
    return Launched(run_dir=directory, result=result)


def check_renames(directory: pathlib.Path) -> None:
    """Refuses a run directory whose filesystem cannot rename a directory (probe: a fresh one, renamed, removed).

    The Stage Bank and Orbax commit by renaming directories, which some filesystems refuse (a gcsfuse mount of a flat
    bucket without ``--rename-dir-limit``).

    Raises:
      LaunchError: the rename failed; the message names the run directory and the storage to use instead.
    """
    probe = pathlib.Path(tempfile.mkdtemp(prefix=".rename-probe-", dir=directory))
    renamed = probe.with_name(probe.name + "-renamed")
    try:
        os.rename(probe, renamed)
    except OSError as e:
        raise LaunchError(
            f"run directory {directory.resolve()}: its filesystem refuses to rename a directory ({e}), and the Stage "
            "Bank and Orbax checkpoints commit by renaming directories; use storage that renames directories (a local "
            "or NFS disk, or gcsfuse with --rename-dir-limit; docs/scaling.md)") from e
    finally:
        for path in (probe, renamed):
            shutil.rmtree(path, ignore_errors=True)


def show_config(run_dir: pathlib.Path) -> str:
    """A job that only prints the resolved configuration (a dry run of any run file).

    Select it with `--gin_bindings="launch.run.job = @launch.show_config"`."""
    text = gin.config_str()
    print(text, flush=True)
    return text


# Referenced as `@launch.show_config` from bindings; registered here because a binding string cannot import.
gin.external_configurable(show_config, name="show_config", module="launch")


def launch(files: Sequence[str], bindings: Sequence[str] = (), extra_paths: Sequence[str] = (),
           run_dir: str | None = None, runs_root: str = "runs") -> Launched:
    """Programmatic entry point (what `main` calls): parse gin, then `run` with the directory overrides.

    Raises:
      LaunchError: besides `parse_gin`'s, files that bind no job or run name (a base file given alone: the message
        names the run files that include it).
    """
    parse_gin(files, bindings, extra_paths)
    try:
        configured_run = gin.get_configurable(run)
    except ValueError:
        missing = ["job", "run_name"]  # not even imported: bat_jax.launch.run is unknown to gin
    else:
        missing = [name for name in ("job", "run_name") if not _bound(f"launch.run.{name}")]
    if missing:
        raise LaunchError(f"the gin files {list(files)} bind no {' / '.join('launch.run.' + m for m in missing)}: "
                          + _base_file_hint(files[-1], search_paths(extra_paths)))
    overrides = {"runs_root": runs_root}
    if run_dir:
        overrides["run_dir"] = run_dir
    return configured_run(**overrides)


def _bound(binding: str) -> bool:
    """Whether the parsed gin configuration binds `binding` (e.g. 'launch.run.job')."""
    try:
        gin.query_parameter(binding)
    except ValueError:
        return False
    return True


def _base_file_hint(name: str, paths: Sequence[pathlib.Path]) -> str:
    """What to run instead of `name` when it names no job: the run files that include it, if any."""
    base = pathlib.PurePath(name).name
    including = [other for other in available_gin_files(paths)
                 if any(f"include '{base}'" in (root / other).read_text(errors="replace")
                        for root in paths if (root / other).is_file())]
    if including:
        return (f"{base} is a base file that run files include; run one of them ({', '.join(including)}) or bind "
                f"both in --gin_bindings")
    return ("a top-level gin file imports bat_jax.launch as launch and binds launch.run.job and launch.run.run_name "
            "(or add them with --gin_bindings)")


def main(argv: Sequence[str]) -> None:
    if len(argv) > 1:
        raise SystemExit(f"unexpected positional arguments: {list(argv[1:])}")
    # multi-host: jax.distributed starts from the environment (variables named in learn/distributed.py) before
    # anything else touches JAX; a single process does nothing here
    several = distributed.initialize(distributed.DistributedConfig.from_env())
    guarded(lambda: launch(FLAGS.gin_file, FLAGS.gin_bindings, FLAGS.gin_search_paths, FLAGS.run_dir,
                           FLAGS.runs_root), several=several)


def guarded(job: Callable[[], Any], *, several: bool) -> None:
    """Runs `job`; a configuration error is one line, and with several processes any error ends the process.

    With several processes a failing process must stop at once: a normal interpreter exit waits in
    ``jax.distributed``'s shutdown for peers still inside a collective, keeps sending heartbeats and hangs them
    all. So it prints the error (one line, or the traceback) and leaves with ``os._exit``; its peers then stop
    within the heartbeat timeout, naming it. `BAT_JAX_DEBUG=1` / `--debug` re-raises configuration errors.

    Raises:
      SystemExit: status 2 after a configuration error (one process).
      BaseException: any other error of `job`, unchanged (one process).
    """
    try:
        job()
    except ConfigError as e:
        if FLAGS.debug or os.environ.get("BAT_JAX_DEBUG", "") not in ("", "0"):
            raise
        print(f"[bat_jax] error: {one_line(e)}", file=sys.stderr)
        _leave(2, several)
    except BaseException:
        if not several:
            raise
        traceback.print_exc()
        _leave(1, several)


def _leave(status: int, several: bool) -> None:
    """Exits with `status`: at once (no shutdown handshake) with several processes, else by SystemExit."""
    if several:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    raise SystemExit(status) from None


def one_line(error: BaseException) -> str:
    """A configuration error's message without what gin appends ('In call to configurable ...'), on one line."""
    text = str(error).split("\n  In call to configurable")[0]
    return " ".join(text.split())

