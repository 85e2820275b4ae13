"""Detection track: bright fictional fracture fragments in wrist-radiograph-like PNGs; metric AP@0.5."""

from __future__ import annotations

import math

import numpy as np

from bat_jax.benchmarks.imaging.base import Case, TaskInstance, Track
from bat_jax.benchmarks.imaging.metrics import average_precision

_METHOD = '''

def predict(x, row, cfg):
    """Threshold + connected components; returns boxes [[x0, y0, x1, y1, score], ...] (pixel edges)."""
    from scipy import ndimage
    labels, n = ndimage.label(x > cfg["threshold"])
    boxes = []
    for k, sl in enumerate(ndimage.find_objects(labels), start=1):
        if int((labels[sl] == k).sum()) < cfg["min_pixels"]:
            continue
        ys, xs = sl
        score = float(x[sl][labels[sl] == k].mean())
        boxes.append([float(xs.start), float(ys.start), float(xs.stop), float(ys.stop), round(score, 4)])
    return np.array(boxes, dtype=np.float64).reshape(-1, 5)


def save_prediction(pred, out_dir, case_id):
    return _write_entry(out_dir, case_id, {"boxes": [[float(v) for v in b] for b in pred]})


def summarize(pred):
    return {"shape": list(pred.shape), "nondegenerate": bool(pred.shape[0] > 0)}
'''


def _finite_number(value) -> bool:
    """An int or float (not a bool) with a finite float64 value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an int past float64's range
        return False


class DetectionTrack(Track):
    name = "detection"
    title = "wrist radiograph fracture detection"
    input_ext = "png"
    metric_name = "average precision at IoU 0.5 (0-1)"
    method_summary = "a threshold + connected-component fragment detector returning scored boxes."
    output_summary = "list of boxes [x0, y0, x1, y1, score] in pixel edges"
    method_body = _METHOD
    method_config = {"threshold": 0.5, "min_pixels": 4}
    n_cases = 4

    def make_case(self, rng, case_id, phrasing=0):
        img = np.full((32, 32), 0.12) + rng.normal(0, 0.03, (32, 32))
        boxes = []
        for k in range(int(rng.integers(1, 3))):
            w, h = int(rng.integers(4, 8)), int(rng.integers(4, 8))
            x0 = int(rng.integers(1, 14)) + 16 * k
            y0 = int(rng.integers(1, 32 - h - 1))
            x0 = min(x0, 31 - w)
            img[y0:y0 + h, x0:x0 + w] = rng.uniform(0.75, 0.95)
            boxes.append([x0, y0, x0 + w, y0 + h])
        return np.clip(img, 0, 1), {"view": str(rng.choice(["PA", "lateral"]))}, boxes

    def check_entry(self, entry, files):
        if not isinstance(entry, dict) or not isinstance(entry.get("boxes"), list):
            return ["entry must be an object with a list 'boxes'"]
        for i, b in enumerate(entry["boxes"]):
            if (not isinstance(b, list) or len(b) != 5 or not all(_finite_number(v) for v in b)
                    or float(b[2]) <= float(b[0]) or float(b[3]) <= float(b[1])):
                return [f"boxes[{i}] must be [x0, y0, x1, y1, score] of finite numbers with x1 > x0 and y1 > y0"]
        return []

    def task_metric(self, instance: TaskInstance, predictions, files) -> float:
        preds = {cid: e["boxes"] for cid, e in predictions.items() if not self.check_entry(e, files)}
        return average_precision(preds, {c.case_id: c.target for c in instance.cases})

    def expected_shape(self, case: Case):
        return [len(case.target), 5]

    def nondegenerate(self, entry, files):
        return len(entry["boxes"]) > 0

    def manifest_extra(self, case):
        return {"answer": case.target}
