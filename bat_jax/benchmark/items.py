"""Rubric item pass rates over a set of cells or rollouts: which items of which stage fail, as aggregates only.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from bat_jax.atomic_io import atomic_file
from bat_jax.benchmark.stages import StageSet

#: stage id → item id → passed (one cell's or rollout's decisions; a stage absent or None = not verified).
Decisions = Mapping[str, Mapping[str, bool] | None]


@dataclasses.dataclass(frozen=True)
class ItemRates:
    """Pass counts of rubric items: stage id → item id → track → (passed, decided).

    Attributes:
      counts: the nested counts; every `decided` >= 1 and 0 <= `passed` <= `decided`.
    Raises:
      ValueError: a count that is not an int, a negative count, or passed > decided (names stage, item, track).
    """

    counts: Mapping[str, Mapping[str, Mapping[str, tuple[int, int]]]] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        clean: dict[str, dict[str, dict[str, tuple[int, int]]]] = {}
        for stage, items in self.counts.items():
            for item, tracks in items.items():
                for track, pair in tracks.items():
                    try:
                        passed, decided = pair
                    except (TypeError, ValueError):
                        raise ValueError(f"item {stage}/{item} track {track!r}: expected [passed, decided], "
                                         f"got {pair!r}") from None
                    if any(isinstance(v, bool) or not isinstance(v, int) for v in (passed, decided)) or not (
                            0 <= passed <= decided and decided >= 1):
                        raise ValueError(f"item {stage}/{item} track {track!r}: counts [passed, decided] must be "
                                         f"ints with 0 <= passed <= decided, decided >= 1; got {pair!r}")
                    clean.setdefault(str(stage), {}).setdefault(str(item), {})[str(track)] = (passed, decided)
        object.__setattr__(self, "counts", clean)

    @classmethod
    def tally(cls, records: Iterable[tuple[str, Decisions | None]]) -> "ItemRates":
        """Counts the decisions of `records`, each (track, stage id → item id → passed); None entries skipped."""
        counts: dict[str, dict[str, dict[str, list[int]]]] = {}
        for track, decisions in records:
            for stage, items in (decisions or {}).items():
                for item, passed in (items or {}).items():
                    pair = counts.setdefault(stage, {}).setdefault(item, {}).setdefault(track, [0, 0])
                    pair[0] += bool(passed)
                    pair[1] += 1
        return cls({s: {i: {t: tuple(p) for t, p in tr.items()} for i, tr in it.items()}
                    for s, it in counts.items()})

    def __bool__(self) -> bool:
        return bool(self.counts)

    def count(self, stage: str, item: str, track: str | None = None) -> tuple[int, int]:
        """(passed, decided) of one item over every track, or over `track` alone; (0, 0) when never decided."""
        tracks = self.counts.get(stage, {}).get(item, {})
        pairs = list(tracks.values()) if track is None else [tracks[track]] if track in tracks else []
        return sum(p for p, _ in pairs), sum(n for _, n in pairs)

    def rate(self, stage: str, item: str, track: str | None = None) -> float | None:
        """Pass rate (0–1) of one item, pooled over cells (of `track` only when given); None when never decided."""
        passed, decided = self.count(stage, item, track)
        return passed / decided if decided else None

    def keys(self, stages: StageSet | None = None) -> list[tuple[str, str]]:
        """(stage id, item id) of every counted item, in workflow then name order.

        Stages in `stages`' workflow order (unknown ones after, in name order; all in name order without `stages`),
        items in name order inside a stage."""
        order = {s: i for i, s in enumerate(stages.ids)} if stages is not None else {}
        ranked = sorted(self.counts, key=lambda s: (order.get(s, len(order)), s))
        return [(s, i) for s in ranked for i in sorted(self.counts[s])]

    def tracks(self) -> list[str]:
        """Every track with a decision, in name order."""
        return sorted({t for items in self.counts.values() for tracks in items.values() for t in tracks})

    def scalars(self) -> dict[str, float]:
        """'<stage id>/<item id>' → pass rate on the 0–100 scale (TensorBoard's; only decided items)."""
        return {f"{s}/{i}": 100.0 * self.rate(s, i) for s, i in self.keys()}

    def to_dict(self) -> dict[str, dict[str, dict[str, list[int]]]]:
        """JSON-ready ``{stage: {item: {track: [passed, decided]}}}``."""
        return {s: {i: {t: list(p) for t, p in tr.items()} for i, tr in it.items()} for s, it in self.counts.items()}

    @classmethod
    def from_dict(cls, d: Mapping | None, where: str = "item counts") -> "ItemRates":
        """The rates of `to_dict` output; None or {} gives empty rates.

        Raises:
          ValueError: a malformed entry (names `where`, stage, item and track).
        """
        if not d:
            return cls()
        if not isinstance(d, Mapping) or not all(isinstance(v, Mapping) and all(isinstance(t, Mapping)
                                                                                for t in v.values())
                                                 for v in d.values()):
            raise ValueError(f"{where}: expected {{stage: {{item: {{track: [passed, decided]}}}}}}")
        try:
            return cls({s: {i: {t: tuple(p) for t, p in tr.items()} for i, tr in it.items()} for s, it in d.items()})
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None


def changes(series: Iterable[ItemRates | None], stage: str, item: str) -> list[tuple[int, float, float]]:
    """(index, previous rate, rate) wherever an item's pooled pass rate changes along `series`.

    A rate is compared with the previous entry of `series` that decided it (entries that did not decide it — None, or no
    decision — are skipped)."""
    out, prev = [], None
    for k, rates in enumerate(series):
        value = rates.rate(stage, item) if rates else None
        if value is None:
            continue
        if prev is not None and value != prev:
            out.append((k, prev, value))
        prev = value
    return out


def _pct(rates: ItemRates | None, stage: str, item: str) -> str:
    value = rates.rate(stage, item) if rates else None
    return "—" if value is None else f"{100.0 * value:.0f}"


def failing_items_table(stages: StageSet, final: Mapping[str, ItemRates], controller: Sequence[ItemRates | None],
                        rollouts: Sequence[ItemRates | None] = (), per_stage: int = 3) -> str:
    """The rubric items that fail most, per stage, as a text table.

    Pass rates (0–100, pooled over cells) in the final evaluation of each system, in the controller evaluation of every
    round, in each round's GRPO rollouts, and the rounds whose controller evaluation changed the item's rate.

    Args:
      stages: the benchmark's stages (row order and labels).
      final: system name → its final evaluation's counts, in display order; the last system's rates rank the
        items (the lowest first), or the last controller evaluation's when `final` has none.
      controller: the controller evaluation's counts of round 0, 1, ... (None = not recorded).
      rollouts: the GRPO rollouts' counts of round 1, 2, ... (None = not recorded).
      per_stage: items shown per stage (the most failing ones; ties in item-id order).
    Returns:
      The text table ('' when nothing was counted). '—' = the item was not decided there.
    """
    ranking = next((r for r in reversed([*controller, *final.values()]) if r), None)
    if ranking is None:
        return ""
    keys = sorted({k for r in [*final.values(), *controller, *rollouts] if r for k in r.keys(stages)},
                  key=lambda k: (stages.index(k[0]) if k[0] in stages else len(stages), k[0]))
    shown = []
    for stage in dict.fromkeys(s for s, _ in keys):
        ranked = sorted((i for s, i in keys if s == stage),
                        key=lambda i: (2.0 if ranking.rate(stage, i) is None else ranking.rate(stage, i), i))
        shown += [(stage, i) for i in ranked[:per_stage]]
    label = lambda s: stages.label(s) if s in stages else s  # noqa: E731
    cols = ["stage", "item", *(f"final {n}" for n in final), f"controller r0→r{len(controller) - 1}", "changed in"]
    if any(rollouts):
        cols.append(f"GRPO rollouts r1→r{len(rollouts)}")
    rows = []
    for stage, item in shown:
        moved = changes(controller, stage, item)
        row = [label(stage), item, *(_pct(r, stage, item) for r in final.values()),
               " → ".join(_pct(r, stage, item) for r in controller) or "—",
               ", ".join(f"round {k} ({100 * (b - a):+.0f})" for k, a, b in moved) or "never"]
        if any(rollouts):
            row.append(" → ".join(_pct(r, stage, item) for r in rollouts))
        rows.append(row)
    widths = [max(len(c), *(len(r[j]) for r in rows)) for j, c in enumerate(cols)]
    fmt = lambda cells: "  ".join(f"{c:<{w}}" for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(cols), "-" * len(fmt(cols)), *(fmt(r) for r in rows)])


def heat_map(stages: StageSet, columns: Sequence[tuple[str, ItemRates | None]], path, title: str = ""):
    """Writes a PNG heat map of item pass rates and returns its path.

    One row per item (stages in workflow order), one column per evaluation or rollout set (`columns`: label → counts;
    None = not recorded), 0–100 from red to green, grey where the item was not decided. The file is written via a temp
    file, then renamed.

    Raises:
      ValueError: no column counted any item.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    keys = sorted({k for _, r in columns if r for k in r.keys(stages)},
                  key=lambda k: (stages.index(k[0]) if k[0] in stages else len(stages), k[0], k[1]))
    if not keys:
        raise ValueError("heat_map: no rubric item was counted in any column")
    grid = np.array([[np.nan if not r or r.rate(s, i) is None else 100.0 * r.rate(s, i) for _, r in columns]
                     for s, i in keys])
    fig, ax = plt.subplots(figsize=(max(5.0, 2.6 + 0.55 * len(columns)), 1.6 + 0.28 * len(keys)), dpi=120)
    cmap = matplotlib.colormaps["RdYlGn"].with_extremes(bad="lightgray")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=0.0, vmax=100.0, aspect="auto")
    for (y, x), value in np.ndenumerate(grid):
        if value == value:
            ax.text(x, y, f"{value:.0f}", ha="center", va="center", fontsize=6)
    ax.set_yticks(range(len(keys)), [f"{s} {i}" for s, i in keys], fontsize=7)
    ax.set_xticks(range(len(columns)), [c for c, _ in columns], fontsize=7, rotation=45, ha="right")
    ax.set_title(title or "rubric item pass rate (%)", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    fig.tight_layout()
    try:
        with atomic_file(path) as f:
            fig.savefig(f, format="png")
    finally:
        plt.close(fig)
    return path
