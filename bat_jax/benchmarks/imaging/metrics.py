"""Task metrics of the seven track families, each on a 0–1 scale (PSNR also in dB).

Details: docs/design.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from scipy import ndimage


def dice(pred: np.ndarray, target: np.ndarray, label: int) -> float:
    """Dice of one label between two integer masks of equal shape; 1.0 when both lack the label.

    Raises:
      ValueError: shapes differ.
    """
    pred, target = np.asarray(pred), np.asarray(target)
    if pred.shape != target.shape:
        raise ValueError(f"dice: shape mismatch {pred.shape} vs {target.shape}")
    a, b = pred == label, target == label
    denom = int(a.sum()) + int(b.sum())
    if denom == 0:
        return 1.0
    return 2.0 * float(np.logical_and(a, b).sum()) / denom


def mean_dice(pred: np.ndarray, target: np.ndarray, labels: Iterable[int]) -> float:
    """Mean Dice over the given foreground labels, 0–1."""
    values = [dice(pred, target, int(lab)) for lab in labels]
    if not values:
        raise ValueError("mean_dice needs at least one label")
    return float(np.mean(values))


def psnr(reference: np.ndarray, test: np.ndarray, data_range: float) -> float:
    """Peak signal-to-noise ratio in dB: 10·log10(R² / MSE); +inf for identical images.

    Raises:
      ValueError: shapes differ or data_range <= 0.
    """
    reference, test = np.asarray(reference, np.float64), np.asarray(test, np.float64)
    if reference.shape != test.shape:
        raise ValueError(f"psnr: shape mismatch {reference.shape} vs {test.shape}")
    if not data_range > 0:
        raise ValueError(f"psnr: data_range must be > 0, got {data_range}")
    # PSNR is invariant to scaling R, reference and test together: scaled into [-1, 1] no square overflows
    scale = max(float(np.max(np.abs(reference), initial=0.0)), float(np.max(np.abs(test), initial=0.0)),
                float(data_range))
    diff = reference / scale - test / scale
    peak = float(np.max(np.abs(diff), initial=0.0))
    if peak == 0.0:
        return float("inf")
    mse_rel = float(np.mean((diff / peak) ** 2))  # mse = (peak * scale)^2 * mse_rel, each factor finite
    return float(20.0 * np.log10(data_range / scale) - 20.0 * np.log10(peak) - 10.0 * np.log10(mse_rel))


def ssim(reference: np.ndarray, test: np.ndarray, data_range: float, sigma: float = 1.5) -> float:
    """Mean structural similarity (Wang et al. 2004) with a Gaussian window, clipped to [0, 1].

    Local statistics use `scipy.ndimage.gaussian_filter` (truncate 3.5σ, reflect borders) with the unbiased
    covariance correction N/(N-1), N = (2·⌊3.5σ+0.5⌋+1)^ndim, as scikit-image does.

    Finite for any finite input: values are clipped to ±1e30·data_range (a window holding such a value has a
    luminance term below 1e-27 either way), local variances to >= 0 and each window's index to [-1, 1] (its
    mathematical range), so float round-off on huge values cannot add up to a score.

    Raises:
      ValueError: shapes differ, data_range <= 0, or a non-finite value in either image.
    """
    x, y = np.asarray(reference, np.float64), np.asarray(test, np.float64)
    if x.shape != y.shape:
        raise ValueError(f"ssim: shape mismatch {x.shape} vs {y.shape}")
    if not data_range > 0:
        raise ValueError(f"ssim: data_range must be > 0, got {data_range}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("ssim: images must be finite")
    bound = 1e30 * float(data_range)
    x, y = np.clip(x, -bound, bound), np.clip(y, -bound, bound)
    truncate = 3.5
    radius = int(truncate * sigma + 0.5)
    n = (2 * radius + 1) ** x.ndim
    cov_norm = n / (n - 1.0)

    def filt(a):
        return ndimage.gaussian_filter(a, sigma=sigma, truncate=truncate, mode="reflect")

    ux, uy = filt(x), filt(y)
    vx = np.maximum(cov_norm * (filt(x * x) - ux * ux), 0.0)
    vy = np.maximum(cov_norm * (filt(y * y) - uy * uy), 0.0)
    vxy = cov_norm * (filt(x * y) - ux * uy)
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux**2 + uy**2 + c1) * (vx + vy + c2))
    crop = tuple(slice(radius, max(radius + 1, d - radius)) for d in x.shape)
    return float(np.clip(np.clip(s[crop], -1.0, 1.0).mean(), 0.0, 1.0))


def accuracy(pred: Sequence, target: Sequence) -> float:
    """Fraction of equal pairs, 0–1. Raises ValueError on unequal lengths or empty input."""
    if len(pred) != len(target) or not target:
        raise ValueError(f"accuracy: need equal non-empty lengths, got {len(pred)} and {len(target)}")
    return float(np.mean([p == t for p, t in zip(pred, target)]))


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """IoU of two boxes [x0, y0, x1, y1] (pixel edges, x1 > x0), 0–1.

    0.0 for a box with a non-finite coordinate. Computed after scaling both boxes into [-1, 1] (IoU is scale invariant),
    so coordinates up to float64's range cannot overflow the areas."""
    a, b = [float(v) for v in a[:4]], [float(v) for v in b[:4]]
    if not all(math.isfinite(v) for v in a + b):
        return 0.0
    scale = max(max(abs(v) for v in a + b), 1e-300)
    a, b = [v / scale for v in a], [v / scale for v in b]
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return min(1.0, max(0.0, inter / union)) if union > 0 else 0.0


def average_precision(
    predictions: Mapping[str, Sequence[Sequence[float]]],
    ground_truth: Mapping[str, Sequence[Sequence[float]]],
    iou_threshold: float = 0.5,
) -> float:
    """Single-class VOC all-point average precision over a set of images, 0–1.

    Args:
      predictions: image id → boxes [x0, y0, x1, y1, score]; images absent count as no detections.
      ground_truth: image id → boxes [x0, y0, x1, y1].
      iou_threshold: a detection is a true positive when IoU >= threshold with an unmatched GT box.

    Returns:
      AP; 1.0 when there is no ground truth and no prediction, 0.0 when only one side is empty.
    """
    n_gt = sum(len(v) for v in ground_truth.values())
    dets = [(float(b[4]), img, b) for img, boxes in predictions.items() for b in boxes]
    if n_gt == 0:
        return 1.0 if not dets else 0.0
    dets.sort(key=lambda d: -d[0])
    used = {img: [False] * len(v) for img, v in ground_truth.items()}
    tp = np.zeros(len(dets))
    for k, (_, img, box) in enumerate(dets):
        gts = ground_truth.get(img, [])
        best, best_j = 0.0, -1
        for j, g in enumerate(gts):
            iou = box_iou(box, g)
            if iou > best:
                best, best_j = iou, j
        if best_j >= 0 and best >= iou_threshold and not used[img][best_j]:
            used[img][best_j] = True
            tp[k] = 1.0
    if not dets:
        return 0.0
    ctp = np.cumsum(tp)
    recall = ctp / n_gt
    precision = ctp / np.arange(1, len(dets) + 1)
    mrec = np.concatenate([[0.0], recall, [1.0]])
    mpre = np.concatenate([[0.0], precision, [0.0]])
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]
    idx = np.where(mrec[1:] != mrec[:-1])[0]
    return float(np.sum((mrec[idx + 1] - mrec[idx]) * mpre[idx + 1]))


_NEGATION = re.compile(r"\b(no|without|negative for|free of|absent)\b[^.;]*$")


def report_labels(text: str, vocabulary: Iterable[str]) -> set[str]:
    """Positive finding labels mentioned in a report: a vocabulary term in a sentence, not negated before it.

    A mention is negated when 'no', 'without', 'negative for', 'free of' or 'absent' occurs earlier in
    the same sentence (sentences split at '.', ';' and newlines). Case-insensitive.
    """
    found: set[str] = set()
    for sentence in re.split(r"[.;\n]", text.lower()):
        for term in vocabulary:
            pos = sentence.find(term.lower())
            if pos >= 0 and not _NEGATION.search(sentence[:pos]):
                found.add(term)
    return found


def label_f1(pred: set[str], target: set[str]) -> float:
    """F1 between two label sets, 0–1; 1.0 when both are empty."""
    if not pred and not target:
        return 1.0
    tp = len(pred & target)
    if tp == 0:
        return 0.0
    p, r = tp / len(pred), tp / len(target)
    return 2 * p * r / (p + r)


def normalize_answer(text: str) -> str:
    """VQA answer normalisation: lower case, strip punctuation/articles/extra spaces."""
    text = re.sub(r"[^a-z0-9 ]", " ", str(text).lower())
    words = [w for w in text.split() if w not in ("a", "an", "the")]
    return " ".join(words)
