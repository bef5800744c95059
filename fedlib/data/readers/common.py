"""What every reader shares: the data root, the cache folder, the errors and the checks on labels and pixels.

The errors name the file, what is wrong with it and the layout that was expected, so a data problem is fixed
from its message alone; they rebuild from their arguments when pickled, so they reach the caller intact from a
worker process.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

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


class UncheckedDataWarning(UserWarning):
    """A data file or folder with no published checksum is used: only its format and contents are checked.

    Its own class so that a user who accepts such a source can filter it (``warnings.filterwarnings("ignore",
    category=UncheckedDataWarning)``) without hiding other warnings."""


# --------------------------------------------------------------------------- paths


def data_root(root: str | os.PathLike | None = None) -> Path:
    """Return the data root: ``root`` if given, else ``$FEDLIB_DATA``, else the
    project's ``data/`` folder (source checkout) or ``./data``."""
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get("FEDLIB_DATA")
    if env:
        return Path(env).expanduser()
    project = Path(__file__).resolve().parents[3]  # fedlib/data/readers/common.py -> the checkout
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
