"""VQA track: questions about bright fictional lesions in PNG images; metric exact-match accuracy."""

from __future__ import annotations

import numpy as np

from bat_jax.benchmarks.imaging.base import Case, Track
from bat_jax.benchmarks.imaging.metrics import normalize_answer

#: Question templates by phrasing: 0 training, 1 held-out (disjoint strings, same method keywords).
QUESTIONS = (
    {"count": "How many bright lesions are visible?",
     "side": "Is the largest lesion in the left or the right half of the image?",
     "upper": "Is there any lesion in the upper half of the image?"},
    {"count": "In this image, how many high-intensity lesions can be seen?",
     "side": "Does the biggest lesion lie in the left or right half?",
     "upper": "Is at least one lesion located in the upper half?"},
)
_NUMBERS = ("zero", "one", "two", "three", "four", "five")

_METHOD = '''

def predict(x, row, cfg):
    """Rule-based visual question answering over bright connected components. Returns {"answer": str,
    "lesions": [[pixels, row, col] of each component], "background": [mean, std] of the other pixels}."""
    from scipy import ndimage
    labels, n = ndimage.label(x > cfg["threshold"])
    sizes = ndimage.sum(np.ones_like(x), labels, index=range(1, n + 1)) if n else []
    centers = ndimage.center_of_mass(np.ones_like(x), labels, range(1, n + 1)) if n else []
    rest = x[labels == 0].astype(np.float64)
    q = row["question"].lower()
    if "how many" in q:
        answer = cfg["numbers"][n] if n < len(cfg["numbers"]) else str(n)
    elif "left or" in q:
        if not n:
            answer = "none"
        else:
            cy, cx = centers[int(np.argmax(sizes))]
            answer = "left" if cx < x.shape[1] / 2 else "right"
    elif "upper half" in q:
        answer = "yes" if any(cy < x.shape[0] / 2 for cy, cx in centers) else "no"
    else:
        answer = "unknown"
    lesions = [[float(s), float(c[0]), float(c[1])] for s, c in zip(sizes, centers)]
    background = [float(rest.mean()), float(rest.std())] if rest.size else [0.0, 0.0]
    return {"answer": answer, "lesions": lesions, "background": background}


def save_prediction(pred, out_dir, case_id):
    return _write_entry(out_dir, case_id, {"answer": str(pred["answer"]), "lesions": pred["lesions"],
                                           "background": pred["background"]})


def summarize(pred):
    answer = str(pred["answer"])
    return {"shape": [1], "nondegenerate": bool(answer.strip()) and answer != "unknown"}
'''


class VQATrack(Track):
    name = "vqa"
    title = "medical visual question answering"
    input_ext = "png"
    metric_name = "exact-match accuracy of normalised answers (0-1)"
    method_summary = "a rule-based question answerer over bright image components (reads the question column)."
    output_summary = "short answer to the case's question"
    method_body = _METHOD
    method_config = {"threshold": 0.5, "numbers": list(_NUMBERS)}
    n_cases = 6

    def make_case(self, rng, case_id, phrasing=0):
        img = np.full((32, 32), 0.1) + rng.normal(0, 0.03, (32, 32))
        n = int(rng.integers(1, 4))
        cells = rng.choice(16, size=n, replace=False)
        spots = []
        for k, cell in enumerate(cells):
            size = 2 + 2 * k + int(rng.integers(0, 2))  # distinct sizes: the largest lesion is unambiguous
            y0, x0 = 8 * (cell // 4) + 1, 8 * (cell % 4) + 1
            img[y0:y0 + size, x0:x0 + size] = 0.85
            spots.append((size, y0 + size / 2, x0 + size / 2))
        kind = str(rng.choice(list(QUESTIONS[0])))
        if kind == "count":
            answer = _NUMBERS[n]
        elif kind == "side":
            answer = "left" if max(spots)[2] < 16 else "right"
        else:
            answer = "yes" if any(cy < 16 for _, cy, _ in spots) else "no"
        return np.clip(img, 0, 1), {"question": QUESTIONS[phrasing][kind]}, answer

    def check_entry(self, entry, files):
        if not isinstance(entry, dict) or not isinstance(entry.get("answer"), str):
            return ["entry must be an object with a string 'answer'"]
        return []

    def case_score(self, entry, files, case: Case) -> float:
        return float(normalize_answer(entry["answer"]) == normalize_answer(case.target))

    def expected_shape(self, case):
        return [1]

    def nondegenerate(self, entry, files):
        return bool(entry["answer"].strip()) and entry["answer"] != "unknown"

    def manifest_extra(self, case):
        return {"question": case.meta["question"], "answer": case.target}
