"""Staged-benchmark scoring: Agentic, Task, Overall, two-level aggregation, uncertainty, paired comparison.

All scores inside the library are on a 0–1 scale; `display()` turns one into the paper's 0–100 scale with
one decimal. Differences are always computed from unrounded values (paper Section 3).

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping

from scipy import stats as _scipy_stats

from bat_jax.benchmark.items import Decisions, ItemRates
from bat_jax.benchmark.stages import StageSet


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


def agentic_score(stage_scores: Mapping[str, object], stages: StageSet) -> float | None:
    """Weighted stage score of one cell, 0–1.

    Args:
      stage_scores: one entry per stage of `stages`: a float in [0, 1], `None` (unscored) or `NOT_APPLICABLE`.
      stages: the benchmark's stages and their Agentic weights (summing to 1).

    Returns:
      The Agentic score renormalised over applicable stages, or `None` if any applicable stage is unscored.

    Raises:
      ValueError: a missing or unknown stage, a score outside [0, 1], or every stage not applicable.
    """
    parsed = stages.check_scores(stage_scores, "stage scores")
    weights = stages.weights
    total_w = 0.0
    acc = 0.0
    for stage, value in parsed.items():
        if value is NOT_APPLICABLE:
            continue
        if value is None:
            return None
        acc += weights[stage] * _check_unit(value, f"stage score {stages.label(stage)}")
        total_w += weights[stage]
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
      track: track (task family) name, e.g. 'segmentation'.
      repeat: repeat index (int >= 0).
      stage_scores: stage id → float in [0, 1] | None (unscored) | NOT_APPLICABLE.
      task: task metric in [0, 1], or None (unscored).
      items: the rubric verifier's item decisions, stage id → item id → passed (a stage absent or None: not
        verified), or None when not recorded (e.g. an external evaluator's cell).
    """

    track: str
    repeat: int
    stage_scores: Mapping[str, object]
    task: float | None
    items: Decisions | None = None

    def __post_init__(self):
        for stage, value in self.stage_scores.items():
            if value is not None and value is not NOT_APPLICABLE:
                _check_unit(value, f"cell ({self.track}, repeat {self.repeat}) stage {stage}")
        if self.task is not None:
            _check_unit(self.task, f"cell ({self.track}, repeat {self.repeat}) task")
        object.__setattr__(self, "stage_scores", dict(self.stage_scores))

    def agentic(self, stages: StageSet) -> float | None:
        return agentic_score(self.stage_scores, stages)

    def scored(self, stages: StageSet) -> bool:
        """True when every applicable stage and the task are scored."""
        return self.task is not None and self.agentic(stages) is not None


def half_width(values: Iterable[float], confidence: float = 0.95) -> float:
    """Two-sided Student-t CI half-width of the mean: t_{(1+c)/2, n-1} · sd / √n; 0.0 when n < 2."""
    xs = list(values)
    if len(xs) < 2:
        return 0.0
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    t = float(_scipy_stats.t.ppf(0.5 + confidence / 2.0, len(xs) - 1))
    return t * statistics.stdev(xs) / math.sqrt(len(xs))


def min_detectable_difference(values: Iterable[float], confidence: float = 0.95, power: float = 0.8
                              ) -> float | None:
    """The smallest true mean difference that paired differences like `values` would detect.

    A two-sided Student-t test at level 1 − `confidence` (the interval of `half_width` excludes 0) finds it with
    probability `power`.

    MDE = (t_{(1+c)/2, n-1} + t_{power, n-1}) · sd / √n = half_width · (t_{(1+c)/2, n-1} + t_{power, n-1}) /
    t_{(1+c)/2, n-1}, with sd the n-1 sample standard deviation of the n differences (the track is the unit: n =
    tracks). Source: Bloom (1995), "Minimum detectable effects", Evaluation Review 19(5) 547–556, Eq. 1 (the
    multiplier t_{α/2} + t_{β} of the standard error); Cohen (1988), Statistical Power Analysis, ch. 2. With 7
    tracks, c = 0.95 and power 0.8 the multiplier is 2.447 + 0.906 = 3.353 standard errors. A repeat more per
    track lowers sd (the track means average more cells): when the cells' own noise dominates, sd — and the MDE —
    fall as 1/√repeats.

    Returns:
      The MDE in the values' units (≥ 0), or None when n < 2 (no standard deviation).
    Raises:
      ValueError: `confidence` or `power` outside (0, 1).
    """
    xs = list(values)
    for name, p in (("confidence", confidence), ("power", power)):
        if not 0.0 < p < 1.0:
            raise ValueError(f"{name} must be in (0, 1), got {p}")
    if len(xs) < 2:
        return None
    df = len(xs) - 1
    multiplier = float(_scipy_stats.t.ppf(0.5 + confidence / 2.0, df)) + float(_scipy_stats.t.ppf(power, df))
    return multiplier * statistics.stdev(xs) / math.sqrt(len(xs))


@dataclasses.dataclass(frozen=True)
class Summary:
    """Aggregate of a set of cells (all 0–1, unrounded).

    Attributes:
      overall, agentic, task: mean of track means (None when no track has a scored cell).
      overall_hw, agentic_hw, task_hw: CI half-widths over track means.
      stages: stage id → mean of track means of the stage score (NOT_APPLICABLE cells skipped), in workflow order.
      tracks: track → {'overall', 'agentic', 'task', each stage id, 'n'} track means (n = scored cells).
      n_cells: cells given; n_unscored: cells excluded as unscored.
      cells: ``(track, repeat)`` of every scored cell: what the aggregates rest on. The non-inferiority gate pairs
        two evaluations only over identical cells.
      items: pass counts of every rubric item over the scored cells that recorded their decisions.
    """

    overall: float | None
    agentic: float | None
    task: float | None
    overall_hw: float
    agentic_hw: float
    task_hw: float
    stages: Mapping[str, float | None]
    tracks: Mapping[str, Mapping[str, float]]
    n_cells: int
    n_unscored: int
    cells: frozenset[tuple[str, int]] = frozenset()
    items: ItemRates = ItemRates()


def _mean_or_none(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def aggregate(cells: Iterable[Cell], stages: StageSet, confidence: float = 0.95) -> Summary:
    """Two-level aggregation: repeats → track mean → mean of track means, over the benchmark's `stages`.

    Unscored cells are dropped before any mean (never zeroed); a track with no scored cell is absent.

    Raises:
      ValueError: a cell missing a stage of `stages` or naming another.
    """
    cells = list(cells)
    by_track: dict[str, list[Cell]] = defaultdict(list)
    n_unscored = 0
    for cell in cells:
        if cell.scored(stages):
            by_track[cell.track].append(cell)
        else:
            n_unscored += 1
    tracks: dict[str, dict[str, float]] = {}
    for track in sorted(by_track):
        group = by_track[track]
        row: dict[str, float] = {
            "agentic": statistics.fmean(c.agentic(stages) for c in group),
            "task": statistics.fmean(c.task for c in group),
            "n": len(group),
        }
        row["overall"] = statistics.fmean(overall_score(c.task, c.agentic(stages)) for c in group)
        for stage in stages.ids:
            vals = [c.stage_scores[stage] for c in group if c.stage_scores[stage] is not NOT_APPLICABLE]
            if vals:
                row[stage] = statistics.fmean(vals)
        tracks[track] = row
    means = {k: [row[k] for row in tracks.values()] for k in ("overall", "agentic", "task")}
    stage_means = {s: _mean_or_none([row[s] for row in tracks.values() if s in row]) for s in stages.ids}
    return Summary(
        overall=_mean_or_none(means["overall"]),
        agentic=_mean_or_none(means["agentic"]),
        task=_mean_or_none(means["task"]),
        overall_hw=half_width(means["overall"], confidence),
        agentic_hw=half_width(means["agentic"], confidence),
        task_hw=half_width(means["task"], confidence),
        stages=stage_means,
        tracks=tracks,
        n_cells=len(cells),
        n_unscored=n_unscored,
        cells=frozenset((c.track, c.repeat) for group in by_track.values() for c in group),
        items=ItemRates.tally((c.track, c.items) for group in by_track.values() for c in group),
    )


@dataclasses.dataclass(frozen=True)
class PairedComparison:
    """Track-level paired difference (candidate − baseline), 0–1 scale, unrounded.

    Attributes:
      metric: 'overall', 'agentic', 'task' or a stage id such as 'S3'.
      mean_diff: mean over shared tracks of (candidate track mean − baseline track mean).
      half_width: Student-t CI half-width over the per-track differences.
      per_track: track → difference; tracks present in only one summary are left out.
      mde: the minimum detectable difference of these tracks (`min_detectable_difference`, at the interval's
        confidence and `power`); None with fewer than 2 shared tracks.
      power: the power the MDE is computed at.
    """

    metric: str
    mean_diff: float | None
    half_width: float
    per_track: Mapping[str, float]
    mde: float | None = None
    power: float = 0.8

    @property
    def detectable(self) -> bool | None:
        """Whether |mean_diff| exceeds the MDE (None when either is unknown).

        False = the difference is inside what these cells can detect, so they cannot tell the two systems apart."""
        if self.mean_diff is None or self.mde is None:
            return None
        return abs(self.mean_diff) > self.mde


def paired_comparison(
    candidate: Summary, baseline: Summary, metric: str = "overall", confidence: float = 0.95, power: float = 0.8
) -> PairedComparison:
    """Paired comparison of two systems at the track level (the statistical unit).

    It carries the minimum detectable difference at `confidence` and `power`."""
    shared = sorted(t for t in candidate.tracks if t in baseline.tracks and metric in candidate.tracks[t]
                    and metric in baseline.tracks[t])
    diffs = {t: candidate.tracks[t][metric] - baseline.tracks[t][metric] for t in shared}
    return PairedComparison(
        metric=metric,
        mean_diff=_mean_or_none(list(diffs.values())),
        half_width=half_width(diffs.values(), confidence),
        per_track=diffs,
        mde=min_detectable_difference(diffs.values(), confidence, power),
        power=power,
    )


def display(value: float | None) -> str:
    """A 0–1 score as the paper prints it: 0–100 with one decimal ('—' when unscored)."""
    if value is None:
        return "—"
    return f"{100.0 * value:.1f}"
