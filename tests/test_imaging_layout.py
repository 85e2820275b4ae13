"""Workspace layouts (bat_jax/benchmarks/imaging/layout.py): the fixed training and held-out layouts, the brief's path
lines rendered and parsed back, and seed-drawn training layouts that never spell a held-out path or prefix."""

import pytest

from bat_jax.benchmarks.imaging.layout import HELDOUT_LAYOUT, TRAIN_LAYOUT, Layout, varied_naming


def test_derived_paths_sit_under_the_outputs_directory():
    assert (TRAIN_LAYOUT.pred_dir, TRAIN_LAYOUT.validation_dir, TRAIN_LAYOUT.validation_json) == (
        "outputs/pred", "outputs/validation", "outputs/validation.json")
    assert (HELDOUT_LAYOUT.env_json, HELDOUT_LAYOUT.submission) == ("results/env.json", "results/submission.json")


def test_the_briefs_path_lines_render_and_parse_back():
    text = HELDOUT_LAYOUT.render()
    lines = text.split("\n")
    assert lines[0] == "- images_dir: `study/scans`" and lines[-1] == "- plan_path: `notes/plan.md`"
    assert Layout.parse("# Task\n\n" + text + "\n\nMore text.") == HELDOUT_LAYOUT
    with pytest.raises(ValueError, match="brief has no path line for 'plan_path'"):
        Layout.parse(text.replace("- plan_path:", "- plan:"))


def test_seed_drawn_layouts_are_pure_vary_and_never_spell_a_held_out_component():
    assert varied_naming(7) == varied_naming(7)
    drawn = [varied_naming(seed) for seed in range(200)]
    assert len({layout for layout, _ in drawn}) > 190 and len({prefix for _, prefix in drawn}) > 100
    held_out = (HELDOUT_LAYOUT.images_dir, HELDOUT_LAYOUT.archive_dir, HELDOUT_LAYOUT.cases_csv,
                HELDOUT_LAYOUT.method_dir, HELDOUT_LAYOUT.outputs_dir, HELDOUT_LAYOUT.plan_path)
    roots = {"study", "tools", "results", "notes"}  # the held-out layout's top-level names
    for layout, prefix in drawn:
        assert prefix != "hx" and len(prefix) == 2
        paths = (layout.images_dir, layout.archive_dir, layout.cases_csv, layout.method_dir, layout.outputs_dir,
                 layout.plan_path)
        assert not [h for h in held_out for p in paths if h in p], layout
        assert not {p.split("/")[0] for p in paths} & roots, layout
