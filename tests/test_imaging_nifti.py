"""The imaging suite's NIfTI reader (bat_jax/benchmarks/imaging/nifti.py) on hand-made volumes: voxel values with
scaling, and headers refused before their data is inflated (a huge shape, a short stream, a far data offset, a
complex dtype); through `readers.load_array` only with the suite's decoders."""

import gzip

import nibabel as nib
import numpy as np
import pytest

from bat_jax.benchmarks.imaging.nifti import DECODERS, load_nifti
from bat_jax.sandbox.readers import DEFAULT_LIMITS, ArtefactError, DecodeLimits, load_array


def _header(shape, dtype, offset=352) -> bytes:
    header = nib.Nifti1Header()
    header.set_data_dtype(dtype)
    header.set_data_shape(shape)
    header.set_data_offset(offset)
    return header.binaryblock + b"\0" * 4  # 348 header bytes and the 4 extension-flag bytes


def test_voxel_values_with_scaling_applied():
    image = nib.Nifti1Image(np.array([[0, 1], [2, 3]], dtype=np.int16), np.eye(4))
    image.header.set_slope_inter(2.0, 1.0)  # stored v is read as 2·v + 1
    array = load_nifti(gzip.compress(image.to_bytes()), "p/m.nii.gz", DEFAULT_LIMITS)
    assert array.dtype == np.float64 and array.tolist() == [[1.0, 3.0], [5.0, 7.0]]


def test_a_header_is_checked_before_its_data_is_inflated():
    huge = gzip.compress(_header((400, 400, 400), np.float32))  # 64 M values claimed, none present
    with pytest.raises(ArtefactError, match=r"m.nii.gz: array of shape \(400, 400, 400\) holds 64000000 values, over "
                                            r"the 4096-byte decoded cap"):
        load_nifti(huge, "m.nii.gz", DecodeLimits(max_array_bytes=4096))
    short = gzip.compress(_header((4, 4, 4), np.float32) + b"\0" * 10)  # 64 float32 = 256 bytes claimed, 10 given
    with pytest.raises(ArtefactError, match=r"m.nii.gz: NIfTI data shorter than its header's shape \(4, 4, 4\)"):
        load_nifti(short, "m.nii.gz", DEFAULT_LIMITS)
    far = gzip.compress(_header((2, 2), np.float32, offset=70_000) + b"\0" * 16)  # past 348 + 65,536
    with pytest.raises(ArtefactError, match="m.nii.gz: NIfTI data offset 70000 is past the header and its extensions"):
        load_nifti(far, "m.nii.gz", DEFAULT_LIMITS)
    complex_ = gzip.compress(_header((2, 2), np.complex64) + b"\0" * 32)
    with pytest.raises(ArtefactError, match="m.nii.gz: dtype <c8 is not a plain bool, int or float type"):
        load_nifti(complex_, "m.nii.gz", DEFAULT_LIMITS)


def test_the_core_reads_nifti_only_with_the_suites_decoders():
    data = gzip.compress(nib.Nifti1Image(np.ones((2, 3), dtype=np.uint8), np.eye(4)).to_bytes())
    assert load_array(data, "p/m.nii.gz", DEFAULT_LIMITS, DECODERS).tolist() == [[1.0] * 3] * 2
    with pytest.raises(ArtefactError, match=r"p/m.nii.gz: unsupported extension \(expected one of .npy, .png\)"):
        load_array(data, "p/m.nii.gz")
    with pytest.raises(ArtefactError, match="p/m.nii.gz: unreadable"):
        load_array(b"not gzip", "p/m.nii.gz", DEFAULT_LIMITS, DECODERS)
