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
