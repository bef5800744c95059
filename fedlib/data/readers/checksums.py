"""MD5 checks of the files whose published bytes are known, SHA-256 digests of sources, and the warning for the rest.

A file listed in :data:`MD5` is hashed before it is parsed, so a corrupt or substituted copy is refused with
both hashes named instead of being read. A source with no published checksum is named once per process in an
:class:`~fedlib.data.readers.common.UncheckedDataWarning` (:func:`_warn_unchecked`): it gets the content checks
only, and the user should know which file that is. Hashes are memoised per resolved path, size, mtime, ctime and
inode: each file is hashed once per process, and a file replaced in place is hashed again even when its size and
mtime were put back (``os.utime`` can set the mtime; the ctime it always moves).
"""

from __future__ import annotations

import functools
import hashlib
import os
import warnings
from pathlib import Path

from fedlib.data.readers.common import DatasetChecksumError, UncheckedDataWarning

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
    # they are the MD5s of the archives above decompressed (`gzip -dc X.gz | md5sum`) once those passed
    # torchvision's MD5s; the test suite recomputes them from the archives whenever those are present.
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


def _stamp(path: Path) -> tuple:
    """What a memoised hash of ``path`` is keyed by: resolved path, size, mtime, ctime and inode."""
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def _hash_file(path: str, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _sha256_memo(path: str, size: int, mtime_ns: int, ctime_ns: int, ino: int) -> str:
    return _hash_file(path, "sha256")


def _sha256(path: Path) -> str:
    """The SHA-256 of ``path``'s bytes (hex), memoised per :func:`_stamp`: what a decode cache is keyed by."""
    return _sha256_memo(*_stamp(path))


@functools.lru_cache(maxsize=None)
def _verify_md5(path: str, size: int, mtime_ns: int, ctime_ns: int, ino: int, expected: str, source: str) -> None:
    # Keyed by the file's stamp so a replaced file is checked again; success is
    # memoised (lru_cache does not cache exceptions), so each file is hashed once.
    got = _hash_file(path, "md5")
    if got != expected:
        raise DatasetChecksumError(
            f"{path} has md5 {got}, expected {expected} ({source}); "
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
        _verify_md5(*_stamp(path), expected, _md5_source(rel))


# Resolved paths already named in an UncheckedDataWarning in this process.
_WARNED: set[str] = set()


def _warn_unchecked(path: Path, what: str) -> None:
    """Name ``path``, a source with no published checksum, in an UncheckedDataWarning, once per process and path.

    ``what`` says whose release it is and what the user can do instead. A planted file or folder cannot be told
    from a genuine one without a checksum, so the user is told which source was used and can remove it if it is
    not theirs."""
    key = os.path.realpath(path)
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(
        f"{path} has no published checksum, so only its format and contents are checked ({what}). "
        "If you did not put it there, remove it.",
        UncheckedDataWarning,
        stacklevel=3,
    )
