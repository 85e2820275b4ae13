"""The prescription filter: only aggregates cross from the router to the data side."""

import pytest

from bat_jax.benchmark.stages import StageSet
from bat_jax.stage_bank.prescription import PrescriptionError, check_prescription
from bat_jax.benchmarks.imaging.stages import STAGES


def test_prescription_allows_only_aggregates():
    ok = check_prescription({"round": 3, "target_stage": "Validate", "overall": 0.41,
                             "stage_scores": {"S1": 0.7, "Setup": 0.5, "S3": 0.2, "S4": 0.4, "S5": 0.6},
                             "task_mean": 0.3, "track_changes": {"vqa": -0.02}, "counts": {"target": 400}},
                            STAGES, tracks=("vqa", "segmentation"))
    assert ok["target_stage"] == "S3" and ok["stage_scores"]["S2"] == 0.5
    bad = [
        ({"case_ids": ["case-017"]}, "'case_ids' is not an allowed"),
        ({"stage_scores": {"S1": "0.7 on ISIC_0024306"}}, "stage_scores.S1"),
        ({"track_changes": {"ISIC_0024306": 0.1}}, "only aggregate names"),
        ({"track_changes": {"isic_0024306": 0.1}}, "unknown tracks"),
        ({"counts": {"target": 2.5}}, "must be a count"),
        ({"task_mean": [0.1, 0.2]}, "finite number"),
        ({"round": "3"}, "round index"),
        ({"target_stage": "heldout/vqa"}, "unknown stage"),
    ]
    for payload, message in bad:
        with pytest.raises(PrescriptionError, match=message):
            check_prescription(payload, STAGES, tracks=("vqa",))


def test_stage_names_are_the_benchmarks_own():
    three = StageSet.of([("inspect", "Inspect", 0.2), ("clean", "Clean", 0.3), ("report", "Report", 0.5)], "tabular")
    ok = check_prescription({"target_stage": "Clean", "stage_scores": {"inspect": 0.5, "report": 0.1}}, three)
    assert ok == {"target_stage": "clean", "stage_scores": {"inspect": 0.5, "report": 0.1}}
    with pytest.raises(PrescriptionError, match="unknown stage 'S3' for benchmark 'tabular'"):
        check_prescription({"target_stage": "S3"}, three)
    with pytest.raises(PrescriptionError, match="must name a stage"):
        check_prescription({"target_stage": 3}, three)
