"""The tabular suite's scripted teacher: on the local backend (and in Docker) its trajectory passes every rubric item
of every family and variant, held-out tasks included, from the start and from a stage boundary; its action texts are
the same for every task; a teacher that keeps duplicate records, a guess written without reading the clean table and
a policy that does nothing fail the items that rest on the work they skipped."""

import itertools
import json

import pytest

from bat_jax.rollout.play import play
from bat_jax.sandbox.tools import Action
from bat_jax.benchmarks.tabular import tables
from bat_jax.benchmarks.tabular.benchmark import TabularBenchmark
from bat_jax.benchmarks.tabular.tasks import RESULT, heldout_suite
from bat_jax.benchmarks.tabular.teacher import CLEAN, PREAMBLE, SCRIPT, ScriptedTeacher, _code, shared_span

BENCH = TabularBenchmark()
PERFECT = {"inspect": 1.0, "clean": 1.0, "analyse": 1.0, "report": 1.0}


class WrongTeacher(ScriptedTeacher):
    """Keeps records whose id appeared earlier (the cleaning rule half applied)."""

    script = {**SCRIPT, "clean": (_code("clean", CLEAN.replace("    if rec[0] in seen:", "    if False:")),)}


def _failed(result) -> dict:
    return {s: sorted(k for k, ok in v.items.items() if not ok) for s, v in result.score.verdicts.items()}


@pytest.mark.parametrize("family", tables.TASK_FAMILIES)
def test_the_teacher_passes_every_item_of_every_variant(family):
    for variant in tables.VARIANTS:
        result = play(BENCH, BENCH.training_task(family, 21, variant), BENCH.teacher("scripted"))
        assert _failed(result) == {s: [] for s in PERFECT}, (family, variant)
        assert result.score.stage_rewards() == PERFECT and result.score.task == 1.0 and result.score.reward == 1.0
        assert len(result.episode.turns) == 5 and result.evidence.submitted == RESULT


def test_the_teacher_passes_heldout_tasks_and_stage_rows():
    for task in heldout_suite(1, ("mixed",), 0):
        assert play(BENCH, task, BENCH.teacher("scripted")).score.reward == 1.0
    task = BENCH.training_task("filtered_median", 4, "duplicates")
    for stage in ("clean", "analyse", "report"):  # starts at the boundary the teacher's own prefix reaches
        result = play(BENCH, task, BENCH.teacher("scripted"), focus=stage)
        assert result.score.stage_rewards() == {stage: 1.0} and result.score.reward == 1.0


def test_its_action_texts_are_the_same_for_every_task():
    texts = set()
    for family in tables.TASK_FAMILIES:
        result = play(BENCH, BENCH.training_task(family, 2, "missing"), BENCH.teacher("scripted"))
        texts.add(json.dumps([t.action.to_dict() for t in result.episode.turns]))
        assert [t.stage for t in result.episode.turns] == ["inspect", "clean", "analyse", "report", "report"]
    assert len(texts) == 1


def test_shared_span():
    assert shared_span("abcde", "xbcdy") == "bcd"
    assert shared_span("abc", "xyz") == ""
    assert shared_span("print(T, P)\n", "print(A)\n") == "print("


def test_no_stretch_of_one_stage_body_appears_in_another():
    """A policy writes an action token by token: text two stages share mid-action is where it loses which stage it
    is in. The SFT policy of the v1 texts (60 steps, nll 0.256) went on after inspect's `T = re.search(...)` line —
    shared with report — with report's next line, and no action it wrote ran (Overall 0.0 on every stage). Every
    action is its stage's own body, then the text all of them share (`PREAMBLE`, ending with the call)."""
    own = {}
    for stage, actions in SCRIPT.items():
        code = actions[0].arguments["code"]
        assert code.startswith(f"def run():\n    # {stage}: ") and code.endswith(PREAMBLE), stage
        own[stage] = code[: -len(PREAMBLE)]
    spans = {(a, b): len(shared_span(own[a], own[b])) for a, b in itertools.combinations(own, 2)}
    # longest: ' = table("data/raw.csv")\n    ' (inspect / clean); v1 shared 243 characters (inspect / clean: the
    # raw-table read and the record check) and 71 (inspect / report: the task-id line)
    assert max(spans.values()) == 29 and spans[("inspect", "clean")] == 29
    assert spans[("inspect", "report")] == 18


def test_a_teacher_that_keeps_duplicates_fails_the_items_that_rest_on_cleaning():
    task = BENCH.training_task("group_mean", 8, "duplicates")
    kept_all = [list(r) for r in task.table.rows]
    assert tables.analyse("group_mean", task.table.header, kept_all, task.params) != task.answer  # precondition
    result = play(BENCH, task, WrongTeacher())
    assert _failed(result) == {"inspect": [], "clean": ["clean.log", "clean.rows"], "analyse": ["analyse.correct"],
                               "report": ["report.written"]}
    # every evidence is still confirmed (eta 1): the rewards are the item means
    assert result.score.stage_rewards() == pytest.approx({"inspect": 1.0, "clean": 1 / 3, "analyse": 2 / 3,
                                                          "report": 0.5})
    assert result.score.task < 1.0


def test_a_guessed_result_without_the_work_earns_no_credit():
    task = BENCH.training_task("filtered_median", 8, "clean")
    forged = json.dumps({"answer": task.answer})  # the right answer, written by a call that read nothing
    steps = iter([Action("Guess.", "execute_code", {"language": "bash",
                                                    "code": f"mkdir -p work && echo '{forged}' > {RESULT}"}, "analyse"),
                  Action("Hand in.", "submit", {"path": RESULT}, "report")])
    result = play(BENCH, task, lambda conversation: next(steps, None))
    rewards = result.score.stage_rewards()
    # the submit call is real, but what it handed in no analysis wrote (report.submitted fails too); nothing was
    # done by a call that read its input
    assert rewards == {"inspect": 0.0, "clean": 0.0, "analyse": 0.0, "report": 0.0}
    assert _failed(result)["analyse"] == ["analyse.correct", "analyse.ran", "analyse.replayed"]
    assert _failed(result)["report"] == ["report.submitted", "report.written"]
    # E2E: 0.5 * 0 + 0.5 * task; the metric reads the submitted answer only
    assert result.score.task == 1.0 and result.score.reward == pytest.approx(0.5)
    idle = play(BENCH, task, lambda conversation: None)
    assert idle.score.reward == 0.0 and idle.score.task == 0.0


@pytest.mark.docker
def test_the_teacher_passes_every_item_in_docker():
    from bat_jax.sandbox.backends import BackendUnavailable, backend_factory

    try:
        make = backend_factory("docker")
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    for family in tables.TASK_FAMILIES:
        result = play(BENCH, BENCH.training_task(family, 30, "mixed"), BENCH.teacher("scripted"), make_sandbox=make)
        assert _failed(result) == {s: [] for s in PERFECT} and result.score.reward == 1.0, family
