"""MNIST-M: PNG images with a labels file per split, as folders or in a tarball read in place.

The checksum-verified subset (``mnist_m/mnist_m_subset.tar.gz``) is read before any other source; a folder or
archive no checksum covers is named in a warning. Decoding tens of thousands of PNGs is slow, so the decoded arrays
are cached (:mod:`~fedlib.data.readers.decode_cache`), keyed by the SHA-256 of the source's bytes and checked
against their own digest before they are served; one that fails is decoded again with a warning. A labels file
names each image by its bare file name, so nothing outside the split's folder is ever read.
"""

from __future__ import annotations

import io
import tarfile
import zlib
from pathlib import Path, PurePosixPath

import numpy as np

from fedlib.data.readers.checksums import _verify, _warn_unchecked
from fedlib.data.readers.common import DatasetFormatError, DatasetNotFoundError, _labels, cache_dir
from fedlib.data.readers.decode_cache import read_cache, source_digest, write_cache

# --------------------------------------------------------------------------- MNIST-M

_MNISTM_EXPECTED = [
    "mnist_m/mnist_m_train/*.png",
    "mnist_m/mnist_m_train_labels.txt",
    "mnist_m/mnist_m_test/*.png",
    "mnist_m/mnist_m_test_labels.txt",
]


# The MNIST-M tarballs with a published checksum (:data:`~fedlib.data.readers.checksums.MD5`, as mnist_m/<name>).
# One is read before any other source, and checked wherever it lies (mnist_m/ or the root), under its own name.
_MNISTM_VERIFIED = ("mnist_m_subset.tar.gz",)


def _mnistm_source(split: str, root: Path) -> Path:
    """The source MNIST-M's ``split`` is read from: the labels file (folder layout) or a tarball of the layout.

    A tarball with a published checksum comes first (``mnist_m/mnist_m_subset.tar.gz``, or that name at the
    root), so a folder or another archive placed beside it can never take its place; then the unpacked folder,
    ``mnist_m/mnist_m.tar.gz`` and any ``mnist_m*.tar.gz`` at the root, which no checksum covers (the release
    publishes none): they are named in a warning when read."""
    folder = root / "mnist_m"
    for name in _MNISTM_VERIFIED:
        for tar in (folder / name, root / name):
            if tar.is_file():
                return tar
    labels = folder / f"mnist_m_{split}_labels.txt"
    if labels.is_file() and (folder / f"mnist_m_{split}").is_dir():
        return labels
    tars = [folder / "mnist_m.tar.gz", *sorted(root.glob("mnist_m*.tar.gz"))]
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
_MNISTM_CACHE_VERSION = "3"


def _mnistm_digest(source: Path) -> str:
    """The SHA-256 the decoded cache of ``source`` is keyed by: of the tarball's bytes, or (folder layout) of the
    labels file and every image it lists, by name. The labels file is parsed (and checked) here, before any cache is
    read, so a labels file that became bad is refused even where a cache decoded from an earlier version of it
    exists; and an image replaced under an unchanged labels file is decoded (and checked) again, not served from
    the cache, whatever its size and mtime."""
    if not source.name.endswith("_labels.txt"):
        return source_digest([(_MNISTM_CACHE_VERSION, b""), ("tar", source)])
    data = source.read_bytes()
    folder = source.parent / f"mnist_m_{source.name[len('mnist_m_') : -len('_labels.txt')]}"
    parts: list[tuple[str, Path | bytes]] = [(_MNISTM_CACHE_VERSION, b""), (source.name, data)]
    for name, _ in _parse_labels(data, source):
        image = folder / name
        # absent: hashed as such, and decoding says so (DatasetNotFoundError naming it)
        parts.append((name, image) if image.is_file() else (f"{name}:absent", b""))
    return source_digest(parts)


def _mnistm_problem(arrays: dict) -> str | None:
    """None when a decoded cache holds what :func:`_decode_mnistm` writes, else what is wrong (it is decoded again)."""
    splits = {k[2:] for k in arrays}
    if not splits or set(arrays) != {f"{p}_{s}" for s in splits for p in "xy"}:
        return "does not hold the decoded MNIST-M arrays"
    for s in splits:
        x, y = arrays[f"x_{s}"], arrays[f"y_{s}"]
        if x.dtype != np.uint8 or x.shape[1:] != (32, 32, 3) or y.dtype != np.int64 or y.shape != (len(x),):
            return "does not hold the decoded MNIST-M arrays"
        if y.size and (y.min() < 0 or y.max() > 9):
            return "does not hold the decoded MNIST-M arrays"
    return None


def _read_mnist_m(split: str, root: Path, verify: bool = True):
    source = _mnistm_source(split, root)
    if source.name in _MNISTM_VERIFIED:
        if verify:  # under its own name wherever it lies: a copy at the root claims to be the same file
            _verify(source, f"mnist_m/{source.name}")
    elif verify:
        _warn_unchecked(
            source.parent if source.name.endswith("_labels.txt") else source,
            f"MNIST-M's release publishes none; mnist_m/{_MNISTM_VERIFIED[0]}, when present, is read first and "
            "MD5-checked",
        )
    digest = _mnistm_digest(source)
    cached = cache_dir() / f"mnist_m-{digest[:24]}.npz"
    what = f"MNIST-M cache {{cached}} {{problem}}; decoding {source} again"
    arrays = read_cache(cached, digest, what, _mnistm_problem)
    if arrays is None:
        arrays = _decode_mnistm(source, root)
        write_cache(cached, digest, arrays)
    if f"x_{split}" not in arrays:
        raise DatasetNotFoundError(
            "mnistm", root, [f"mnist_m/mnist_m_{split}_labels.txt"], f"{source} has no {split} split."
        )
    return arrays[f"x_{split}"], arrays[f"y_{split}"]
