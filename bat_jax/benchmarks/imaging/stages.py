"""The imaging suite's five stages: S1 Plan, S2 Setup, S3 Validate, S4 Inference, S5 Submit.

Source: paper Section 3 ("Agentic scores completion of Plan, Setup, Validate, Inference, and Submit"); weights
.25/.15/.35/.15/.10 from the paper's AutoMedBench-Lite protocol (App. A.6, Table 7).
"""

from __future__ import annotations

from bat_jax.benchmark.stages import StageSet


class Stage:
    """The imaging suite's stage ids, by name (plain strings: the core reads stages as ids)."""

    PLAN = "S1"
    SETUP = "S2"
    VALIDATE = "S3"
    INFERENCE = "S4"
    SUBMIT = "S5"


#: The imaging suite's stages in workflow order, with the paper's Agentic weights.
STAGES = StageSet.of([(Stage.PLAN, "Plan", 0.25), (Stage.SETUP, "Setup", 0.15), (Stage.VALIDATE, "Validate", 0.35),
                      (Stage.INFERENCE, "Inference", 0.15), (Stage.SUBMIT, "Submit", 0.10)], benchmark="imaging")

#: The stages the released non-inferiority gate holds to its late-stage margin (S3–S5).
LATE_STAGES = (Stage.VALIDATE, Stage.INFERENCE, Stage.SUBMIT)
