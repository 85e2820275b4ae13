"""The tabular suite's rubric (items and evidence per stage) and its task metric.

Details: docs/design.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from bat_jax.sandbox.readers import DecodeLimits, json_or_none
from bat_jax.sandbox.types import Receipt
from bat_jax.benchmarks.tabular import tables
from bat_jax.benchmarks.tabular.stages import STAGES
from bat_jax.benchmarks.tabular.tasks import CLEAN_CSV, CLEAN_LOG, INSPECT, RAW, REPORT, RESULT, TabularTask
from bat_jax.verify.rubric import Evidence, EvidenceRequirement, Rubric, RubricItem

#: A report longer than this earns no credit (the honest one is a few lines).
REPORT_MAX_BYTES = 4096
#: A number as a report states it.
NUMBER = re.compile(r"-?\d[\d.]*")


def _same_types(got, want: Mapping) -> bool:
    """`got` is a dict holding every key of `want` with an equal value of the same type (no True for 1)."""
    return isinstance(got, dict) and all(k in got and type(got[k]) is type(v) and got[k] == v
                                         for k, v in want.items())


def _rows_equal(header, rows, want_header, want_rows) -> bool:
    """Same header and records in the same order; numeric cells compared as numbers (1.5 == 1.50)."""
    if list(header) != list(want_header) or len(rows) != len(want_rows):
        return False
    for got, want in zip(rows, want_rows):
        if len(got) != len(want) or got[:2] != want[:2]:
            return False
        if any(tables.number(a) != tables.number(b) for a, b in zip(got[2:], want[2:])):
            return False
    return True


def _answer(ev: Evidence):
    data = ev.json(RESULT)
    if not isinstance(data, dict) or "answer" not in data:
        raise ValueError(f"{RESULT} is not an object with an 'answer'")
    return data["answer"]


def _last_after(ev: Evidence, calls: list[Receipt], path: str) -> bool:
    """Some call of `calls` came after every call (failed ones too) that wrote `path`: it saw `path` as it ends."""
    later = [r.index for r in ev.receipts if path in r.writes]
    return any(all(i <= c.index for i in later) for c in calls)


def _kept(ev: Evidence, path: str, reads: tuple[str, ...]) -> bool:
    """`path` is this episode's work (a call that read `reads` left it) or the start state's, unchanged."""
    return bool(ev.wrote(path, reads)) or (path in ev.start_files and ev.start_files[path] == ev.files.get(path))


def report_numbers(text: str, task_id: str) -> list[str]:
    """The numbers a report states (digits and dots, a leading minus; a sentence's final dot dropped), task id aside."""
    return [t.rstrip(".") for t in NUMBER.findall(text.replace(task_id, " "))]


def build_rubric(task: TabularTask) -> Rubric:
    """The reward contract (c, G) of one task over the stages inspect, clean, analyse, report."""
    header = task.table.header

    def profile_ok(ev: Evidence) -> bool:
        return _same_types(ev.json(INSPECT), task.profile)

    def rows_ok(ev: Evidence) -> bool:
        got_header, got_rows = tables.parse_csv(ev.text(CLEAN_CSV) or "")
        return _rows_equal(got_header, got_rows, header, task.cleaned[0])

    def drawn(ev: Evidence) -> bool:
        """clean.csv is a cleaning of the task's raw table (`tables.drawn_from`), by a call that read raw.csv."""
        text = ev.text(CLEAN_CSV)
        return (text is not None and _kept(ev, CLEAN_CSV, (RAW,))
                and tables.drawn_from(task.table, *tables.parse_csv(text)))

    def log_ok(ev: Evidence) -> bool:
        """clean.json's counts are the host's and its 'kept' is clean.csv's record count (not guessed beside it)."""
        return (_same_types(ev.json(CLEAN_LOG), task.cleaned[1])
                and len(tables.parse_csv(ev.text(CLEAN_CSV) or "")[1]) == task.cleaned[1]["kept"])

    def analysed(ev: Evidence) -> bool:
        """result.json holds an answer of the family's shape, left by a call that read clean.csv (or the start's)."""
        return _kept(ev, RESULT, (CLEAN_CSV,)) and tables.is_answer(task.track, _answer(ev), task.params)

    def replayed(ev: Evidence) -> bool:
        """The answer is the host's finite analysis of the clean.csv (a cleaning of raw) an analysing call read.

        That clean.csv unchanged since the call."""
        if not _last_after(ev, ev.wrote(RESULT, (CLEAN_CSV,)), CLEAN_CSV) or not drawn(ev):
            return False
        got_header, got_rows = tables.parse_csv(ev.text(CLEAN_CSV) or "")
        want = tables.analyse(task.track, got_header, got_rows, task.params)
        return tables.answer_score(task.track, _answer(ev), want) == 1.0

    def correct(ev: Evidence) -> bool:
        return tables.answer_score(task.track, _answer(ev), task.answer) == 1.0

    def report_ok(ev: Evidence) -> bool:
        """A short report, by a call that read result.json as it ends (and right), stating exactly its numbers."""
        data = ev.files.get(REPORT)
        if data is None or len(data) > REPORT_MAX_BYTES or not correct(ev):
            return False
        if not _last_after(ev, ev.wrote(REPORT, (RESULT,)), RESULT):
            return False
        text, kept = ev.text(REPORT) or "", task.cleaned[1]["kept"]
        phrases = [task.task_id, f"{kept} rows kept"] + tables.answer_phrases(task.track, task.answer)
        numbers = [str(kept)] + [p.split(" ")[-1] for p in tables.answer_phrases(task.track, task.answer)]
        return all(p in text for p in phrases) and sorted(report_numbers(text, task.task_id)) == sorted(numbers)

    requirements = [
        EvidenceRequirement("receipt.inspect", f"a successful call read task.md and {RAW} and printed the task id",
                            lambda ev: any(task.task_id in r.stdout for r in ev.ran(("task.md", RAW)))),
        EvidenceRequirement("file.inspect", f"{INSPECT} as a successful call that read {RAW} left it",
                            lambda ev: bool(ev.wrote(INSPECT, (RAW,))), INSPECT),
        EvidenceRequirement("receipt.clean", f"{CLEAN_CSV} as a successful call that read {RAW} left it",
                            lambda ev: bool(ev.wrote(CLEAN_CSV, (RAW,))), CLEAN_CSV),
        EvidenceRequirement("file.clean_log", f"{CLEAN_LOG} as a successful call that read {RAW} left it",
                            lambda ev: bool(ev.wrote(CLEAN_LOG, (RAW,))), CLEAN_LOG),
        EvidenceRequirement("receipt.analyse", f"{RESULT} as a successful call that read {CLEAN_CSV} left it",
                            lambda ev: bool(ev.wrote(RESULT, (CLEAN_CSV,))), RESULT),
        EvidenceRequirement("file.report", f"{REPORT} as a successful call left it",
                            lambda ev: bool(ev.wrote(REPORT)), REPORT),
        EvidenceRequirement("receipt.submit", "a successful submit call",
                            lambda ev: bool(ev.ok_receipts(tool="submit"))),
    ]
    items = (
        RubricItem("inspect.read", "inspect", "the brief and the raw table were read", ("receipt.inspect",),
                   lambda ev: True),
        RubricItem("inspect.profile", "inspect", "inspect.json gives the raw table's row count, columns, duplicate "
                   "ids and invalid records as the host counts them", ("receipt.inspect", "file.inspect"), profile_ok),
        RubricItem("clean.ran", "clean", "a call that read the raw table wrote clean.csv of its records, every record "
                   "the rule keeps among them", ("receipt.clean",), drawn),
        RubricItem("clean.rows", "clean", "clean.csv holds exactly the records the cleaning rule keeps, in order",
                   ("receipt.clean",), rows_ok),
        RubricItem("clean.log", "clean", "clean.json's counts are the host's (kept, duplicates, invalid), kept that of "
                   "clean.csv", ("file.clean_log",), log_ok),
        RubricItem("analyse.ran", "analyse", "a call that read clean.csv wrote an answer of the question's shape",
                   ("receipt.analyse",), analysed),
        RubricItem("analyse.replayed", "analyse", "the answer is what the question gives on the clean.csv the call "
                   "read, a cleaning of the raw table (host replay, finite)", ("receipt.analyse",), replayed),
        RubricItem("analyse.correct", "analyse", "the answer equals the host's answer on the correctly cleaned table",
                   ("receipt.analyse",), correct),
        RubricItem("report.written", "report", "a call that read result.json (right, unchanged since) wrote a report "
                   "of the task id, the rows kept and the answer, and no other number", ("file.report",), report_ok),
        RubricItem("report.submitted", "report", "result.json, an analysis's answer, was submitted",
                   ("receipt.submit",), lambda ev: ev.submitted == RESULT and analysed(ev)),
    )
    return Rubric(items, {r.key: r for r in requirements}, STAGES)


def score_task(task: TabularTask, files: Mapping[str, bytes], submitted: str | None, limits: DecodeLimits) -> float:
    """The task metric, 0–1: the submitted result.json's answer against the host's (`tables.answer_score`).

    It is 0 when another path (or nothing) was submitted or the file is not a JSON object with an 'answer'."""
    if submitted != RESULT:
        return 0.0
    data = json_or_none(files.get(RESULT), RESULT, limits)
    if not isinstance(data, dict) or "answer" not in data:
        return 0.0
    return tables.answer_score(task.track, data["answer"], task.answer)
