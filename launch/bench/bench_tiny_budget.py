"""What the tiny default's 2-core budget buys: prompt tokens, SFT rows that fit, SFT tokens/s, full vs compact prompts.

Details: docs/design.md.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np



def imaging(layouts: str = "fixed"):
    """The bundled imaging suite with training layouts `layouts`."""
    from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark

    return ImagingBenchmark(layouts=layouts)


def sample_rows(args) -> list:
    """SFT rows of `--bank`, or of a sample bank built with the local backend."""
    from bat_jax.stage_bank.bank import StageBank
    from bat_jax.stage_bank.factory import FactoryConfig, build_bank

    if args.bank:
        return list(StageBank(args.bank).read().sft_rows)
    root = Path(tempfile.mkdtemp(prefix="bench_tiny_budget_"))
    cfg = FactoryConfig(bank_dir=str(root / "bank"), backend="local", outcomes=tuple(args.outcomes.split(",")),
                        workers=2)
    t0 = time.perf_counter()
    report = build_bank(cfg, imaging(args.layouts), progress=False)
    print(f"sample bank: {report.sources_accepted}/{report.sources_total} sources, {report.sft_rows} SFT rows, "
          f"{time.perf_counter() - t0:.0f} s (local backend), rejected {report.rejected}")
    rows = list(StageBank(cfg.bank_dir).read().sft_rows)
    shutil.rmtree(root, ignore_errors=True)
    return rows


def prompt_tokens(policy, style: str) -> dict[str, float]:
    """Tokens of the held-out E2E prompt (mean over the 7 tracks) and of its parts in `style`."""
    from bat_jax.models.episode import EpisodeBuilder
    from bat_jax.prompts import PromptFormat
    from bat_jax.benchmarks.imaging.heldout import heldout_suite

    def n(messages, tools):
        return len(EpisodeBuilder(policy.tokenizer, policy.chat_family).start(messages, tools))

    benchmark = imaging()
    prompt = PromptFormat.of(benchmark, style)
    system, tools = prompt.head()
    empty = n([{"role": "user", "content": "x"}], None)
    head = n([{"role": "system", "content": system}, {"role": "user", "content": "x"}], [dict(t) for t in tools])
    totals = [n(*prompt.first_messages(task.brief, benchmark.row_skill("E2E")))
              for task in heldout_suite(1, ("recovery",))]
    return {"system+tools": head - empty, "brief+skills": float(np.mean(totals)) - head + empty,
            "total": float(np.mean(totals))}


def rendered(policy, rows, max_seq_len: int, obs_chars: int) -> list:
    from bat_jax.bicurl.sft_data import render_sft_row
    from bat_jax.prompts import PromptFormat

    prompt = PromptFormat.of(imaging(), policy.prompt_style)
    return [e for e in (render_sft_row(r, policy, prompt, max_seq_len, obs_chars) for r in rows) if e is not None]


def sft_speed(tiny: dict, batches: list[dict], steps: int) -> tuple[float, float, float]:
    """(real tokens/s by wall time, by process CPU time, seconds per step) of `steps` SFT steps on `batches`
    after one warm-up step per distinct batch shape."""
    import jax

    from bat_jax.learn.learner import Learner
    from bat_jax.models.mesh import MeshConfig
    from bat_jax.learn.optim import OptimizerConfig
    from bat_jax.learn.sft import SFTConfig
    from bat_jax.policy import PolicyConfig, build_policy

    policy = build_policy(PolicyConfig(tiny=tiny))
    learner = Learner(policy.model, MeshConfig(data=1, fsdp=1, tensor=1))
    cfg = SFTConfig(optimizer=OptimizerConfig(learning_rate=1e-3), global_batch_size=len(batches[0]["input_ids"]),
                    total_steps=steps + 8, max_seq_len=max(b["input_ids"].shape[1] for b in batches))
    step, state = learner.sft_block(cfg, cfg.total_steps)
    for shape in {b["input_ids"].shape: b for b in batches}.values():  # compile every shape first
        state, _ = step(state, shape)
    jax.block_until_ready(state.params)
    real, wall, cpu = 0, time.perf_counter(), time.process_time()
    for b in batches[:steps]:
        state, _ = step(state, b)
        real += int(b["attention_mask"].sum())
    jax.block_until_ready(state.params)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return real / wall, real / cpu, wall / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bank", default="")
    ap.add_argument("--outcomes", default="recovery")
    ap.add_argument("--layouts", default="varied")
    ap.add_argument("--before_seq", type=int, default=2048)
    ap.add_argument("--after_seq", type=int, default=2048)
    ap.add_argument("--obs_chars", type=int, default=512)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--models", default="", help="extra tiny sizes HIDDENxLAYERS, comma-separated")
    ap.add_argument("--no_speed", action="store_true", help="prompt tokens and row fit only (no SFT timing)")
    args = ap.parse_args()

    from bat_jax.learn.batching import pad_batch
    from bat_jax.policy import PolicyConfig, build_policy
    from bat_jax.bicurl.sft_data import sft_batch

    rows = sample_rows(args)
    micro = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    full, compact = (build_policy(PolicyConfig(tiny=micro, prompt_style=s)) for s in ("full", "compact"))

    before_p, after_p = prompt_tokens(full, "full"), prompt_tokens(compact, "compact")
    print("\nprompt tokens of the held-out E2E prompt (mean over 7 tracks; system + tools block, brief + skills):")
    for key in before_p:
        print(f"  {key:13s} before {before_p[key]:7.0f}   after {after_p[key]:7.0f}   ratio before/after "
              f"{before_p[key] / max(after_p[key], 1):5.2f}x")

    before_rows = rendered(full, rows, args.before_seq, args.obs_chars)
    after_rows = rendered(compact, rows, args.after_seq, args.obs_chars)
    lengths = [int(e["attention_mask"].sum()) for e in rendered(compact, rows, 1 << 20, args.obs_chars)]
    print(f"\nSFT rows that fit: before {len(before_rows)}/{len(rows)} at {args.before_seq} tokens (full prompts), "
          f"after {len(after_rows)}/{len(rows)} at {args.after_seq} (compact); ratio "
          f"{len(after_rows) / max(len(before_rows), 1):.2f}x. Compact rows at 2,048: "
          f"{sum(n <= 2048 for n in lengths)}; compact row tokens p50 {np.percentile(lengths, 50):.0f}, "
          f"p90 {np.percentile(lengths, 90):.0f}, max {max(lengths)}")

    if args.no_speed:
        return
    rng = np.random.default_rng(0)
    n = args.steps
    before_b = [pad_batch([before_rows[i] for i in rng.choice(len(before_rows), args.batch)], 1, args.before_seq)
                for _ in range(n)]
    after_b = [sft_batch(after_rows, args.batch, rng, args.after_seq) for _ in range(n)]
    from launch.bench.workloads import tiny_default

    shape = dict(tiny_default().policy.tiny)
    b_wall, b_cpu, b_step = sft_speed(shape, before_b, n)
    a_wall, a_cpu, a_step = sft_speed(shape, after_b, n)
    pad_b = np.mean([b["attention_mask"].mean() for b in before_b])
    pad_a = np.mean([b["attention_mask"].mean() for b in after_b])
    print(f"\nSFT step, tiny {shape['hidden_size']}x{shape['num_hidden_layers']}, batch {args.batch}, {n} timed steps:")
    print(f"  before: {b_wall:7.0f} real tok/s (cpu {b_cpu:6.0f}), {b_step:5.2f} s/step, {100 * pad_b:4.1f}% real tokens")
    print(f"  after:  {a_wall:7.0f} real tok/s (cpu {a_cpu:6.0f}), {a_step:5.2f} s/step, {100 * pad_a:4.1f}% real tokens")
    print(f"  ratio after/before: {a_wall / b_wall:.2f}x real tok/s (cpu {a_cpu / b_cpu:.2f}x); rows per second "
          f"{b_step / a_step:.2f}x")
    for spec in [m for m in args.models.split(",") if m]:
        hidden, layers = (int(x) for x in spec.split("x"))
        tiny = {**shape, "hidden_size": hidden, "intermediate_size": 3 * hidden, "num_hidden_layers": layers}
        wall, cpu, step = sft_speed(tiny, after_b, n)
        print(f"  model {spec}: {wall:7.0f} real tok/s (cpu {cpu:6.0f}), {step:5.2f} s/step on the after batches")


if __name__ == "__main__":
    main()
