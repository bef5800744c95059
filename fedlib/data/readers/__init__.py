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
  for SynthDigits: those get the content checks only, and the file or folder
  used is named in an :class:`UncheckedDataWarning` (once per process). A
  verified source is read before an unverified one (MNIST-M: the subset before
  a folder or another archive beside it). Success is memoised per file path,
  size, mtime, ctime and inode, so each file is hashed once per process.
- Decode caches (MNIST-M, Office, DomainNet) are keyed by the SHA-256 of their
  source and hold a digest of their own arrays, checked on every read; a cache
  that fails is discarded with a warning and decoded again
  (:mod:`~fedlib.data.readers.decode_cache`).
- Content: each reader checks the format, the shapes and dtypes of the expected
  layout, that labels and images agree in number, that labels are integers in
  0..9 and that pixels are in range (uint8, or USPS floats in [0, 1]); anything
  else raises :class:`DatasetFormatError` naming the file, what is wrong and the
  expected layout.
- No code runs from a data folder: CIFAR-10's pickled batches are read with a
  restricted unpickler that resolves only the NumPy names an array needs
  (never ``pickle.load``); ``.npz`` caches are read without pickle; HDF5 and
  MATLAB files are read with h5py / scipy, which never execute code.

Modules, one per file format
----------------------------
- :mod:`~fedlib.data.readers.common`: data root, cache folder, errors, label and pixel checks;
- :mod:`~fedlib.data.readers.checksums`: :data:`MD5` and the MD5 check;
- :mod:`~fedlib.data.readers.idx`: MNIST / Fashion-MNIST IDX files;
- :mod:`~fedlib.data.readers.cifar`: CIFAR-10's pickled batches;
- :mod:`~fedlib.data.readers.usps`: USPS's HDF5 file;
- :mod:`~fedlib.data.readers.mnistm`: MNIST-M's PNGs (folders or tarball) and their decode cache;
- :mod:`~fedlib.data.readers.decode_cache`: decode caches keyed by their source's SHA-256 and checked on read;
- :mod:`~fedlib.data.readers.matlab`: SVHN's and SynthDigits' ``.mat`` files;
- :mod:`~fedlib.data.readers.dispatch`: the public loaders, :func:`available` and the in-process memo.

A private name is looked up in the module that defines it: patch it there.
"""

from __future__ import annotations

from fedlib.data.readers.checksums import MD5
from fedlib.data.readers.common import (
    DATASETS,
    SPLITS,
    DatasetChecksumError,
    DatasetFormatError,
    DatasetNotFoundError,
    UncheckedDataWarning,
    cache_dir,
    data_root,
)

# _cached: the in-process memo of loaded arrays; ``readers._cached.cache_clear()`` forgets them.
from fedlib.data.readers.dispatch import _cached as _cached
from fedlib.data.readers.dispatch import (
    available,
    load,
    load_cifar10,
    load_fashion_mnist,
    load_mnist,
    load_mnist_m,
    load_svhn,
    load_synthdigits,
    load_usps,
    missing,
)
