"""Segmentation track: two fictional organs in small CT-like NIfTI volumes; metric mean Dice (labels 1, 2)."""

from __future__ import annotations

import numpy as np

from bat_jax.benchmarks.imaging.base import Case, Track, array_entry_errors, artefact_array
from bat_jax.benchmarks.imaging.metrics import mean_dice

SHAPE = (16, 16, 8)

_METHOD = '''

def predict(x, row, cfg):
    """Two-threshold organ labelling followed by a 3-voxel median filter; returns an int16 label volume."""
    from scipy import ndimage
    mask = (x > cfg["threshold_organ_a"]).astype(np.int16) + (x > cfg["threshold_organ_b"]).astype(np.int16)
    return ndimage.median_filter(mask, size=cfg["median_size"]).astype(np.int16)


def save_prediction(pred, out_dir, case_id):
    import nibabel as nib
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, case_id + ".nii.gz")
    nib.save(nib.Nifti1Image(pred.astype(np.int16), np.eye(4)), path)
    return _write_entry(out_dir, case_id, {"mask": path})


def summarize(pred):
    labels = sorted(int(v) for v in np.unique(pred))
    return {"shape": list(pred.shape), "labels": labels, "nondegenerate": len(labels) > 1}
'''


class SegmentationTrack(Track):
    name = "segmentation"
    title = "multi-organ CT segmentation"
    input_ext = "nii.gz"
    metric_name = "mean Dice over organ labels 1 and 2 (0-1)"
    method_summary = ("a two-threshold organ labeller with median smoothing (labels: 0 background, "
                      "1 organ A, 2 organ B); `load_input` resamples volumes from their header voxel size to "
                      "the config's `target_spacing`.")
    output_summary = "label volume (NIfTI, same shape as the input)"
    method_body = _METHOD
    method_config = {"threshold_organ_a": 0.25, "threshold_organ_b": 0.6, "median_size": 1,
                     "target_spacing": [1.0, 1.0, 2.0]}
    n_cases = 4
    spacing = (1.0, 1.0, 2.0)

    def make_case(self, rng, case_id, phrasing=0):
        zz, yy, xx = np.meshgrid(*[np.arange(n) for n in SHAPE], indexing="ij")
        target = np.zeros(SHAPE, np.int16)
        for label in (1, 2):
            c = [rng.uniform(4, 12), rng.uniform(3, 6) if label == 1 else rng.uniform(10, 13), rng.uniform(3, 5)]
            r = [rng.uniform(2.5, 4), rng.uniform(2.5, 3.5), rng.uniform(2, 3)]
            inside = ((zz - c[0]) / r[0]) ** 2 + ((yy - c[1]) / r[1]) ** 2 + ((xx - c[2]) / r[2]) ** 2 <= 1
            target[inside] = label
        levels = np.array([0.1, 0.42, 0.8])
        volume = levels[target] + rng.normal(0, 0.04, SHAPE)
        return volume.astype(np.float32), {"modality": "CT"}, target

    def check_entry(self, entry, files):
        return array_entry_errors(entry, "mask", "nii.gz", files)

    def _mask(self, entry, files):
        """The entry's label volume as int16 (values rounded, then clipped to the int16 range)."""
        mask = np.rint(artefact_array(files, entry["mask"]).astype(np.float64))
        return np.clip(mask, -32768, 32767).astype(np.int16)

    def case_score(self, entry, files, case: Case) -> float:
        mask = self._mask(entry, files)
        if mask.shape != case.target.shape:
            return 0.0
        return mean_dice(mask, case.target, (1, 2))

    def expected_shape(self, case):
        return list(case.target.shape)

    def nondegenerate(self, entry, files):
        return bool(np.any(self._mask(entry, files) > 0))
