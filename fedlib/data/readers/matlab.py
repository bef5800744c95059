"""SVHN and SynthDigits: MATLAB ``.mat`` files holding ``X`` (32, 32, 3, n) and ``y``.

MATLAB v5 files are read with scipy and v7.3 files (HDF5) with h5py; both read data only (MATLAB objects stay
opaque, nothing is executed). Label 10 means digit 0 in both, as in torchvision's SVHN.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

from fedlib.data.readers.checksums import _verify, _warn_unchecked
from fedlib.data.readers.common import DatasetFormatError, DatasetNotFoundError, _labels, _pixels_uint8

# --------------------------------------------------------------------------- SVHN


_SVHN_LAYOUT = (
    "SVHN's cropped digits (torchvision's format): a MATLAB (v5) .mat file with 'X' (32, 32, 3, n) uint8 and "
    "'y' (n, 1) labels 1..10, where 10 means digit 0"
)
_SYNTH_LAYOUT = (
    "a MATLAB .mat file (v5, or v7.3 = HDF5) with 'X' (32, 32, 3, n) pixels 0..255 and 'y' (n labels 0..9, "
    "or 10 for digit 0)"
)


def _loadmat(path: Path, expected: str) -> dict:
    """A MATLAB v5 file's variables (scipy reads data only: MATLAB objects stay opaque, nothing is executed)."""
    with open(path, "rb") as f:
        header = f.read(128)
    # A v5 file opens with a 116-byte text header, 8 bytes of subsystem offset, the version and "IM"/"MI"
    # (the byte order); checked first so a wrong file is named as such even without scipy.
    if len(header) < 128 or header[126:128] not in (b"IM", b"MI"):
        raise DatasetFormatError(path, "not a readable MATLAB file (no MATLAB v5 header, and not HDF5)", expected)
    try:
        import scipy.io
    except ImportError as e:
        raise ImportError(f"reading {path} (a MATLAB v5 .mat file) needs scipy: pip install scipy") from e
    try:
        return scipy.io.loadmat(path)
    except (ValueError, TypeError, OSError, NotImplementedError, EOFError, zlib.error, struct.error) as e:
        raise DatasetFormatError(path, f"not a readable MATLAB file ({type(e).__name__}: {e})", expected) from None


def _mat_images(path: Path, mat, expected: str):
    """Check 'X' (32, 32, 3, n) and 'y' (n labels) of a digits .mat file; returns x (n, 32, 32, 3) uint8, y."""
    missing = [k for k in ("X", "y") if k not in mat]
    if missing:
        names = sorted(k for k in mat if not k.startswith("__"))
        raise DatasetFormatError(path, f"has no variable {' or '.join(missing)} (it holds: {names})", expected)
    x, y = np.asarray(mat["X"]), np.asarray(mat["y"])
    if x.ndim != 4 or x.shape[:3] != (32, 32, 3):
        raise DatasetFormatError(path, f"'X' has shape {x.shape}", expected)
    if y.size != x.shape[3] or y.ndim > 2 or (y.ndim == 2 and 1 not in y.shape):
        raise DatasetFormatError(path, f"'y' has shape {y.shape} for {x.shape[3]} images", expected)
    x = _pixels_uint8(path, x, expected)
    return np.ascontiguousarray(x.transpose(3, 0, 1, 2)), _labels(path, y.reshape(-1), expected, ten_is_zero=True)


def _svhn_file(split: str, root: Path) -> None:
    if not (root / "svhn" / f"{split}_32x32.mat").is_file():
        raise DatasetNotFoundError("svhn", root, [f"svhn/{split}_32x32.mat"], "(torchvision's SVHN format)")


def _read_svhn(split: str, root: Path, verify: bool = True):
    _svhn_file(split, root)
    path = root / "svhn" / f"{split}_32x32.mat"
    if verify:
        _verify(path, f"svhn/{split}_32x32.mat")
    # As torchvision's SVHN: label 10 is digit 0.
    return _mat_images(path, _loadmat(path, _SVHN_LAYOUT), _SVHN_LAYOUT)


def _download_svhn(root: Path, split: str) -> None:
    from torchvision.datasets import SVHN
    from torchvision.datasets.utils import download_url

    url, filename, md5 = SVHN.split_list[split]
    download_url(url, str(root / "svhn"), filename, md5)


# --------------------------------------------------------------------------- SynthDigits


def _synth_file(split: str, root: Path) -> Path:
    path = root / "synth_digits" / f"synth_{split}_32x32.mat"
    if not path.is_file():
        raise DatasetNotFoundError("synthdigits", root, [f"synth_digits/synth_{split}_32x32.mat"])
    return path


def _read_synthdigits(split: str, root: Path, verify: bool = True):
    # verify: no published checksum is known for SynthDigits; the content checks always run, and the file is named.
    path = _synth_file(split, root)
    if verify:
        _warn_unchecked(path, "SynthDigits publishes none")
    import h5py

    if h5py.is_hdf5(path):
        # MATLAB v7.3 is HDF5 and stores arrays column-major, so h5py sees the
        # dimensions reversed: X (32,32,3,n) arrives as (n,3,32,32); .T gives MATLAB's order back.
        try:
            with h5py.File(path, "r") as f:
                mat = {k: np.asarray(f[k]).T for k in ("X", "y") if isinstance(f.get(k), h5py.Dataset)}
                mat.update({k: None for k in f if k not in mat and k not in ("X", "y")})
        except OSError as e:
            raise DatasetFormatError(path, f"cannot be read ({e})", _SYNTH_LAYOUT) from None
    else:
        mat = _loadmat(path, _SYNTH_LAYOUT)
    return _mat_images(path, mat, _SYNTH_LAYOUT)
