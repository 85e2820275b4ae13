"""The staged-benchmark contract (bat_jax/staged_benchmark/contract.py): bad definitions fail at launch, before any
work, with an error naming the benchmark and the field; derived row text follows the benchmark's stages."""

import dataclasses
import pathlib
import sys

import pytest

from bat_jax.benchmark.stages import StageSet
from bat_jax.staged_benchmark.contract import BenchmarkError, describe
from bat_jax.verify.rubric import Rubric, RubricItem

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent / "fixtures" / "wordcount"))
import wordcount  # noqa: E402  (the example benchmark that lives outside bat_jax)

GOOD = wordcount.WordCountBenchmark()


class _Broken(wordcount.WordCountBenchmark):
    """The example with one part replaced (set per test)."""

    name = "broken"


def test_the_example_describes_itself():
    assert describe(GOOD) == {
        "name": "wordcount", "stages": [{"id": "count", "title": "Count", "weight": 0.6},
                                        {"id": "submit", "title": "Submit", "weight": 0.4}],
        "tracks": {"count": "exact count (1 or 0)"}, "variants": ["success"], "late_stages": [],
        "teachers": ["scripted"], "has_e2e_surrogate": False}


def test_weights_that_do_not_sum_to_one_name_the_benchmark():
    class Weights(_Broken):
        @property
        def stages(self):
            return StageSet.of([("count", "Count", 0.6), ("submit", "Submit", 0.5)], "broken")

    with pytest.raises(BenchmarkError, match=r"benchmark 'broken': stages: weights must sum to 1.*count=0.6"):
        Weights().validate()


@pytest.mark.parametrize("specs, message", [
    ([("count", "Count", 0.5), ("count", "Again", 0.5)], r"duplicate stage ids \['count'\]"),
    ([("count", "Count", 0.5), ("", "Empty", 0.5)], "stage id '' must be a non-empty string"),
    ([("count", "Count", 1.0)], "at least 2 stages"),
])
def test_bad_stage_ids_name_the_benchmark(specs, message):
    class Ids(_Broken):
        @property
        def stages(self):
            return StageSet.of(specs, "broken")

    with pytest.raises(BenchmarkError, match=rf"benchmark 'broken'.*{message}"):
        Ids().validate()


def test_a_rubric_item_of_a_stage_it_does_not_have_is_refused():
    class Item(_Broken):
        def rubric(self, task):
            base = super().rubric(task)
            extra = RubricItem("review.done", "review", "reviewed", ("file.count",), lambda ev: True)
            return Rubric(base.items + (extra,), base.requirements, base.stages)

    with pytest.raises(BenchmarkError, match=r"benchmark 'broken': rubric of task family 'count': rubric item "
                                             r"'review.done' is tagged with stage 'review'.*\['count', 'submit'\]"):
        Item().validate()


def test_a_stage_without_items_a_family_without_a_metric_and_an_unknown_late_stage_are_refused():
    class Bare(_Broken):
        def rubric(self, task):
            base = super().rubric(task)
            return dataclasses.replace(base, items=tuple(i for i in base.items if i.stage == "count"))

    with pytest.raises(BenchmarkError, match=r"task family 'count' has no rubric item for stages \['submit'\]"):
        Bare().validate()

    class Metric(_Broken):
        @property
        def tracks(self):
            return {"count": "exact count", "spell": ""}

    with pytest.raises(BenchmarkError, match=r"task family 'spell' has no task metric \(tracks\['spell'\]\)"):
        Metric().validate()

    class Late(_Broken):
        late_stages = ("review",)

    with pytest.raises(BenchmarkError, match=r"late_stages \['review'\] are not among its stages"):
        Late().validate()


def test_a_missing_heldout_suite_is_refused():
    class NoHeldOut(_Broken):
        def heldout_suite(self, n_per_track, variants, suite_seed, tracks=None):
            return []

    with pytest.raises(BenchmarkError, match="benchmark 'broken': its held-out suite is empty"):
        NoHeldOut().validate()


def test_a_teacher_that_tags_another_stage_stops_the_factory(tmp_path):
    from bat_jax.sandbox.tools import Action
    from bat_jax.stage_bank.factory import FactoryConfig, build_bank

    class Teacher(_Broken):
        def teacher(self, kind, endpoint=None):
            return lambda conversation: (Action("Review.", "execute_code", {"language": "bash", "code": "true"},
                                                "review") if not conversation.turns else None)

    with pytest.raises(BenchmarkError, match=r"benchmark 'broken', teacher 'scripted' on task tr-count-\d+: the policy "
                                             r"tagged an action with stage 'review', which benchmark 'wordcount'"):
        build_bank(FactoryConfig(bank_dir=str(tmp_path / "bank"), foci=("E2E",), workers=1), Teacher(),
                   progress=False)
    assert not (tmp_path / "bank" / "versions").exists() or not list((tmp_path / "bank" / "versions").iterdir())


def test_row_prompt_and_skill_follow_the_benchmarks_stages():
    task = GOOD.training_task("count", 1, "success")
    assert GOOD.row_prompt(task, "E2E") == task.brief
    assert GOOD.row_prompt(task, "submit").endswith(
        "## Current stage\nYou start at the boundary of stage submit Submit. Stages already completed in this "
        "workspace: count Count. Do the work of submit only, then stop.\n")
    assert GOOD.row_skill("E2E") == GOOD.stage_skill("count") + "\n\n" + GOOD.stage_skill("submit")
    with pytest.raises(BenchmarkError, match=r"RL row 3: focus 'S3' is not a stage of benchmark 'wordcount'"):
        GOOD.check_focus("S3", "RL row 3")


@pytest.mark.parametrize("value", [float("nan"), 1.7, "1.0"])
def test_a_task_metric_outside_0_1_is_refused_at_launch_naming_score_task(value):
    class Metric(_Broken):
        def score_task(self, task, files, submitted, limits):
            return value

    with pytest.raises(BenchmarkError) as e:
        Metric().validate()
    assert str(e.value) == (f"benchmark 'broken': score_task returned {value!r} for task 'tr-count-0' (submitted "
                            f"None); it must return None or a number in [0, 1]")


def test_a_bad_task_metric_during_the_run_is_the_benchmarks_error_not_the_agents():
    """After launch (a metric that goes wrong on a submitted answer only), scoring an episode raises `MetricError`:
    a `ScorerError` (the reward code never scores it 0) that launch prints as one line (a `ConfigError`)."""
    from bat_jax.errors import ConfigError
    from bat_jax.staged_benchmark.contract import MetricError
    from bat_jax.verify.rubric import Evidence, ScorerError

    class Late(_Broken):
        def score_task(self, task, files, submitted, limits):
            return 1.7 if submitted else 0.0

    bench, task = Late(), GOOD.training_task("count", 5, "success")
    bench.validate()
    assert bench.score_episode(task, Evidence((), {}, None)).task == 0.0
    with pytest.raises(MetricError) as e:
        bench.score_episode(task, Evidence((), {"count.json": b"{}"}, "count.json"))
    assert isinstance(e.value, ScorerError) and isinstance(e.value, ConfigError)
    assert str(e.value) == ("benchmark 'broken': score_task returned 1.7 for task 'tr-count-5' (submitted "
                            "'count.json'); it must return None or a number in [0, 1]")


def test_a_score_task_that_raises_on_the_starting_workspace_is_refused():
    class Raises(_Broken):
        def score_task(self, task, files, submitted, limits):
            return float(files["count.json"] == b"x")

    with pytest.raises(BenchmarkError) as e:
        Raises().validate()
    assert str(e.value) == ("benchmark 'broken': score_task raised KeyError: 'count.json' on the starting workspace "
                            "of task 'tr-count-0' (no call has run); it must return 0 or None when the answer is "
                            "missing")


def test_a_class_missing_a_method_is_refused_naming_it():
    from bat_jax.staged_benchmark.contract import StagedBenchmark

    body = {k: v for k, v in vars(wordcount.WordCountBenchmark).items()
            if not k.startswith("__") and k != "heldout_suite"}
    no_suite = type("NoSuite", (StagedBenchmark,), {**body, "__module__": __name__})
    with pytest.raises(BenchmarkError) as e:
        no_suite()
    assert str(e.value) == ("benchmark 'wordcount' (test_staged_benchmark_contract.NoSuite) does not implement "
                            "heldout_suite (abstract methods of StagedBenchmark)")


@pytest.mark.parametrize("manifest, message", [
    (lambda tasks: [{"task_id": t.task_id} for t in tasks],
     "manifest(tasks) must return a dict {'tasks': [{'task_id': str, 'paths': [str], 'cases': [dict]}]}, got a list"),
    (lambda tasks: {"ids": [t.task_id for t in tasks]},
     "manifest(tasks)['tasks'] must be a non-empty list of task entries {'tasks': [{'task_id': str, 'paths': [str], "
     "'cases': [dict]}]}, got None"),
    (lambda tasks: {"tasks": [{"task_id": t.task_id, "paths": "words.txt"} for t in tasks]},
     "manifest(tasks)['tasks'][0]['paths'] must be a list of path strings, got 'words.txt'"),
    (lambda tasks: {"tasks": [{"id": t.task_id} for t in tasks]},
     "manifest(tasks)['tasks'][0] must be a dict with a non-empty 'task_id' string, got {'id': 'hx-count-1000000'}"),
    (lambda tasks: {"tasks": [{"task_id": "hx-other"}]},
     "manifest(tasks) has no entry for held-out tasks ['hx-count-1000000'] (each task's 'task_id')"),
])
def test_a_malformed_manifest_is_refused_naming_the_field(manifest, message):
    class Manifest(_Broken):
        def manifest(self, tasks):
            return manifest(list(tasks))

    with pytest.raises(BenchmarkError) as e:
        Manifest().validate()
    assert str(e.value) == f"benchmark 'broken': {message}"


def test_a_rubric_check_with_a_misspelt_evidence_name_is_refused_a_failing_read_is_not():
    """A check may raise on a missing file (a failed check, as `verify.rubric` scores it); an AttributeError of the
    evidence itself would fail every episode."""
    from bat_jax.verify.rubric import RubricItem

    class Typo(_Broken):
        def rubric(self, task):
            base = super().rubric(task)
            typo = RubricItem("count.typo", "count", "typo", ("file.count",), lambda ev: ev.file["count.json"] == b"")
            return dataclasses.replace(base, items=base.items + (typo,))

    with pytest.raises(BenchmarkError) as e:
        Typo().validate()
    assert str(e.value) == ("benchmark 'broken': rubric item 'count.typo' check raised AttributeError: 'Evidence' "
                            "object has no attribute 'file' on the starting workspace of task 'tr-count-0' (no call "
                            "has run); what a check receives: bat_jax.staged_benchmark.api.Evidence")

    class Missing(_Broken):
        def rubric(self, task):
            base = super().rubric(task)
            read = RubricItem("count.read", "count", "read", ("file.count",), lambda ev: ev.files["count.json"] == b"")
            return dataclasses.replace(base, items=base.items + (read,))

    Missing().validate()  # KeyError on the starting workspace: the item fails there, as it should


def test_a_benchmark_may_declare_its_own_sandbox_packages_and_a_bad_name_is_refused():
    from bat_jax.sandbox import images

    assert GOOD.sandbox_packages is None and GOOD.sandbox_image() is None  # the shared image

    class Own(_Broken):
        sandbox_packages = ("python3", "python3-pandas")

    assert Own().sandbox_image() == images.task_tag(pkgs=("python3", "python3-pandas")) != images.task_tag()
    Own().validate()

    class Bad(_Broken):
        sandbox_packages = ("python3", "pandas>=2")

    with pytest.raises(BenchmarkError, match=r"benchmark 'broken': sandbox_packages: .*'pandas>=2'"):
        Bad().validate()
