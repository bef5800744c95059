"""CIFAR-10: the python version's pickled batches, read without running code.

The batches are Python 2 pickles, and ``pickle.load`` would call whatever a planted file names; here they are
read with an unpickler that resolves only the NumPy names an array needs, so a data folder can hold data only.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from fedlib.data.readers.checksums import _verify
from fedlib.data.readers.common import DatasetFormatError, DatasetNotFoundError, _labels

# --------------------------------------------------------------------------- CIFAR-10

_CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]


def _cifar_files(root: Path) -> None:
    expected = [f"cifar-10-batches-py/{f}" for f in _CIFAR_FILES]
    if not all((root / e).is_file() for e in expected):
        raise DatasetNotFoundError(
            "cifar10", root, expected, "(the python version of CIFAR-10: cifar-10-python.tar.gz, unpacked)"
        )


_CIFAR_LAYOUT = (
    "the python version of CIFAR-10 (cifar-10-python.tar.gz, unpacked): cifar-10-batches-py/data_batch_1..5 and "
    "test_batch, each a pickled dict with 'data' (n x 3072 uint8: 32x32 red, then green, then blue planes) and "
    "'labels' (n integers 0..9)"
)


def _numpy_reconstruct():
    try:  # NumPy >= 2
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # NumPy 1.x
        from numpy.core.multiarray import _reconstruct
    return _reconstruct


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain data and NumPy arrays only: never calls anything else, so a planted file runs no code.

    A pickle can only call what ``find_class`` hands it (every global, reduce and extension opcode goes
    through it); here that is ndarray reconstruction (``_reconstruct``, ``ndarray``, ``dtype``), which is
    all the CIFAR-10 batches (Python 2 pickles of a dict of bytes, ints, lists and one uint8 array) need.
    """

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"): _numpy_reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): _numpy_reconstruct,
        ("numpy", "ndarray"): lambda: np.ndarray,
        ("numpy", "dtype"): lambda: np.dtype,
    }

    def find_class(self, module, name):
        get = self._ALLOWED.get((module, name))
        if get is None:
            raise pickle.UnpicklingError(f"refused to load {module}.{name}: only NumPy arrays and plain data")
        return get()


def _read_cifar_batch(path: Path):
    try:
        with open(path, "rb") as f:
            # latin1: the batches are Python 2 pickles; NumPy's array state decodes correctly this way.
            batch = _ArrayUnpickler(f, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as e:
        raise DatasetFormatError(path, f"not a CIFAR-10 batch ({type(e).__name__}: {e})", _CIFAR_LAYOUT) from None
    if not isinstance(batch, dict):
        raise DatasetFormatError(path, f"holds a {type(batch).__name__}, not a dict", _CIFAR_LAYOUT)
    batch = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise DatasetFormatError(path, f"has keys {sorted(map(str, batch))}, not 'data' and 'labels'", _CIFAR_LAYOUT)
    x = batch["data"]
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3072:
        what = f"{x.dtype} of shape {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
        raise DatasetFormatError(path, f"'data' is {what}", _CIFAR_LAYOUT)
    try:
        y = np.asarray(batch["labels"])
    except (TypeError, ValueError) as e:
        raise DatasetFormatError(path, f"'labels' is not a list of integers ({e})", _CIFAR_LAYOUT) from None
    if y.ndim != 1 or len(y) != len(x):
        raise DatasetFormatError(path, f"{y.size} labels for {len(x)} images", _CIFAR_LAYOUT)
    # rows are channel-major 32x32 planes -> (n, 32, 32, 3)
    return x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), _labels(path, y, _CIFAR_LAYOUT)


def _read_cifar10(split: str, root: Path, verify: bool = True):
    _cifar_files(root)
    names = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    xs, ys = [], []
    for name in names:
        path = root / "cifar-10-batches-py" / name
        if verify:
            _verify(path, f"cifar-10-batches-py/{name}")
        x, y = _read_cifar_batch(path)
        xs.append(x)
        ys.append(y)
    return np.ascontiguousarray(np.concatenate(xs)), np.concatenate(ys)


def _download_cifar10(root: Path) -> None:
    from torchvision.datasets import CIFAR10
    from torchvision.datasets.utils import download_and_extract_archive

    # Only fetch and unpack the (MD5-checked) archive: constructing torchvision's CIFAR10 would unpickle
    # the batches with pickle.load; the reader above reads them without running code.
    download_and_extract_archive(CIFAR10.url, str(root), filename=CIFAR10.filename, md5=CIFAR10.tgz_md5)
