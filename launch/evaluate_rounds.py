"""Every kept checkpoint of a run on its final held-out cells, each paired with step 0 (the SFT policy).

    python -m launch.evaluate_rounds --run_dir=runs/tabular_dev/lr1e4_r3s3_c4_t0_bn_s1 [--steps=0,3]
writes ``rounds_eval.json`` / ``.md`` into the run directory.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

from bat_jax import report
from bat_jax.atomic_io import atomic_write
from bat_jax.benchmark.scoring import display
from launch import teacher_nll


def measure(run_dir: pathlib.Path, components=None, steps: list[int] | None = None, backend: str = "docker") -> dict:
    """{step: `Summary`} of the final evaluation played on each checkpoint in `steps` (default: every kept one).

    `components`: the run's `experiment.Components` (`teacher_nll.run_components`).
    Raises FileNotFoundError for a step the run did not keep."""
    from bat_jax.bicurl.evaluate_only import open_held_out
    from bat_jax.checkpoint import CheckpointConfig, Checkpointer
    from bat_jax.learn.learner import Learner

    checkpoints = Checkpointer(CheckpointConfig(directory=str((run_dir / "checkpoints").resolve())))
    kept = checkpoints.all_steps()
    steps = kept if steps is None else steps
    if missing := sorted(set(steps) - set(kept)):
        raise FileNotFoundError(f"{run_dir}: no checkpoint of step(s) {missing} under checkpoints/ (kept: {kept})")
    out = {}
    with open_held_out(components, run_dir, "final", backend) as held_out:
        learner = Learner(held_out.policy.model, components.mesh, components.memory)
        for step in steps:
            t0 = time.perf_counter()
            held_out.engine.update_weights(learner.sync_model(checkpoints.restore_params(learner.params, step)))
            out[step], _ = held_out.evaluate()
            print(f"[evaluate_rounds] step {step}: Overall {display(out[step].overall)} over "
                  f"{out[step].n_cells} cells ({time.perf_counter() - t0:.0f} s)", flush=True)
    return out


def table(summaries: dict, targets: dict[int, str]) -> str:
    """The results table (one row per step) and each later step's paired difference with step 0."""
    name = {s: "step 0 (SFT)" if s == 0 else f"step {s} ({targets.get(s, '?')})" for s in summaries}
    lines = ["```", report.results_table([(name[s], summaries[s]) for s in sorted(summaries)]), "```"]
    if 0 in summaries:
        lines += [report.paired_line(name[s], summaries[s], name[0], summaries[0]) for s in sorted(summaries) if s]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run_dir", required=True, help="a BiCuRL run directory (its config.gin, checkpoints/)")
    parser.add_argument("--steps", default="", help="comma-separated checkpoint steps (default: every kept one)")
    parser.add_argument("--backend", default="docker", help="sandbox backend: 'docker' or 'local' (tests only)")
    args = parser.parse_args(argv)
    run_dir = pathlib.Path(args.run_dir)
    steps = [int(s) for s in args.steps.split(",") if s.strip()] or None
    summaries = measure(run_dir, teacher_nll.run_components(run_dir, "evaluate_rounds"), steps, args.backend)
    text = table(summaries, teacher_nll.round_targets(run_dir))
    atomic_write(run_dir / "rounds_eval.json",
                 json.dumps({s: report.summary_dict(v) for s, v in summaries.items()}, indent=2).encode())
    atomic_write(run_dir / "rounds_eval.md", (text + "\n").encode())
    print(text)


if __name__ == "__main__":
    main()
