"""USPS: the Kaggle ``usps.h5`` (HDF5 groups ``train``/``test`` holding ``data`` and ``target``).

h5py reads datasets only (nothing in an HDF5 file is executed); the pixels are floats and must lie in [0, 1].
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedlib.data.readers.checksums import _verify
from fedlib.data.readers.common import DatasetFormatError, DatasetNotFoundError, _labels

# --------------------------------------------------------------------------- USPS


def _usps_file(root: Path) -> Path:
    path = root / "usps" / "usps.h5"
    if not path.is_file():
        raise DatasetNotFoundError(
            "usps", root, ["usps/usps.h5"], "This is the HDF5 layout (groups train/test with data and target)."
        )
    return path


_USPS_LAYOUT = (
    "HDF5 with groups 'train' and 'test', each holding 'data' (n x 256 floats in [0, 1]: 16x16 images, "
    "row-major) and 'target' (n labels 0..9) - the Kaggle usps.h5"
)


def _read_usps(split: str, root: Path, verify: bool = True):
    import h5py

    path = _usps_file(root)
    if verify:
        _verify(path, "usps/usps.h5")
    if not h5py.is_hdf5(path):
        raise DatasetFormatError(path, "not an HDF5 file", _USPS_LAYOUT)
    try:
        with h5py.File(path, "r") as f:
            group = f.get(split)
            if not isinstance(group, h5py.Group):
                raise DatasetFormatError(path, f"no group {split!r} (top level holds: {sorted(f)})", _USPS_LAYOUT)
            for key in ("data", "target"):
                if not isinstance(group.get(key), h5py.Dataset):
                    raise DatasetFormatError(
                        path, f"group {split!r} has no dataset {key!r} (it holds: {sorted(group)})", _USPS_LAYOUT
                    )
            x, y = group["data"][()], group["target"][()]
    except OSError as e:  # damaged inside (h5py's messages do not name the file)
        raise DatasetFormatError(path, f"cannot be read ({e})", _USPS_LAYOUT) from None
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim != 2 or x.shape[1] != 256 or x.dtype.kind != "f":
        raise DatasetFormatError(path, f"{split}/data is {x.dtype} of shape {x.shape}", _USPS_LAYOUT)
    if not (y.ndim == 1 or (y.ndim == 2 and y.shape[1] == 1)) or y.size != len(x):
        raise DatasetFormatError(
            path, f"{split}/data has {len(x)} images but {split}/target has shape {y.shape}", _USPS_LAYOUT
        )
    if x.size and not (np.isfinite(x).all() and x.min() >= 0 and x.max() <= 1):
        raise DatasetFormatError(path, f"{split}/data has values outside [0, 1] (or not finite)", _USPS_LAYOUT)
    return x.astype(np.float32).reshape(-1, 16, 16), _labels(f"{path} [{split}/target]", y.reshape(-1), _USPS_LAYOUT)
