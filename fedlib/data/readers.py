"""Offline readers for the raw image datasets used by fedlib.

Every loader returns a pair ``(x, y)`` of NumPy arrays: ``x`` holds the images
(uint8 pixels, except USPS which ships floats in [0, 1]) and ``y`` the labels
as int64 in 0..9. Returned arrays are memoised in-process and read-only, so
callers that want to modify them must copy first.

Data root
---------
Files are looked up under a *data root*, chosen in this order:

1. the ``root`` argument of a loader;
2. the environment variable ``FEDLIB_DATA``;
3. the project's ``data/`` folder (next to ``pyproject.toml``) when fedlib runs
   from a source checkout, else ``./data`` in the current directory.

Readers never write inside the data root, so it may be read-only. The only
exception is ``download=True`` (MNIST, Fashion-MNIST, CIFAR-10, SVHN), which
asks torchvision to fetch the files into the root. Decoded MNIST-M arrays are
cached under :func:`cache_dir` instead (``FEDLIB_CACHE``, default
``~/.cache/fedlib``).

Expected layouts (relative to the root)
---------------------------------------
- ``mnist``:  ``MNIST/raw/{train-images-idx3-ubyte, train-labels-idx1-ubyte,
  t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte}`` each ``.gz`` or
  uncompressed (torchvision's layout).
- ``fmnist``: the same file names under ``FashionMNIST/raw/``.
- ``cifar10``: ``cifar-10-batches-py/{data_batch_1..5, test_batch,
  batches.meta}`` (torchvision's layout).
- ``usps``: ``usps/usps.h5`` with groups ``train``/``test`` each holding
  ``data`` (n x 256 floats in [0, 1]) and ``target``.
- ``mnistm``: ``mnist_m/`` in the original release layout
  (``mnist_m_train/*.png``, ``mnist_m_train_labels.txt`` with lines
  ``<file> <label>``, same for ``test``), or a tarball of that layout:
  ``mnist_m/mnist_m.tar.gz``, ``mnist_m/mnist_m_subset.tar.gz`` or
  ``mnist_m*.tar.gz`` at the root (read in place, never extracted).
- ``svhn``: ``svhn/{train,test}_32x32.mat`` (torchvision's SVHN format; needs
  scipy).
- ``synthdigits``: ``synth_digits/synth_{train,test}_32x32.mat`` with keys
  ``X`` (32, 32, 3, n) and ``y`` (MATLAB v7.3 files are read with h5py, older
  ones need scipy).

Checks on what is read (before any training can start)
-------------------------------------------------------
- Integrity: with ``verify=True`` (the default) every file whose published bytes
  are known is MD5-checked (:data:`MD5`): the MNIST / Fashion-MNIST files, both
  ``.gz`` and uncompressed, the CIFAR-10 batches, the SVHN ``.mat`` files,
  ``usps/usps.h5`` and ``mnist_m/mnist_m_subset.tar.gz``. A mismatch raises
  :class:`DatasetChecksumError` naming the file and both hashes. There is no
  published checksum for the MNIST-M release (folder or ``mnist_m.tar.gz``) or
  for SynthDigits: those get the content checks only. Success is memoised per
  file path, size and mtime, so each file is hashed once per process.
- Content: each reader checks the format, the shapes and dtypes of the expected
  layout, that labels and images agree in number, that labels are integers in
  0..9 and that pixels are in range (uint8, or USPS floats in [0, 1]); anything
  else raises :class:`DatasetFormatError` naming the file, what is wrong and the
  expected layout.
- No code runs from a data folder: CIFAR-10's pickled batches are read with a
  restricted unpickler that resolves only the NumPy names an array needs
  (never ``pickle.load``); ``.npz`` caches are read without pickle; HDF5 and
  MATLAB files are read with h5py / scipy, which never execute code.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import os
import pickle
import struct
import tarfile
import warnings
import zipfile
import zlib
from pathlib import Path, PurePosixPath

import numpy as np

__all__ = [
    "DATASETS",
    "DatasetNotFoundError",
    "DatasetChecksumError",
    "DatasetFormatError",
    "MD5",
    "data_root",
    "cache_dir",
    "load_mnist",
    "load_fashion_mnist",
    "load_cifar10",
    "load_usps",
    "load_mnist_m",
    "load_svhn",
    "load_synthdigits",
    "load",
    "available",
]

DATASETS = ("mnist", "fmnist", "cifar10", "usps", "mnistm", "svhn", "synthdigits")
SPLITS = ("train", "test", "all")
# Datasets that torchvision can fetch; only these get "download=True" advice.
_DOWNLOADABLE = ("mnist", "fmnist", "cifar10", "svhn")


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are not under the data root.

    The message names the dataset, the expected files (relative to the root),
    the root that was searched and how to fix it.
    """

    def __init__(self, dataset: str, root: Path, expected: list[str], hint: str = ""):
        self.dataset, self.root, self.expected, self.hint = dataset, Path(root), list(expected), hint
        fixes = f"put the files under {self.root}, or set FEDLIB_DATA to a folder that has them"
        if dataset in _DOWNLOADABLE:  # named as a call: fedlib.run and RunConfig take no download argument
            fixes += f", or download them into it with fedlib.data.readers.load({dataset!r}, 'train', download=True)"
            fixes += " and again with 'test'" if dataset == "svhn" else " (every split at once)"  # SVHN: one a call
        msg = (
            f"dataset {dataset!r} not found under data root {self.root}. "
            f"Expected (relative to the root): {', '.join(self.expected)}. "
            f"To fix: {fixes}."
        )
        if hint:
            msg += f" {hint}"
        super().__init__(msg)

    def __reduce__(self):
        # rebuilt from its arguments, so it crosses process boundaries intact (``run_configs(jobs=N)``)
        return type(self), (self.dataset, self.root, self.expected, self.hint)


class DatasetChecksumError(RuntimeError):
    """A dataset file is present but its MD5 differs from the published one."""


class DatasetFormatError(ValueError):
    """A dataset file is present but malformed: not the expected format, layout, shape, dtype or value range.

    The message names the file, what is wrong and the expected layout.
    """

    def __init__(self, path, problem: str, expected: str = ""):
        self.path, self.problem, self.expected = str(path), problem, expected
        msg = f"{self.path}: {problem}"
        if expected:
            msg += f". Expected: {expected}"
        super().__init__(msg)

    def __reduce__(self):
        # rebuilt from its arguments, so it crosses process boundaries intact (``run_configs(jobs=N)``)
        return type(self), (self.path, self.problem, self.expected)


# MD5 of every file whose published bytes are known, by path relative to the data root. Files not listed here
# (the MNIST-M release, SynthDigits) get the content checks only.
MD5: dict[str, str] = {
    # MNIST and Fashion-MNIST archives: torchvision's lists (MNIST.resources, FashionMNIST.resources), which are
    # also the MD5s in the offline data's MANIFEST.md; tests/test_bad_data.py checks they still agree.
    "MNIST/raw/train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "MNIST/raw/train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "MNIST/raw/t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "MNIST/raw/t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    "FashionMNIST/raw/train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "FashionMNIST/raw/train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "FashionMNIST/raw/t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "FashionMNIST/raw/t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    # The same files uncompressed (what torchvision extracts next to the archives). Nobody publishes these:
    # computed by decompressing the archives above after they passed torchvision's MD5s
    # (`gzip -dc X.gz | md5sum`, on the offline copies in /work/shared/data, 2026-11-24); the test suite
    # recomputes them from the archives whenever those are present.
    "MNIST/raw/train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "MNIST/raw/train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "MNIST/raw/t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "MNIST/raw/t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
    "FashionMNIST/raw/train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
    "FashionMNIST/raw/train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
    "FashionMNIST/raw/t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
    "FashionMNIST/raw/t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
    # CIFAR-10 python batches: torchvision's CIFAR10.train_list / test_list / meta.
    "cifar-10-batches-py/data_batch_1": "c99cafc152244af753f735de768cd75f",
    "cifar-10-batches-py/data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "cifar-10-batches-py/data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "cifar-10-batches-py/data_batch_4": "634d18415352ddfa80567beed471001a",
    "cifar-10-batches-py/data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "cifar-10-batches-py/test_batch": "40351d587109b95175f43aff81a1287e",
    "cifar-10-batches-py/batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
    # SVHN cropped digits: torchvision's SVHN.split_list.
    "svhn/train_32x32.mat": "e26dedcc434d2e4c54c9b2d4a06d8373",
    "svhn/test_32x32.mat": "eb5a983be6a315427106f1b164d9cef3",
    # USPS (the Kaggle HDF5 file) and this project's MNIST-M subset archive: the offline data's MANIFEST.md.
    "usps/usps.h5": "355df6b942eb766252e0340bc019b0b9",
    "mnist_m/mnist_m_subset.tar.gz": "57cc3aa4cb0968dc078a1983b2c7a708",
}


# --------------------------------------------------------------------------- paths


def data_root(root: str | os.PathLike | None = None) -> Path:
    """Return the data root: ``root`` if given, else ``$FEDLIB_DATA``, else the
    project's ``data/`` folder (source checkout) or ``./data``."""
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get("FEDLIB_DATA")
    if env:
        return Path(env).expanduser()
    project = Path(__file__).resolve().parents[2]
    # Only trust the checkout's data/ when we really run from a checkout; an
    # installed package would otherwise point into site-packages.
    if (project / "pyproject.toml").is_file():
        return project / "data"
    return Path.cwd() / "data"


def cache_dir() -> Path:
    """Return (and create) the cache folder: ``$FEDLIB_CACHE`` or ``~/.cache/fedlib``."""
    env = os.environ.get("FEDLIB_CACHE")
    path = Path(env).expanduser() if env else Path.home() / ".cache" / "fedlib"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split


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


@functools.lru_cache(maxsize=None)
def _verify_md5(path: str, size: int, mtime_ns: int, expected: str, source: str) -> None:
    # Keyed by size and mtime so a replaced file is checked again; success is
    # memoised (lru_cache does not cache exceptions), so each file is hashed once.
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != expected:
        raise DatasetChecksumError(
            f"{path} has md5 {h.hexdigest()}, expected {expected} ({source}); "
            "the file is corrupt or not the original - replace it, or pass verify=False"
        )


def _md5_source(rel: str) -> str:
    if rel.startswith(("usps/", "mnist_m/")):
        return "the checksum in the offline data's MANIFEST.md"
    if rel.startswith(("MNIST/", "FashionMNIST/")) and not rel.endswith(".gz"):
        return "the checksum of torchvision's published archive, decompressed"
    return "torchvision's published checksum"


def _verify(path: Path, rel: str) -> None:
    """MD5-check ``path`` (found at ``rel`` under the root) when :data:`MD5` knows that file; else nothing."""
    expected = MD5.get(rel)
    if expected is not None:
        st = path.stat()
        _verify_md5(str(path.resolve()), st.st_size, st.st_mtime_ns, expected, _md5_source(rel))


def _labels(path, raw, expected: str, n_classes: int = 10, ten_is_zero: bool = False) -> np.ndarray:
    """``raw`` as int64 labels in 0..n_classes-1, or DatasetFormatError naming ``path`` and ``expected``.

    ``ten_is_zero``: SVHN-style files write digit 0 as label 10; it is mapped to 0 (a no-op when 0..9)."""
    y = np.asarray(raw)
    if y.dtype.kind not in "iuf":
        raise DatasetFormatError(path, f"labels have dtype {y.dtype}, not numbers", expected)
    if y.dtype.kind == "f" and not (np.isfinite(y).all() and (y == np.round(y)).all()):
        raise DatasetFormatError(path, "labels are not all whole numbers", expected)
    y = y.astype(np.int64)
    if ten_is_zero:
        y[y == 10] = 0
    bad = (y < 0) | (y >= n_classes)
    if bad.any():
        values = np.unique(y[bad])
        raise DatasetFormatError(
            path,
            f"{int(bad.sum())} of {y.size} labels are outside 0..{n_classes - 1} "
            f"(values {', '.join(map(str, values[:5].tolist()))}{', ...' if len(values) > 5 else ''})",
            expected,
        )
    return y


def _pixels_uint8(path, raw, expected: str) -> np.ndarray:
    """Image array as uint8: integers (or whole-number floats) in 0..255, else DatasetFormatError."""
    x = np.asarray(raw)
    if x.dtype == np.uint8:
        return x
    if x.dtype.kind not in "iuf":
        raise DatasetFormatError(path, f"images have dtype {x.dtype}, not numbers", expected)
    if x.size and (
        not np.isfinite(x).all() or x.min() < 0 or x.max() > 255 or (x.dtype.kind == "f" and (x != np.round(x)).any())
    ):
        raise DatasetFormatError(path, f"image pixels ({x.dtype}) are not all whole numbers in 0..255", expected)
    return x.astype(np.uint8)


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


# --------------------------------------------------------------------------- MNIST-M

_MNISTM_EXPECTED = [
    "mnist_m/mnist_m_train/*.png",
    "mnist_m/mnist_m_train_labels.txt",
    "mnist_m/mnist_m_test/*.png",
    "mnist_m/mnist_m_test_labels.txt",
]


def _mnistm_source(split: str, root: Path) -> Path:
    """The labels file of ``split`` (folder layout) or a tarball of the whole layout."""
    folder = root / "mnist_m"
    labels = folder / f"mnist_m_{split}_labels.txt"
    if labels.is_file() and (folder / f"mnist_m_{split}").is_dir():
        return labels
    tars = [folder / "mnist_m.tar.gz", folder / "mnist_m_subset.tar.gz", *sorted(root.glob("mnist_m*.tar.gz"))]
    for tar in tars:
        if tar.is_file():
            return tar
    raise DatasetNotFoundError(
        "mnistm",
        root,
        _MNISTM_EXPECTED,
        "A tarball of that layout is read in place too: mnist_m/mnist_m.tar.gz, "
        "mnist_m/mnist_m_subset.tar.gz or mnist_m*.tar.gz at the root.",
    )


_MNISTM_LAYOUT = (
    "the MNIST-M release layout: mnist_m/mnist_m_{train,test}/*.png (32x32 RGB) and "
    "mnist_m/mnist_m_{train,test}_labels.txt with one '<file> <label>' line per image (labels 0..9), "
    "as folders or in a tar(.gz) archive"
)


def _parse_labels(data: bytes, where) -> list[tuple[str, int]]:
    """The ``<file> <label>`` lines of an MNIST-M labels file, checked: UTF-8 text, each image named once by a bare
    file name (read from its split's folder only: no folder part, no ``..``, not absolute) and at least one line; a
    DatasetFormatError naming ``where`` (and the line) otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DatasetFormatError(
            where, f"is not UTF-8 text (line {line}: byte 0x{data[e.start]:02x} at offset {e.start})", _MNISTM_LAYOUT
        ) from None
    rows, first = [], {}
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        # isascii: str.isdigit() is also true of superscripts and other digits that int() refuses
        if len(parts) != 2 or not (parts[1].isascii() and parts[1].isdigit()):
            raise DatasetFormatError(where, f"line {i} is {line[:80]!r}, not '<file> <label>'", _MNISTM_LAYOUT)
        name = parts[0]
        if "/" in name or "\\" in name or "\x00" in name or name in (".", ".."):
            raise DatasetFormatError(
                where,
                f"line {i} names {name[:300]!r}, not a file name: an image is named by its bare file name, read from "
                "the split's own folder (no folder part, no '..', not an absolute path)",
                _MNISTM_LAYOUT,
            )
        if name in first:
            raise DatasetFormatError(
                where,
                f"line {i} lists {name[:300]!r} again (first on line {first[name]}): each image once",
                _MNISTM_LAYOUT,
            )
        first[name] = i
        rows.append((name, int(parts[1])))
    if not rows:
        raise DatasetFormatError(where, "lists no images (no '<file> <label>' line)", _MNISTM_LAYOUT)
    return rows


def _decode_png(data: bytes, where) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            x = np.asarray(im.convert("RGB"), dtype=np.uint8)
    except Exception as e:  # PIL raises many types (UnidentifiedImageError, OSError, SyntaxError, ...) on bad data
        raise DatasetFormatError(where, f"not a readable image ({type(e).__name__}: {e})", _MNISTM_LAYOUT) from None
    if x.shape != (32, 32, 3):
        raise DatasetFormatError(where, f"image is {x.shape[1]}x{x.shape[0]}, not 32x32", _MNISTM_LAYOUT)
    return x


def _stack(split, labels, images, root: Path, source: Path):
    missing = [f for f, _ in labels if f not in images]
    if missing:
        raise DatasetNotFoundError(
            "mnistm",
            root,
            [f"mnist_m/mnist_m_{split}/{f}" for f in missing[:3]],
            f"{source} lists {len(missing)} image(s) that are absent.",
        )
    x = np.stack([images[f] for f, _ in labels]) if labels else np.zeros((0, 32, 32, 3), np.uint8)
    y = np.array([lab for _, lab in labels], dtype=np.int64)
    return x, _labels(f"{source} [mnist_m_{split}_labels.txt]", y, _MNISTM_LAYOUT)


def _decode_mnistm(source: Path, root: Path) -> dict[str, np.ndarray]:
    """Decode MNIST-M from ``source``; returns {"x_<split>", "y_<split>"} arrays."""
    out = {}
    if source.name.endswith("_labels.txt"):
        split = source.name[len("mnist_m_") : -len("_labels.txt")]
        labels = _parse_labels(source.read_bytes(), source)
        folder = source.parent / f"mnist_m_{split}"
        images = {f: _decode_png((folder / f).read_bytes(), folder / f) for f, _ in labels if (folder / f).is_file()}
        out[f"x_{split}"], out[f"y_{split}"] = _stack(split, labels, images, root, source)
        return out
    # One sequential pass over the (gzip) tarball: random access into a .gz is
    # costly, and the labels files come after the images in the release.
    images, labels = {"train": {}, "test": {}}, {}
    try:
        with tarfile.open(source, "r:*") as tf:
            for member in tf:
                if not member.isfile():
                    continue
                p = PurePosixPath(member.name)
                where = f"{source} [{member.name}]"
                for split in ("train", "test"):
                    if p.name == f"mnist_m_{split}_labels.txt":
                        labels[split] = _parse_labels(tf.extractfile(member).read(), where)
                    elif p.parent.name == f"mnist_m_{split}" and p.suffix == ".png":
                        images[split][p.name] = _decode_png(tf.extractfile(member).read(), where)
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        # empty, truncated or not a tar archive (tarfile's messages do not name the file)
        raise DatasetFormatError(
            source, f"is not a complete tar archive ({type(e).__name__}: {e})", _MNISTM_LAYOUT
        ) from None
    if not labels:
        raise DatasetFormatError(source, "holds no mnist_m_train_labels.txt or mnist_m_test_labels.txt", _MNISTM_LAYOUT)
    for split, rows in labels.items():
        out[f"x_{split}"], out[f"y_{split}"] = _stack(split, rows, images[split], root, source)
    return out


# Bump when decoding or the checks on what is decoded change: a cache written before (say, from a labels file that
# named an image outside its folder, or one image twice) is then never read again.
_MNISTM_CACHE_VERSION = "2"


def _mnistm_cache_key(source: Path) -> str:
    """What the decoded cache of ``source`` depends on: the source's path, size and mtime, and for the folder layout
    every listed image's too. The labels file is parsed (and checked) here, before any cache is read, so a labels
    file that became bad is refused even where a cache decoded from an earlier version of it exists; and an image
    replaced under an unchanged labels file is decoded (and checked) again, not served from the cache."""
    st = source.stat()
    parts = [_MNISTM_CACHE_VERSION, str(source.resolve()), str(st.st_size), str(st.st_mtime_ns)]
    if source.name.endswith("_labels.txt"):
        folder = source.parent / f"mnist_m_{source.name[len('mnist_m_') : -len('_labels.txt')]}"
        for name, _ in _parse_labels(source.read_bytes(), source):
            try:
                ist = (folder / name).stat()
                parts.append(f"{name}:{ist.st_size}:{ist.st_mtime_ns}")
            except OSError:  # absent: decoding says so (DatasetNotFoundError naming it)
                parts.append(f"{name}:-")
    return "|".join(parts)


def _valid_mnistm_cache(arrays: dict) -> bool:
    """Whether a decoded cache holds what :func:`_decode_mnistm` writes (else it is decoded again)."""
    splits = {k[2:] for k in arrays}
    if not splits or set(arrays) != {f"{p}_{s}" for s in splits for p in "xy"}:
        return False
    for s in splits:
        x, y = arrays[f"x_{s}"], arrays[f"y_{s}"]
        if x.dtype != np.uint8 or x.shape[1:] != (32, 32, 3) or y.dtype != np.int64 or y.shape != (len(x),):
            return False
        if y.size and (y.min() < 0 or y.max() > 9):
            return False
    return True


def _read_mnist_m(split: str, root: Path, verify: bool = True):
    source = _mnistm_source(split, root)
    if verify and not source.name.endswith("_labels.txt"):
        _verify(source, source.relative_to(root).as_posix())
    key = hashlib.sha1(_mnistm_cache_key(source).encode()).hexdigest()[:20]
    cached = cache_dir() / f"mnist_m-{key}.npz"
    arrays = None
    if cached.is_file():
        try:
            # allow_pickle=False (NumPy's default, spelled out): a cache can hold arrays only, never code
            with np.load(cached, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            problem = None if _valid_mnistm_cache(arrays) else "does not hold the decoded MNIST-M arrays"
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
            problem = f"is unreadable ({type(e).__name__}: {e})"
        if problem:
            warnings.warn(f"MNIST-M cache {cached} {problem}; decoding {source} again", RuntimeWarning, stacklevel=2)
            arrays = None
    if arrays is None:
        arrays = _decode_mnistm(source, root)
        # Write to a temporary name then rename, so a crash never leaves a
        # truncated cache that a later run would trust.
        tmp = cached.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, cached)
    if f"x_{split}" not in arrays:
        raise DatasetNotFoundError(
            "mnistm", root, [f"mnist_m/mnist_m_{split}_labels.txt"], f"{source} has no {split} split."
        )
    return arrays[f"x_{split}"], arrays[f"y_{split}"]


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
    # verify: no published checksum is known for SynthDigits; the content checks always run.
    path = _synth_file(split, root)
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


# --------------------------------------------------------------------------- dispatch and memoisation

_READERS = {
    "mnist": functools.partial(_read_idx_dataset, "mnist"),
    "fmnist": functools.partial(_read_idx_dataset, "fmnist"),
    "cifar10": _read_cifar10,
    "usps": _read_usps,
    "mnistm": _read_mnist_m,
    "svhn": _read_svhn,
    "synthdigits": _read_synthdigits,
}


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@functools.lru_cache(maxsize=None)
def _cached(name: str, split: str, root: str, verify: bool = True):
    # One entry per (dataset, split, resolved root, verify); arrays are made
    # read-only so no caller can corrupt what the next caller receives.
    if split == "all":
        xtr, ytr = _cached(name, "train", root, verify)
        xte, yte = _cached(name, "test", root, verify)
        x, y = np.concatenate([xtr, xte]), np.concatenate([ytr, yte])
    else:
        x, y = _READERS[name](split, Path(root), verify=verify)
    return _readonly(x), _readonly(y)


def _present(name: str, root: Path, splits=("train", "test")) -> bool:
    try:
        for split in splits:
            if name in _IDX_FOLDER:
                _idx_files(name, root, [split])
            elif name == "cifar10":
                _cifar_files(root)
            elif name == "usps":
                _usps_file(root)
            elif name == "mnistm":
                _mnistm_source(split, root)
            elif name == "svhn":
                _svhn_file(split, root)
            elif name == "synthdigits":
                _synth_file(split, root)
    except DatasetNotFoundError:
        return False
    return True


def _load(name, split, root, download=False, verify=True):
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; name must be one of {DATASETS}")
    _check_split(split)
    if not isinstance(verify, bool):
        raise ValueError(f"verify={verify!r}: must be True or False")
    r = data_root(root)
    splits = ("train", "test") if split == "all" else (split,)
    if download and name in _DOWNLOADABLE and not _present(name, r, splits):
        if name in _IDX_FOLDER:
            _download_idx(name, r)
        elif name == "cifar10":
            _download_cifar10(r)
        else:
            for s in splits:
                _download_svhn(r, s)
    return _cached(name, split, str(r.resolve()), verify)


# --------------------------------------------------------------------------- public loaders
# verify=True (the default) MD5-checks every file listed in MD5; verify=False skips only that: the format,
# shape, dtype and range checks always run.


def load_mnist(split="train", root=None, download=False, *, verify=True):
    """MNIST: x uint8 (n, 28, 28), y int64 (n,); 60000 train / 10000 test.

    Reads ``<root>/MNIST/raw/*-ubyte[.gz]``; both forms are MD5-checked
    (:data:`MD5`) unless ``verify=False``. ``download=True`` fetches missing
    files with torchvision (writing into the root).
    """
    return _load("mnist", split, root, download, verify)


def load_fashion_mnist(split="train", root=None, download=False, *, verify=True):
    """Fashion-MNIST: as :func:`load_mnist`, files under ``<root>/FashionMNIST/raw``."""
    return _load("fmnist", split, root, download, verify)


def load_cifar10(split="train", root=None, download=False, *, verify=True):
    """CIFAR-10: x uint8 (n, 32, 32, 3), y int64; from ``<root>/cifar-10-batches-py`` (read without running code)."""
    return _load("cifar10", split, root, download, verify)


def load_usps(split="train", root=None, *, verify=True):
    """USPS: x float32 (n, 16, 16) in [0, 1], y int64; 7291 train / 2007 test, from ``<root>/usps/usps.h5``."""
    return _load("usps", split, root, False, verify)


def load_mnist_m(split="train", root=None, *, verify=True):
    """MNIST-M: x uint8 (n, 32, 32, 3), y int64.

    Reads ``<root>/mnist_m/`` (original layout) or a tarball of it without
    extracting; decoded arrays are cached as ``.npz`` in :func:`cache_dir`,
    keyed by the source's path, size and mtime (folder layout: and every listed
    image's; the labels file is checked before any cache is read; a damaged
    cache is decoded again, with a warning). A labels file must be UTF-8, name
    each image once by its bare file name (no folder part, no ``..``) and list
    at least one. Only ``mnist_m/mnist_m_subset.tar.gz`` has a known
    MD5; the release itself publishes none.
    """
    return _load("mnistm", split, root, False, verify)


def load_svhn(split="train", root=None, download=False, *, verify=True):
    """SVHN: x uint8 (n, 32, 32, 3), y int64 in 0..9; ``<root>/svhn/{train,test}_32x32.mat`` (needs scipy)."""
    return _load("svhn", split, root, download, verify)


def load_synthdigits(split="train", root=None, *, verify=True):
    """SynthDigits: x uint8 (n, 32, 32, 3), y int64; ``<root>/synth_digits/synth_{train,test}_32x32.mat``.

    No published checksum is known, so ``verify`` changes nothing; the content checks always run."""
    return _load("synthdigits", split, root, False, verify)


def load(name: str, split="train", root=None, download=False, *, verify=True):
    """Load dataset ``name`` (one of :data:`DATASETS`). ``download`` is honoured
    where torchvision can fetch the dataset and ignored otherwise."""
    return _load(name, split, root, download, verify)


def missing(names, root=None) -> list[str]:
    """The data sets among ``names`` that are not under the root (a notebook's ``metadata.fedlib.requires``)."""
    return [d for d in names if not available(d, root)]


def available(name: str, root=None) -> bool:
    """True when both splits of ``name`` are present under the root (no download, no exception)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; name must be one of {DATASETS}")
    return _present(name, data_root(root))
