"""Held-out suite: disjoint seeds/templates/ids/paths from training tasks; manifest; expert ≥ 90 per track."""

import json

import pytest

from bat_jax.benchmark.scoring import aggregate, overall_score
from bat_jax.benchmarks.imaging.heldout import (
    HELDOUT_SEED_BASE, heldout_suite, manifest, manifest_strings, training_task, write_manifest)
from bat_jax.rollout.play import play
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.registry import TRACKS
from bat_jax.benchmarks.imaging.stages import STAGES
from bat_jax.benchmarks.imaging.teacher import DoNothingPolicy, RandomCommandPolicy, ScriptedExpert

IMAGING = ImagingBenchmark()


@pytest.fixture(scope="module")
def suite():
    return heldout_suite(n_per_track=1, variants=("success", "recovery"))


def test_suite_covers_every_track_with_heldout_seeds(suite):
    assert sorted({t.track for t in suite}) == sorted(TRACKS) and len(suite) == 14
    assert all(t.seed >= HELDOUT_SEED_BASE for t in suite)
    assert len({t.task_id for t in suite}) == 14
    assert heldout_suite(1, ("success",), tracks=["vqa"])[0].files == \
        [t for t in suite if t.track == "vqa" and t.variant == "success"][0].files


def test_training_tasks_are_disjoint_from_the_manifest(suite):
    held = manifest_strings(manifest(suite))
    train = [training_task(TRACKS[t.track], seed=t.seed - HELDOUT_SEED_BASE, variant=t.variant,
                           template=t.seed % 2) for t in suite]
    train_man = manifest(train)
    assert not held & manifest_strings(train_man)
    # no held-out string occurs anywhere in a training workspace (brief, manifests, method files)
    blob = "\n".join(data.decode("latin-1") for t in train for data in t.files.values())
    assert not [s for s in held if s in blob]
    assert all(t.task_id.startswith("hx-") for t in suite) and all(t.task_id.startswith("tr-") for t in train)
    assert all(p.startswith(("study/", "tools/", "task.md")) for t in suite for p in t.files)


def test_training_task_guards():
    with pytest.raises(ValueError, match="training seed"):
        training_task(TRACKS["vqa"], HELDOUT_SEED_BASE + 1)
    with pytest.raises(ValueError, match="reserved"):
        training_task(TRACKS["vqa"], 1, template=2)


def test_manifest_lists_ids_paths_questions_answers_reports(suite, tmp_path):
    man = write_manifest(tmp_path / "m" / "heldout.json", suite)
    assert json.loads((tmp_path / "m" / "heldout.json").read_text())["version"] == man["version"]
    assert not [p for p in (tmp_path / "m").iterdir() if p.name.startswith(".manifest")]
    by_track = {t["track"]: t for t in man["tasks"]}
    vqa_case = by_track["vqa"]["cases"][0]
    assert {"case_id", "file", "question", "answer"} <= set(vqa_case)
    assert "report_text" in by_track["report"]["cases"][0]
    seg = by_track["segmentation"]
    assert seg["cases"][0]["file"] in seg["paths"] and "task.md" in seg["paths"]


@pytest.mark.slow
def test_expert_scores_at_least_90_on_every_track_and_baselines_at_most_10(suite):
    expert, nothing, random_cells = [], [], []
    for k, inst in enumerate(suite):
        expert.append(play(IMAGING, inst, ScriptedExpert()).score.to_cell(inst.track, k, STAGES))
        nothing.append(play(IMAGING, inst, DoNothingPolicy()).score.to_cell(inst.track, k, STAGES))
        random_cells.append(play(IMAGING, inst, RandomCommandPolicy(seed=k, n_turns=4)).score.to_cell(inst.track, k,
                                                                                                    STAGES))
    summary = aggregate(expert, STAGES)
    for name, row in summary.tracks.items():
        assert row["overall"] >= 0.90, (name, row)
    for cells in (nothing, random_cells):
        assert all(overall_score(c.task, c.agentic(STAGES)) <= 0.10 for c in cells)


def test_leakage_scanner_accepts_training_content_and_flags_heldout_content(suite):
    leakage = pytest.importorskip("bat_jax.stage_bank.leakage")
    scanner = leakage.LeakageScanner(leakage.HeldOutManifest.from_task_manifest(manifest(suite)))
    train = [training_task(TRACKS[t.track], seed=t.seed - HELDOUT_SEED_BASE, variant=t.variant) for t in suite]
    for inst in train:
        for path, data in inst.files.items():
            assert scanner.scan_text(path + "\n" + data.decode("latin-1")) == [], (inst.task_id, path)
    held = next(t for t in suite if t.track == "vqa")
    hits = scanner.scan_text(held.files[held.layout.cases_csv].decode())
    assert hits and {kind for kind, _ in hits} >= {"case_id", "question"}
