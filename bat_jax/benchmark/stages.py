"""The stages of a staged benchmark B = (S, C, V): ordered ids, titles and Agentic weights, as data.

Details: docs/design.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping

#: Row focus of the end-to-end surrogate (not a stage).
E2E = "E2E"


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """One stage: its id (e.g. 'S3'), title (e.g. 'Validate') and Agentic weight (0–1)."""

    id: str
    title: str
    weight: float


@dataclasses.dataclass(frozen=True)
class StageSet:
    """The ordered stages of one benchmark, in workflow order (the first stage first).

    Attributes:
      stages: one `StageSpec` per stage; at least two; ids and titles unique and non-empty; weights finite,
        non-negative and summing to 1.
      benchmark: the benchmark's name, for error messages.
    Raises:
      ValueError: naming the benchmark and the field (ids, titles or weights) that is wrong.
    """

    stages: tuple[StageSpec, ...]
    benchmark: str = "benchmark"

    def __post_init__(self):
        where = f"benchmark {self.benchmark!r}: stages"
        specs = tuple(self.stages)
        object.__setattr__(self, "stages", specs)
        if len(specs) < 2:
            raise ValueError(f"{where}: a staged benchmark needs at least 2 stages, got {len(specs)}")
        ids = [s.id for s in specs]
        for spec in specs:
            if not isinstance(spec.id, str) or not spec.id.strip() or spec.id != spec.id.strip():
                raise ValueError(f"{where}: stage id {spec.id!r} must be a non-empty string without outer spaces")
            if spec.id.upper() == E2E:
                raise ValueError(f"{where}: stage id {spec.id!r} is reserved for the end-to-end focus")
            if not isinstance(spec.title, str) or not spec.title.strip():
                raise ValueError(f"{where}: stage {spec.id!r} needs a non-empty title, got {spec.title!r}")
            if not isinstance(spec.weight, (int, float)) or not math.isfinite(spec.weight) or spec.weight < 0:
                raise ValueError(f"{where}: weight of stage {spec.id!r} must be finite and >= 0, got "
                                 f"{spec.weight!r}")
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"{where}: duplicate stage ids {dupes}")
        titles = [s.title.lower() for s in specs]
        dupes = sorted({t for t in titles if titles.count(t) > 1})
        if dupes:
            raise ValueError(f"{where}: duplicate stage titles {dupes}")
        clash = sorted(set(ids) & {s.title for s in specs if s.title != s.id})
        if clash:
            raise ValueError(f"{where}: {clash} is both a stage id and another stage's title")
        total = math.fsum(s.weight for s in specs)
        if abs(total - 1.0) > 1e-9:
            detail = ", ".join(f"{s.id}={s.weight}" for s in specs)
            raise ValueError(f"{where}: weights must sum to 1, got {total!r} ({detail})")

    @classmethod
    def of(cls, specs: Iterable[tuple[str, str, float]], benchmark: str = "benchmark") -> "StageSet":
        """A StageSet from (id, title, weight) triples in workflow order."""
        return cls(tuple(StageSpec(i, t, float(w)) for i, t, w in specs), benchmark)

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.stages)

    def __contains__(self, stage: object) -> bool:
        return stage in self.ids

    @property
    def ids(self) -> tuple[str, ...]:
        """Stage ids in workflow order."""
        return tuple(s.id for s in self.stages)

    @property
    def foci(self) -> tuple[str, ...]:
        """Row foci: 'E2E' then every stage id."""
        return (E2E,) + self.ids

    @property
    def weights(self) -> dict[str, float]:
        """Stage id → Agentic weight, in workflow order."""
        return {s.id: float(s.weight) for s in self.stages}

    def index(self, stage: str) -> int:
        """0-based position of stage `stage` in workflow order (raises like `parse`)."""
        return self.ids.index(self.parse(stage))

    def title(self, stage: str) -> str:
        """The title of stage `stage` (raises like `parse`)."""
        return self.stages[self.index(stage)].title

    def label(self, stage: str) -> str:
        """'<id> <title>' (e.g. 'S3 Validate'), or the id alone when id and title are the same."""
        spec = self.stages[self.index(stage)]
        return spec.id if spec.id == spec.title else f"{spec.id} {spec.title}"

    def parse(self, value: str) -> str:
        """The stage id named by `value`: an id ('S3') or a title, either case-insensitively ('Validate').

        Raises:
          ValueError: naming the value, the benchmark and the accepted spellings.
        """
        text = str(value).strip()
        for spec in self.stages:
            if text == spec.id:
                return spec.id
        for spec in self.stages:
            if text.lower() in (spec.id.lower(), spec.title.lower()):
                return spec.id
        accepted = ", ".join(f"{s.id}/{s.title}" for s in self.stages)
        raise ValueError(f"unknown stage {value!r} for benchmark {self.benchmark!r}; expected one of {accepted}")

    def parse_focus(self, value: str) -> str:
        """'E2E' or a stage id (`parse`)."""
        return E2E if str(value).strip().upper() == E2E else self.parse(value)

    def check_scores(self, scores: Mapping[str, object], what: str) -> dict[str, object]:
        """`scores` keyed by stage id in workflow order, every stage present (keys may be titles).

        Raises:
          ValueError: a stage missing or unknown (the message names `what`, the benchmark and the stages).
        """
        parsed = {self.parse(k): v for k, v in scores.items()}
        missing = [s for s in self.ids if s not in parsed]
        if missing:
            raise ValueError(f"{what} are missing stages {missing} of benchmark {self.benchmark!r} "
                             f"(use None for an unscored stage)")
        return {s: parsed[s] for s in self.ids}
