"""Enhancement (denoising) track: SSIM on hand-built submissions, expert beats the noisy input."""

import json

import numpy as np
import pytest

from bat_jax.benchmark.scoring import overall_score
from bat_jax.benchmarks.imaging.base import decode_array, encode_input
from bat_jax.rollout.play import play
from bat_jax.benchmarks.imaging.heldout import heldout_suite
from bat_jax.benchmarks.imaging.metrics import psnr, ssim
from bat_jax.benchmarks.imaging.benchmark import ImagingBenchmark
from bat_jax.benchmarks.imaging.registry import get_track
from bat_jax.benchmarks.imaging.stages import STAGES
from bat_jax.benchmarks.imaging.teacher import ScriptedExpert

IMAGING = ImagingBenchmark()
TRACK = get_track("enhancement")


def _with_images(inst, images):
    files, preds = dict(inst.files), {}
    for cid, img in images.items():
        path = f"{inst.layout.pred_dir}/{cid}.npy"
        files[path] = encode_input(img, "npy")
        preds[cid] = {"image": path}
    return files, preds


def test_noise_level_matches_design():
    inst = TRACK.generate(1)
    for c in inst.cases:
        noisy = decode_array(inst.files[c.file], c.file)
        # σ = 0.03 Gaussian noise → PSNR ≈ 10·log10(1 / 0.0009) ≈ 30.5 dB
        assert psnr(c.target, noisy, 1.0) == pytest.approx(30.46, abs=0.6)


def test_ssim_metric_on_hand_built_submissions():
    inst = TRACK.generate(1)
    files, preds = _with_images(inst, {c.case_id: c.target for c in inst.cases})
    assert TRACK.task_metric(inst, preds, files) == pytest.approx(1.0)
    first = inst.cases[0]
    files, preds = _with_images(inst, {first.case_id: np.zeros((8, 8))})
    assert TRACK.task_metric(inst, preds, files) == 0.0  # wrong shape scores 0, other cases missing
    bad = {"image": "elsewhere.png"}
    assert "must end with .npy" in TRACK.check_entry(bad, files)[0]


def test_expert_beats_the_noisy_input(factory):
    inst = heldout_suite(1, ("recovery",), tracks=["enhancement"])[0]
    result = play(IMAGING, inst, ScriptedExpert(), make_sandbox=factory)
    cell = result.score.to_cell("enhancement", 0, STAGES)
    sub = json.loads(result.evidence.files[inst.layout.submission])
    baseline = np.mean([ssim(c.target, decode_array(result.evidence.files[c.file], c.file), 1.0)
                        for c in inst.cases])
    assert set(sub["predictions"]) == set(inst.case_ids)
    assert cell.task > baseline and cell.agentic(STAGES) == pytest.approx(1.0)
    assert overall_score(cell.task, cell.agentic(STAGES)) >= 0.9
