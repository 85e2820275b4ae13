"""Per stage, the NLL of the Stage Bank's SFT targets at every checkpoint of a run: what each round did to them.

    python -m launch.teacher_nll --run_dir=runs/tabular_dev/lr1e4_r3s3_c4_t0_bn_s1 [--rows_per_stage=16]
writes ``teacher_nll.json`` / ``.md`` into the run directory (read in docs/measurements.md).
"""

from __future__ import annotations

import argparse
import json
import pathlib

import gin
import numpy as np

from bat_jax.atomic_io import atomic_write


def measure(run_dir: pathlib.Path, components=None, rows_per_stage: int = 16) -> dict:
    """{'stages', 'rows', 'steps': {step: {stage: NLL}}, 'targets': {step: routed stage}} for `run_dir`.

    `components`: the run's `experiment.Components` (`run_components`).
    Raises FileNotFoundError when the run kept no checkpoint or its bank has no SFT row of a stage."""

    from bat_jax.bicurl.sft_data import render_sft_row
    from bat_jax.checkpoint import CheckpointConfig, Checkpointer
    from bat_jax.learn import grpo
    from bat_jax.learn.learner import Learner
    from bat_jax.policy import build_policy
    from bat_jax.prompts import PromptFormat
    from bat_jax.rollout.sampling import SamplingConfig
    from bat_jax.stage_bank.bank import StageBank

    benchmark, policy = components.benchmark, build_policy(components.policy)
    prompt = PromptFormat.of(benchmark, policy.prompt_style)
    versions = json.loads((run_dir / "bank_versions.json").read_text())
    view = StageBank(components.bank.bank_dir).read(int(versions["0"]))
    max_len = components.sft.max_seq_len
    examples, rows = {}, {}
    for stage in benchmark.stages.ids:
        picked = sorted((r for r in view.sft_rows if r.focus == stage), key=lambda r: r.row_id)
        rendered = [e for e in (render_sft_row(r, policy, prompt, max_len, components.agent.max_observation_chars)
                                for r in picked) if e is not None][:rows_per_stage]
        if not rendered:
            raise FileNotFoundError(f"{run_dir}: the bank has no SFT row focused on stage {stage!r} that fits "
                                    f"{max_len} tokens")
        examples[stage], rows[stage] = rendered, len(rendered)
    learner = Learner(policy.model, components.mesh, components.memory)
    checkpoints = Checkpointer(CheckpointConfig(directory=str((run_dir / "checkpoints").resolve())))
    steps = checkpoints.all_steps()
    if not steps:
        raise FileNotFoundError(f"{run_dir}: no checkpoint under checkpoints/")
    scoring = grpo.GRPOConfig(kl_coef=0.0, sampling=SamplingConfig(temperature=1.0))  # the model's own logprobs
    out = {"stages": list(benchmark.stages.ids), "rows": rows, "steps": {}, "targets": round_targets(run_dir)}
    for step in steps:
        params = checkpoints.restore_params(learner.params, step)
        out["steps"][step] = {stage: _nll(learner, params, examples[stage], scoring) for stage in examples}
        print(f"[teacher_nll] step {step}: " + ", ".join(f"{s} {v:.4f}" for s, v in out["steps"][step].items()),
              flush=True)
    return out


def _nll(learner, params, examples, scoring) -> float:
    """Token-mean NLL of the target tokens over `examples` (padding cut to the longest row)."""
    length = max(int(e["attention_mask"].sum()) for e in examples)
    batch = {k: np.stack([e[k][:length] for e in examples]) for k in ("input_ids", "attention_mask", "loss_mask")}
    logprobs = np.asarray(learner.logprobs(params, batch, scoring))
    mask = batch["loss_mask"].astype(np.float64)
    return float(-(logprobs * mask).sum() / mask.sum())


def run_components(run_dir: pathlib.Path, tool: str):
    """The `experiment.Components` of the run in `run_dir`, bound from its ``config.gin``.

    Raises SystemExit (one `[tool] error:` line) when `run_dir` has no ``config.gin``."""
    if not (run_dir / "config.gin").exists():
        raise SystemExit(f"[{tool}] error: {run_dir / 'config.gin'} not found: not a run directory")
    from bat_jax.bicurl import experiment

    gin.parse_config_file(str(run_dir / "config.gin"))
    return gin.get_configurable(experiment.Components)()


def round_targets(run_dir: pathlib.Path) -> dict[int, str]:
    """Each round's routed stage, from the run's ledger."""
    ledger = run_dir / "ledger.jsonl"
    if not ledger.exists():
        return {}
    records = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
    return {int(r["round"]): str(r.get("selected_stage") or "") for r in records}


def table(result: dict) -> str:
    """Markdown: one row per kept checkpoint, one column per stage (NLL and its change from step 0)."""
    stages = result["stages"]
    steps = sorted(result["steps"])
    head = "| step (routed stage) | " + " | ".join(f"{s} ({result['rows'][s]} rows)" for s in stages) + " |"
    lines = [head, "|" + " --- |" * (len(stages) + 1)]
    base = result["steps"].get(0)
    for step in steps:
        cells = []
        for s in stages:
            v = result["steps"][step][s]
            cells.append(f"{v:.4f}" if base is None or step == 0 else f"{v:.4f} ({v - base[s]:+.4f})")
        label = "0 (SFT)" if step == 0 else f"{step} ({result['targets'].get(step, '?')})"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run_dir", required=True, help="a BiCuRL run directory (its config.gin, checkpoints/)")
    parser.add_argument("--rows_per_stage", type=int, default=16, help="SFT rows scored per stage")
    args = parser.parse_args(argv)
    run_dir = pathlib.Path(args.run_dir)
    result = measure(run_dir, run_components(run_dir, "teacher_nll"), rows_per_stage=args.rows_per_stage)
    atomic_write(run_dir / "teacher_nll.json", json.dumps(result, indent=2).encode())
    text = table(result)
    atomic_write(run_dir / "teacher_nll.md", (text + "\n").encode())
    print(text)


if __name__ == "__main__":
    main()
