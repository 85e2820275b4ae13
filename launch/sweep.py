"""Run a sweep of gin-binding sets, one after another, each into its own run directory.

    python launch/sweep.py --gin_file=bicurl_tiny.gin --sweep=launch/sweeps/pool_ablations.json \
        --runs_root=runs/sweeps [--dry_run]

A sweep file is JSON: a list of {"name": str, "bindings": [str, ...], "gin_files": [str, ...] (optional,
added after the --gin_file ones)}. Each entry runs as
`python -m bat_jax.launch --gin_file=... --gin_bindings=... --run_dir=<runs_root>/<name>`; a failed entry is
reported and the sweep goes on; the exit status is 1 when any entry failed.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import shlex
import subprocess
import sys

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def load_sweep(path: pathlib.Path) -> list[dict]:
    """Reads and validates a sweep file. Raises ValueError naming the file, entry index and field."""
    try:
        entries = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from e
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: expected a non-empty JSON list of entries")
    seen = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: entry {i} must be an object")
        name = entry.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"{path}: entry {i} field 'name' must match {_NAME.pattern}, got {name!r}")
        if name in seen:
            raise ValueError(f"{path}: entry {i} repeats the name {name!r}")
        seen.add(name)
        for field in ("bindings", "gin_files"):
            value = entry.get(field, [])
            if not isinstance(value, list) or not all(isinstance(b, str) for b in value):
                raise ValueError(f"{path}: entry {i} ({name}) field {field!r} must be a list of strings")
    return entries


def commands(gin_files: list[str], entries: list[dict], runs_root: str, python: str = sys.executable) -> list[tuple[str, list[str]]]:
    """The launch command of every entry, as (name, argv)."""
    out = []
    for entry in entries:
        argv = [python, "-m", "bat_jax.launch"]
        argv += [f"--gin_file={f}" for f in gin_files + entry.get("gin_files", [])]
        argv += [f"--gin_bindings={b}" for b in entry.get("bindings", [])]
        argv.append(f"--run_dir={pathlib.Path(runs_root) / entry['name']}")
        out.append((entry["name"], argv))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gin_file", action="append", default=[], help="base gin file(s), repeatable")
    parser.add_argument("--sweep", required=True, type=pathlib.Path, help="JSON sweep file")
    parser.add_argument("--runs_root", default="runs/sweep", help="parent of the per-entry run directories")
    parser.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    try:
        entries = load_sweep(args.sweep)
    except (OSError, ValueError) as e:
        print(f"sweep: {e}", file=sys.stderr)
        return 2
    failed = []
    for name, cmd in commands(args.gin_file, entries, args.runs_root):
        print(f"[sweep] {name}: {shlex.join(cmd)}", flush=True)
        if args.dry_run:
            continue
        if subprocess.run(cmd).returncode != 0:
            failed.append(name)
            print(f"[sweep] {name} FAILED", flush=True)
    if failed:
        print(f"[sweep] failed entries: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
