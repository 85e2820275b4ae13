"""Synthesis track: fictional T1 → T2 pancreas-MR-like slice translation (NPY); metric mean SSIM."""

from __future__ import annotations

import numpy as np

from bat_jax.benchmarks.imaging.base import ImageToImageTrack

_T1 = (0.0, 0.3, 0.6, 0.9)
_T2 = (0.0, 0.8, 0.5, 0.2)

_METHOD = '''

def predict(x, row, cfg):
    """Piecewise-linear intensity lookup (T1 -> T2) after light smoothing; float32, input shape."""
    from scipy import ndimage
    x = ndimage.gaussian_filter(x, sigma=cfg["sigma"])
    return np.interp(x, cfg["t1_points"], cfg["t2_points"]).astype(np.float32)


def save_prediction(pred, out_dir, case_id):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, case_id + ".npy")
    np.save(path, pred.astype(np.float32))
    return _write_entry(out_dir, case_id, {"image": path})


def summarize(pred):
    return {"shape": list(pred.shape), "nondegenerate": bool(np.isfinite(pred).all() and pred.std() > 1e-3)}
'''


class SynthesisTrack(ImageToImageTrack):
    name = "synthesis"
    title = "pancreas MR T1-to-T2 synthesis"
    input_ext = "npy"
    metric_name = "mean SSIM against the acquired T2 (0-1)"
    method_summary = "a piecewise-linear T1-to-T2 intensity mapping (lookup points in the config)."
    output_summary = "synthetic T2 image (NPY float32, same shape as the input)"
    method_body = _METHOD
    method_config = {"t1_points": list(_T1), "t2_points": list(_T2), "sigma": 0.6}
    n_cases = 4

    def make_case(self, rng, case_id, phrasing=0):
        from scipy import ndimage

        yy, xx = np.mgrid[0:32, 0:32].astype(np.float64)
        tissue = np.zeros((32, 32), np.int64)
        tissue[((yy - 16) / 13) ** 2 + ((xx - 16) / 12) ** 2 <= 1] = 1
        for label in (2, 3):
            cy, cx, r = rng.uniform(10, 22), rng.uniform(10, 22), rng.uniform(3, 5)
            tissue[(yy - cy) ** 2 + (xx - cx) ** 2 <= r * r] = label
        t1 = ndimage.gaussian_filter(np.asarray(_T1)[tissue], 0.8) + rng.normal(0, 0.01, (32, 32))
        t2 = ndimage.gaussian_filter(np.asarray(_T2)[tissue], 0.8)
        return t1.astype(np.float32), {"sequence": "T1w"}, t2

