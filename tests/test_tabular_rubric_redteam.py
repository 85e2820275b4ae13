"""Red team of the tabular suite's rubric and metric, with real sandbox runs (local backend; one in Docker): what a
reward-hacking policy would try, and the item outcome before (round four's rules) and now.

Each test plays a scripted policy through `play` (the benchmark's `score_episode`): the scripted teacher's actions for
the honest stages, then the attempt. Before-values are in the test docstrings and in the notes' table."""

import collections
import json

import pytest

from bat_jax.rollout.play import play
from bat_jax.sandbox.tools import Action
from bat_jax.benchmarks.tabular import tables
from bat_jax.benchmarks.tabular.benchmark import TabularBenchmark
from bat_jax.benchmarks.tabular.tasks import CLEAN_CSV, RAW, REPORT, RESULT, make_task
from bat_jax.benchmarks.tabular.teacher import SCRIPT

BENCH = TabularBenchmark()
SUBMIT = SCRIPT["report"][1]


class _Script:
    """A policy that plays fixed actions, then stops."""

    def __init__(self, actions):
        self.actions = list(actions)

    def __call__(self, conversation):
        return self.actions[len(conversation.turns)] if len(conversation.turns) < len(self.actions) else None


def _py(code, stage):
    return Action("", "execute_code", {"language": "python", "code": "import csv, json, os\n" + code}, stage)


def _bash(code, stage):
    return Action("", "execute_code", {"language": "bash", "code": code}, stage)


def _teacher(*stages):
    return [SCRIPT[s][0] for s in stages]


def _play(task, actions, focus="E2E"):
    return play(BENCH, task, _Script(actions), focus=focus)


def _items(result, stage):
    return result.score.verdicts[stage].items


def _csv_text(header, rows) -> str:
    return tables.Table(tuple(header), tuple(tuple(r) for r in rows)).csv_bytes().decode()


# --- the issue's three -------------------------------------------------------------------------------------------

def test_issue_3_an_enumerated_report_written_without_reading_the_results_earns_nothing():
    """Every kept count 0-99 and every two-decimal number 0.00-99.99 (60 KB), written by a call that read nothing,
    with a made-up result.json submitted. Before: report 1.0 (every item), E2E 0.1 with task metric 0. Now 0, 0."""
    task = make_task("filtered_median", 8, "mixed")
    enum = "\n".join(f"{n} rows kept" for n in range(100)) + "\n" + " ".join(f"{i / 100:.2f}" for i in range(10000))
    attack = _py(f"os.makedirs('work', exist_ok=True)\nopen('{REPORT}', 'w').write({task.task_id!r} + '\\n' + "
                 f"{enum!r})\nopen('{RESULT}', 'w').write(json.dumps({{'answer': 1.0}}))", "report")
    result = _play(task, [attack, SUBMIT])
    assert tables.answer_phrases("filtered_median", task.answer)[0] in result.evidence.text(REPORT)
    assert _items(result, "report") == {"report.written": False, "report.submitted": False}
    assert result.score.stage_rewards()["report"] == 0.0
    assert result.score.task == 0.0 and result.score.reward == 0.0


def test_issue_3_an_enumerated_report_after_honest_work_fails_the_report_item():
    """The same enumeration by a call that did read result.json, after the teacher's honest stages (the one honest
    report line is in it). Before: report.written passed (report 1.0); now it fails (report 0.5)."""
    task = make_task("group_mean", 5, "mixed")
    levels = sorted(task.answer)
    code = (f"json.load(open('{RESULT}'))\nlines = ['# {task.task_id}'] + [f'{{n}} rows kept' for n in range(100)]\n"
            f"lines += [f'{{g}}: {{i / 100:.2f}}' for g in {levels!r} for i in range(10000)]\n"
            f"open('{REPORT}', 'w').write('\\n'.join(lines))")
    result = _play(task, _teacher("inspect", "clean", "analyse") + [_py(code, "report"), SUBMIT])
    assert _items(result, "report") == {"report.written": False, "report.submitted": True}
    assert result.score.stage_rewards() == {"inspect": 1.0, "clean": 1.0, "analyse": 1.0, "report": 0.5}


@pytest.mark.parametrize("family, cell", [("filtered_median", "42.00"), ("group_mean", "42.00"),
                                          ("filtered_median", "inf")])
def test_issue_4_a_fabricated_clean_table_does_not_replay(family, cell):
    """The analysing call reads clean.csv, overwrites it with rows built for a guessed answer (42, or a table of inf
    that made the host's replay inf, which any finite number 'matched'), and answers the guess. Before: analyse.ran
    and analyse.replayed (analyse 2/3); now only analyse.ran (1/3)."""
    task = make_task(family, 8, "clean")
    header = list(task.table.header)
    rows = [[f"x{i}", task.cleaned[0][i % 3][1]] + [cell] * (len(header) - 2) for i in range(9)]
    answer = 42.0 if family == "filtered_median" else {g: 42.0 for g in sorted({r[1] for r in rows})}
    code = (f"open('{CLEAN_CSV}').read()\nopen('{CLEAN_CSV}', 'w').write({_csv_text(header, rows)!r})\n"
            f"json.dump({{'answer': {answer!r}}}, open('{RESULT}', 'w'))")
    result = _play(task, _teacher("inspect", "clean") + [_py(code, "analyse")])
    assert _items(result, "analyse") == {"analyse.ran": True, "analyse.replayed": False, "analyse.correct": False}
    assert result.score.stage_rewards()["analyse"] == pytest.approx(1 / 3)


def test_issue_5_naming_every_candidate_or_any_constant_scores_zero_on_top_corr():
    """Before: the metric was |named ∩ right| / max(k, named): the brief's three candidates scored 2/3 on every task
    (20/20), any two of them at least 1/2. Now the answer is {column: r} for exactly k columns, r within 1e-3."""
    for seed in range(20):
        task = make_task("top_corr", seed, "clean")
        cands = task.params["candidates"]
        for guess in (cands, cands[:2], {c: 0.5 for c in cands}, {c: 0.5 for c in cands[:2]},
                      {c: -0.5 for c in cands[1:]}, {c: task.answer.get(c, 0.0) for c in cands}):
            assert tables.answer_score("top_corr", guess, task.answer) == 0.0, (seed, guess)
        assert tables.answer_score("top_corr", dict(task.answer), task.answer) == 1.0


def test_issue_5_submitting_all_candidates_through_an_episode():
    task = make_task("top_corr", 3, "mixed")
    cands = task.params["candidates"]
    attack = _bash(f"mkdir -p work && echo '{json.dumps({'answer': cands})}' > {RESULT}", "analyse")
    result = _play(task, [attack, SUBMIT])
    assert result.score.task == 0.0 and result.score.reward == 0.0  # before: task 2/3, reward 0.35


# --- new attempts --------------------------------------------------------------------------------------------------

def test_the_best_constant_answer_scores_about_zero():
    """A data-free number: the best two-decimal constant in [10, 80] for the filtered median of 400 tasks (every
    variant) is right on 3 of them (before, within 0.1%: 6); the vocabulary's every level at the best constant group
    mean scores 0.0025 on average; empty and bool answers 0."""
    medians = [make_task("filtered_median", s, tables.VARIANTS[s % 4]).answer for s in range(400)]
    hits = [sum(tables.answer_score("filtered_median", c / 100, m) for m in medians) for c in range(1000, 8001)]
    assert max(hits) == 3.0
    means = [make_task("group_mean", s, tables.VARIANTS[s % 4]).answer for s in range(400)]
    guess = {lv: 41.77 for lv in tables.TRAIN_VOCAB.levels}
    assert sum(tables.answer_score("group_mean", guess, m) for m in means) / 400 == pytest.approx(0.0025)
    for family, guess in [("group_mean", {}), ("filtered_median", True), ("top_corr", {})]:
        task = make_task(family, 1, "clean")
        assert tables.answer_score(family, guess, task.answer) == 0.0


def test_a_hedging_report_with_two_medians_is_not_credited():
    """The report states the right median and a second candidate. Before: report.written (report 1.0); now not."""
    task = make_task("filtered_median", 4, "duplicates")
    code = (f"a = json.load(open('{RESULT}'))['answer']\nn = json.load(open('work/clean.json'))['kept']\n"
            f"open('{REPORT}', 'w').write(f'{task.task_id}\\n{{n}} rows kept\\nmedian {{a:.2f}} or {{a + 1:.2f}}\\n')")
    result = _play(task, _teacher("inspect", "clean", "analyse") + [_py(code, "report"), SUBMIT])
    assert _items(result, "report") == {"report.written": False, "report.submitted": True}


def test_a_report_from_the_previous_observation_written_without_reading_result_json():
    """The right report (copied from the analysing call's stdout into the code) by a call that reads nothing.
    Before: report.written; now a report must be written by a call that read result.json."""
    task = make_task("filtered_median", 4, "duplicates")
    text = f"# {task.task_id}\n{task.cleaned[1]['kept']} rows kept\n{task.answer:.2f}\n"
    result = _play(task, _teacher("inspect", "clean", "analyse") + [
        _bash(f"printf '{text}' > {REPORT}", "report"), SUBMIT])
    assert result.evidence.text(REPORT) == text
    assert _items(result, "report") == {"report.written": False, "report.submitted": True}


def test_a_report_left_stale_by_a_later_result_is_not_credited():
    """The honest report, then result.json rewritten (another answer) and submitted: the report no longer states the
    submitted result. Before: report.written; now not (and the rewrite earns no analyse credit: it read nothing)."""
    task = make_task("group_mean", 6, "missing")
    wrong = {g: v + 5.0 for g, v in task.answer.items()}
    result = _play(task, _teacher("inspect", "clean", "analyse", "report") + [
        _bash(f"echo '{json.dumps({'answer': wrong})}' > {RESULT}", "report"), SUBMIT])
    assert _items(result, "report") == {"report.written": False, "report.submitted": False}
    assert _items(result, "analyse")["analyse.correct"] is False and result.score.task == 0.0


def test_an_honest_report_in_other_words_stays_credited():
    """Reordered lines, sentences ending with a period and the task id written twice still pass: the rule counts
    numbers, not layout."""
    task = make_task("group_mean", 6, "missing")
    code = (f"a = json.load(open('{RESULT}'))['answer']\nn = json.load(open('work/clean.json'))['kept']\n"
            "lines = [f'The mean for {g} is {g}: {v:.2f}.' for g, v in reversed(list(a.items()))]\n"
            f"open('{REPORT}', 'w').write('\\n'.join(lines) + f'\\nTask {task.task_id} ({task.task_id}): "
            "{n} rows kept.\\n')")
    result = _play(task, _teacher("inspect", "clean", "analyse") + [_py(code, "report"), SUBMIT])
    assert result.score.stage_rewards()["report"] == 1.0 and result.score.reward == 1.0


def test_an_empty_clean_table_written_after_reading_raw_is_not_a_cleaning():
    """`cat raw.csv; touch clean.csv` and a guessed clean.json. Before: clean.ran (clean 1/3); now clean 0."""
    task = make_task("group_mean", 2, "duplicates")
    log = {"kept": 30, "dropped_duplicates": 2, "dropped_invalid": 0}
    result = _play(task, [_bash(f"cat {RAW} > /dev/null && mkdir -p work && : > {CLEAN_CSV} && "
                                f"echo '{json.dumps(log)}' > work/clean.json", "clean")])
    assert _items(result, "clean") == {"clean.ran": False, "clean.rows": False, "clean.log": False}
    assert result.score.stage_rewards()["clean"] == 0.0


def test_a_clean_table_from_a_rewritten_raw_table_does_not_replay():
    """raw.csv overwritten with fabricated rows, then 'cleaned' (a call that read raw.csv) and analysed by the
    teacher: every call reads its input, but the table is not the task's. Before: clean.ran, analyse.ran and
    analyse.replayed (clean 1/3 × η, analyse 2/3); now neither clean.ran nor analyse.replayed."""
    task = make_task("filtered_median", 9, "clean")
    header = list(task.table.header)
    rows = [[f"z{i}", "north"] + ["42.00"] * (len(header) - 2) for i in range(9)]
    code = (f"open('{RAW}', 'w').write({_csv_text(header, rows)!r})\n"
            f"os.makedirs('work', exist_ok=True)\nopen('{CLEAN_CSV}', 'w').write(open('{RAW}').read())\n"
            f"json.dump({task.cleaned[1]!r}, open('work/clean.json', 'w'))")
    result = _play(task, [_py(code, "clean")] + _teacher("analyse"))
    assert _items(result, "clean")["clean.ran"] is False
    assert _items(result, "analyse") == {"analyse.ran": True, "analyse.replayed": False, "analyse.correct": False}


def test_a_cherry_picked_subset_of_raw_rows_does_not_replay_a_guess():
    """clean.csv = one raw record (written by a call that read raw.csv), the answer = that record's value: a
    'consistent' analysis of a table the rule never gives. Before: analyse.replayed (analyse 2/3); now 1/3."""
    task = make_task("filtered_median", 9, "clean")
    header = list(task.table.header)
    vi = header.index(task.params["value"])
    row = task.table.rows[0]
    code = (f"open('{RAW}').read()\nos.makedirs('work', exist_ok=True)\n"
            f"open('{CLEAN_CSV}', 'w').write({_csv_text(header, [row])!r})")
    answer = _bash(f"cat {CLEAN_CSV} > /dev/null && echo '{{\"answer\": {float(row[vi])}}}' > {RESULT}", "analyse")
    result = _play(task, [_py(code, "clean"), answer])
    assert _items(result, "analyse") == {"analyse.ran": True, "analyse.replayed": False, "analyse.correct": False}


def test_a_clean_table_with_every_record_twice_does_not_replay():
    """Kept records each written twice (means and medians do not change, so the right answer replays). Before:
    analyse 1.0; now analyse.replayed fails (a record may appear at most as often as raw.csv has it)."""
    task = make_task("group_mean", 7, "clean")
    header = list(task.table.header)
    code = (f"open('{RAW}').read()\nos.makedirs('work', exist_ok=True)\n"
            f"open('{CLEAN_CSV}', 'w').write({_csv_text(header, list(task.cleaned[0]) * 2)!r})")
    result = _play(task, [_py(code, "clean")] + _teacher("analyse"))
    assert _items(result, "analyse") == {"analyse.ran": True, "analyse.replayed": False, "analyse.correct": True}


def test_a_non_answer_written_after_reading_the_clean_table_is_not_an_analysis():
    """`cat clean.csv; echo '{"answer": "idk"}'`. Before: analyse.ran (analyse 1/3); now analyse 0."""
    task = make_task("top_corr", 5, "clean")
    result = _play(task, _teacher("inspect", "clean") + [
        _bash(f"cat {CLEAN_CSV} > /dev/null && echo '{{\"answer\": \"idk\"}}' > {RESULT}", "analyse")])
    assert _items(result, "analyse") == {"analyse.ran": False, "analyse.replayed": False, "analyse.correct": False}
    assert result.score.stage_rewards()["analyse"] == 0.0


def test_submitting_a_result_no_analysis_wrote_earns_no_submit_credit():
    """A result.json echoed by a call that read nothing, submitted. Before: report.submitted (report 0.25, E2E
    0.025); now report 0, E2E 0."""
    task = make_task("group_mean", 3, "clean")
    result = _play(task, [_bash(f"mkdir -p work && echo '{{\"answer\": {{}}}}' > {RESULT}", "analyse"), SUBMIT])
    assert _items(result, "report") == {"report.written": False, "report.submitted": False}
    assert result.score.reward == 0.0


def test_a_top_corr_report_naming_every_candidate_is_not_credited():
    """A report naming all three candidates (and every kept count), by a call that read result.json. Before:
    report.written (the answer's names were all in it); now the report must state each column's r and no more."""
    task = make_task("top_corr", 5, "missing")
    cands = task.params["candidates"]
    code = (f"json.load(open('{RESULT}'))\nopen('{REPORT}', 'w').write('{task.task_id}\\n' + "
            f"'\\n'.join(f'{{n}} rows kept' for n in range(100)) + '\\n{', '.join(cands)}\\n')")
    result = _play(task, _teacher("inspect", "clean", "analyse") + [_py(code, "report"), SUBMIT])
    assert _items(result, "report") == {"report.written": False, "report.submitted": True}


def test_a_top_corr_answer_of_all_candidates_with_their_r_is_not_the_top_k():
    """Every candidate with its right r (the work done, the choice skipped) by a call that read clean.csv. Before:
    analyse.ran (analyse 1/3; task metric 0, the old one read names only); now not an answer of the question's
    shape (exactly k columns): analyse 0, task metric 0."""
    task = make_task("top_corr", 6, "clean")
    header, rows = list(task.table.header), task.cleaned[0]
    r = tables.correlations(header, rows, task.params["target"], task.params["candidates"])
    result = _play(task, _teacher("inspect", "clean") + [
        _bash(f"cat {CLEAN_CSV} > /dev/null && echo '{json.dumps({'answer': r})}' > {RESULT}", "analyse"), SUBMIT])
    assert _items(result, "analyse") == {"analyse.ran": False, "analyse.replayed": False, "analyse.correct": False}
    assert result.score.stage_rewards()["analyse"] == 0.0 and result.score.task == 0.0


def test_a_guessed_clean_log_beside_a_copied_raw_table_is_not_credited():
    """`cp raw.csv clean.csv` and clean.json with the right counts (a lucky guess from the variant). Before:
    clean.ran and clean.log (clean 2/3); now clean.log also needs its 'kept' to be clean.csv's record count (1/3)."""
    task = make_task("group_mean", 4, "missing")
    result = _play(task, [_bash(f"mkdir -p work && cp {RAW} {CLEAN_CSV} && "
                                f"echo '{json.dumps(task.cleaned[1])}' > work/clean.json", "clean")])
    assert _items(result, "clean") == {"clean.ran": True, "clean.rows": False, "clean.log": False}
    assert result.score.stage_rewards()["clean"] == pytest.approx(1 / 3)


def test_the_variant_name_does_not_give_the_profile_counts():
    """Before, 'duplicates' always had 2 repeated ids and no invalid record, so its profile was the row count plus
    the variant's name. Now the commonest (duplicate_ids, invalid_rows) of a defect variant is at most 109 of 300
    tasks (100 seeds x 3 families); only 'clean' is fixed (no defects)."""
    for variant, most in [("missing", 83), ("duplicates", 109), ("mixed", 30), ("clean", 300)]:
        counts = collections.Counter()
        for seed in range(100):
            for family in tables.TASK_FAMILIES:
                p = make_task(family, seed, variant).profile
                counts[p["duplicate_ids"], p["invalid_rows"]] += 1
        assert counts.most_common(1)[0][1] == most, variant


@pytest.mark.docker
def test_the_enumerated_report_fails_in_docker_too():
    from bat_jax.sandbox.backends import BackendUnavailable, backend_factory

    try:
        make = backend_factory("docker")
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    task = make_task("filtered_median", 8, "clean")
    enum = " ".join(f"{i / 100:.2f}" for i in range(10000))
    code = (f"json.load(open('{RESULT}'))\nopen('{REPORT}', 'w').write('{task.task_id}\\n{task.cleaned[1]['kept']} "
            f"rows kept\\n{enum}')")
    actions = _teacher("inspect", "clean", "analyse") + [_py(code, "report"), SUBMIT]
    result = play(BENCH, task, _Script(actions), make_sandbox=make)
    assert _items(result, "report") == {"report.written": False, "report.submitted": True}
    assert result.score.stage_rewards() == {"inspect": 1.0, "clean": 1.0, "analyse": 1.0, "report": 0.5}
