"""Evaluate-only launch job: the held-out suite on a policy as it is, with no Stage Bank and no training.

Details: docs/design.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import time

from bat_jax import report
from bat_jax.atomic_io import atomic_write
from bat_jax.benchmark.scoring import display
from bat_jax.bicurl.engines import build_engine
from bat_jax.bicurl.experiment import Components
from bat_jax.bicurl.evaluation import EvalConfig
from bat_jax.bicurl.run_loops import RunLoops, open_run_loops
from bat_jax.errors import ConfigValueError
from bat_jax.policy import Policy, build_policy
from bat_jax.prompts import PromptFormat
from bat_jax.rollout.engine import RolloutEngine
from bat_jax.staged_benchmark.contract import StagedBenchmark
from bat_jax.verify.judge import RubricJudge


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """An open held-out evaluation of one policy: its engine, the run loops' sandboxes, the judge and prompts."""

    policy: Policy
    engine: RolloutEngine
    loops: RunLoops
    evaluation: EvalConfig
    benchmark: StagedBenchmark
    judge: RubricJudge | None
    prompt: PromptFormat

    def evaluate(self):
        """(`Summary`, agent_failed) of the held-out suite played on the engine's current weights."""
        return self.loops.evaluate(self.evaluation, self.benchmark, self.judge, self.prompt)


@contextlib.contextmanager
def open_held_out(components: Components, run_dir: pathlib.Path, purpose: str = "final", backend: str = "docker",
                  sandbox_pool: bool = True):
    """Opens `components.policy`'s engine and run loops for the held-out suite (`run`'s arguments); closes both.

    Raises ConfigValueError without a benchmark, and what `run` names."""
    benchmark = components.benchmark
    if benchmark is None:
        raise ConfigValueError("experiment.Components.benchmark (the staged benchmark to evaluate on) is required")
    benchmark.validate()
    if components.judge is not None:
        benchmark.check_judged_items(components.judge.items)  # against this benchmark's rubric items
    evaluation = dataclasses.replace(components.evaluation, purpose=purpose)  # validates purpose
    policy = build_policy(components.policy)
    engine = build_engine(policy, components.engine, components.agent.max_context_tokens, run_dir)
    try:
        loops = open_run_loops(policy, engine, components.agent, evaluation, benchmark, batch_rows=0,
                               backend=backend, warm_pool=sandbox_pool)
        try:
            judge = RubricJudge(components.judge) if components.judge is not None else None
            yield HeldOut(policy, engine, loops, evaluation, benchmark, judge,
                          PromptFormat.of(benchmark, policy.prompt_style))
        finally:
            loops.close()
    finally:
        if hasattr(engine, "close"):
            engine.close()


def run(run_dir: pathlib.Path, components: Components = Components(), backend: str = "docker",
        purpose: str = "final", system: str = "untrained", sandbox_pool: bool = True) -> dict:
    """Evaluates `components.policy` on the held-out suite and writes ``evaluation.json`` / ``evaluation.md``.

    Args:
      run_dir: the run directory (`bat_jax.launch.run`).
      components: the run's components; read: `benchmark`, `policy`, `agent` (limits, sampling, workers),
        `evaluation` (repeats, tracks, max_turns, seed), `engine`, `judge`. `bank` and the training settings are
        ignored.
      backend: sandbox backend, 'docker' (isolated) or 'local' (non-isolated subprocesses).
      purpose: 'final' (the held-out slice of a run's reported rows, e.g. its "untrained" row) or
        'controller'.
      system: the row name in the table.
      sandbox_pool: Docker only: the cells' sandboxes come from a warm pool of one container per cell, each reset
        to a fresh state between episodes (removed at the end, also on errors); False = a new container per cell.
    Returns: the written ``evaluation.json`` content.
    Raises: FileNotFoundError for a missing checkpoint directory; `sandbox.backends.BackendUnavailable` when the
      Docker backend is asked for and not usable; ValueError for an unknown backend or purpose, or no benchmark.
    """
    run_dir = pathlib.Path(run_dir)
    t0 = time.perf_counter()
    with open_held_out(components, run_dir, purpose, backend, sandbox_pool) as held_out:
        t1 = time.perf_counter()
        summary, agent_failed = held_out.evaluate()
        t2 = time.perf_counter()
    out = {"system": system, "purpose": purpose, "backend": backend, "policy": dataclasses.asdict(components.policy),
           "engine": components.engine.kind, "setup_s": round(t1 - t0, 1), "eval_s": round(t2 - t1, 1),
           "summary": report.summary_dict(summary), "agent_failed": agent_failed}
    table = report.results_table([(system, summary)])
    atomic_write(run_dir / "evaluation.json", json.dumps(out, indent=2, default=str).encode())
    atomic_write(run_dir / "evaluation.md", (table + "\n").encode())
    print(table)
    print(f"[bat_jax] held-out ({purpose}) evaluation of {system}: Overall {display(summary.overall)}, Agentic "
          f"{display(summary.agentic)}, Task {display(summary.task)} over {summary.n_cells} cells "
          f"({summary.n_unscored} unscored); set-up {t1 - t0:.0f} s, evaluation {t2 - t1:.0f} s", flush=True)
    return out
