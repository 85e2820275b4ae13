"""Reports of a run and of a sweep over runs.

The Table-2-style results table, per-round stage scores, GRPO signal per round, the best-so-far staircase plot
(paper Figure 1(c)), TensorBoard scalars, `report.md` / `summary.json` of a run (`write_run_report`) and the
one-table report of a sweep over runs (`bat_jax/sweep_report.py`).

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from bat_jax.atomic_io import atomic_file, atomic_write
from bat_jax.benchmark.items import ItemRates, failing_items_table, heat_map
from bat_jax.benchmark.scoring import Summary, display, paired_comparison
from bat_jax.benchmark.stages import StageSet


def _pm(value: float | None, hw: float) -> str:
    if value is None:
        return "—"
    return f"{display(value)} ± {100.0 * hw:.1f}"


def results_table(systems: Sequence[tuple[str, Summary]]) -> str:
    """A plain-text table like the paper's Table 2: one row per system, Overall / Agentic / Task ± half-width.

    Args:
      systems: (name, Summary) pairs in display order; the name column is 22 characters or the longest name.
    """
    w = max([22] + [len(name) for name, _ in systems])
    header = f"{'System':<{w}} {'Overall':>14} {'Agentic':>14} {'Task':>14} {'unscored':>9}"
    lines = [header, "-" * len(header)]
    for name, s in systems:
        lines.append(f"{name:<{w}} {_pm(s.overall, s.overall_hw):>14} {_pm(s.agentic, s.agentic_hw):>14} "
                     f"{_pm(s.task, s.task_hw):>14} {s.n_unscored:>4}/{s.n_cells:<4}")
    return "\n".join(lines)


def stage_table(rounds: Sequence[tuple[str, Mapping]], stages: StageSet) -> str:
    """Per-round stage scores as a text table.

    Rows are rounds (label, {stage id: score}), one column per stage of the benchmark in workflow order, headed '<id>
    <title>' (0–100, one decimal; '—' = unscored)."""
    width = max([15] + [len(stages.label(s)) + 2 for s in stages.ids])
    header = f"{'Round':<12}" + "".join(f"{stages.label(s):>{width}}" for s in stages.ids)
    lines = [header, "-" * len(header)]
    for label, scores in rounds:
        lines.append(f"{label:<12}" + "".join(f"{display(scores.get(s)):>{width}}" for s in stages.ids))
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


#: Printed under `scoring_table`: what separates the two failure columns.
SCORING_LEGEND = (
    "agent-failed (scored): the agent's own code killed or hung its sandbox; scored from the evidence gathered "
    "until then (a failure of the policy, counted in 'scored').\n"
    "unscored (infra): engine or sandbox start failed, or the LLM judge was unreachable; left out of the GRPO "
    "loss and of the evaluation means.")


def scoring_table(rounds: Sequence[RoundCounts | tuple]) -> str:
    """Per-round scoring counts as a text table, then `SCORING_LEGEND`.

    Columns: rollouts, scored (= rollouts − unscored), agent-failed (scored), unscored (infra); then the controller
    evaluation's agent-failed and unscored cells as 'count/cells'. Each row is a `RoundCounts` (or a tuple in its field
    order); None prints '—'."""
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


class RoundSignal(NamedTuple):
    """One row of `signal_table` (None = not recorded: nothing scored, or an older ledger)."""

    label: str
    target: str
    reward_before: float | None
    reward_after: float | None
    groups_with_variance: int | None
    groups_scored: int | None
    logp_shift_pos: float | None = None
    logp_shift_neg: float | None = None
    token_kl: float | None = None


def signal_table(rounds: Sequence[RoundSignal | tuple]) -> str:
    """Per-round GRPO signal as a text table.

    Columns: mean reward (0–1, three decimals) of the round's first pool batch before and after its update (same rows,
    same seed), the change, and the groups whose rewards vary out of the scored groups (with their share). Then how the
    update moved the first batch's own rollouts: token-mean logprob change (nats) of those with positive / negative
    advantage and KL(old ‖ new) per token (`grpo.update_shift`); None prints '—'."""
    cols = [("target", 8), ("reward before", 15), ("after", 9), ("change", 9), ("groups with variance", 22),
            ("Δlogp A>0", 11), ("Δlogp A<0", 11), ("KL/token", 10)]
    lines = [f"{'Round':<12}" + "".join(f"{a:>{w}}" for a, w in cols)]
    lines.append("-" * len(lines[0]))

    def num(x: float | None, sign: str = "", digits: int = 3) -> str:
        return "—" if x is None else f"{x:{sign}.{digits}f}"

    for row in rounds:
        r = RoundSignal(*row)
        change = None if r.reward_before is None or r.reward_after is None else r.reward_after - r.reward_before
        if r.groups_scored is None or r.groups_with_variance is None:
            groups = "—"
        else:
            share = f" ({100 * r.groups_with_variance / r.groups_scored:.0f}%)" if r.groups_scored else ""
            groups = f"{r.groups_with_variance}/{r.groups_scored}{share}"
        values = [r.target, num(r.reward_before), num(r.reward_after), num(change, "+"), groups,
                  num(r.logp_shift_pos, "+", 4), num(r.logp_shift_neg, "+", 4), num(r.token_kl, "", 5)]
        lines.append(f"{r.label:<12}" + "".join(f"{v:>{w}}" for v, (_, w) in zip(values, cols)))
    return "\n".join(lines)


def groups_table(records: Sequence[Any]) -> str:
    """Per-round GRPO groups as a text table.

    Groups drawn / dropped without reward variance / trained (dynamic sampling). The mismatch between the learner's and
    the engine's logprobs of the sampled tokens (mean and max |Δ log π|, nats; with rollout correction, tokens whose
    importance weight was truncated and rollouts masked) and the trained groups per pool. '—' = not recorded."""
    lines = [f"{'Round':<12}{'drawn':>8}{'dropped':>9}{'trained':>9}{'mean |Δlogp|':>14}{'max |Δlogp|':>13}"
             f"{'truncated':>11}{'masked':>8}  trained per pool"]
    lines.append("-" * len(lines[0]))
    for rec in records:
        g = rec.grpo
        mm = g.rollout_mismatch or {}
        cell = lambda v, fmt: "—" if v is None else format(v, fmt)  # noqa: E731
        lines.append(f"{f'round {rec.round}':<12}{cell(g.groups_drawn, 'd'):>8}{cell(g.groups_dropped, 'd'):>9}"
                     f"{cell(g.groups_trained, 'd'):>9}{cell(mm.get('mismatch_mean_abs'), '.4f'):>14}"
                     f"{cell(mm.get('mismatch_max_abs'), '.4f'):>13}{cell(mm.get('tis_truncated_frac'), '.1%'):>11}"
                     f"{cell(None if 'seq_masked' not in mm else int(mm['seq_masked']), 'd'):>8}"
                     f"  {' · '.join(f'{k} {v}' for k, v in g.trained_pool_counts.items()) or '—'}")
    return "\n".join(lines)


def staleness_table(records: Sequence[Any]) -> str:
    """Per-round bounded-staleness GRPO counts (`ledger.GRPOStats`) as a text table.

    Columns: groups dropped as too stale, evicted for an infrastructure failure, aborted after a sync, refills rolled
    out, and the mean / max staleness (weight versions) of the trained groups. '—' = not recorded (the synchronous
    block)."""
    lines = [f"{'Round':<12}{'stale':>7}{'evicted':>9}{'aborted':>9}{'refilled':>10}{'mean lag':>10}{'max lag':>9}"]
    lines.append("-" * len(lines[0]))
    for rec in records:
        g = rec.grpo
        cell = lambda v, fmt: "—" if v is None else format(v, fmt)  # noqa: E731
        lines.append(f"{f'round {rec.round}':<12}{g.groups_dropped_stale:>7d}{g.groups_evicted:>9d}"
                     f"{g.groups_aborted:>9d}{g.groups_refilled:>10d}{cell(g.staleness_mean, '.2f'):>10}{cell(g.staleness_max, 'd'):>9}")
    return "\n".join(lines)


def bank_table(records: Sequence[Any]) -> str:
    """Per round: the Stage Bank version it read and the RL rows new since the previous round's version.

    '—' in ledgers written before rounds read versions."""
    lines = [f"{'Round':<12}{'bank version':>14}{'new RL rows':>13}"]
    for rec in records:
        new = "—" if rec.bank_rows_new is None else str(rec.bank_rows_new)
        lines.append(f"{'round ' + str(rec.round):<12}{'v' + str(rec.bank_version):>14}{new:>13}")
    return "\n".join(lines)


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
      baselines: optional horizontal reference lines, name → Overall (0–1; None = unscored, not drawn).
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
        if value is None:  # an unscored baseline has no line (never a line at 0)
            continue
        ax.axhline(100.0 * value, linestyle=":", color="gray")
        ax.annotate(name, (0, 100.0 * value), textcoords="offset points", xytext=(2, 3), fontsize=8, color="gray")
    ax.set_xlabel("round")
    ax.set_ylabel("Overall (0–100)")
    ax.set_title(title, fontsize=10)
    ax.set_xticks(xs)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    try:
        with atomic_file(path) as f:
            fig.savefig(f, format="png")
    finally:
        plt.close(fig)
    return path


@dataclasses.dataclass
class ScalarWriter:
    """TensorBoard scalars under `<run_dir>/tensorboard` (tensorboardX).

    E.g. 'eval/overall' per round; stage scalars are named '<id>_<title>' of the run's benchmark `stages`."""

    log_dir: pathlib.Path
    stages: StageSet

    def __post_init__(self):
        from tensorboardX import SummaryWriter

        self._writer = SummaryWriter(str(self.log_dir))

    def summary(self, prefix: str, summary: Summary, step: int) -> None:
        """Writes Overall/Agentic/Task, each stage and each rubric item's pass rate (0–100) at `step`.

        Item tags are '<prefix>/items/<stage>/<item>'. Characters TensorBoard does not allow in a tag (e.g. the spaces
        and parentheses of 'BiCuRL (retained)') become '_'."""
        prefix = re.sub(r"[^A-Za-z0-9_./-]+", "_", prefix).strip("_")
        for key in ("overall", "agentic", "task"):
            value = getattr(summary, key)
            if value is not None:
                self._writer.add_scalar(f"{prefix}/{key}", 100.0 * value, step)
        for stage, value in summary.stages.items():
            if value is not None:
                tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{stage}_{self.stages.title(stage)}")
                self._writer.add_scalar(f"{prefix}/{tag}", 100.0 * value, step)
        for key, value in summary.items.scalars().items():  # rubric item pass rates, 0–100
            self._writer.add_scalar(f"{prefix}/items/{re.sub(r'[^A-Za-z0-9_./-]+', '_', key)}", value, step)

    def scalar(self, tag: str, value: float, step: int) -> None:
        self._writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()


# ---- run and sweep reports ------------------------------------------------------------------------------------


def summary_dict(s: Summary) -> dict:
    """A Summary as JSON-ready values (stages by name, track means included; `summary_from_dict` reads it)."""
    return {"overall": s.overall, "agentic": s.agentic, "task": s.task, "overall_hw": s.overall_hw,
            "agentic_hw": s.agentic_hw, "task_hw": s.task_hw, "stages": dict(s.stages),
            "tracks": {t: dict(row) for t, row in s.tracks.items()}, "n_cells": s.n_cells,
            "n_unscored": s.n_unscored, "cells": sorted([t, r] for t, r in s.cells), "items": s.items.to_dict()}


def summary_from_dict(d: Mapping) -> Summary:
    """The Summary of `summary_dict` output; fields an older summary.json lacks read as 0 / empty."""
    return Summary(d.get("overall"), d.get("agentic"), d.get("task"), d.get("overall_hw", 0.0),
                   d.get("agentic_hw", 0.0), d.get("task_hw", 0.0),
                   dict(d.get("stages", {})), dict(d.get("tracks", {})),
                   int(d.get("n_cells", 0)), int(d.get("n_unscored", 0)),
                   frozenset((str(t), int(r)) for t, r in d.get("cells", ())),
                   ItemRates.from_dict(d.get("items"), "summary items"))


def mde_words(diff: float | None, mde: float | None, power: float = 0.8, confidence: float = 0.95) -> str:
    """What a paired difference's minimum detectable difference says of it, in words (0–100 scale)."""
    if mde is None or diff is None:
        return "minimum detectable difference: — (fewer than 2 tracks)"
    if mde == 0 and diff == 0:
        return ("every track scored the same in both systems (for example the same checkpoint retained): "
                "no difference to detect")
    where = ("the difference is inside it: these cells cannot tell the two systems apart"
             if abs(diff) <= mde else "the difference is larger than it")
    return (f"minimum detectable difference {100 * mde:.1f} ({100 * confidence:.0f} % level, {100 * power:.0f} % "
            f"power): {where}")


def paired_line(candidate: str, a: Summary, baseline: str, b: Summary) -> str:
    """The paired track-level difference of Overall as one line of text.

    'Paired track-level difference A − B (Overall): m ± hw (n tracks); minimum detectable difference d (…):
    …' (0–100 scale; `mde_words`)."""
    cmp = paired_comparison(a, b, "overall")
    return (f"Paired track-level difference {candidate} − {baseline} (Overall): {display(cmp.mean_diff)} ± "
            f"{100 * cmp.half_width:.1f} ({len(cmp.per_track)} tracks); {mde_words(cmp.mean_diff, cmp.mde)}")


def write_run_report(run_dir: os.PathLike | str, final: Mapping[str, Summary], records, round0, stages: StageSet,
                     writer: ScalarWriter | None = None, note: str = "", round0_items: Mapping | None = None) -> dict:
    """Writes a run's `report.md`, `staircase.png`, `items.png` and `summary.json`; returns the summary.

    `report.md` holds the results table, paired differences SFT − untrained and last system − SFT with their minimum
    detectable differences, per-round stage scores, the rubric items that fail most, GRPO signal, scoring counts.
    `items.png` (item pass rates × rounds) is written when items were counted.

    Args:
      final: system name → final Summary, in display order ('untrained', 'SFT', then the trained system).
      records: the ledger's `RoundRecord`s; round0: the SFT policy's controller `Evaluation`.
      stages: the run's benchmark stages (the per-round stage table's columns).
      note: a line under the title (e.g. what the benchmark's held-out suite is).
      round0_items: round 0's rubric item counts (`ItemRates.to_dict()`), None when not recorded.
    """

    run_dir = pathlib.Path(run_dir)
    names = list(final)
    lines = [f"# BiCuRL run report: {stages.benchmark}", "", *([note, ""] if note else []),
             "Final evaluation (held-out runs disjoint from the controller's):", "", "```",
             results_table(list(final.items())), "```", ""]
    if "SFT" in final and "untrained" in final:
        lines.append(paired_line("SFT", final["SFT"], "untrained", final["untrained"]))
    if len(names) >= 3:
        lines.append(paired_line(names[-1], final[names[-1]], "SFT", final["SFT"]))
    stage_rows = [("round 0", dict(round0.stage_scores))]
    stage_rows += [(f"round {rec.round}", dict(rec.controller_scores["stage_scores"])) for rec in records]
    lines += ["", "Controller evaluation per round:", "", "```", stage_table(stage_rows, stages), "```"]
    lines += _item_section(run_dir, final, records, round0_items, stages)
    if records:
        signal = [RoundSignal(f"round {rec.round}", rec.selected_stage, rec.grpo.pool_reward_before,
                              rec.grpo.pool_reward_after, rec.grpo.groups_with_variance, rec.grpo.groups_scored,
                              rec.grpo.update_logp_shift_pos, rec.grpo.update_logp_shift_neg, rec.grpo.update_token_kl)
                  for rec in records]
        lines += ["", "GRPO signal per round: mean reward of the round's first pool batch before / after its update "
                  "(same rows, same seed), groups (K rollouts of one row) whose rewards vary, and how the update moved that "
                  "batch's own rollouts (an ascent step: Δlogp A>0 up, A<0 down):", "", "```",
                  signal_table(signal), "```"]
        lines += ["", "GRPO groups per round (dynamic sampling drops groups without reward variance and replaces "
                  "them from the same pool) and the learner / engine logprob mismatch on "
                  "sampled tokens:", "", "```", groups_table(records), "```"]
        if any(rec.grpo.staleness_mean is not None or rec.grpo.groups_evicted or rec.grpo.groups_refilled
               for rec in records):
            lines += ["", "Bounded-staleness GRPO per round: groups dropped as too stale, evicted (infrastructure "
                      "failure), aborted after a sync, refills rolled out, and the staleness trained on (weight "
                      "versions):", "", "```", staleness_table(records), "```"]
        lines += ["", "Stage Bank version per round (resolved at round start) and RL rows new since the previous "
                  "round:", "", "```", bank_table(records), "```"]
        lines += [f"Data Factory, round {rec.round}: {rec.factory}" for rec in records if rec.factory]
        counts = [RoundCounts(f"round {rec.round}", rec.grpo.rollouts, rec.grpo.unscored, rec.grpo.agent_failed,
                              rec.eval_cells, rec.eval_unscored, rec.eval_agent_failed) for rec in records]
        lines += ["", "Rollouts and evaluation cells per round: agent-caused failures (scored) apart from "
                  "infrastructure failures (unscored):", "", "```", scoring_table(counts), "```"]
    overall = [round0.overall] + [rec.controller_scores["overall"] for rec in records]
    staircase_plot(overall, run_dir / "staircase.png", baselines={"SFT": round0.overall})
    text = "\n".join(lines) + "\n"
    atomic_write(run_dir / "report.md", text.encode())
    print(text, flush=True)
    if writer is not None:
        for i, (name, summary) in enumerate(final.items()):
            writer.summary(f"final/{name}", summary, i)
        writer.close()
    controller = [{"round": 0, "target": None, "overall": round0.overall, "decision": None}]
    controller += [{"round": rec.round, "target": rec.selected_stage, "overall": rec.controller_scores["overall"],
                    "decision": rec.decision} for rec in records]
    out = {"final": {name: summary_dict(s) for name, s in final.items()}, "rounds": len(records),
           "controller": controller}
    atomic_write(run_dir / "summary.json", json.dumps(out, indent=2, default=str).encode())
    return out


def _item_section(run_dir: pathlib.Path, final: Mapping[str, Summary], records, round0_items: Mapping | None,
                  stages: StageSet) -> list[str]:
    """The rubric item table of report.md and `items.png` (controller rounds, final systems, GRPO rollouts per round).

    [] when no item was counted (e.g. an older run or an external evaluator)."""
    controller = [ItemRates.from_dict(round0_items, "round 0 items")] + [rec.eval_item_rates() for rec in records]
    rollouts = [rec.grpo.item_rates() for rec in records]
    finals = {name: s.items for name, s in final.items()}
    table = failing_items_table(stages, finals, controller, rollouts)
    if not table:
        return []
    columns = ([(f"round {k}", r) for k, r in enumerate(controller)] + [(f"final {n}", r) for n, r in finals.items()]
               + [(f"GRPO r{rec.round}", r) for rec, r in zip(records, rollouts)])
    heat_map(stages, columns, run_dir / "items.png", "rubric item pass rate (%)\ncontroller evaluation per round, "
             "final evaluation, GRPO rollouts")
    return ["", "Rubric items that fail most, per stage: pass rate (0–100, pooled over the cells that decided the "
            "item) in the final evaluation, the controller evaluation of each round, the rounds whose controller "
            "evaluation changed it (points) and each round's GRPO rollouts (`items.png`: every item):", "", "```",
            table, "```"]
