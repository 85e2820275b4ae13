"""Seed-drawn training layouts and ids: paths and ids vary widely between training tasks and never
spell a held-out path or id; the factory, the reward's task rebuild and the scripted expert all follow them."""

import dataclasses
import types

import pytest

from bat_jax.stage_bank.factory import FactoryConfig, sources
from bat_jax.stage_bank.leakage import HeldOutManifest, LeakageScanner
from bat_jax.benchmarks.imaging.brief import VARIED_TEMPLATES
from bat_jax.benchmarks.imaging.heldout import (HELDOUT_SEED_BASE, heldout_suite, manifest, manifest_strings,
                                                training_task)
from bat_jax.benchmarks.imaging.layout import HELDOUT_LAYOUT, TRAIN_LAYOUT, Layout, varied_naming
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.registry import TRACKS
from bat_jax.benchmarks.imaging.stages import STAGES


def test_varied_naming_is_a_pure_function_of_the_seed_and_varies_widely():
    drawn = [varied_naming(seed) for seed in range(300)]
    assert drawn == [varied_naming(seed) for seed in range(300)]
    for field in ("images_dir", "cases_csv", "archive_dir"):
        assert len({getattr(layout, field) for layout, _ in drawn}) >= 200, field
    for field in ("method_dir", "outputs_dir", "plan_path"):
        assert len({getattr(layout, field) for layout, _ in drawn}) >= 20, field
    assert len({prefix for _, prefix in drawn}) >= 150
    assert sum(layout.cases_csv == TRAIN_LAYOUT.cases_csv for layout, _ in drawn) == 0


def _parts(layout: Layout) -> set[str]:
    return {p for value in dataclasses.asdict(layout).values() for p in value.replace(".", "/").split("/")}


def test_varied_names_never_hold_a_heldout_component_or_prefix():
    # held-out names the fixed training layout does not already share (it shares 'method', 'plan', 'csv', 'md')
    held = _parts(HELDOUT_LAYOUT) - _parts(TRAIN_LAYOUT)
    assert held == {"study", "scans", "backup", "manifest", "tools", "results", "notes"}
    for seed in range(2000):
        layout, prefix = varied_naming(seed)
        assert prefix != "hx" and len(prefix) == 2
        assert not _parts(layout) & held, (seed, _parts(layout) & held)


def test_varied_training_tasks_are_disjoint_from_the_heldout_manifest():
    suite = heldout_suite(n_per_track=1, variants=("success", "recovery"))
    held = manifest_strings(manifest(suite))
    scanner = LeakageScanner(HeldOutManifest.from_task_manifest(manifest(suite)))
    train = [training_task(TRACKS[t.track], seed=t.seed - HELDOUT_SEED_BASE, variant=t.variant,
                           template=VARIED_TEMPLATES[t.seed % 2]) for t in suite]
    assert not held & manifest_strings(manifest(train))
    blob = "\n".join(data.decode("latin-1") for t in train for data in t.files.values())
    assert not [s for s in held if s in blob]
    for inst in train:
        assert not inst.task_id.startswith("hx")
        for path, data in inst.files.items():
            assert scanner.scan_text(path + "\n" + data.decode("latin-1")) == [], (inst.task_id, path)
    assert len({t.layout for t in train}) == len(train)


def test_a_varied_task_states_its_own_paths_and_ids_in_its_brief():
    inst = training_task(TRACKS["segmentation"], 7, "recovery", template=10)
    layout, prefix = varied_naming(7)
    assert inst.layout == layout == Layout.parse(inst.brief)
    assert inst.task_id == f"{prefix}-seg-00000007-rec" and f"Task id: {inst.task_id}" in inst.brief
    assert all(cid.startswith(prefix) for cid in inst.case_ids)
    assert all(c.file.startswith(layout.images_dir + "/" + prefix) for c in inst.cases)
    assert inst.brief.split("\n")[2].startswith("You are an imaging research assistant")  # wording of template 0
    with pytest.raises(ValueError, match="template"):
        training_task(TRACKS["vqa"], 1, template=12)


def test_factory_sources_use_varied_templates_and_the_reward_rebuilds_the_same_task():
    from bat_jax.stage_bank.slicing import transformation
    from bat_jax.bicurl.reward import row_task

    cfg = FactoryConfig(tracks=("vqa",), outcomes=("recovery",), foci=("E2E", "S3"))
    varied = ImagingBenchmark(layouts="varied")
    grid = sources(cfg, varied)
    assert {s.template for s in grid} <= set(VARIED_TEMPLATES)
    assert [s.template - 10 for s in grid] == [s.template for s in sources(cfg, ImagingBenchmark(layouts="fixed"))]
    src = grid[1]
    inst = training_task(TRACKS["vqa"], src.task_seed, src.outcome, src.template)
    prov = types.SimpleNamespace(track="vqa", transformations=(
        transformation("task_synthesis", seed=src.task_seed, variant=src.outcome, template=src.template),))
    rebuilt = row_task(types.SimpleNamespace(state_id="s", provenance=prov), varied)
    assert rebuilt.state().digest() == inst.state().digest() and rebuilt.layout == inst.layout
    with pytest.raises(ValueError, match="layouts"):
        dataclasses.replace(varied, layouts="random")


def test_the_scripted_expert_solves_a_varied_task():
    from bat_jax.benchmark.scoring import overall_score
    from bat_jax.rollout.play import play
    from bat_jax.benchmarks.imaging.teacher import ScriptedExpert

    for track, seed in (("segmentation", 11), ("vqa", 12)):
        inst = training_task(TRACKS[track], seed, "recovery", template=11)
        cell = play(ImagingBenchmark(layouts="varied"), inst, ScriptedExpert()).score.to_cell(track, 0, STAGES)
        assert overall_score(cell.task, cell.agentic(STAGES)) >= 0.9, (track, cell)
