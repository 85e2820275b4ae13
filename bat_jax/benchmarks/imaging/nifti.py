"""The imaging suite's NIfTI reader: a gzip'd NIfTI-1 volume decoded on the host within `readers.DecodeLimits`."""

from __future__ import annotations

import gzip
import io
import math

from bat_jax.sandbox.readers import ArrayDecoder, ArtefactError, DecodeLimits, check_dtype, check_shape

#: Bytes of a NIfTI-1 header; header extensions after it are allowed up to `_NIFTI_EXTENSION_BYTES`.
_NIFTI_HEADER_BYTES = 348
_NIFTI_EXTENSION_BYTES = 1 << 16


def load_nifti(data: bytes, path: str, limits: DecodeLimits):
    """A gzip'd NIfTI-1 volume as float64 voxel values (scaling applied), its header checked first.

    Its header is inflated and checked first; the stream is then inflated only up to the bytes that header's shape and
    data type need (a bomb stops there, whatever it would inflate to). Raises ArtefactError, or what nibabel raises on
    a corrupt file (`readers.load_array` reads either as unreadable)."""
    import nibabel as nib
    import numpy as np

    with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
        head = stream.read(_NIFTI_HEADER_BYTES)
        header = nib.Nifti1Header.from_fileobj(io.BytesIO(head), check=True)
        dtype, shape = header.get_data_dtype(), header.get_data_shape()
        check_dtype(dtype, path)
        check_shape(shape, 8, path, limits)
        offset = int(header.get_data_offset())  # nibabel reads the data from there, 0 included
        if not 0 <= offset <= _NIFTI_HEADER_BYTES + _NIFTI_EXTENSION_BYTES:
            raise ArtefactError(f"{path}: NIfTI data offset {offset} is past the header and its extensions")
        need = max(offset + math.prod(shape) * dtype.itemsize, _NIFTI_HEADER_BYTES + 4)
        raw = head + stream.read(need - len(head))
    if len(raw) < need:
        raise ArtefactError(f"{path}: NIfTI data shorter than its header's shape {tuple(shape)}")
    return np.asarray(nib.Nifti1Image.from_bytes(raw).get_fdata())


#: The array formats the imaging suite reads beyond the core's `.npy` and `.png` (`readers.load_array(decoders=)`).
DECODERS: dict[str, ArrayDecoder] = {".nii.gz": load_nifti}
