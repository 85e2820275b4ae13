"""Leakage preflight throughput on a synthetic bank (goal: 10,000 rows in under 10 s on the CPU box).

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path

import numpy as np

from bat_jax.sandbox.tools import STOP, Action
from bat_jax.stage_bank.leakage import HeldOutManifest, LeakageConfig, preflight
from bat_jax.stage_bank.row import (EvidenceSpec, Message, Provenance, RLRow, RubricSpec, SFTRow,
                                    StateRef)

H = "ab" * 32


def words(rng: np.random.Generator, vocab: np.ndarray, n: int) -> str:
    return " ".join(rng.choice(vocab, size=n))


def build(n_rows: int, seed: int) -> tuple[list, HeldOutManifest]:
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(5000)] + "the a lung liver mask dice model run file".split())
    manifest = HeldOutManifest(
        case_ids=tuple(f"case-{i:05d}" for i in range(2385)),
        task_ids=tuple(f"amb-track-{i}" for i in range(7)),
        paths=tuple(f"/benchmarks/heldout/t{i % 7}/img_{i:05d}.nii.gz" for i in range(500)),
        questions=tuple(words(rng, vocab, 12) for _ in range(2005)),
        answers=tuple(words(rng, vocab, 15) for _ in range(2005)),
        reports=tuple(words(rng, vocab, 60) for _ in range(100)),
    )
    rows = []
    for i in range(n_rows):
        prov = Provenance(f"fict-{i}", H, "vqa", "success")
        if i % 2 == 0:
            rows.append(RLRow(StateRef(H, f"states/{i}.tar"), "S3", words(rng, vocab, 250),
                              tuple(RubricSpec(f"r{k}", words(rng, vocab, 15)) for k in range(6)),
                              (EvidenceSpec("e", "artifact", {"path": f"out/fict_{i}/mask.nii.gz"}),),
                              words(rng, vocab, 250), prov))
        else:
            ctx = [Message("system", words(rng, vocab, 100)), Message("user", words(rng, vocab, 150))]
            for _ in range(3):
                ctx.append(Message("assistant", action=Action(words(rng, vocab, 30), "execute_code",
                                                              {"language": "python", "code": words(rng, vocab, 30)})))
                ctx.append(Message("tool", words(rng, vocab, 40)))
            rows.append(SFTRow(tuple(ctx), Action(words(rng, vocab, 60), STOP), "S4", prov))
    return rows, manifest


def naive_scan(lines: list[str], manifest: HeldOutManifest, n: int = 8) -> int:
    """Baseline: substring search of every marker and held-out n-word span in each row's text."""
    markers = [m.lower() for m in manifest.case_ids + manifest.task_ids + manifest.paths]
    for text in manifest.questions + manifest.answers + manifest.reports:
        ws = re.findall(r"[a-z0-9]+", text.lower())
        markers += [" ".join(ws[i:i + n]) for i in range(len(ws) - n + 1)]
    hits = 0
    for line in lines:
        text = " ".join(re.findall(r"[a-z0-9_./\-]+", line.lower()))
        hits += sum(1 for m in markers if m in text)
    return hits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--baseline-rows", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    t0 = time.perf_counter()
    rows, manifest = build(args.rows, args.seed)
    lines = [json.dumps(r.to_record()) for r in rows]
    print(f"built {len(rows)} rows ({sum(map(len, lines)) / 1e6:.1f} MB JSON) in {time.perf_counter() - t0:.1f} s")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.jsonl"
        path.write_text("\n".join(lines) + "\n")
        t0, c0 = time.perf_counter(), time.process_time()
        report = preflight(manifest, files=[path], config=LeakageConfig())
        t_file, c_file = time.perf_counter() - t0, time.process_time() - c0
    t0 = time.perf_counter()
    mem = preflight(manifest, rows=rows)
    t_mem = time.perf_counter() - t0

    c0 = time.process_time()
    naive_scan(lines[: args.baseline_rows], manifest)
    c_naive_per_row = (time.process_time() - c0) / args.baseline_rows

    print(f"preflight (JSONL file): {len(rows)} rows in {t_file:.2f} s wall, {c_file:.2f} s CPU "
          f"= {len(rows) / c_file:,.0f} rows per CPU-second, {report.strings_scanned:,} strings, "
          f"{len(report.hits)} hits")
    print(f"preflight (in-memory rows): {t_mem:.2f} s, {len(mem.hits)} hits")
    print(f"baseline naive substring scan: {c_naive_per_row * 1e3:.2f} CPU-ms/row on {args.baseline_rows} rows "
          f"-> {c_naive_per_row * len(rows):.0f} CPU-s projected for {len(rows)} rows")
    print(f"speed-up vs baseline (CPU time): {c_naive_per_row * len(rows) / c_file:.1f}x; "
          f"goal < 10 s: {'met' if c_file < 10 else 'MISSED'} on CPU time, "
          f"{'met' if t_file < 10 else 'MISSED'} on wall time (shared machine)")


if __name__ == "__main__":
    main()
