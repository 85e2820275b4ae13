"""Reports of a run: the Table-2-style results table, per-round stage scores, the best-so-far staircase plot
(paper Figure 1(c)) and TensorBoard scalars.

All inputs are 0–1 scores (unrounded); tables print them on the paper's 0–100 scale with one decimal.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from bat_jax.benchmark.scoring import Summary, display
from bat_jax.benchmark.stages import STAGES


def _pm(value: float | None, hw: float) -> str:
    if value is None:
        return "—"
    return f"{display(value)} ± {100.0 * hw:.1f}"


def results_table(systems: Sequence[tuple[str, Summary]]) -> str:
    """A plain-text table like the paper's Table 2: one row per system, Overall / Agentic / Task ± half-width.

    Args:
      systems: (name, Summary) pairs in display order.
    """
    header = f"{'System':<22} {'Overall':>14} {'Agentic':>14} {'Task':>14} {'unscored':>9}"
    lines = [header, "-" * len(header)]
    for name, s in systems:
        lines.append(f"{name:<22} {_pm(s.overall, s.overall_hw):>14} {_pm(s.agentic, s.agentic_hw):>14} "
                     f"{_pm(s.task, s.task_hw):>14} {s.n_unscored:>4}/{s.n_cells:<4}")
    return "\n".join(lines)


def stage_table(rounds: Sequence[tuple[str, Mapping]]) -> str:
    """Per-round stage scores: rows are rounds (label, {Stage: score}), columns S1..S5 (0–100, one decimal)."""
    header = f"{'Round':<12}" + "".join(f"{s.value + ' ' + s.title:>15}" for s in STAGES)
    lines = [header, "-" * len(header)]
    for label, stages in rounds:
        lines.append(f"{label:<12}" + "".join(f"{display(stages.get(s)):>15}" for s in STAGES))
    return "\n".join(lines)


def _count(n: int | None) -> str:
    return "—" if n is None else str(n)


class RoundCounts(NamedTuple):
    """One row of `scoring_table` (counts; None = not recorded, e.g. an older ledger)."""

    label: str
    rollouts: int | None
    unscored: int | None
    agent_failed: int | None
    eval_cells: int | None
    eval_unscored: int | None
    eval_agent_failed: int | None


#: Printed under `scoring_table`: what separates the two failure columns (issue 13).
SCORING_LEGEND = (
    "agent-failed (scored): the agent's own code killed or hung its sandbox; scored from the evidence gathered "
    "until then (a failure of the policy, counted in 'scored').\n"
    "unscored (infra): engine or sandbox start failed, or the LLM judge was unreachable; left out of the GRPO "
    "loss and of the evaluation means.")


def scoring_table(rounds: Sequence[RoundCounts | tuple]) -> str:
    """Per-round scoring counts, then `SCORING_LEGEND`: rollouts, scored (= rollouts − unscored), agent-failed
    (scored), unscored (infra); then the controller evaluation's agent-failed and unscored cells as
    'count/cells'. Each row is a `RoundCounts` (or a tuple in its field order); None prints '—'."""
    cols = [("rollouts", "", 10), ("scored", "", 8), ("agent-failed", "(scored)", 14), ("unscored", "(infra)", 10),
            ("eval agent-failed", "(scored)/cells", 19), ("eval unscored", "(infra)/cells", 16)]
    lines = [f"{'Round':<12}" + "".join(f"{a:>{w}}" for a, _, w in cols),
             " " * 12 + "".join(f"{b:>{w}}" for _, b, w in cols)]
    lines.append("-" * len(lines[0]))

    def frac(k: int | None, n: int | None) -> str:
        return "—" if k is None or n is None else f"{k}/{n}"

    for row in rounds:
        r = RoundCounts(*row)
        scored = None if r.rollouts is None or r.unscored is None else r.rollouts - r.unscored
        values = [_count(r.rollouts), _count(scored), _count(r.agent_failed), _count(r.unscored),
                  frac(r.eval_agent_failed, r.eval_cells), frac(r.eval_unscored, r.eval_cells)]
        lines.append(f"{r.label:<12}" + "".join(f"{v:>{w}}" for v, (_, _, w) in zip(values, cols)))
    return "\n".join(lines + ["", SCORING_LEGEND])


def best_so_far(values: Sequence[float | None]) -> list[float | None]:
    """Running maximum, skipping unscored (None) entries; None until the first scored value."""
    out: list[float | None] = []
    best = None
    for v in values:
        if v is not None and (best is None or v > best):
            best = v
        out.append(best)
    return out


def staircase_plot(overall_per_round: Sequence[float | None], path: os.PathLike | str,
                   title: str = "BiCuRL: Overall per round and best-so-far",
                   baselines: Mapping[str, float] | None = None) -> pathlib.Path:
    """Writes the Figure-1(c)-style PNG: dashed per-round Overall, solid best-so-far steps, stars on new bests.

    Args:
      overall_per_round: Overall (0–1) of round 0 (the starting policy), 1, 2, ...; None = unscored.
      path: PNG path (written via a temp file, then renamed).
      baselines: optional horizontal reference lines, name → Overall (0–1).
    Returns:
      The PNG path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = pathlib.Path(path)
    xs = list(range(len(overall_per_round)))
    ys = [None if v is None else 100.0 * v for v in overall_per_round]
    best = [None if v is None else 100.0 * v for v in best_so_far(overall_per_round)]
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    ax.plot([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None], "--o",
            color="tab:blue", alpha=0.6, label="round evaluation")
    ax.step([x for x, b in zip(xs, best) if b is not None], [b for b in best if b is not None], where="post",
            color="tab:red", linewidth=2, label="best so far")
    prev = None
    for x, b in zip(xs, best):
        if b is not None and b != prev:
            ax.plot([x], [b], marker="*", markersize=13, color="gold", markeredgecolor="black", zorder=5)
            prev = b
    for name, value in (baselines or {}).items():
        ax.axhline(100.0 * value, linestyle=":", color="gray")
        ax.annotate(name, (0, 100.0 * value), textcoords="offset points", xytext=(2, 3), fontsize=8, color="gray")
    ax.set_xlabel("round")
    ax.set_ylabel("Overall (0–100)")
    ax.set_title(title, fontsize=10)
    ax.set_xticks(xs)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)
    return path


@dataclasses.dataclass
class ScalarWriter:
    """TensorBoard scalars under `<run_dir>/tensorboard` (tensorboardX), e.g. 'eval/overall' per round."""

    log_dir: pathlib.Path

    def __post_init__(self):
        from tensorboardX import SummaryWriter

        self._writer = SummaryWriter(str(self.log_dir))

    def summary(self, prefix: str, summary: Summary, step: int) -> None:
        """Writes Overall/Agentic/Task and S1..S5 (0–100) at `step`; characters TensorBoard does not allow in
        a tag (e.g. the spaces and parentheses of 'BiCuRL (retained)') become '_'."""
        prefix = re.sub(r"[^A-Za-z0-9_./-]+", "_", prefix).strip("_")
        for key in ("overall", "agentic", "task"):
            value = getattr(summary, key)
            if value is not None:
                self._writer.add_scalar(f"{prefix}/{key}", 100.0 * value, step)
        for stage, value in summary.stages.items():
            if value is not None:
                self._writer.add_scalar(f"{prefix}/{stage.value}_{stage.title}", 100.0 * value, step)

    def scalar(self, tag: str, value: float, step: int) -> None:
        self._writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()
