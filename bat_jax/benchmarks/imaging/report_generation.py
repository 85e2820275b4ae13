"""Report-generation track (track name "report", as in banks and digests).

Fictional chest radiograph PNGs; metric label F1 of the findings in the report."""

from __future__ import annotations

import numpy as np

from bat_jax.benchmarks.imaging.base import Case, Track
from bat_jax.benchmarks.imaging.metrics import label_f1, report_labels

FINDINGS = ("effusion", "nodule", "cardiomegaly")

_METHOD = '''

def predict(x, row, cfg):
    """Rule-based finding detector. Returns {"findings": {finding: bool} for effusion, nodule, cardiomegaly,
    "levels": {region: mean intensity} of the heart, fluid and nodule regions the findings are read from}."""
    regions = {"heart": x[12:25, 12:21], "fluid": x[18:24, 3:12], "nodule": x[4:13, 21:30]}
    heart = int((regions["heart"] > cfg["heart_level"]).sum())
    effusion = int((regions["fluid"] > cfg["fluid_level"]).sum())
    nodule = int((regions["nodule"] > cfg["nodule_level"]).sum())
    findings = {"effusion": effusion >= cfg["min_fluid_pixels"], "nodule": nodule >= cfg["min_nodule_pixels"],
                "cardiomegaly": heart >= cfg["min_heart_pixels"]}
    return {"findings": findings, "levels": {k: float(v.astype(np.float64).mean()) for k, v in regions.items()}}


def write_report(findings):
    present = [k for k, v in findings.items() if v]
    absent = [k for k, v in findings.items() if not v]
    lines = ["Findings:"]
    for k in present:
        lines.append(cfg_sentence(k, True))
    for k in absent:
        lines.append(cfg_sentence(k, False))
    lines.append("Impression: " + (", ".join(present) if present else "no acute abnormality") + ".")
    return "\\n".join(lines)


def cfg_sentence(finding, present):
    text = {"effusion": "pleural effusion", "nodule": "pulmonary nodule", "cardiomegaly": "cardiomegaly"}[finding]
    return ("There is " + text + ".") if present else ("No " + text + ".")


def save_prediction(pred, out_dir, case_id):
    report = write_report(pred["findings"])
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, case_id + ".txt"), "w") as f:
        f.write(report)
    return _write_entry(out_dir, case_id, {"report": report, "levels": pred["levels"]})


def summarize(pred):
    return {"shape": [len(pred["findings"])], "nondegenerate": bool(len(write_report(pred["findings"])) > 20)}
'''


def reference_report(findings: set[str], phrasing: int = 0) -> str:
    """The hidden reference report text of a case (manifest field for the leakage preflight).

    phrasing 0 (training) and 1 (held-out) use disjoint sentence templates with the same labels."""
    names = {"effusion": "pleural effusion", "nodule": "pulmonary nodule", "cardiomegaly": "cardiomegaly"}
    if phrasing:
        parts = [f"Radiograph demonstrates {names[f]}." if f in findings else f"Without {names[f]}."
                 for f in FINDINGS]
        return "Reference read: " + " ".join(parts)
    parts = [f"There is {names[f]}." if f in findings else f"No {names[f]}." for f in FINDINGS]
    return "Findings: " + " ".join(parts)


class _Findings(frozenset):
    """Hidden target of a report case: the finding labels, carrying the reference report text."""

    def __new__(cls, labels, text: str):
        obj = super().__new__(cls, labels)
        obj.text = text
        return obj


class ReportTrack(Track):
    name = "report"
    title = "chest X-ray report generation"
    input_ext = "png"
    metric_name = "label F1 of the findings (effusion, nodule, cardiomegaly) extracted from the report (0-1)"
    method_summary = "a rule-based finding detector with a templated report writer."
    output_summary = "free-text radiology report"
    method_body = _METHOD
    method_config = {"heart_level": 0.45, "fluid_level": 0.45, "nodule_level": 0.75, "min_fluid_pixels": 8,
                     "min_nodule_pixels": 2, "min_heart_pixels": 45}
    n_cases = 4

    def make_case(self, rng, case_id, phrasing=0):
        yy, xx = np.mgrid[0:32, 0:32].astype(np.float64)
        img = np.full((32, 32), 0.2)
        lungs = []
        for cx in (7, 25):
            lung = ((yy - 14) / 9) ** 2 + ((xx - cx) / 4) ** 2 <= 1
            img[lung] = 0.05
            lungs.append(lung)
        findings = {f for f in FINDINGS if rng.random() < 0.5}
        r = 5.0 if "cardiomegaly" in findings else 3.0
        img[(yy - 18) ** 2 + (xx - 16) ** 2 <= r * r] = 0.6
        if "effusion" in findings:
            band = lungs[0] & (yy >= 19) & (yy <= 23)
            img[band] = 0.7
        if "nodule" in findings:
            y0, x0 = int(rng.integers(6, 10)), int(rng.integers(23, 26))
            img[y0:y0 + 2, x0:x0 + 2] = 0.9
        img = img + rng.normal(0, 0.03, (32, 32))
        return np.clip(img, 0, 1), {"view": "PA"}, _Findings(findings, reference_report(findings, phrasing))

    def check_entry(self, entry, files):
        if not isinstance(entry, dict) or not isinstance(entry.get("report"), str) or not entry["report"].strip():
            return ["entry must be an object with a non-empty string 'report'"]
        return []

    def case_score(self, entry, files, case: Case) -> float:
        return label_f1(report_labels(entry["report"], FINDINGS), set(case.target))

    def expected_shape(self, case):
        return [len(FINDINGS)]

    def nondegenerate(self, entry, files):
        return len(entry["report"].strip()) > 20

    def manifest_extra(self, case):
        return {"report_text": case.target.text, "answer": sorted(case.target)}
