"""Synthesis track: SSIM on hand-built submissions and expert on a held-out task."""

import numpy as np
import pytest

from bat_jax.benchmark.scoring import overall_score
from bat_jax.benchmarks.imaging.base import decode_array, encode_input
from bat_jax.rollout.play import play
from bat_jax.benchmarks.imaging.heldout import heldout_suite
from bat_jax.benchmarks.imaging.metrics import ssim
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.registry import get_track
from bat_jax.benchmarks.imaging.stages import STAGES
from bat_jax.benchmarks.imaging.teacher import ScriptedExpert

IMAGING = ImagingBenchmark()
TRACK = get_track("synthesis")


def test_contrast_is_inverted_between_input_and_target():
    inst = TRACK.generate(4)
    for c in inst.cases:
        t1 = decode_array(inst.files[c.file], c.file)
        # T1 → T2 is not the identity: copying the input scores far below a real synthesis
        assert ssim(c.target, t1, 1.0) < 0.8


def test_metric_on_hand_built_submissions():
    inst = TRACK.generate(4)
    files, preds = dict(inst.files), {}
    for c in inst.cases[:3]:
        path = f"{inst.layout.pred_dir}/{c.case_id}.npy"
        files[path] = encode_input(c.target, "npy")
        preds[c.case_id] = {"image": path}
    assert TRACK.task_metric(inst, preds, files) == pytest.approx(0.75)  # 3 perfect of 4
    files[preds[inst.case_ids[0]]["image"]] = encode_input(np.full((32, 32), np.nan), "npy")
    assert "non-finite" in TRACK.check_entry(preds[inst.case_ids[0]], files)[0]


def test_expert_scores_high_on_heldout_success_task(factory):
    inst = heldout_suite(1, ("success",), tracks=["synthesis"])[0]
    cell = play(IMAGING, inst, ScriptedExpert(), make_sandbox=factory).score.to_cell("synthesis", 0, STAGES)
    assert cell.task >= 0.9 and cell.agentic(STAGES) == pytest.approx(1.0)
    assert overall_score(cell.task, cell.agentic(STAGES)) >= 0.9
