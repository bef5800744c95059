"""MNIST and Fashion-MNIST: IDX files (``.gz`` or uncompressed), torchvision's layout.

An IDX file is a magic number (dtype code, number of dimensions), the dimensions and a raw payload; the header
is checked against the payload's length before anything is reshaped, so a cut or padded file is refused.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

from fedlib.data.readers.checksums import _verify
from fedlib.data.readers.common import DatasetFormatError, DatasetNotFoundError, _labels

# --------------------------------------------------------------------------- MNIST / Fashion-MNIST (IDX)

_IDX_FOLDER = {"mnist": "MNIST", "fmnist": "FashionMNIST"}
_IDX_STEMS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
# IDX type codes -> big-endian numpy dtypes (http://yann.lecun.com/exdb/mnist/).
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


_IDX_LAYOUT = (
    "an IDX file (http://yann.lecun.com/exdb/mnist/), gzip-compressed when named .gz: images unsigned bytes "
    "(type 0x08) of shape (n, 28, 28), labels unsigned bytes of shape (n,) in 0..9"
)


def _read_idx(path: Path) -> np.ndarray:
    """Parse one IDX file (``.gz`` or raw) into a native-endian array."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            buf = f.read()
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise DatasetFormatError(path, f"cannot be decompressed ({type(e).__name__}: {e})", _IDX_LAYOUT) from None
    if len(buf) < 4 or buf[0] != 0 or buf[1] != 0 or buf[2] not in _IDX_DTYPES:
        raise DatasetFormatError(path, f"not an IDX file (bad magic number {buf[:4].hex()})", _IDX_LAYOUT)
    dtype, ndim = np.dtype(_IDX_DTYPES[buf[2]]), buf[3]
    if len(buf) < 4 + 4 * ndim:
        raise DatasetFormatError(path, f"header of {ndim} dimensions is cut short ({len(buf)} bytes)", _IDX_LAYOUT)
    dims = struct.unpack(f">{ndim}I", buf[4 : 4 + 4 * ndim])
    offset = 4 + 4 * ndim
    count = int(np.prod(dims, dtype=np.int64))
    if len(buf) - offset != count * dtype.itemsize:
        raise DatasetFormatError(path, f"header says {dims} but payload has {len(buf) - offset} bytes", _IDX_LAYOUT)
    return np.frombuffer(buf, dtype=dtype, offset=offset).reshape(dims).astype(dtype.newbyteorder("="))


def _idx_files(name: str, root: Path, splits) -> list[Path]:
    """Locate the IDX files for ``splits``, preferring ``.gz`` (it can be MD5-checked)."""
    folder = _IDX_FOLDER[name]
    found, expected, missing = [], [], False
    for split in splits:
        for stem in _IDX_STEMS[split]:
            expected.append(f"{folder}/raw/{stem}.gz")
            cands = [root / folder / "raw" / (stem + ".gz"), root / folder / "raw" / stem]
            hit = next((c for c in cands if c.is_file()), None)
            missing |= hit is None
            found.append(hit)
    if missing:
        raise DatasetNotFoundError(
            name, root, expected, "Uncompressed copies (same names without .gz) are accepted too."
        )
    return found


def _read_idx_dataset(name: str, split: str, root: Path, verify: bool = True):
    images, labels = _idx_files(name, root, [split])
    if verify:
        for path in (images, labels):
            _verify(path, path.relative_to(root).as_posix())
    x, y = _read_idx(images), _read_idx(labels)
    if x.dtype != np.uint8 or x.ndim != 3 or x.shape[1:] != (28, 28):
        raise DatasetFormatError(images, f"images are {x.dtype} of shape {x.shape}", _IDX_LAYOUT)
    if y.dtype != np.uint8 or y.ndim != 1:
        raise DatasetFormatError(labels, f"labels are {y.dtype} of shape {y.shape}", _IDX_LAYOUT)
    if len(x) != len(y):
        raise DatasetFormatError(labels, f"{len(y)} labels for the {len(x)} images of {images}", _IDX_LAYOUT)
    return x, _labels(labels, y, _IDX_LAYOUT)


def _download_idx(name: str, root: Path) -> None:
    from torchvision.datasets import MNIST, FashionMNIST

    # torchvision downloads all four files into <root>/<Folder>/raw and unpacks them.
    (MNIST if name == "mnist" else FashionMNIST)(str(root), train=True, download=True)
