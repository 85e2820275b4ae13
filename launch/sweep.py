"""Run a sweep of gin-binding sets, one after another, each into its own run directory.

    python -m launch.sweep --gin_file=bicurl_tiny.gin --sweep=launch/sweeps/pool_ablations.json \
        --runs_root=runs/sweeps [--only=no_s_mix,grpo_e2e_task_reward] [--init_from=runs/bicurl_tiny] [--dry_run]
        [--parallel=4]

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

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
        if "group" in entry and not (isinstance(entry["group"], str) and entry["group"].strip()):
            raise ValueError(f"{path}: entry {i} ({name}) field 'group' must be a non-empty string")
        if "seed" in entry and not (isinstance(entry["seed"], int) and not isinstance(entry["seed"], bool)):
            raise ValueError(f"{path}: entry {i} ({name}) field 'seed' must be an integer")
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


def seed_from_sft(source: pathlib.Path, run_dir: pathlib.Path) -> None:
    """Copies the SFT cold start of run `source` (checkpoints/0 and round0_eval.json) into `run_dir`, unless
    `run_dir` already has one (a resumed sweep).

    Raises:
      FileNotFoundError: `source` has no finished SFT cold start (names the missing path).
    """
    step0, round0 = source / "checkpoints" / "0", source / "round0_eval.json"
    for path in (step0, round0):
        if not path.exists():
            raise FileNotFoundError(f"--init_from: {path} does not exist (run the SFT cold start there first)")
    if (run_dir / "round0_eval.json").exists():
        return
    tmp = run_dir / ".init_from.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(step0, tmp / "0")
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    (tmp / "0").rename(run_dir / "checkpoints" / "0")
    shutil.rmtree(tmp)
    shutil.copyfile(round0, run_dir / ".round0_eval.json.tmp")
    (run_dir / ".round0_eval.json.tmp").rename(run_dir / "round0_eval.json")


def write_report(runs_root: pathlib.Path, names: list[str], groups: dict[str, str] | None = None,
                 seeds: dict[str, int] | None = None) -> pathlib.Path | None:
    """Writes `<runs_root>/sweep_report.md` over the entries of `names` that have a summary.json (in order;
    `groups`: entry name -> group, `seeds`: entry name -> seed); returns its path, or None when none has finished."""
    from bat_jax.sweep_report import sweep_report

    runs = [(name, json.loads((runs_root / name / "summary.json").read_text())) for name in names
            if (runs_root / name / "summary.json").is_file()]
    if not runs:
        return None
    path = runs_root / "sweep_report.md"
    text = "# Sweep report\n\n" + sweep_report(runs, groups=groups, seeds=seeds)
    tmp = path.with_name(".sweep_report.md.tmp")
    tmp.write_text(text)
    tmp.replace(path)
    print(text, flush=True)
    return path


def run_entry(name: str, cmd: list[str], log: pathlib.Path | None) -> bool:
    """Runs one entry's launch command, its output to the console or to `log`; True when it exited 0."""
    t0 = time.perf_counter()
    if log is None:
        ok = subprocess.run(cmd).returncode == 0
    else:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            ok = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode == 0
    print(f"[sweep] {name} {'done' if ok else 'FAILED'} in {time.perf_counter() - t0:.0f} s"
          + (f" (log: {log})" if log is not None else ""), flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gin_file", action="append", default=[], help="base gin file(s), repeatable")
    parser.add_argument("--sweep", required=True, type=pathlib.Path, help="JSON sweep file")
    parser.add_argument("--runs_root", default="runs/sweep", help="parent of the per-entry run directories")
    parser.add_argument("--only", default="", help="comma-separated entry names to run (default: all)")
    parser.add_argument("--init_from", type=pathlib.Path, default=None,
                        help="run directory whose SFT cold start every entry starts from")
    parser.add_argument("--parallel", type=int, default=1, help="entries run at once (each logs to <name>.log)")
    parser.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--report_only", action="store_true", help="write sweep_report.md, run nothing")
    args = parser.parse_args(argv)
    try:
        entries = load_sweep(args.sweep)
        wanted = [n for n in args.only.split(",") if n]
        unknown = sorted(set(wanted) - {e["name"] for e in entries})
        if unknown:
            raise ValueError(f"{args.sweep}: --only names unknown entries {unknown}")
        entries = [e for e in entries if not wanted or e["name"] in wanted]
    except (OSError, ValueError) as e:
        print(f"sweep: {e}", file=sys.stderr)
        return 2
    groups = {e["name"]: e["group"] for e in entries if "group" in e}
    seeds = {e["name"]: e["seed"] for e in entries if "seed" in e}
    if args.report_only:
        return 0 if write_report(pathlib.Path(args.runs_root), [e["name"] for e in entries], groups, seeds) else 1
    if args.parallel < 1:
        print(f"sweep: --parallel must be >= 1, got {args.parallel}", file=sys.stderr)
        return 2
    runs_root, todo = pathlib.Path(args.runs_root), []
    for name, cmd in commands(args.gin_file, entries, args.runs_root):
        print(f"[sweep] {name}: {shlex.join(cmd)}", flush=True)
        if args.dry_run:
            continue
        if args.init_from is not None:
            try:
                seed_from_sft(args.init_from, runs_root / name)
            except OSError as e:
                print(f"sweep: {e}", file=sys.stderr)
                return 2
        todo.append((name, cmd, runs_root / f"{name}.log" if args.parallel > 1 else None))
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        outcomes = list(pool.map(lambda job: run_entry(*job), todo))
    failed = [name for (name, _, _), ok in zip(todo, outcomes) if not ok]
    if not args.dry_run:
        write_report(pathlib.Path(args.runs_root), [e["name"] for e in entries], groups, seeds)
    if failed:
        print(f"[sweep] failed entries: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
