"""Held-out evaluation suite over the seven tracks, and its manifest for the leakage preflight.

Details: docs/design.md.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable, Sequence

from bat_jax.atomic_io import atomic_write
from bat_jax.benchmarks.imaging.base import TaskInstance, Track
from bat_jax.benchmarks.imaging.brief import HELDOUT_TEMPLATE, N_TEMPLATES, VARIED_TEMPLATES, render_brief, stage_skill
from bat_jax.benchmarks.imaging.layout import HELDOUT_LAYOUT, TRAIN_LAYOUT, varied_naming
from bat_jax.benchmarks.imaging.registry import TRACKS
from bat_jax.benchmarks.imaging.stages import STAGES

HELDOUT_SEED_BASE = 1_000_000_000
HELDOUT_PREFIX = "hx"
TRAIN_PREFIX = "tr"
MANIFEST_VERSION = "bat_heldout_manifest/v1"


def heldout_suite(n_per_track: int = 2, variants: Sequence[str] = ("success", "recovery"),
                  suite_seed: int = 0, tracks: Iterable[str] | None = None) -> list[TaskInstance]:
    """Generates the held-out suite: for each track, `n_per_track` tasks per variant.

    Seeds are HELDOUT_SEED_BASE + 10⁶·suite_seed + 10⁴·track index (registry order) + 100·variant index + k,
    so a task's seed does not depend on which other tracks are requested.

    Raises:
      ValueError: n_per_track outside 1..99 or an unknown track.
    """
    if not 1 <= n_per_track <= 99:
        raise ValueError(f"n_per_track must be in 1..99, got {n_per_track}")
    names = list(tracks) if tracks is not None else list(TRACKS)
    out = []
    for name in names:
        if name not in TRACKS:
            raise ValueError(f"unknown track {name!r}; known: {sorted(TRACKS)}")
        track, ti = TRACKS[name], list(TRACKS).index(name)
        for vi, variant in enumerate(variants):
            for k in range(n_per_track):
                seed = HELDOUT_SEED_BASE + 1_000_000 * suite_seed + 10_000 * ti + 100 * vi + k
                out.append(track.generate(seed, variant, HELDOUT_LAYOUT, HELDOUT_PREFIX, HELDOUT_TEMPLATE))
    return out


def training_task(track: Track, seed: int, variant: str = "success", template: int = 0) -> TaskInstance:
    """A training (Stage Bank) task of a given template.

    TRAIN_LAYOUT and TRAIN_PREFIX with template 0 or 1; with one of `brief.VARIED_TEMPLATES` (10, 11: wording 0, 1) the
    layout and id prefix drawn from the seed (`layout.varied_naming`), so that paths and ids vary from task to task.

    Raises:
      ValueError: a held-out seed, the held-out template or an unknown template.
    """
    if not 0 <= seed < HELDOUT_SEED_BASE:
        raise ValueError(f"training seed must be in [0, {HELDOUT_SEED_BASE}), got {seed}")
    if template == HELDOUT_TEMPLATE:
        raise ValueError(f"template {HELDOUT_TEMPLATE} is reserved for the held-out suite")
    if template in VARIED_TEMPLATES:
        layout, prefix = varied_naming(seed)
        return track.generate(seed, variant, layout, prefix, template)
    return track.generate(seed, variant, TRAIN_LAYOUT, TRAIN_PREFIX, template)


def manifest(instances: Iterable[TaskInstance]) -> dict:
    """Manifest of a suite: per task its id, track, seed, variant, file paths and per-case fields."""
    tasks = []
    for inst in instances:
        track = TRACKS[inst.track]
        cases = []
        for c in inst.cases:
            row = {"case_id": c.case_id, "file": c.file, **{k: v for k, v in c.meta.items()}}
            extra = track.manifest_extra(c)
            row.update({k: v for k, v in extra.items()})
            cases.append(row)
        tasks.append({"task_id": inst.task_id, "track": inst.track, "seed": inst.seed, "variant": inst.variant,
                      "paths": sorted(inst.files), "brief": inst.brief, "cases": cases})
    return {"version": MANIFEST_VERSION, "tasks": tasks}


def manifest_strings(man: dict) -> set[str]:
    """Every identifying string of a manifest (ids, paths, questions, report texts) of length >= 6.

    Answers are left out: they are shared class vocabulary ("melanoma", "yes") that cannot identify held-out content."""
    out: set[str] = set()
    for task in man["tasks"]:
        out.add(task["task_id"])
        out.update(p for p in task["paths"] if p != "task.md")  # the brief's fixed name identifies nothing
        for case in task["cases"]:
            for key in ("case_id", "file", "question", "report_text"):
                value = case.get(key)
                if isinstance(value, str) and len(value) >= 6:
                    out.add(value)
    return out


def write_manifest(path: str | os.PathLike, instances: Iterable[TaskInstance]) -> dict:
    """Writes the manifest as JSON all or nothing (`atomic_io.atomic_write`) and returns it."""
    man = manifest(instances)
    atomic_write(path, json.dumps(man, indent=1, default=str).encode())
    return man


def sample_training_prompt(rng: random.Random) -> str:
    """A training-split first user turn: a brief followed by stage skills, as the agent sees it.

    It uses the training layout and templates only, never the held-out ones. The shipped tiny tokenizer's corpus drew
    from it (`launch/train_tokenizer.py`, `models.tokenizer.generate_corpus`)."""
    track = TRACKS[rng.choice(sorted(TRACKS))]
    template = rng.choice([t for t in range(N_TEMPLATES) if t != HELDOUT_TEMPLATE])
    task_id = f"{TRAIN_PREFIX}-{track.name}-{rng.randint(0, 10**9)}-{rng.choice(['suc', 'rec', 'fail'])}"
    brief = render_brief(track, task_id, TRAIN_LAYOUT, rng.randint(3, 12), template)
    skills = "\n\n".join(stage_skill(s) for s in rng.sample(list(STAGES.ids), rng.randint(1, len(STAGES))))
    return f"{brief}\n\n## Stage skill\n{skills}"
