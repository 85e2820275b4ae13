"""The held-out firewall: leakage preflight over training/validation data (files, rows, state files).

Source: paper Section 3 ("A hard preflight covers every training and validation file"; "Generation-time rules
... block known task and path markers") and Eq. 15 (Leak(z) = 0 for acceptance). The other side of the
firewall, what the router may tell the data side, is `stage_bank.prescription`.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tarfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from bat_jax.sandbox.types import SandboxState
from bat_jax.sandbox import snapshot
from bat_jax.stage_bank.row import RLRow, SFTRow, StateRef

_WORD = re.compile(r"[a-z0-9]+")
_ID_TOKEN = re.compile(r"[a-z0-9]+(?:[_.\-][a-z0-9]+)*")
_ID_PART = re.compile(r"[a-z0-9]+")
# Lookbehinds + possessive quantifiers keep these linear (no retry from inside a word).
_MULTI_TOKEN = re.compile(r"(?<![a-z0-9])[a-z0-9]++(?:[_.\-][a-z0-9]++)+")
_SLASH_TOKEN = re.compile(r"(?<![a-z0-9_.\-~])[a-z0-9_.\-~]*+(?:[/\\][a-z0-9_.\-~]*+)+")


class LeakageError(RuntimeError):
    """The preflight found held-out content; the launch must not start."""


@dataclasses.dataclass(frozen=True)
class HeldOutManifest:
    """What must never appear in training or validation data.

    Attributes: tuples of strings — task_ids, case_ids, paths, questions, answers, reports.
    """

    task_ids: tuple[str, ...] = ()
    case_ids: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    questions: tuple[str, ...] = ()
    answers: tuple[str, ...] = ()
    reports: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, source: str = "") -> "HeldOutManifest":
        """Builds a manifest from a mapping of field → list of strings.

        Raises:
          ValueError: an unknown field or a non-string entry (names `source`, field and index).
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"{source}: unknown held-out manifest fields {sorted(unknown)}; allowed {sorted(names)}")
        out = {}
        for name in names:
            values = list(d.get(name, ()))
            for i, v in enumerate(values):
                if not isinstance(v, str) or not v.strip():
                    raise ValueError(f"{source}: field {name!r}[{i}] must be a non-empty string, got {v!r}")
            out[name] = tuple(values)
        return cls(**out)

    @classmethod
    def from_task_manifest(cls, man: Mapping[str, Any], *, ignore_paths: Iterable[str] = ("task.md",)
                           ) -> "HeldOutManifest":
        """Converts a benchmark's held-out suite manifest (`StagedBenchmark.manifest`).

        Its shape: {'tasks': [{'task_id', 'paths', 'cases': [{'case_id', 'file', 'question', 'answer', 'report_text',
        ...}]}]}.

        `ignore_paths`: fixed file names shared by every task (they identify nothing). Non-string answers
        (label lists, boxes) are skipped; the task brief is not a marker (training briefs share its template).

        Raises:
          ValueError: the mapping has no 'tasks' list.
        """
        if not isinstance(man.get("tasks"), list):
            raise ValueError("a task manifest needs a 'tasks' list (StagedBenchmark.manifest)")
        ignore = set(ignore_paths)
        fields: dict[str, list[str]] = {f.name: [] for f in dataclasses.fields(cls)}
        for task in man["tasks"]:
            fields["task_ids"].append(task["task_id"])
            fields["paths"] += [p for p in task.get("paths", ()) if p not in ignore]
            for case in task.get("cases", ()):
                for key, field in (("case_id", "case_ids"), ("file", "paths"), ("question", "questions"),
                                   ("answer", "answers"), ("report_text", "reports")):
                    value = case.get(key)
                    if isinstance(value, str) and value.strip() and value not in ignore:
                        fields[field].append(value)
        return cls(**{k: tuple(dict.fromkeys(v)) for k, v in fields.items()})

    @classmethod
    def load(cls, path: str | os.PathLike) -> "HeldOutManifest":
        """Reads a JSON manifest file: this class's fields, or a task manifest (has a 'tasks' list)."""
        data = json.loads(Path(path).read_text("utf-8"))
        if "tasks" in data:
            return cls.from_task_manifest(data)
        return cls.from_dict(data, source=str(path))


@dataclasses.dataclass(frozen=True)
class LeakageConfig:
    """Matching settings.

    `ngram`: span length in words; `min_short_words`: shortest held-out text that is still matched whole when it has
    fewer than `ngram` words (shorter ones, e.g. 'yes', are not matchable)."""

    ngram: int = 8
    min_short_words: int = 4


@dataclasses.dataclass(frozen=True)
class LeakageHit:
    """One finding: where (file, row, field) and what (kind, marker).

    `kind`: task_id/case_id/path/question/answer/report; `marker`: the matched held-out identifier, path or word
    span."""

    file: str
    row: int | None
    field: str
    kind: str
    marker: str

    def __str__(self) -> str:
        row = f" row {self.row}" if self.row is not None else ""
        return f"{self.file}{row} field {self.field!r}: held-out {self.kind} {self.marker!r}"


@dataclasses.dataclass
class LeakageReport:
    """Result of a preflight: hits plus how much was scanned."""

    hits: list[LeakageHit] = dataclasses.field(default_factory=list)
    files_scanned: int = 0
    rows_scanned: int = 0
    strings_scanned: int = 0

    @property
    def clean(self) -> bool:
        return not self.hits

    def raise_if_leaky(self, max_listed: int = 20) -> None:
        """Raises LeakageError listing up to `max_listed` hits when there is any hit."""
        if self.hits:
            listed = "\n  ".join(str(h) for h in self.hits[:max_listed])
            more = f"\n  ... and {len(self.hits) - max_listed} more" if len(self.hits) > max_listed else ""
            raise LeakageError(f"leakage preflight found {len(self.hits)} held-out markers; refusing to start:"
                               f"\n  {listed}{more}")


def _norm_path(path: str) -> tuple[str, ...]:
    parts = path.strip().lower().replace("\\", "/").split("/")
    return tuple(p for p in parts if p and p != ".")


class LeakageScanner:
    """Compiled matchers for one manifest. Thread-compatible; build once, scan many."""

    def __init__(self, manifest: HeldOutManifest, config: LeakageConfig = LeakageConfig()):
        if config.ngram < 2 or config.min_short_words < 1:
            raise ValueError(f"LeakageConfig needs ngram >= 2 and min_short_words >= 1, got {config}")
        self.config = config
        # Identifiers (and single-component paths) split by parts: one-part keys are looked up among the
        # text's words, multi-part keys as runs of parts inside separator-joined tokens.
        self._ids: dict[str, tuple[str, str]] = {}
        self._literal_ids: list[tuple[str, str, str]] = []
        self._paths: dict[tuple[str, ...], str] = {}
        id_like = [("task_id", v) for v in manifest.task_ids] + [("case_id", v) for v in manifest.case_ids]
        for p in manifest.paths:
            comps = _norm_path(p)
            if len(comps) == 1:
                id_like.append(("path", p))
            elif comps:
                self._paths.setdefault(comps, p)
        for kind, v in id_like:
            key = v.strip().lower()
            if kind == "path":
                key = _norm_path(key)[0]
            if _ID_TOKEN.fullmatch(key):
                self._ids.setdefault(key, (kind, v))
            else:
                self._literal_ids.append((key, kind, v))
        self._single_ids = {k for k in self._ids if _ID_PART.fullmatch(k)}
        self._multi_first = {_ID_PART.match(k).group() for k in self._ids if k not in self._single_ids}
        self._max_id_parts = max((len(_ID_PART.findall(k)) for k in self._ids), default=1)
        self._max_path_parts = max((len(c) for c in self._paths), default=1)
        n = config.ngram
        self._grams: dict[tuple[str, ...], tuple[str, int]] = {}
        self._short: dict[int, dict[tuple[str, ...], tuple[str, int]]] = {}
        for kind, values in (("question", manifest.questions), ("answer", manifest.answers),
                             ("report", manifest.reports)):
            for idx, text in enumerate(values):
                words = _WORD.findall(text.lower())
                if len(words) >= n:
                    for i in range(len(words) - n + 1):
                        self._grams.setdefault(tuple(words[i:i + n]), (kind, idx))
                elif len(words) >= config.min_short_words:
                    self._short.setdefault(len(words), {}).setdefault(tuple(words), (kind, idx))

    def _window_hits(self, words: list[str], length: int, table: Mapping[tuple[str, ...], tuple[str, int]],
                     found: dict) -> None:
        windows = zip(*(words[k:] for k in range(length)))  # tuples built in C
        matched = set(windows) & table.keys()
        if matched:  # rare: report in text order
            for window in zip(*(words[k:] for k in range(length))):
                if window in matched:
                    found[(table[window][0], " ".join(window))] = None

    def scan_text(self, text: str) -> list[tuple[str, str]]:
        """(kind, marker) pairs found in one string, each distinct marker once.

        Order: identifiers, then paths, then spans (spans in text order); deterministic for a given text."""
        low = text.lower()
        found: dict[tuple[str, str], None] = {}
        words = _WORD.findall(low)
        if self._ids:
            for tok in sorted(self._single_ids.intersection(words)):
                found[self._ids[tok]] = None
            if self._multi_first:
                for tok in sorted(set(_MULTI_TOKEN.findall(low))):
                    bounds = [(m.start(), m.end()) for m in _ID_PART.finditer(tok)]
                    for i in range(len(bounds)):
                        if tok[bounds[i][0]:bounds[i][1]] not in self._multi_first:
                            continue
                        for j in range(i + 1, min(len(bounds), i + self._max_id_parts)):
                            hit = self._ids.get(tok[bounds[i][0]:bounds[j][1]])
                            if hit is not None:
                                found[hit] = None
        for key, kind, original in self._literal_ids:
            if key in low:
                found[(kind, original)] = None
        if self._paths:
            for tok in sorted(set(_SLASH_TOKEN.findall(low))):
                comps = _norm_path(tok)
                for i in range(len(comps)):
                    for j in range(i + 2, min(len(comps), i + self._max_path_parts) + 1):
                        hit = self._paths.get(comps[i:j])
                        if hit is not None:
                            found[("path", hit)] = None
        if self._grams or self._short:
            if self._grams:
                self._window_hits(words, self.config.ngram, self._grams, found)
            for length, table in self._short.items():
                self._window_hits(words, length, table, found)
        return list(found)

    def scan_value(self, value: Any, *, file: str, row: int | None, field: str, report: LeakageReport) -> None:
        """Scans a JSON-like value recursively (dict keys and values, lists, strings), appending hits.

        Fast path: all strings are joined with newlines and scanned once; only a value with a candidate hit
        is walked again string by string to name the field (so a span spanning two strings is not reported).
        """
        texts = _flatten(value, [])
        report.strings_scanned += len(texts)
        if not texts or not self.scan_text("\n".join(texts)):
            return
        stack = [(field, value)]
        while stack:
            path, v = stack.pop()
            if isinstance(v, str):
                for kind, marker in self.scan_text(v):
                    report.hits.append(LeakageHit(file, row, path, kind, marker))
            elif isinstance(v, Mapping):
                for k, sub in reversed(list(v.items())):
                    sub_path = f"{path}.{k}" if path else str(k)
                    stack.append((sub_path, sub))
                    stack.append((f"{sub_path}<key>", str(k)))
            elif isinstance(v, (list, tuple)):
                for i in reversed(range(len(v))):
                    stack.append((f"{path}[{i}]", v[i]))

    def scan_state(self, state: SandboxState, *, file: str, row: int | None, field: str,
                   report: LeakageReport) -> None:
        """Scans every file of a sandbox state (its path and its bytes decoded as UTF-8) and its env."""
        for path in sorted(state.files):
            f = f"{field}.files[{path}]"
            for kind, marker in self.scan_text(path):
                report.hits.append(LeakageHit(file, row, f + "<path>", kind, marker))
            self.scan_value(bytes(state.files[path]).decode("utf-8", errors="replace"), file=file, row=row,
                            field=f, report=report)
        self.scan_value(dict(state.env), file=file, row=row, field=f"{field}.env", report=report)

    def scan_file(self, path: Path, report: LeakageReport) -> None:
        """Scans one file by its kind.

        .jsonl → each line as a row; .json → one value; .tar → a sandbox-state snapshot (`bat_jax.sandbox.snapshot`; any
        other tar: each member); anything else → its text.

        Raises:
          LeakageError: a .tar that cannot be read at all (an unscannable file must not pass the firewall).
        """
        name = str(path)
        data = path.read_bytes()
        report.files_scanned += 1
        if path.suffix == ".jsonl":
            for i, line in enumerate(data.decode("utf-8", errors="replace").splitlines()):
                report.rows_scanned += 1
                try:
                    value = json.loads(line)
                except json.JSONDecodeError:
                    value = line
                self.scan_value(value, file=name, row=i, field="", report=report)
        elif path.suffix == ".json":
            try:
                value = json.loads(data.decode("utf-8", errors="replace"))
            except json.JSONDecodeError:
                value = data.decode("utf-8", errors="replace")
            self.scan_value(value, file=name, row=None, field="", report=report)
        elif path.suffix == ".tar":
            try:
                state = snapshot.load(path)
            except ValueError:  # not a snapshot (or a damaged one): scan its members as they are
                state = SandboxState(_tar_members(path, name))
            self.scan_state(state, file=name, row=None, field="state", report=report)
        else:
            self.scan_value(data.decode("utf-8", errors="replace"), file=name, row=None, field="<text>",
                            report=report)


def _tar_members(path: Path, name: str) -> dict[str, bytes]:
    try:
        with tarfile.open(path, mode="r") as tar:
            return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    except tarfile.TarError as e:
        raise LeakageError(f"{name}: unreadable tar archive, cannot be scanned ({e})") from e


def _flatten(value: Any, out: list[str]) -> list[str]:
    """Every string of a JSON-like value (dict keys included), depth first."""
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            out.append(str(k))
            _flatten(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _flatten(v, out)
    return out


def _walk(paths: Iterable[str | os.PathLike]) -> list[Path]:
    out = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file())
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"leakage preflight: {p} does not exist")
    return out


def preflight(
    manifest: HeldOutManifest,
    *,
    files: Iterable[str | os.PathLike] = (),
    rows: Iterable[RLRow | SFTRow] = (),
    load_state: Callable[[StateRef], SandboxState] | None = None,
    config: LeakageConfig = LeakageConfig(),
    source: str = "<rows>",
) -> LeakageReport:
    """Scans files (directories recursively) and in-memory rows for held-out markers.

    Args:
      manifest: the held-out manifest.
      files: training and validation files or directories (a bank root covers its rows and state archives).
      rows: in-memory rows; their `row` index in hits is their position, `file` is `source`.
      load_state: when given, each RL row's sandbox state is loaded and its files scanned too.

    Returns:
      A LeakageReport; call `raise_if_leaky()` to refuse a launch on any hit.

    A file under a listed directory that disappears between the listing and its reading (a concurrent writer's
    temporary or staging file) is skipped.

    Raises:
      FileNotFoundError: a listed path does not exist.
    """
    scanner = LeakageScanner(manifest, config)
    report = LeakageReport()
    for path in _walk(files):
        try:
            scanner.scan_file(path, report)
        except FileNotFoundError:  # gone since the listing: a writer's temporary or staging file (a Data Factory
            continue               # admitting beside a run); an admitted version's rows are preflighted by rows
    for i, row in enumerate(rows):
        report.rows_scanned += 1
        scanner.scan_value(row.to_dict(), file=source, row=i, field="", report=report)
        if load_state is not None and isinstance(row, RLRow):
            scanner.scan_state(load_state(row.state), file=source, row=i, field="state", report=report)
    return report
