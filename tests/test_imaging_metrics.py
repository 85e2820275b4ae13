"""Task metrics on hand-built cases (values computed by hand in the comments)."""

import math

import numpy as np
import pytest

from bat_jax.benchmarks.imaging import metrics as M


def test_dice_of_known_masks():
    a = np.array([[1, 1], [0, 2]])
    b = np.array([[1, 0], [1, 2]])
    assert M.dice(a, b, 1) == pytest.approx(0.5)  # |A∩B| = 1, |A| + |B| = 4 → 2/4
    assert M.dice(a, b, 2) == 1.0
    assert M.dice(a, b, 3) == 1.0  # absent from both
    assert M.mean_dice(a, b, (1, 2)) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="shape mismatch"):
        M.dice(a, b[:1], 1)


def test_psnr_of_known_noise_levels():
    ref = np.zeros((8, 8))
    assert M.psnr(ref, ref + 0.1, data_range=1.0) == pytest.approx(20.0)  # MSE 0.01 → 10·log10(100)
    assert M.psnr(ref, ref, 1.0) == math.inf
    rng = np.random.default_rng(0)
    big = np.zeros((256, 256))
    noisy = big + rng.normal(0, 0.05, big.shape)
    # σ = 0.05 → MSE ≈ 0.0025 → PSNR ≈ 26.02 dB
    assert M.psnr(big, noisy, 1.0) == pytest.approx(26.02, abs=0.1)


def test_ssim_identical_and_constant_images():
    x = np.random.default_rng(1).random((16, 16))
    assert M.ssim(x, x, 1.0) == pytest.approx(1.0)
    # constant images: variances vanish, SSIM = (2·c1·c2 + C1) / (c1² + c2² + C1), C1 = (0.01)^2
    c1, c2, C1 = 0.5, 0.25, 1e-4
    expected = (2 * c1 * c2 + C1) / (c1**2 + c2**2 + C1)
    assert M.ssim(np.full((16, 16), c1), np.full((16, 16), c2), 1.0) == pytest.approx(expected, rel=1e-6)
    noisy = x + np.random.default_rng(2).normal(0, 0.3, x.shape)
    assert 0.0 <= M.ssim(x, noisy, 1.0) < 0.7


def test_box_iou_and_average_precision():
    assert M.box_iou([0, 0, 2, 2], [1, 1, 3, 3]) == pytest.approx(1 / 7)
    gt = {"i1": [[0, 0, 4, 4]], "i2": [[10, 10, 14, 14]]}
    preds = {"i1": [[0, 0, 4, 4, 0.9]], "i2": [[20, 20, 24, 24, 0.8], [10, 10, 14, 14, 0.7]]}
    # ranked tp = [1, 0, 1]: precision [1, .5, 2/3], recall [.5, .5, 1] → AP = .5·1 + .5·(2/3)
    assert M.average_precision(preds, gt) == pytest.approx(0.5 + 0.5 * 2 / 3)
    assert M.average_precision({}, gt) == 0.0
    assert M.average_precision({"i1": [[0, 0, 4, 4, 1.0]], "i2": [[10, 10, 14, 14, 1.0]]}, gt) == 1.0
    # a duplicate detection of the same box is a false positive
    dup = {"i1": [[0, 0, 4, 4, 0.9], [0, 0, 4, 4, 0.8]], "i2": [[10, 10, 14, 14, 0.7]]}
    # tp = [1, 0, 1] again → same AP
    assert M.average_precision(dup, gt) == pytest.approx(0.5 + 0.5 * 2 / 3)


def test_report_labels_with_negation_and_label_f1():
    vocab = ("effusion", "nodule", "cardiomegaly")
    text = "There is pleural effusion. No pulmonary nodule; heart size normal without cardiomegaly."
    assert M.report_labels(text, vocab) == {"effusion"}
    assert M.report_labels("Nodule in the right apex.\nNo effusion.", vocab) == {"nodule"}
    assert M.label_f1({"a", "b"}, {"a"}) == pytest.approx(2 / 3)  # p = 1/2, r = 1
    assert M.label_f1(set(), set()) == 1.0
    assert M.label_f1({"a"}, set()) == 0.0


def test_accuracy_and_answer_normalisation():
    assert M.accuracy(["a", "b", "c", "d"], ["a", "b", "x", "d"]) == 0.75
    assert M.normalize_answer("The Left.") == "left"
    assert M.normalize_answer("  TWO lesions! ") == "two lesions"
    with pytest.raises(ValueError):
        M.accuracy([], [])
