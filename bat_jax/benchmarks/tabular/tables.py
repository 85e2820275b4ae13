"""Tables of the tabular suite: seeded generation with defects, the public cleaning rule and the host's analyses.

Details: docs/design.md.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import io
import math
import random
import statistics
from collections.abc import Sequence

#: Task families, each with its analysis (`analyse`) and its metric (`answer_score`).
TASK_FAMILIES = ("group_mean", "filtered_median", "top_corr")
#: Outcome variants: which defects the raw table carries.
VARIANTS = ("clean", "missing", "duplicates", "mixed")
#: Spellings of a missing numeric cell the generator writes (any non-number is invalid under the rule).
MISSING = ("", "NA", "n/a", "?")
#: The MAD multiple of the outlier filter (`filtered_median`): keep |x - median| <= MAD_K * MAD.
MAD_K = 3.0
#: How many columns `top_corr` names.
TOP_K = 2
#: How far an answer's number may be from the host's: right to its second decimal.
TOLERANCE = 0.005


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """Column names and category levels tables draw from; the held-out suite has its own, disjoint one."""

    categories: tuple[str, ...]
    levels: tuple[str, ...]
    numeric: tuple[str, ...]


TRAIN_VOCAB = Vocabulary(("region", "site", "batch"), ("north", "south", "east", "west", "centre"),
                         ("height", "weight", "score", "load", "speed", "yield", "width", "cost"))
HELDOUT_VOCAB = Vocabulary(("clinic", "lab", "ward"), ("alpha", "beta", "gamma", "delta", "omega"),
                           ("volume", "pressure", "dose", "flux", "ratio", "depth", "mass", "rate"))


@dataclasses.dataclass(frozen=True)
class Table:
    """A raw table: header and rows of cells, as the CSV file holds them."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def csv_bytes(self) -> bytes:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(self.header)
        writer.writerows(self.rows)
        return buf.getvalue().encode()


def parse_csv(text: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of CSV text; ([], []) for an empty text. Never raises on odd rows (they stay as read)."""
    records = list(csv.reader(io.StringIO(text)))
    return (records[0], records[1:]) if records else ([], [])


def number(cell: str) -> float | None:
    """The finite number a cell holds, or None (missing spellings, text, NaN and infinities)."""
    try:
        value = float(cell)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def is_valid(row: Sequence[str], width: int) -> bool:
    """A record of the header's width with a category and every numeric cell (third on) a finite number."""
    return len(row) == width and bool(row[1].strip()) and all(number(c) is not None for c in row[2:])


def profile(header: Sequence[str], rows: Sequence[Sequence[str]]) -> dict:
    """What the inspect stage reports of a raw table.

    Row count, columns, records whose id appeared earlier, and records that are not valid (`is_valid`), both counted
    over every raw record."""
    seen: set[str] = set()
    dupes = 0
    for row in rows:
        key = row[0] if row else ""
        dupes += key in seen
        seen.add(key)
    return {"rows": len(rows), "columns": list(header), "duplicate_ids": dupes,
            "invalid_rows": sum(not is_valid(r, len(header)) for r in rows)}


def clean(header: Sequence[str], rows: Sequence[Sequence[str]]) -> tuple[list[list[str]], dict]:
    """The cleaning rule: records whose id appeared earlier go first, then invalid ones.

    Returns the kept rows (in order, cells unchanged) and the log {'kept', 'dropped_duplicates', 'dropped_invalid'}."""
    seen: set[str] = set()
    kept, dupes, invalid = [], 0, 0
    for row in rows:
        key = row[0] if row else ""
        if key in seen:
            dupes += 1
            continue
        seen.add(key)
        if is_valid(row, len(header)):
            kept.append(list(row))
        else:
            invalid += 1
    return kept, {"kept": len(kept), "dropped_duplicates": dupes, "dropped_invalid": invalid}


def _column(header: Sequence[str], rows: Sequence[Sequence[str]], name: str) -> list[float]:
    i = list(header).index(name)
    return [float(r[i]) for r in rows]


def filtered_values(values: Sequence[float], k: float = MAD_K) -> list[float]:
    """The values within k median absolute deviations of the median (all of them when the MAD is 0)."""
    m = statistics.median(values)
    mad = statistics.median([abs(v - m) for v in values])
    return [v for v in values if abs(v - m) <= k * mad] if mad > 0 else list(values)


def correlations(header: Sequence[str], rows: Sequence[Sequence[str]], target: str,
                 candidates: Sequence[str]) -> dict[str, float]:
    """Pearson r of each candidate column with the target column."""
    y = _column(header, rows, target)
    return {c: statistics.correlation(_column(header, rows, c), y) for c in candidates}


def analyse(family: str, header: Sequence[str], rows: Sequence[Sequence[str]], params: dict):
    """The answer of `family` on cleaned rows.

    group_mean → {level: mean of `value`}; filtered_median → the median of `value` after the MAD filter; top_corr →
    {column: Pearson r with `target`} of the `k` candidate columns with the largest |r|, largest first.

    Raises:
      ValueError: an unknown family, a column the header lacks, or too few rows for the statistic.
      statistics.StatisticsError: (a ValueError) too few rows.
    """
    if family == "group_mean":
        groups: dict[str, list[float]] = {}
        gi, vi = list(header).index(params["group"]), list(header).index(params["value"])
        for r in rows:
            groups.setdefault(r[gi], []).append(float(r[vi]))
        return {g: statistics.fmean(v) for g, v in sorted(groups.items())}
    if family == "filtered_median":
        return statistics.median(filtered_values(_column(header, rows, params["value"]), params["mad_k"]))
    if family == "top_corr":
        r = correlations(header, rows, params["target"], params["candidates"])
        return {c: r[c] for c in sorted(r, key=lambda c: -abs(r[c]))[:params["k"]]}
    raise ValueError(f"tabular: unknown task family {family!r}; known: {TASK_FAMILIES}")


def _close(got, want) -> bool:
    """`got` is a JSON number (not a bool) within `TOLERANCE` of `want`, both finite (no credit against an inf)."""
    return (isinstance(got, (int, float)) and not isinstance(got, bool) and math.isfinite(got)
            and isinstance(want, (int, float)) and math.isfinite(want) and abs(got - want) <= TOLERANCE + 1e-9)


def is_answer(family: str, got, params: dict) -> bool:
    """`got` has the shape of a `family` answer: finite numbers, keyed by group or by exactly k candidate columns."""
    finite = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if family == "filtered_median":
        return finite(got)
    if not isinstance(got, dict) or not got or not all(finite(v) for v in got.values()):
        return False
    return family == "group_mean" or (len(got) == params["k"] and set(got) <= set(params["candidates"]))


def answer_score(family: str, got, want) -> float:
    """The task metric, 0–1, of an answer `got` (decoded JSON, any shape) against the host's `want`.

    group_mean: the fraction of groups (of either answer) whose mean is right; filtered_median: 1 when right, else 0;
    top_corr: 0 unless exactly k columns are named, else the fraction of the host's k columns named with the right r.
    Right: within `TOLERANCE`. An answer the brief gives away (every candidate, a constant) scores about 0.
    """
    if family == "group_mean":
        if not isinstance(got, dict) or not want:
            return 0.0
        keys = set(got) | set(want)
        return sum(k in got and k in want and _close(got[k], want[k]) for k in keys) / len(keys)
    if family == "filtered_median":
        return float(_close(got, want))
    if family == "top_corr":
        if not isinstance(got, dict) or len(got) != len(want) or not want:
            return 0.0
        return sum(k in got and _close(got[k], want[k]) for k in want) / len(want)
    raise ValueError(f"tabular: unknown task family {family!r}; known: {TASK_FAMILIES}")


def answer_phrases(family: str, answer) -> list[str]:
    """What a report must state of the answer: 'level: mean' per group, the median, or 'column: r' per column.

    Numbers with two decimals."""
    if family == "filtered_median":
        return [f"{answer:.2f}"]
    return [f"{g}: {v:.2f}" for g, v in answer.items()]


def _key(row: Sequence[str]) -> tuple:
    """A record as its cells compare: id and category as text, numeric cells as numbers (text when not one)."""
    return tuple(row[:2]) + tuple(c if number(c) is None else number(c) for c in row[2:])


def drawn_from(table: Table, header: Sequence[str], rows: Sequence[Sequence[str]]) -> bool:
    """`rows` under `header` are a cleaning of `table` (a clean table that a replay may trust).

    Its header, raw records only (each at most as often as the raw table has it, numbers compared as numbers) and
    every record the cleaning rule keeps."""
    if list(header) != list(table.header):
        return False
    raw, got = collections.Counter(map(_key, table.rows)), collections.Counter(map(_key, rows))
    kept = collections.Counter(map(_key, clean(table.header, table.rows)[0]))
    return not got - raw and not kept - got


def _draw(family: str, rng: random.Random, vocab: Vocabulary) -> tuple[list[str], list[list[float | str]], dict]:
    """Header, clean records (id, level, numbers) and the analysis parameters of one table."""
    category = rng.choice(vocab.categories)
    names = rng.sample(vocab.numeric, 4)
    levels = rng.sample(vocab.levels, 3)
    n = rng.randint(24, 34)
    cols = [[rng.uniform(0.0, 10.0) for _ in range(n)] for _ in names]
    groups = [levels[i % 3] for i in range(n)]
    rng.shuffle(groups)
    if family == "group_mean":
        centre = {g: rng.uniform(10.0, 50.0) for g in levels}
        cols[0] = [centre[g] + rng.gauss(0.0, 3.0) for g in groups]
        params = {"group": category, "value": names[0]}
    elif family == "filtered_median":
        mu, sd = rng.uniform(20.0, 60.0), rng.uniform(2.0, 5.0)
        cols[0] = [rng.gauss(mu, sd) for _ in range(n)]
        for i in rng.sample(range(1, n), 3):
            cols[0][i] = mu + rng.choice((-1, 1)) * rng.uniform(15.0, 30.0) * sd
        params = {"value": names[0], "mad_k": MAD_K}
    elif family == "top_corr":
        weights = [rng.choice((-1.0, 1.0)) * w for w in (2.0, 1.0, 0.25)]
        rng.shuffle(weights)
        cols[0] = [sum(w * c[i] for w, c in zip(weights, cols[1:])) + rng.gauss(0.0, 1.5) for i in range(n)]
        params = {"target": names[0], "candidates": names[1:], "k": TOP_K}
    else:
        raise ValueError(f"tabular: unknown task family {family!r}; known: {TASK_FAMILIES}")
    rows = [[f"r{i + 1:03d}", groups[i]] + [round(c[i], 2) for c in cols] for i in range(n)]
    return ["id", category] + names, rows, params


def _defects(rows: list[list[str]], variant: str, rng: random.Random) -> list[list[str]]:
    """The raw records of `variant`, with its defects.

    Invalid cells first (1-4, never in the first record), then exact copies of 1-3 valid records inserted after their
    originals: how many varies, so the variant's name does not give the profile's counts.
    """
    rows = [list(r) for r in rows]
    if variant in ("missing", "mixed"):
        for i in rng.sample(range(1, len(rows)), rng.randint(1, 4)):
            rows[i][rng.randrange(2, len(rows[i]))] = rng.choice(MISSING)
    if variant in ("duplicates", "mixed"):
        valid = [i for i, r in enumerate(rows) if is_valid(r, len(r))]
        for i in sorted(rng.sample(valid, rng.randint(1, 3)), reverse=True):
            rows.insert(rng.randint(i + 1, len(rows)), list(rows[i]))
    return rows


def generate(family: str, seed: int, variant: str, vocab: Vocabulary) -> tuple[Table, dict]:
    """The raw table and analysis parameters of (family, seed, variant) from `vocab`, deterministic.

    Redraws (a sub-seed at a time) until the answer is well posed on the cleaned table: every group keeps ≥ 3
    rows; the |r| of the top_corr candidates differ by ≥ 0.05 (no near ties).

    Raises:
      ValueError: an unknown family or variant.
    """
    if variant not in VARIANTS:
        raise ValueError(f"tabular: unknown variant {variant!r}; known: {VARIANTS}")
    for attempt in range(100):
        rng = random.Random(f"tabular/{family}/{seed}/{variant}/{attempt}")
        header, records, params = _draw(family, rng, vocab)
        rows = _defects([[f"{c:.2f}" if isinstance(c, float) else str(c) for c in r] for r in records], variant, rng)
        kept, _ = clean(header, rows)
        if family == "group_mean":
            gi = header.index(params["group"])
            if min(sum(r[gi] == g for r in kept) for g in {r[gi] for r in records}) < 3:
                continue
        if family == "top_corr":
            r = sorted(abs(v) for v in correlations(header, kept, params["target"], params["candidates"]).values())
            if min(b - a for a, b in zip(r, r[1:])) < 0.05:
                continue
        return Table(tuple(header), tuple(tuple(r) for r in rows)), params
    raise RuntimeError(f"tabular: no well-posed table for {family}/{seed}/{variant} in 100 draws")
