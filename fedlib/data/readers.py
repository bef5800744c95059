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
  uncompressed (torchvision's layout). ``.gz`` files are MD5-checked against
  torchvision's list.
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
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import os
import tarfile
from pathlib import Path, PurePosixPath

import numpy as np

__all__ = [
    "DATASETS",
    "DatasetNotFoundError",
    "DatasetChecksumError",
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
        if dataset in _DOWNLOADABLE:
            fixes += ", or pass download=True to fetch them"
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


def _read_idx(path: Path) -> np.ndarray:
    """Parse one IDX file (``.gz`` or raw) into a native-endian array."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        buf = f.read()
    if len(buf) < 4 or buf[0] != 0 or buf[1] != 0 or buf[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {buf[:4].hex()})")
    dtype, ndim = np.dtype(_IDX_DTYPES[buf[2]]), buf[3]
    dims = tuple(int.from_bytes(buf[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    offset = 4 + 4 * ndim
    count = int(np.prod(dims, dtype=np.int64))
    if len(buf) - offset != count * dtype.itemsize:
        raise ValueError(f"{path}: header says {dims} but payload has {len(buf) - offset} bytes")
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
def _verify_md5(path: str, size: int, mtime_ns: int, expected: str) -> None:
    # Keyed by size and mtime so a replaced file is checked again; success is
    # memoised (lru_cache does not cache exceptions), so each file is hashed once.
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != expected:
        raise DatasetChecksumError(
            f"{path} has md5 {h.hexdigest()}, expected {expected} (torchvision's published "
            "checksum); the file is corrupt or not the original - replace it, or pass verify=False"
        )


def _check_idx_md5(name: str, path: Path) -> None:
    if path.suffix != ".gz":
        return  # torchvision only publishes MD5s of the .gz archives
    from torchvision.datasets import FashionMNIST, MNIST

    resources = (MNIST if name == "mnist" else FashionMNIST).resources
    # Entries are (filename-or-url, md5); keep only the file name.
    md5s = {src.rsplit("/", 1)[-1]: md5 for src, md5 in resources}
    st = path.stat()
    _verify_md5(str(path.resolve()), st.st_size, st.st_mtime_ns, md5s[path.name])


def _read_idx_dataset(name: str, split: str, root: Path, verify: bool = True):
    images, labels = _idx_files(name, root, [split])
    if verify:
        _check_idx_md5(name, images)
        _check_idx_md5(name, labels)
    x, y = _read_idx(images), _read_idx(labels).astype(np.int64)
    if x.ndim != 3 or len(x) != len(y):
        raise ValueError(f"{images} / {labels}: inconsistent shapes {x.shape} and {y.shape}")
    return x.astype(np.uint8, copy=False), y


def _download_idx(name: str, root: Path) -> None:
    from torchvision.datasets import FashionMNIST, MNIST

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


def _read_cifar10(split: str, root: Path):
    _cifar_files(root)
    from torchvision.datasets import CIFAR10

    ds = CIFAR10(str(root), train=split == "train", download=False)
    return np.asarray(ds.data, dtype=np.uint8), np.asarray(ds.targets, dtype=np.int64)


def _download_cifar10(root: Path) -> None:
    from torchvision.datasets import CIFAR10

    CIFAR10(str(root), train=True, download=True)


# --------------------------------------------------------------------------- USPS


def _usps_file(root: Path) -> Path:
    path = root / "usps" / "usps.h5"
    if not path.is_file():
        raise DatasetNotFoundError(
            "usps", root, ["usps/usps.h5"], "This is the HDF5 layout (groups train/test with data and target)."
        )
    return path


def _read_usps(split: str, root: Path):
    import h5py

    with h5py.File(_usps_file(root), "r") as f:
        x = np.asarray(f[split]["data"], dtype=np.float32).reshape(-1, 16, 16)
        y = np.asarray(f[split]["target"], dtype=np.int64).reshape(-1)
    return x, y


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
        "mnistm", root, _MNISTM_EXPECTED,
        "A tarball of that layout is read in place too: mnist_m/mnist_m.tar.gz, "
        "mnist_m/mnist_m_subset.tar.gz or mnist_m*.tar.gz at the root.",
    )


def _parse_labels(text: str) -> list[tuple[str, int]]:
    rows = [line.split() for line in text.splitlines() if line.strip()]
    return [(r[0], int(r[1])) for r in rows]


def _decode_png(data: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8)


def _stack(split, labels, images, root: Path, source: Path):
    missing = [f for f, _ in labels if f not in images]
    if missing:
        raise DatasetNotFoundError(
            "mnistm", root, [f"mnist_m/mnist_m_{split}/{f}" for f in missing[:3]],
            f"{source} lists {len(missing)} image(s) that are absent.",
        )
    x = np.stack([images[f] for f, _ in labels]) if labels else np.zeros((0, 32, 32, 3), np.uint8)
    return x, np.array([lab for _, lab in labels], dtype=np.int64)


def _decode_mnistm(source: Path, root: Path) -> dict[str, np.ndarray]:
    """Decode MNIST-M from ``source``; returns {"x_<split>", "y_<split>"} arrays."""
    out = {}
    if source.name.endswith("_labels.txt"):
        split = source.name[len("mnist_m_") : -len("_labels.txt")]
        labels = _parse_labels(source.read_text())
        folder = source.parent / f"mnist_m_{split}"
        images = {f: _decode_png((folder / f).read_bytes()) for f, _ in labels if (folder / f).is_file()}
        out[f"x_{split}"], out[f"y_{split}"] = _stack(split, labels, images, root, source)
        return out
    # One sequential pass over the (gzip) tarball: random access into a .gz is
    # costly, and the labels files come after the images in the release.
    images, labels = {"train": {}, "test": {}}, {}
    with tarfile.open(source, "r:*") as tf:
        for member in tf:
            if not member.isfile():
                continue
            p = PurePosixPath(member.name)
            for split in ("train", "test"):
                if p.name == f"mnist_m_{split}_labels.txt":
                    labels[split] = _parse_labels(tf.extractfile(member).read().decode())
                elif p.parent.name == f"mnist_m_{split}" and p.suffix == ".png":
                    images[split][p.name] = _decode_png(tf.extractfile(member).read())
    for split, rows in labels.items():
        out[f"x_{split}"], out[f"y_{split}"] = _stack(split, rows, images[split], root, source)
    return out


def _read_mnist_m(split: str, root: Path):
    source = _mnistm_source(split, root)
    st = source.stat()
    key = hashlib.sha1(f"{source.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:20]
    cached = cache_dir() / f"mnist_m-{key}.npz"
    arrays = None
    if cached.is_file():
        try:
            with np.load(cached) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError):  # unreadable cache: decode again
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


def _svhn_file(split: str, root: Path) -> None:
    if not (root / "svhn" / f"{split}_32x32.mat").is_file():
        raise DatasetNotFoundError("svhn", root, [f"svhn/{split}_32x32.mat"], "(torchvision's SVHN format)")


def _read_svhn(split: str, root: Path):
    _svhn_file(split, root)
    from torchvision.datasets import SVHN

    ds = SVHN(str(root / "svhn"), split=split, download=False)
    # torchvision stores NCHW and already maps label 10 to digit 0.
    return np.ascontiguousarray(ds.data.transpose(0, 2, 3, 1)), np.asarray(ds.labels, dtype=np.int64)


def _download_svhn(root: Path, split: str) -> None:
    from torchvision.datasets import SVHN

    SVHN(str(root / "svhn"), split=split, download=True)


# --------------------------------------------------------------------------- SynthDigits


def _synth_file(split: str, root: Path) -> Path:
    path = root / "synth_digits" / f"synth_{split}_32x32.mat"
    if not path.is_file():
        raise DatasetNotFoundError("synthdigits", root, [f"synth_digits/synth_{split}_32x32.mat"])
    return path


def _read_synthdigits(split: str, root: Path):
    path = _synth_file(split, root)
    import h5py

    if h5py.is_hdf5(path):
        # MATLAB v7.3 is HDF5 and stores arrays column-major, so h5py sees the
        # dimensions reversed: X (32,32,3,n) arrives as (n,3,32,32) = (n,c,w,h).
        with h5py.File(path, "r") as f:
            x = np.asarray(f["X"]).transpose(0, 3, 2, 1)
            y = np.asarray(f["y"]).reshape(-1)
    else:
        try:
            import scipy.io
        except ImportError as e:
            raise ImportError(f"reading {path} (a MATLAB v5 .mat file) needs scipy: pip install scipy") from e
        mat = scipy.io.loadmat(path)
        x, y = mat["X"].transpose(3, 0, 1, 2), mat["y"].reshape(-1)
    y = y.astype(np.int64)
    y[y == 10] = 0  # SVHN-style "10 means digit 0"; a no-op when labels are already 0..9
    return np.ascontiguousarray(x, dtype=np.uint8), y


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
def _cached(name: str, split: str, root: str, opts: tuple = ()):
    # One entry per (dataset, split, resolved root, options); arrays are made
    # read-only so no caller can corrupt what the next caller receives.
    if split == "all":
        xtr, ytr = _cached(name, "train", root, opts)
        xte, yte = _cached(name, "test", root, opts)
        x, y = np.concatenate([xtr, xte]), np.concatenate([ytr, yte])
    else:
        x, y = _READERS[name](split, Path(root), **dict(opts))
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


def _load(name, split, root, download=False, **opts):
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; name must be one of {DATASETS}")
    _check_split(split)
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
    return _cached(name, split, str(r.resolve()), tuple(sorted(opts.items())))


# --------------------------------------------------------------------------- public loaders


def load_mnist(split="train", root=None, download=False, *, verify=True):
    """MNIST: x uint8 (n, 28, 28), y int64 (n,); 60000 train / 10000 test.

    Reads ``<root>/MNIST/raw/*-ubyte[.gz]``; ``.gz`` files are MD5-checked
    against torchvision's list unless ``verify=False``. ``download=True``
    fetches missing files with torchvision (writing into the root).
    """
    return _load("mnist", split, root, download, verify=verify)


def load_fashion_mnist(split="train", root=None, download=False, *, verify=True):
    """Fashion-MNIST: as :func:`load_mnist`, files under ``<root>/FashionMNIST/raw``."""
    return _load("fmnist", split, root, download, verify=verify)


def load_cifar10(split="train", root=None, download=False):
    """CIFAR-10: x uint8 (n, 32, 32, 3), y int64; from ``<root>/cifar-10-batches-py``."""
    return _load("cifar10", split, root, download)


def load_usps(split="train", root=None):
    """USPS: x float32 (n, 16, 16) in [0, 1], y int64; 7291 train / 2007 test, from ``<root>/usps/usps.h5``."""
    return _load("usps", split, root)


def load_mnist_m(split="train", root=None):
    """MNIST-M: x uint8 (n, 32, 32, 3), y int64.

    Reads ``<root>/mnist_m/`` (original layout) or a tarball of it without
    extracting; decoded arrays are cached as ``.npz`` in :func:`cache_dir`,
    keyed by the source's path, size and mtime.
    """
    return _load("mnistm", split, root)


def load_svhn(split="train", root=None, download=False):
    """SVHN: x uint8 (n, 32, 32, 3), y int64 in 0..9; ``<root>/svhn/{train,test}_32x32.mat`` (needs scipy)."""
    return _load("svhn", split, root, download)


def load_synthdigits(split="train", root=None):
    """SynthDigits: x uint8 (n, 32, 32, 3), y int64; ``<root>/synth_digits/synth_{train,test}_32x32.mat``."""
    return _load("synthdigits", split, root)


def load(name: str, split="train", root=None, download=False):
    """Load dataset ``name`` (one of :data:`DATASETS`). ``download`` is honoured
    where torchvision can fetch the dataset and ignored otherwise."""
    # Same options as the named loaders' defaults, so both share one memo entry.
    opts = {"verify": True} if name in _IDX_FOLDER else {}
    return _load(name, split, root, download, **opts)


def missing(names, root=None) -> list[str]:
    """The data sets among ``names`` that are not under the root (a notebook's ``metadata.fedlib.requires``)."""
    return [d for d in names if not available(d, root)]


def available(name: str, root=None) -> bool:
    """True when both splits of ``name`` are present under the root (no download, no exception)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; name must be one of {DATASETS}")
    return _present(name, data_root(root))
