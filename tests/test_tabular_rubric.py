"""The tabular suite's rubric items and task metric on hand-built evidence: receipts and files written as a call
would leave them, and the ways an item must fail (a file no call wrote, a failed call, a clean table changed after
the analysis, wrong counts, a bool for an int, a report without the kept rows)."""

import hashlib
import json

import pytest

from bat_jax.sandbox.readers import DecodeLimits
from bat_jax.sandbox.types import Receipt
from bat_jax.benchmarks.tabular import tables
from bat_jax.benchmarks.tabular.benchmark import TabularBenchmark
from bat_jax.benchmarks.tabular.rubric import build_rubric, score_task
from bat_jax.benchmarks.tabular.tasks import CLEAN_CSV, CLEAN_LOG, INSPECT, RAW, REPORT, RESULT, make_task
from bat_jax.verify.rubric import Evidence, score

TASK = make_task("group_mean", 5, "mixed")  # repeated ids and invalid records


def _csv(header, rows) -> bytes:
    return tables.Table(tuple(header), tuple(tuple(r) for r in rows)).csv_bytes()


def _files(task=TASK) -> dict[str, bytes]:
    kept, log = task.cleaned
    answer = task.answer
    report = f"# {task.task_id}\n{log['kept']} rows kept\n" + "\n".join(tables.answer_phrases(task.track, answer))
    return {"task.md": task.brief.encode(), RAW: task.table.csv_bytes(),
            INSPECT: json.dumps(task.profile).encode(), CLEAN_CSV: _csv(task.table.header, kept),
            CLEAN_LOG: json.dumps(log).encode(), RESULT: json.dumps({"answer": answer}).encode(),
            REPORT: report.encode()}


def _receipt(index, reads, writes, files, stdout="", exit_code=0, tool="execute_code"):
    digests = tuple((p, hashlib.sha256(files[p]).hexdigest()) for p in writes if p in files)
    return Receipt(index, tool, "python" if tool == "execute_code" else "", "", exit_code, "", "", 0.0, 0.0, False,
                   stdout, tuple(sorted(reads)), tuple(sorted(writes)), True, digests)


def _receipts(files, task=TASK):
    return [_receipt(0, ("task.md", RAW), (INSPECT,), files, stdout=f"{task.task_id} ..."),
            _receipt(1, (RAW,), (CLEAN_CSV, CLEAN_LOG), files),
            _receipt(2, ("task.md", CLEAN_CSV), (RESULT,), files),
            _receipt(3, ("task.md", RESULT, CLEAN_LOG), (REPORT,), files),
            _receipt(4, (), (), files, tool="submit")]


def _score(receipts, files, submitted=RESULT, start=None, task=TASK):
    ev = Evidence(tuple(receipts), files, submitted, start_files=start or {})
    rubric = build_rubric(task)
    return score(rubric, ev, score_task(task, ev.files, submitted, ev.limits))


def test_the_host_values_of_the_task():
    assert TASK.profile["duplicate_ids"] == 3 and TASK.profile["invalid_rows"] == 3 and TASK.profile["rows"] == 37
    assert TASK.cleaned[1] == {"kept": 31, "dropped_duplicates": 3, "dropped_invalid": 3}
    assert sorted(TASK.answer) == sorted({r[1] for r in TASK.cleaned[0]})


def test_a_complete_honest_episode_passes_every_item():
    files = _files()
    result = _score(_receipts(files), files)
    assert all(all(v.items.values()) for v in result.verdicts.values()), result.verdicts
    assert result.stage_rewards() == {"inspect": 1.0, "clean": 1.0, "analyse": 1.0, "report": 1.0}
    assert result.task == 1.0 and result.reward == 1.0


def test_files_no_successful_call_wrote_earn_nothing():
    files = _files()
    receipts = _receipts(files)
    receipts[2] = _receipt(2, ("task.md", CLEAN_CSV), (), files)  # the analysis call wrote nothing
    receipts[1] = _receipt(1, (RAW,), (CLEAN_CSV, CLEAN_LOG), files, exit_code=1)  # the cleaning call failed
    result = _score(receipts, files, start={RESULT: files[RESULT]})  # result.json was there from the start
    assert result.verdicts["clean"].items == {"clean.ran": False, "clean.rows": False, "clean.log": False}
    assert result.verdicts["clean"].reward == 0.0
    assert result.verdicts["analyse"].reward == 0.0 and result.verdicts["analyse"].eta == 0.0
    assert result.verdicts["inspect"].reward == 1.0 and result.verdicts["report"].reward == 1.0
    # E2E reward: 0.5 * (.2 + .2) + 0.5 * task (the submitted answer is still right: the metric reads the file)
    assert result.task == 1.0 and result.reward == pytest.approx(0.5 * 0.4 + 0.5)


def test_a_clean_table_changed_after_the_analysis_is_no_replay():
    files = _files()
    receipts = _receipts(files) + [_receipt(5, (RAW,), (CLEAN_CSV,), files)]  # rewritten after the analysis
    verdict = _score(receipts, files).verdicts["analyse"]
    assert verdict.items == {"analyse.ran": True, "analyse.replayed": False, "analyse.correct": True}
    assert verdict.reward == pytest.approx(2 / 3)


def test_an_answer_its_own_clean_table_does_not_give_earns_no_replay_credit():
    files = _files()
    valid = [list(r) for r in TASK.table.rows if tables.is_valid(r, len(r))]  # the repeated ids kept: rows fails
    files[CLEAN_CSV] = _csv(TASK.table.header, valid)
    verdicts = _score(_receipts(files), files).verdicts
    # clean.json's kept (31) is not clean.csv's record count (34) now: clean.log fails with clean.rows
    assert verdicts["clean"].items == {"clean.ran": True, "clean.rows": False, "clean.log": False}
    assert tables.analyse("group_mean", TASK.table.header, valid, TASK.params) != TASK.answer
    assert verdicts["analyse"].items == {"analyse.ran": True, "analyse.replayed": False, "analyse.correct": True}
    files[CLEAN_CSV] = _csv(TASK.table.header, TASK.cleaned[0][:-1])  # a record the rule keeps is missing
    verdicts = _score(_receipts(files), files).verdicts
    assert verdicts["clean"].items == {"clean.ran": False, "clean.rows": False, "clean.log": False}
    assert verdicts["analyse"].items == {"analyse.ran": True, "analyse.replayed": False, "analyse.correct": True}


def test_wrong_counts_a_bool_for_an_int_and_a_report_without_the_kept_rows_fail():
    files = _files()
    files[INSPECT] = json.dumps({**TASK.profile, "duplicate_ids": True}).encode()  # True is not 2
    files[CLEAN_LOG] = json.dumps({**TASK.cleaned[1], "dropped_invalid": 0}).encode()
    files[REPORT] = files[REPORT].replace(b"rows kept", b"records")
    verdicts = _score(_receipts(files), files).verdicts
    assert verdicts["inspect"].items == {"inspect.read": True, "inspect.profile": False}
    assert verdicts["inspect"].reward == 0.5
    assert verdicts["clean"].items["clean.log"] is False and verdicts["clean"].reward == pytest.approx(2 / 3)
    assert verdicts["report"].items == {"report.written": False, "report.submitted": True}
    assert verdicts["report"].reward == 0.5


@pytest.mark.parametrize("edit, written", [
    (lambda r: r, True),
    (lambda r: "\n".join(reversed(r.split("\n"))) + ".", True),  # any order; a sentence's final dot
    (lambda r: r + "\n(out of 37)", False),  # another number
    (lambda r: r + "\n" + r, False),  # every number twice
    (lambda r: r.replace("rows kept", "rows kept, 6 dropped"), False),
    (lambda r: r + "\n" + "words " * 700, False),  # over REPORT_MAX_BYTES (4096)
    (lambda r: r.replace(TASK.task_id, "the task"), False),
])
def test_the_report_states_exactly_the_tasks_numbers(edit, written):
    files = _files()
    files[REPORT] = edit(files[REPORT].decode()).encode()
    assert _score(_receipts(files), files).verdicts["report"].items["report.written"] is written


def test_a_report_by_a_call_that_did_not_read_the_final_result_is_not_credited():
    files = _files()
    receipts = _receipts(files)
    receipts[3] = _receipt(3, ("task.md", CLEAN_LOG), (REPORT,), files)  # did not read result.json
    assert _score(receipts, files).verdicts["report"].items["report.written"] is False
    receipts = _receipts(files)
    receipts.insert(4, _receipt(4, (CLEAN_CSV,), (RESULT,), files))  # result.json rewritten after the report
    assert _score(receipts, files).verdicts["report"].items["report.written"] is False
    receipts[4] = _receipt(4, (CLEAN_CSV,), (INSPECT,), files)  # another file rewritten: still credited
    assert _score(receipts, files).verdicts["report"].items["report.written"] is True


def test_reading_nothing_earns_no_inspect_credit():
    files = _files()
    receipts = _receipts(files)
    receipts[0] = _receipt(0, (), (INSPECT,), files, stdout=TASK.task_id)  # printed the id, read nothing
    verdict = _score(receipts, files).verdicts["inspect"]
    assert verdict.evidence == {"receipt.inspect": False, "file.inspect": False} and verdict.reward == 0.0


@pytest.mark.parametrize("submitted, result, metric", [
    (RESULT, None, 1.0), (REPORT, None, 0.0), (None, None, 0.0), (RESULT, b'{"answers": {}}', 0.0),
    (RESULT, b"[1, 2]", 0.0), (RESULT, b"{" * 100, 0.0)])
def test_the_task_metric(submitted, result, metric):
    files = _files()
    if result is not None:
        files[RESULT] = result
    assert score_task(TASK, files, submitted, DecodeLimits()) == metric


def test_the_task_metric_of_a_half_right_group_mean():
    files = _files()
    answer = dict(TASK.answer)
    first = sorted(answer)[0]
    answer[first] += 1.0
    files[RESULT] = json.dumps({"answer": answer}).encode()
    assert score_task(TASK, files, RESULT, DecodeLimits()) == pytest.approx((len(answer) - 1) / len(answer))


def test_every_family_has_items_in_every_stage():
    bench = TabularBenchmark()
    for family in bench.tracks:
        rubric = build_rubric(make_task(family, 1, "clean"))
        assert {s: len(rubric.for_stage(s)) for s in bench.stages.ids} == {"inspect": 2, "clean": 3, "analyse": 3,
                                                                           "report": 2}
