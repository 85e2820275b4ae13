"""Stage Bank Data Factory: build the tiny bank (126 sources) and check its targets.

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bat_jax.stage_bank.factory import FactoryConfig, build_bank, load_manifest, sources
from bat_jax.stage_bank.leakage import preflight
from bat_jax.rollout.play import play
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.heldout import training_task
from bat_jax.benchmarks.imaging.registry import TRACKS
from bat_jax.benchmarks.imaging.teacher import ScriptedExpert

#: The bundled imaging suite (fixed training layouts), the benchmark whose bank is built.
IMAGING = ImagingBenchmark()


def baseline_per_source(n: int = 3) -> float:
    """Seconds of one scripted-expert E2E episode (mean over `n` tasks)."""
    t0 = time.perf_counter()
    for i, name in enumerate(list(TRACKS)[:n]):
        play(IMAGING, training_task(TRACKS[name], 11 + i, "recovery"), ScriptedExpert())
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="local")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--twice", action="store_true", help="second fresh build to compare digests")
    ap.add_argument("--keep", default="", help="bank directory to keep (default: a temp dir, removed)")
    args = ap.parse_args()

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_factory_"))
    cfg = FactoryConfig(bank_dir=str(root / "bank"), seed=args.seed, backend=args.backend, workers=args.workers)
    n = len(sources(cfg, IMAGING))
    base = baseline_per_source() * n
    print(f"baseline: {n} scripted E2E episodes ≈ {base:.1f} s")

    t0 = time.perf_counter()
    report = build_bank(cfg, IMAGING, progress=True)
    build_s = time.perf_counter() - t0
    print(f"build: {build_s:.1f} s ({build_s / 60:.2f} min; target <= 15 min) ratio build/baseline = "
          f"{build_s / base:.2f}")
    print(f"sources accepted {report.sources_accepted}/{report.sources_total}, rejected {report.rejected}")
    print(f"RL rows {report.rl_rows} {report.rl_by_focus}")
    print(f"SFT rows {report.sft_rows} (target >= 2000) {report.sft_by_focus}")
    print(f"version {report.version} digest {report.digest}")

    t0 = time.perf_counter()
    bank = Path(cfg.bank_dir)
    leak = preflight(load_manifest(cfg, IMAGING), files=[bank / "versions", bank / "states"])
    print(f"preflight over the bank files: {len(leak.hits)} hits, {leak.files_scanned} files, "
          f"{leak.rows_scanned} rows, {time.perf_counter() - t0:.1f} s")

    t0 = time.perf_counter()
    again = build_bank(cfg, IMAGING, progress=False)
    print(f"resume rebuild: {time.perf_counter() - t0:.1f} s, cached {again.cached_sources}/{n}, "
          f"new version {again.version}, same digest {again.digest == report.digest}")

    if args.twice:
        cfg2 = FactoryConfig(bank_dir=str(root / "bank2"), seed=args.seed, backend=args.backend,
                             workers=args.workers)
        t0 = time.perf_counter()
        second = build_bank(cfg2, IMAGING, progress=True)
        print(f"second fresh build: {time.perf_counter() - t0:.1f} s, same digest {second.digest == report.digest}")

    ok = (build_s <= 900 and report.sft_rows >= 2000 and not leak.hits and again.digest == report.digest)
    print("RESULT", "PASS" if ok else "FAIL")
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
