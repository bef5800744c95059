"""Decode caches: arrays decoded from a data source, stored as ``.npz`` and checked before they are served.

Decoding tens of thousands of images is slow, so MNIST-M's PNGs and the Office / DomainNet folders are decoded
once and their arrays cached under :func:`~fedlib.data.readers.common.cache_dir`. A cache is trusted only as far
as it can be checked:

- its file name is keyed by the SHA-256 of the source's bytes (:func:`source_digest`), not by the source's path,
  size or mtime, so a source replaced by other bytes never meets the cache of the old ones, even when its size and
  mtime were put back;
- it holds the SHA-256 of the source digest and of every array it holds (name, dtype, shape, bytes), written with
  the arrays; on read the arrays are hashed again, and a cache whose digest does not match (edited, truncated,
  copied under another source's name) is discarded with a warning naming it and decoded again;
- it is read without pickle, so it can hold arrays only, never code.

Trust boundary: the digest detects damage and an edit that did not rewrite it. Whoever can write the cache folder
can also write a matching digest, since the folder holds nothing secret; keep ``FEDLIB_CACHE`` a folder only you
can write (the default, ``~/.cache/fedlib``, is), never a shared one.
"""

from __future__ import annotations

import hashlib
import os
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from fedlib.data.readers.checksums import _sha256

_DIGEST = "__digest__"  # the array holding the cache's own digest; no decoded array has this name


def source_digest(parts: Iterable[tuple[str, Path | bytes]]) -> str:
    """The SHA-256 of a source made of named parts, each a file (hashed: :func:`~.checksums._sha256`) or bytes.

    Names are hashed with the contents (and each length-prefixed), so renaming or moving a part changes the
    digest as changing its bytes does."""
    h = hashlib.sha256()
    for name, part in parts:
        digest = _sha256(part) if isinstance(part, Path) else hashlib.sha256(part).hexdigest()
        label = name.encode("utf-8", "surrogateescape")
        h.update(len(label).to_bytes(8, "little") + label + bytes.fromhex(digest))
    return h.hexdigest()


def _arrays_digest(source: str, arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256(source.encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"|{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes() if a.dtype.kind == "U" else a.data)
    return h.hexdigest()


def read_cache(
    cached: Path, source: str, what: str, valid: Callable[[dict[str, np.ndarray]], str | None]
) -> dict[str, np.ndarray] | None:
    """The arrays of ``cached`` when it exists and checks out, else None (after a warning when it existed).

    ``source`` is the digest the cache was keyed by; ``what`` names the cache and its source in the warning
    ("MNIST-M cache {cached} ... ; decoding {source} again" style); ``valid`` returns a problem (text) or None for
    the arrays' shapes, dtypes and ranges, checked after the digest."""
    if not cached.is_file():
        return None
    try:
        # allow_pickle=False (NumPy's default, spelled out): a cache can hold arrays only, never code
        with np.load(cached, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        stored = arrays.pop(_DIGEST, None)
        if stored is None or stored.shape != () or stored.dtype.kind != "U":
            problem: str | None = "holds no digest of its arrays"
        elif str(stored) != _arrays_digest(source, arrays):
            problem = "does not match its digest (edited, damaged, or written from another source)"
        else:
            problem = valid(arrays)
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        problem = f"is unreadable ({type(e).__name__}: {e})"
    if problem is None:
        return arrays
    warnings.warn(what.format(cached=cached, problem=problem), RuntimeWarning, stacklevel=3)
    return None


def write_cache(cached: Path, source: str, arrays: dict[str, np.ndarray]) -> None:
    """Store ``arrays`` with their digest (see :func:`read_cache`) as ``cached``.

    Written to a temporary name then renamed, so a crash never leaves a truncated cache and a reader never sees
    a half-written one."""
    payload: dict[str, Any] = {**arrays, _DIGEST: np.array(_arrays_digest(source, arrays))}
    tmp = cached.with_suffix(f".{os.getpid()}.tmp.npz")
    np.savez(tmp, **payload)
    os.replace(tmp, cached)
