"""The staged-benchmark contract B = (S, C, V): ordered stages and their Agentic weights.

Source: paper Eq. 1 and Section 3 ("Agentic scores completion of Plan, Setup, Validate, Inference, and
Submit"); weights .25/.15/.35/.15/.10 from the paper's AutoMedBench-Lite protocol (see REFERENCE.md).
E2E is not a scored stage: it is a row *focus* (a surrogate that chains all five stages).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping


class Stage(str, enum.Enum):
    """The five public workflow stages, in workflow order (S1 first)."""

    PLAN = "S1"
    SETUP = "S2"
    VALIDATE = "S3"
    INFERENCE = "S4"
    SUBMIT = "S5"

    @property
    def index(self) -> int:
        """0-based position in workflow order (Plan = 0)."""
        return STAGES.index(self)

    @property
    def title(self) -> str:
        return self.name.capitalize()

    @classmethod
    def parse(cls, value: "str | Stage") -> "Stage":
        """Accepts 'S3', 'Validate', 'validate' or a Stage.

        Raises:
          ValueError: naming the value and the accepted spellings.
        """
        if isinstance(value, Stage):
            return value
        text = str(value).strip()
        for stage in cls:
            if text.upper() == stage.value or text.lower() == stage.name.lower():
                return stage
        accepted = ", ".join(f"{s.value}/{s.title}" for s in cls)
        raise ValueError(f"unknown stage {value!r}; expected one of {accepted}")


STAGES: tuple[Stage, ...] = tuple(Stage)

#: Row focus: one of the five stages or the end-to-end surrogate.
E2E = "E2E"
FOCI: tuple[str, ...] = (E2E,) + tuple(s.value for s in STAGES)

#: Agentic weights of the paper (sum to 1).
DEFAULT_STAGE_WEIGHTS: Mapping[Stage, float] = {
    Stage.PLAN: 0.25,
    Stage.SETUP: 0.15,
    Stage.VALIDATE: 0.35,
    Stage.INFERENCE: 0.15,
    Stage.SUBMIT: 0.10,
}


def validate_stage_weights(weights: Mapping[Stage | str, float], *, tol: float = 1e-9) -> dict[Stage, float]:
    """Checks a stage-weight table and returns it keyed by Stage.

    Args:
      weights: one non-negative weight per stage S1..S5 (keys: Stage, 'S3' or 'Validate').
      tol: absolute tolerance on the sum.

    Raises:
      ValueError: a missing/unknown stage, a negative or non-finite weight, or a sum != 1 (the message
        names the sum and each weight).
    """
    parsed = {Stage.parse(k): float(v) for k, v in weights.items()}
    missing = [s.value for s in STAGES if s not in parsed]
    if missing:
        raise ValueError(f"stage weights are missing stages {missing}; got {sorted(k.value for k in parsed)}")
    for stage, w in parsed.items():
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"stage weight for {stage.value} ({stage.title}) must be finite and >= 0, got {w}")
    total = sum(parsed.values())
    if abs(total - 1.0) > tol:
        detail = ", ".join(f"{s.value}={parsed[s]}" for s in STAGES)
        raise ValueError(f"stage weights must sum to 1, got {total!r} ({detail})")
    return {s: parsed[s] for s in STAGES}
