"""Staged-benchmark scoring: Agentic, Task, Overall, two-level aggregation, uncertainty, paired comparison.

All scores inside the library are on a 0–1 scale; `display()` turns one into the paper's 0–100 scale with
one decimal. Differences are always computed from unrounded values (paper Section 3).

Rules (paper Section 3 and REFERENCE.md):
  * Agentic = Σ_s w_s · e_s over the *applicable* stages, weights renormalised over them.
  * Overall = (Task + Agentic) / 2 from unrounded values.
  * An unscored cell (a stage or the task is `None`: missing evidence, infrastructure failure) is excluded
    from every aggregate; it is never counted as 0.
  * Two-level aggregation: mean over repeats inside a track, then the mean of the track means. The track is
    the statistical unit.
  * Uncertainty: the half-width of a two-sided Student-t confidence interval (default 95 %) over the track
    means, t_{1-α/2, n-1} · sd / √n with the n-1 sample standard deviation; 0 when n < 2.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping

from scipy import stats as _scipy_stats

from bat_jax.benchmark.stages import DEFAULT_STAGE_WEIGHTS, STAGES, Stage, validate_stage_weights


class _NotApplicable:
    """Marker for a stage that does not apply to a task (its weight drops out)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NOT_APPLICABLE"


NOT_APPLICABLE = _NotApplicable()

StageValue = "float | None | _NotApplicable"


def _check_unit(value: float, what: str) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0.0 or value > 1.0:
        raise ValueError(f"{what} must be a score in [0, 1], got {value!r}")
    return value


def agentic_score(
    stage_scores: Mapping[Stage | str, object],
    weights: Mapping[Stage | str, float] = DEFAULT_STAGE_WEIGHTS,
) -> float | None:
    """Weighted stage score of one cell, 0–1.

    Args:
      stage_scores: one entry per stage S1..S5: a float in [0, 1], `None` (unscored) or `NOT_APPLICABLE`.
      weights: stage weights summing to 1 (paper: .25/.15/.35/.15/.10).

    Returns:
      The Agentic score renormalised over applicable stages, or `None` if any applicable stage is unscored.

    Raises:
      ValueError: a missing stage, a score outside [0, 1], bad weights, or every stage not applicable.
    """
    w = validate_stage_weights(weights)
    parsed = {Stage.parse(k): v for k, v in stage_scores.items()}
    missing = [s.value for s in STAGES if s not in parsed]
    if missing:
        raise ValueError(f"stage scores are missing stages {missing} (use None for unscored, NOT_APPLICABLE to drop)")
    total_w = 0.0
    acc = 0.0
    for stage in STAGES:
        value = parsed[stage]
        if value is NOT_APPLICABLE:
            continue
        if value is None:
            return None
        acc += w[stage] * _check_unit(value, f"stage score {stage.value} ({stage.title})")
        total_w += w[stage]
    if total_w == 0.0:
        raise ValueError("every stage is NOT_APPLICABLE (or has zero weight); Agentic is undefined")
    return acc / total_w


def overall_score(task: float | None, agentic: float | None) -> float | None:
    """Overall = (Task + Agentic) / 2 on unrounded 0–1 values; `None` if either is unscored.

    Raises:
      ValueError: a score outside [0, 1].
    """
    if task is None or agentic is None:
        return None
    return 0.5 * (_check_unit(task, "task score") + _check_unit(agentic, "agentic score"))


@dataclasses.dataclass(frozen=True)
class Cell:
    """One evaluated run: one track, one repeat.

    Attributes:
      track: track name, e.g. 'segmentation'.
      repeat: repeat index (int >= 0).
      stage_scores: S1..S5 → float in [0, 1] | None (unscored) | NOT_APPLICABLE.
      task: task metric in [0, 1], or None (unscored).
    """

    track: str
    repeat: int
    stage_scores: Mapping[Stage, object]
    task: float | None

    def __post_init__(self):
        parsed = {Stage.parse(k): v for k, v in self.stage_scores.items()}
        for stage, value in parsed.items():
            if value is not None and value is not NOT_APPLICABLE:
                _check_unit(value, f"cell ({self.track}, repeat {self.repeat}) stage {stage.value}")
        if self.task is not None:
            _check_unit(self.task, f"cell ({self.track}, repeat {self.repeat}) task")
        object.__setattr__(self, "stage_scores", parsed)

    def agentic(self, weights: Mapping[Stage | str, float] = DEFAULT_STAGE_WEIGHTS) -> float | None:
        return agentic_score(self.stage_scores, weights)

    def scored(self, weights: Mapping[Stage | str, float] = DEFAULT_STAGE_WEIGHTS) -> bool:
        """True when every applicable stage and the task are scored."""
        return self.task is not None and self.agentic(weights) is not None


def half_width(values: Iterable[float], confidence: float = 0.95) -> float:
    """Two-sided Student-t CI half-width of the mean: t_{(1+c)/2, n-1} · sd / √n; 0.0 when n < 2."""
    xs = list(values)
    if len(xs) < 2:
        return 0.0
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    t = float(_scipy_stats.t.ppf(0.5 + confidence / 2.0, len(xs) - 1))
    return t * statistics.stdev(xs) / math.sqrt(len(xs))


@dataclasses.dataclass(frozen=True)
class Summary:
    """Aggregate of a set of cells (all 0–1, unrounded).

    Attributes:
      overall, agentic, task: mean of track means (None when no track has a scored cell).
      overall_hw, agentic_hw, task_hw: CI half-widths over track means.
      stages: S1..S5 → mean of track means of the stage score (NOT_APPLICABLE cells skipped).
      tracks: track → {'overall','agentic','task', 'S1'..'S5', 'n'} track means (n = scored cells).
      n_cells: cells given; n_unscored: cells excluded as unscored.
      cells: ``(track, repeat)`` of every scored cell: what the aggregates rest on. The non-inferiority gate pairs
        two evaluations only over identical cells.
    """

    overall: float | None
    agentic: float | None
    task: float | None
    overall_hw: float
    agentic_hw: float
    task_hw: float
    stages: Mapping[Stage, float | None]
    tracks: Mapping[str, Mapping[str, float]]
    n_cells: int
    n_unscored: int
    cells: frozenset[tuple[str, int]] = frozenset()


def _mean_or_none(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def aggregate(
    cells: Iterable[Cell],
    weights: Mapping[Stage | str, float] = DEFAULT_STAGE_WEIGHTS,
    confidence: float = 0.95,
) -> Summary:
    """Two-level aggregation: repeats → track mean → mean of track means.

    Unscored cells are dropped before any mean (never zeroed); a track with no scored cell is absent.
    """
    cells = list(cells)
    by_track: dict[str, list[Cell]] = defaultdict(list)
    n_unscored = 0
    for cell in cells:
        if cell.scored(weights):
            by_track[cell.track].append(cell)
        else:
            n_unscored += 1
    tracks: dict[str, dict[str, float]] = {}
    for track in sorted(by_track):
        group = by_track[track]
        row: dict[str, float] = {
            "agentic": statistics.fmean(c.agentic(weights) for c in group),
            "task": statistics.fmean(c.task for c in group),
            "n": len(group),
        }
        row["overall"] = statistics.fmean(overall_score(c.task, c.agentic(weights)) for c in group)
        for stage in STAGES:
            vals = [c.stage_scores[stage] for c in group if c.stage_scores[stage] is not NOT_APPLICABLE]
            if vals:
                row[stage.value] = statistics.fmean(vals)
        tracks[track] = row
    means = {k: [row[k] for row in tracks.values()] for k in ("overall", "agentic", "task")}
    stages = {s: _mean_or_none([row[s.value] for row in tracks.values() if s.value in row]) for s in STAGES}
    return Summary(
        overall=_mean_or_none(means["overall"]),
        agentic=_mean_or_none(means["agentic"]),
        task=_mean_or_none(means["task"]),
        overall_hw=half_width(means["overall"], confidence),
        agentic_hw=half_width(means["agentic"], confidence),
        task_hw=half_width(means["task"], confidence),
        stages=stages,
        tracks=tracks,
        n_cells=len(cells),
        n_unscored=n_unscored,
        cells=frozenset((c.track, c.repeat) for group in by_track.values() for c in group),
    )


@dataclasses.dataclass(frozen=True)
class PairedComparison:
    """Track-level paired difference (candidate − baseline), 0–1 scale, unrounded.

    Attributes:
      metric: 'overall', 'agentic', 'task' or a stage value such as 'S3'.
      mean_diff: mean over shared tracks of (candidate track mean − baseline track mean).
      half_width: Student-t CI half-width over the per-track differences.
      per_track: track → difference; tracks present in only one summary are left out.
    """

    metric: str
    mean_diff: float | None
    half_width: float
    per_track: Mapping[str, float]


def paired_comparison(
    candidate: Summary, baseline: Summary, metric: str = "overall", confidence: float = 0.95
) -> PairedComparison:
    """Paired comparison of two systems at the track level (the statistical unit)."""
    shared = sorted(t for t in candidate.tracks if t in baseline.tracks and metric in candidate.tracks[t]
                    and metric in baseline.tracks[t])
    diffs = {t: candidate.tracks[t][metric] - baseline.tracks[t][metric] for t in shared}
    return PairedComparison(
        metric=metric,
        mean_diff=_mean_or_none(list(diffs.values())),
        half_width=half_width(diffs.values(), confidence),
        per_track=diffs,
    )


def display(value: float | None) -> str:
    """A 0–1 score as the paper prints it: 0–100 with one decimal ('—' when unscored)."""
    if value is None:
        return "—"
    return f"{100.0 * value:.1f}"
