"""Tasks of the tabular suite.

The workspace paths, briefs and stage skills, training tasks, and the held-out suite with its manifest (the stages:
`stages.py`).

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterable, Sequence

from bat_jax.sandbox.types import SandboxState
from bat_jax.benchmarks.tabular import tables
from bat_jax.benchmarks.tabular.stages import STAGES
from bat_jax.benchmarks.tabular.tables import TASK_FAMILIES, VARIANTS, Table

#: Workspace paths every brief names (the same for training and held-out tasks).
RAW = "data/raw.csv"
INSPECT = "work/inspect.json"
CLEAN_CSV = "work/clean.csv"
CLEAN_LOG = "work/clean.json"
RESULT = "work/result.json"
REPORT = "work/report.md"

#: Training seeds are < this; held-out seeds are not.
HELDOUT_SEED_BASE = 1_000_000_000
MANIFEST_VERSION = "tabular_heldout/v1"

QUESTIONS = {
    "group_mean": "the mean of `{value}` for each level of `{group}`",
    "filtered_median": ("the median of `{value}` after dropping outliers: values more than {mad_k:g} median "
                        "absolute deviations from the median of `{value}`"),
    "top_corr": "the Pearson correlation with `{target}` of the {k} columns of {candidates} whose correlation is "
                "largest in absolute value (an object {{column: r}} of exactly {k} columns)",
}

SKILLS = {
    "inspect": (f"Stage inspect: read task.md and {RAW}; count records, records whose id appeared earlier and "
                f"invalid records; write {INSPECT}."),
    "clean": (f"Stage clean: apply the cleaning rule to {RAW}; write the kept records (with the header) to "
              f"{CLEAN_CSV} and the counts to {CLEAN_LOG}."),
    "analyse": (f"Stage analyse: read {CLEAN_CSV}, answer the question, write {RESULT} as {{\"answer\": ...}} "
                "(numbers right to 2 decimals)."),
    "report": (f"Stage report: read {RESULT}; write {REPORT} (task id, 'N rows kept', the answer with 2 decimals as "
               f"'name: value' per group or column; no other number), then submit {RESULT}."),
}


def stage_skill(stage: str) -> str:
    """The public skill κ of a stage id. Raises ValueError for a stage the suite does not have."""
    return SKILLS[STAGES.parse(stage)]


def render_brief(task_id: str, family: str, params: dict) -> str:
    """The public task text (`task.md`): the question, its parameters as one JSON line, the rule and the outputs."""
    question = QUESTIONS[family].format(**params)
    return (f"# Task {task_id}\nTask id: {task_id}\n"
            f"Table: {RAW} (columns: id, a category, then numbers).\n"
            f"Question: {question}.\n"
            f"Parameters: {json.dumps({'family': family, **params})}\n"
            "Cleaning rule: drop a record whose id appeared earlier (keep the first), then any record with an "
            "empty category or a numeric cell that is not a number.\n"
            f"Write: {INSPECT} {{rows, columns, duplicate_ids, invalid_rows}} of the raw table; {CLEAN_CSV} and "
            f"{CLEAN_LOG} {{kept, dropped_duplicates, dropped_invalid}}; {RESULT} {{\"answer\": ...}}; {REPORT} "
            "(the task id, 'N rows kept' and the answer to 2 decimals, no other number). "
            f"Submit {RESULT}.\n")


@dataclasses.dataclass(frozen=True)
class TabularTask:
    """One task: the raw table, the question's parameters (JSON) and the host's answers (never shown)."""

    task_id: str
    track: str
    seed: int
    variant: str
    brief: str
    table: Table
    params_json: str

    @property
    def params(self) -> dict:
        return json.loads(self.params_json)

    def state(self) -> SandboxState:
        """The initial workspace: the brief and the raw table."""
        return SandboxState({"task.md": self.brief.encode(), RAW: self.table.csv_bytes()})

    @functools.cached_property
    def profile(self) -> dict:
        """The host's profile of the raw table (`tables.profile`)."""
        return tables.profile(self.table.header, self.table.rows)

    @functools.cached_property
    def cleaned(self) -> tuple[list[list[str]], dict]:
        """The host's cleaned rows and cleaning log (`tables.clean`)."""
        return tables.clean(self.table.header, self.table.rows)

    @functools.cached_property
    def answer(self):
        """The host's answer on the cleaned table (`tables.analyse`)."""
        return tables.analyse(self.track, self.table.header, self.cleaned[0], self.params)


def make_task(family: str, seed: int, variant: str) -> TabularTask:
    """The task of (family, seed, variant): a held-out or a training one by its seed.

    A held-out one ('ho-' id, held-out vocabulary) when seed ≥ `HELDOUT_SEED_BASE`, else a training one ('tr-'). Raises
    ValueError for an unknown family, variant or a negative seed."""
    if family not in TASK_FAMILIES:
        raise ValueError(f"benchmark 'tabular' has no task family {family!r}; known: {TASK_FAMILIES}")
    if variant not in VARIANTS:
        raise ValueError(f"benchmark 'tabular' has no variant {variant!r}; known: {VARIANTS}")
    if seed < 0:
        raise ValueError(f"benchmark 'tabular': task seeds are >= 0, got {seed}")
    heldout = seed >= HELDOUT_SEED_BASE
    table, params = tables.generate(family, seed, variant, tables.HELDOUT_VOCAB if heldout else tables.TRAIN_VOCAB)
    task_id = f"{'ho' if heldout else 'tr'}-{family}-{seed}-{variant}"
    return TabularTask(task_id, family, seed, variant, render_brief(task_id, family, params), table,
                       json.dumps(params))


def training_task(family: str, seed: int, variant: str, template: int = 0) -> TabularTask:
    """A training task. Raises ValueError for a held-out seed, a template other than 0, or unknown names."""
    if not 0 <= seed < HELDOUT_SEED_BASE:
        raise ValueError(f"benchmark 'tabular': training seeds are in [0, {HELDOUT_SEED_BASE}), got {seed}")
    if template != 0:
        raise ValueError(f"benchmark 'tabular' has one brief template (0), got {template}")
    return make_task(family, seed, variant)


def heldout_suite(n_per_track: int, variants: Sequence[str], suite_seed: int,
                  tracks: Iterable[str] | None = None) -> list[TabularTask]:
    """`n_per_track` held-out tasks per variant of each family.

    Families come in `TASK_FAMILIES` order, or `tracks`. `suite_seed` selects a disjoint block of seeds (100,000 per
    suite seed)."""
    families = tuple(tracks) if tracks is not None else TASK_FAMILIES
    base = HELDOUT_SEED_BASE + 100_000 * suite_seed
    return [make_task(f, base + 1000 * fi + 100 * vi + k, v)
            for fi, f in enumerate(families) for vi, v in enumerate(variants) for k in range(n_per_track)]


def manifest(tasks: Iterable[TabularTask]) -> dict:
    """The held-out manifest: each task's id (also its one case id), family, seed and variant.

    Paths and brief texts are shared with training tasks by design and identify nothing, so they are not markers."""
    return {"version": MANIFEST_VERSION,
            "tasks": [{"task_id": t.task_id, "track": t.track, "seed": t.seed, "variant": t.variant, "paths": [],
                       "cases": [{"case_id": t.task_id}]} for t in tasks]}
