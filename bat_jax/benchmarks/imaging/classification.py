"""Classification track: fictional skin-lesion PNGs in three classes; metric accuracy."""

from __future__ import annotations

import numpy as np

from bat_jax.benchmarks.imaging.base import Case, Track

CLASSES = ("keratosis", "nevus", "melanoma")
_LEVELS = {"keratosis": 0.28, "nevus": 0.5, "melanoma": 0.82}

_METHOD = '''

def predict(x, row, cfg):
    """Nearest-prototype classifier on the mean lesion intensity; returns {label: score} (sums to 1)."""
    lesion = x[x > cfg["lesion_threshold"]]
    level = float(lesion.mean()) if lesion.size else 0.0
    d = np.array([abs(level - cfg["prototypes"][c]) for c in cfg["classes"]])
    w = np.exp(-d / cfg["temperature"])
    return dict(zip(cfg["classes"], (w / w.sum()).tolist()))


def save_prediction(pred, out_dir, case_id):
    label = max(pred, key=pred.get)
    return _write_entry(out_dir, case_id, {"label": label, "scores": pred})


def summarize(pred):
    v = np.array(list(pred.values()))
    return {"shape": [len(v)], "nondegenerate": bool(np.isfinite(v).all() and v.max() - v.min() > 1e-3)}
'''


class ClassificationTrack(Track):
    name = "classification"
    title = "skin-lesion classification"
    input_ext = "png"
    metric_name = "accuracy (0-1)"
    method_summary = ("a nearest-prototype lesion classifier over the classes " + ", ".join(CLASSES) + ".")
    output_summary = "class label"
    method_body = _METHOD
    method_config = {"classes": list(CLASSES), "prototypes": _LEVELS, "lesion_threshold": 0.17,
                     "temperature": 0.05}
    n_cases = 6

    def make_case(self, rng, case_id, phrasing=0):
        label = CLASSES[int(rng.integers(0, len(CLASSES)))]
        yy, xx = np.mgrid[0:32, 0:32]
        cy, cx, r = rng.uniform(12, 20), rng.uniform(12, 20), rng.uniform(5, 9)
        img = np.full((32, 32), 0.06) + rng.normal(0, 0.025, (32, 32))
        img[(yy - cy) ** 2 + (xx - cx) ** 2 <= r * r] += _LEVELS[label] - 0.06
        return np.clip(img, 0, 1), {"body_site": str(rng.choice(["arm", "back", "leg"]))}, label

    def check_entry(self, entry, files):
        if not isinstance(entry, dict) or entry.get("label") not in CLASSES:
            return [f"entry must be an object with 'label' in {list(CLASSES)}"]
        return []

    def case_score(self, entry, files, case: Case) -> float:
        return float(entry["label"] == case.target)

    def expected_shape(self, case):
        return [len(CLASSES)]

    def nondegenerate(self, entry, files):
        scores = entry.get("scores", {})
        return isinstance(scores, dict) and len(set(scores.values())) > 1

    def manifest_extra(self, case):
        return {"answer": case.target}
