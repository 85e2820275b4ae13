"""The tabular suite's four stages: inspect → clean → analyse → report (weights .2/.3/.3/.2; ids are their titles)."""

from __future__ import annotations

from bat_jax.benchmark.stages import StageSet

#: The suite's stages in workflow order, with their Agentic weights (ids are their own titles).
STAGES = StageSet.of([("inspect", "inspect", 0.2), ("clean", "clean", 0.3), ("analyse", "analyse", 0.3),
                      ("report", "report", 0.2)], benchmark="tabular")
#: Stages the non-inferiority gate holds to its late-stage margin.
LATE_STAGES = ("analyse", "report")
