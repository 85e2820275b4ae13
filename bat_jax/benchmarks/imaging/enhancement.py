"""Enhancement track: denoising fictional low-dose CT slices (NPY); metric mean SSIM (PSNR reported)."""

from __future__ import annotations

import numpy as np

from bat_jax.benchmarks.imaging.base import ImageToImageTrack

_METHOD = '''

def predict(x, row, cfg):
    """Gaussian denoiser (sigma from config); returns a float32 image of the input's shape."""
    from scipy import ndimage
    return ndimage.gaussian_filter(x, sigma=cfg["sigma"]).astype(np.float32)


def save_prediction(pred, out_dir, case_id):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, case_id + ".npy")
    np.save(path, pred.astype(np.float32))
    return _write_entry(out_dir, case_id, {"image": path})


def summarize(pred):
    return {"shape": list(pred.shape), "nondegenerate": bool(np.isfinite(pred).all() and pred.std() > 1e-3)}
'''


def smooth_phantom(rng: np.random.Generator, size: int = 32) -> np.ndarray:
    """A smooth fictional slice in [0, 1]: a disc body with two Gaussian structures."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    img = 0.3 * (((yy - 16) / 13) ** 2 + ((xx - 16) / 11) ** 2 <= 1)
    for _ in range(2):
        cy, cx, s = rng.uniform(9, 23), rng.uniform(9, 23), rng.uniform(2.5, 4.5)
        img = img + rng.uniform(0.3, 0.6) * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * s * s))
    from scipy import ndimage

    return np.clip(ndimage.gaussian_filter(img, 1.0), 0, 1)


class EnhancementTrack(ImageToImageTrack):
    name = "enhancement"
    title = "low-dose CT denoising"
    input_ext = "npy"
    metric_name = "mean SSIM against the full-dose reference (0-1)"
    method_summary = "a Gaussian denoiser (sigma in the config)."
    output_summary = "denoised image (NPY float32, same shape as the input)"
    method_body = _METHOD
    method_config = {"sigma": 1.0}
    n_cases = 4

    def make_case(self, rng, case_id, phrasing=0):
        clean = smooth_phantom(rng)
        noisy = clean + rng.normal(0, 0.03, clean.shape)
        return noisy.astype(np.float32), {"dose": "quarter"}, clean

