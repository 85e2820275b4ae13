"""The tabular suite's stages (bat_jax/benchmarks/tabular/stages.py): inspect → clean → analyse → report with their
Agentic weights, and the gate's late stages."""

from bat_jax.benchmarks.tabular.stages import LATE_STAGES, STAGES


def test_stages_and_weights():
    assert STAGES.ids == ("inspect", "clean", "analyse", "report")
    assert STAGES.weights == {"inspect": 0.2, "clean": 0.3, "analyse": 0.3, "report": 0.2}
    assert STAGES.label("clean") == "clean" and STAGES.foci[0] == "E2E"
    assert LATE_STAGES == ("analyse", "report") and set(LATE_STAGES) <= set(STAGES.ids)
