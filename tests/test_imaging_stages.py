"""The imaging suite's stages (bat_jax/benchmarks/imaging/stages.py): S1 Plan … S5 Submit with the paper's Agentic
weights (App. A.6, Table 7) and the gate's late stages."""

from bat_jax.benchmarks.imaging.stages import LATE_STAGES, STAGES, Stage


def test_five_stages_in_workflow_order_with_the_papers_weights():
    assert STAGES.ids == ("S1", "S2", "S3", "S4", "S5") and STAGES.benchmark == "imaging"
    assert [STAGES.title(s) for s in STAGES] == ["Plan", "Setup", "Validate", "Inference", "Submit"]
    assert STAGES.weights == {"S1": 0.25, "S2": 0.15, "S3": 0.35, "S4": 0.15, "S5": 0.10}
    assert (Stage.PLAN, Stage.VALIDATE, Stage.SUBMIT) == ("S1", "S3", "S5")
    assert STAGES.parse("validate") == Stage.VALIDATE and STAGES.label(Stage.INFERENCE) == "S4 Inference"


def test_the_late_stages_are_validate_inference_and_submit():
    assert LATE_STAGES == ("S3", "S4", "S5")
    assert sum(STAGES.weights[s] for s in LATE_STAGES) == 0.35 + 0.15 + 0.10
