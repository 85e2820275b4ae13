"""The medical-imaging suite as a staged benchmark (bat_jax/benchmarks/imaging/benchmark.py): its settings' checks,
tracks and variants, source templates, recipes, teachers and its cases-per-task override."""

import dataclasses

import pytest

from bat_jax.clients.chat_endpoint import ChatEndpointConfig
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.portable_expert import PortableExpert
from bat_jax.benchmarks.imaging.teacher import ChatTeacher, ScriptedExpert


def test_settings_are_checked_naming_the_field():
    with pytest.raises(ValueError, match="ImagingBenchmark.layouts must be one of \\('fixed', 'varied'\\), got 'x'"):
        ImagingBenchmark(layouts="x")
    for bad in (1, -2):
        with pytest.raises(ValueError, match=f"cases_per_task must be 0 \\(track default\\) or >= 2, got {bad}"):
            ImagingBenchmark(cases_per_task=bad)
    assert ImagingBenchmark() == ImagingBenchmark(layouts="fixed", cases_per_task=0)  # equal settings, equal objects


def test_tracks_variants_and_stages():
    b = ImagingBenchmark()
    assert sorted(b.tracks) == ["classification", "detection", "enhancement", "report", "segmentation", "synthesis",
                                "vqa"]
    assert b.tracks["classification"] == "accuracy (0-1)"
    assert b.variants == ("success", "recovery", "failure") and b.heldout_variants == ("success", "recovery")
    assert b.stages.ids == ("S1", "S2", "S3", "S4", "S5")
    with pytest.raises(ValueError, match="benchmark 'imaging' has no track 'xray'"):
        b.training_task("xray", 0, "success")


def test_source_template_is_a_digest_hex_digit_mod_two_plus_the_varied_base():
    digest = "0" * 12 + "b" + "0" * 51  # hex digit 12 = 11: odd → wording 1
    assert ImagingBenchmark().source_template(digest) == 1
    assert ImagingBenchmark(layouts="varied").source_template(digest) == 11  # + VARIED_TEMPLATE_BASE 10
    assert ImagingBenchmark().source_template("0" * 12 + "4" + "0" * 51) == 0


def test_recipes_and_teachers():
    fixed, varied = ImagingBenchmark(), ImagingBenchmark(layouts="varied")
    assert fixed.recipe("scripted") == "teacher=scripted layouts=fixed"
    assert varied.recipe("portable") == "teacher=portable/v2 layouts=varied"
    assert isinstance(fixed.teacher("scripted"), ScriptedExpert)
    assert isinstance(fixed.teacher("portable"), PortableExpert)
    assert isinstance(fixed.teacher("openai", ChatEndpointConfig("http://x.invalid/v1", "m")), ChatTeacher)
    with pytest.raises(ValueError, match="the 'openai' teacher needs a ChatEndpointConfig"):
        fixed.teacher("openai")
    with pytest.raises(ValueError, match="benchmark 'imaging' has no teacher 'human'"):
        fixed.teacher("human")


def test_cases_per_task_overrides_the_tracks_case_count():
    default = ImagingBenchmark().training_task("vqa", 3, "success")
    three = dataclasses.replace(ImagingBenchmark(), cases_per_task=3).training_task("vqa", 3, "success")
    assert len(default.cases) == 6 and len(three.cases) == 3
    assert default.task_id == three.task_id
