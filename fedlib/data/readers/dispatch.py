"""The public loaders: a dataset's name to its reader, downloads, and the in-process memo of what was read.

Arrays are memoised per (dataset, split, resolved root, verify) and made read-only, so no caller can change what
the next one receives; :func:`available` and :func:`missing` only look for the files (nothing is read).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from fedlib.data.readers.cifar import _cifar_files, _download_cifar10, _read_cifar10
from fedlib.data.readers.common import _DOWNLOADABLE, DATASETS, DatasetNotFoundError, _check_split, data_root
from fedlib.data.readers.idx import _IDX_FOLDER, _download_idx, _idx_files, _read_idx_dataset
from fedlib.data.readers.matlab import _download_svhn, _read_svhn, _read_synthdigits, _svhn_file, _synth_file
from fedlib.data.readers.mnistm import _mnistm_source, _read_mnist_m
from fedlib.data.readers.usps import _read_usps, _usps_file

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

    Reads ``mnist_m/mnist_m_subset.tar.gz`` (MD5-checked) when present, else
    ``<root>/mnist_m/`` (original layout) or another tarball of it, without
    extracting; the release publishes no checksum, so such a source is named in
    an :class:`~fedlib.data.readers.UncheckedDataWarning`. Decoded arrays are cached as ``.npz`` in
    :func:`cache_dir`, keyed by the SHA-256 of the source (folder layout: of the
    labels file and every listed image; the labels file is checked before any
    cache is read) and checked against their own digest on read (a damaged or
    edited cache is decoded again, with a warning). A labels file must be UTF-8,
    name each image once by its bare file name (no folder part, no ``..``) and
    list at least one.
    """
    return _load("mnistm", split, root, False, verify)


def load_svhn(split="train", root=None, download=False, *, verify=True):
    """SVHN: x uint8 (n, 32, 32, 3), y int64 in 0..9; ``<root>/svhn/{train,test}_32x32.mat`` (needs scipy)."""
    return _load("svhn", split, root, download, verify)


def load_synthdigits(split="train", root=None, *, verify=True):
    """SynthDigits: x uint8 (n, 32, 32, 3), y int64; ``<root>/synth_digits/synth_{train,test}_32x32.mat``.

    No published checksum is known: the content checks always run, and with ``verify=True`` the file is named in
    an :class:`~fedlib.data.readers.UncheckedDataWarning` (once per process)."""
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
