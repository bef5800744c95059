"""Verified data first: a planted source never takes the place of the checksummed one, a source with no published
checksum is named in a warning, and a decode cache is keyed by its source's SHA-256 and checked on read.

Every planted file is built in a temporary data root (the offline subset is copied there, never changed in place);
the decoded subset is cached once per module, so only the first test that needs it decodes its 19,001 PNGs."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest

from fedlib.data import readers
from fedlib.data.readers import DatasetChecksumError, UncheckedDataWarning, checksums

Image = pytest.importorskip("PIL.Image")

SHARED = Path(os.environ.get("FEDLIB_DATA", Path(__file__).resolve().parents[1] / "data"))
SUBSET = SHARED / "mnist_m" / "mnist_m_subset.tar.gz"
need_subset = pytest.mark.skipif(not SUBSET.is_file(), reason=f"needs the offline MNIST-M subset ({SUBSET})")


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    """Each test reads the files anew (no in-process memo, nothing warned yet) into its own cache folder."""
    monkeypatch.setenv("FEDLIB_CACHE", str(tmp_path / "cache"))
    readers._cached.cache_clear()
    monkeypatch.setattr(checksums, "_WARNED", set())
    yield
    readers._cached.cache_clear()


@pytest.fixture(scope="module")
def subset_cache(tmp_path_factory):
    """A cache folder shared by this module's tests of the real subset (keyed by its SHA-256, so every copy of the
    subset hits the same cache and it is decoded once)."""
    return tmp_path_factory.mktemp("subset_cache")


def _png(rng) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def fake_mnistm(path: Path, label: int = 3, n: int = 2, compress: bool = True) -> None:
    """A planted MNIST-M tarball at ``path``: ``n`` random images per split, every one labelled ``label``."""
    rng = np.random.default_rng(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz" if compress else "w") as tf:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))

        for split in ("train", "test"):
            for i in range(n):
                add(f"mnist_m/mnist_m_{split}/{i:08d}.png", _png(rng))
            add(f"mnist_m/mnist_m_{split}_labels.txt", "".join(f"{i:08d}.png {label}\n" for i in range(n)).encode())


def _caches(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache").glob("*.npz"))


# --------------------------------------------------------------------------- the verified source first


@need_subset
@pytest.mark.parametrize("planted", ["archive", "folder"])
def test_a_planted_source_beside_the_verified_subset_is_not_read(tmp_path, monkeypatch, subset_cache, planted):
    """A planted mnist_m/mnist_m.tar.gz (or its unpacked folder) beside the checksummed subset was read instead of
    it, with no check and no message (2 planted images for the subset's 9,001 test images)."""
    monkeypatch.setenv("FEDLIB_CACHE", str(subset_cache))
    root = tmp_path / "data"
    (root / "mnist_m").mkdir(parents=True)
    shutil.copy(SUBSET, root / "mnist_m")
    fake_mnistm(tmp_path / "planted.tar.gz")
    if planted == "archive":
        shutil.copy(tmp_path / "planted.tar.gz", root / "mnist_m" / "mnist_m.tar.gz")
    else:
        with tarfile.open(tmp_path / "planted.tar.gz") as tf:
            tf.extractall(root, filter="data")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncheckedDataWarning)  # the subset is verified: nothing to warn about
        x, y = readers.load_mnist_m("test", root=root)
    assert x.shape == (9001, 32, 32, 3)
    assert np.bincount(y, minlength=10).min() > 700  # all ten digits, not the planted label only


def test_a_fake_subset_at_the_root_is_checksummed(tmp_path):
    """``mnist_m*.tar.gz`` at the root is read in place, and one named like the verified subset was read without
    its checksum (it is under the root, not under mnist_m/): now it is MD5-checked under its own name."""
    fake_mnistm(tmp_path / "mnist_m_subset.tar.gz")
    with pytest.raises(DatasetChecksumError, match=f"{tmp_path / 'mnist_m_subset.tar.gz'} has md5 .*expected 57cc"):
        readers.load_mnist_m("train", root=tmp_path)
    assert not _caches(tmp_path)


@need_subset
def test_a_verified_file_replaced_in_place_is_hashed_again(tmp_path, monkeypatch, subset_cache):
    """The MD5 check was memoised by path, size and mtime, and the decode cache keyed by the same: one byte of the
    subset changed in place with its mtime put back was neither checked again nor decoded (the old arrays were
    served). The memo now includes the ctime and inode, which ``os.utime`` cannot put back."""
    monkeypatch.setenv("FEDLIB_CACHE", str(subset_cache))
    tar = tmp_path / "mnist_m" / "mnist_m_subset.tar.gz"
    tar.parent.mkdir()
    shutil.copy(SUBSET, tar)
    readers.load_mnist_m("test", root=tmp_path)
    st = tar.stat()
    with open(tar, "r+b") as f:
        f.seek(st.st_size // 2)
        byte = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(tar, ns=(st.st_atime_ns, st.st_mtime_ns))
    readers._cached.cache_clear()
    with pytest.raises(DatasetChecksumError, match=f"{tar} has md5"):
        readers.load_mnist_m("test", root=tmp_path)


# --------------------------------------------------------------------------- a source no checksum covers is named


@pytest.mark.parametrize("layout", ["archive", "folder"])
def test_an_unverified_source_is_named_in_a_warning_once(tmp_path, layout):
    """Without the subset, the release's folder or archive is read with the content checks only; it was read
    silently. Now its path is named, once per process (a second load, reading the files again, says nothing)."""
    root = tmp_path / "data"
    fake_mnistm(tmp_path / "planted.tar.gz")
    if layout == "archive":
        (root / "mnist_m").mkdir(parents=True)
        shutil.copy(tmp_path / "planted.tar.gz", root / "mnist_m" / "mnist_m.tar.gz")
        named = root / "mnist_m" / "mnist_m.tar.gz"
    else:
        with tarfile.open(tmp_path / "planted.tar.gz") as tf:
            tf.extractall(root, filter="data")
        named = root / "mnist_m"
    with pytest.warns(UncheckedDataWarning, match=f"{named} has no published checksum"):
        readers.load_mnist_m("train", root=root)
    readers._cached.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UncheckedDataWarning)
        readers.load_mnist_m("train", root=root)


def test_synthdigits_is_named_in_a_warning(tmp_path):
    """SynthDigits publishes no checksum either: the file read is named (it was read silently)."""
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "synth_digits" / "synth_train_32x32.mat"
    path.parent.mkdir()
    with h5py.File(path, "w") as f:  # MATLAB v7.3 order, as h5py sees it: X (n, 3, 32, 32), y (1, n)
        f["X"] = np.zeros((2, 3, 32, 32), np.uint8)
        f["y"] = np.array([[1, 2]], np.float64)
    with pytest.warns(UncheckedDataWarning, match=f"{path} has no published checksum"):
        x, y = readers.load_synthdigits("train", root=tmp_path)
    assert x.shape == (2, 32, 32, 3) and y.tolist() == [1, 2]


# --------------------------------------------------------------------------- decode caches


def test_a_doctored_mnistm_cache_is_discarded_and_rebuilt(tmp_path):
    """A cache whose labels were edited (every one set to 9, still a valid-looking cache) was served as is."""
    fake_mnistm(tmp_path / "mnist_m" / "mnist_m.tar.gz", label=3)
    with pytest.warns(UncheckedDataWarning):
        readers.load_mnist_m("test", root=tmp_path)
    (cache,) = _caches(tmp_path)
    with np.load(cache) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["y_test"] = np.full_like(arrays["y_test"], 9)
    np.savez(cache, **arrays)  # the digest kept as it was: it no longer matches
    readers._cached.cache_clear()
    with pytest.warns(RuntimeWarning, match=f"MNIST-M cache {cache} does not match its digest.*decoding .* again"):
        _, y = readers.load_mnist_m("test", root=tmp_path)
    assert y.tolist() == [3, 3]
    readers._cached.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rebuilt: no warning the next time
        assert readers.load_mnist_m("test", root=tmp_path)[1].tolist() == [3, 3]


def test_a_cache_copied_under_another_sources_name_is_discarded(tmp_path):
    """A cache (with its digest) copied over another source's cache name is refused: the digest binds the source."""
    a, b = tmp_path / "a", tmp_path / "b"
    fake_mnistm(a / "mnist_m" / "mnist_m.tar.gz", label=3)
    fake_mnistm(b / "mnist_m" / "mnist_m.tar.gz", label=5)
    with pytest.warns(UncheckedDataWarning):
        readers.load_mnist_m("test", root=a)
    (cache_a,) = _caches(tmp_path)
    with pytest.warns(UncheckedDataWarning):
        readers.load_mnist_m("test", root=b)
    (cache_b,) = [c for c in _caches(tmp_path) if c != cache_a]
    shutil.copy(cache_a, cache_b)
    readers._cached.cache_clear()
    with pytest.warns(RuntimeWarning, match=f"MNIST-M cache {cache_b} does not match its digest"):
        assert readers.load_mnist_m("test", root=b)[1].tolist() == [5, 5]


def test_a_source_replaced_with_its_size_and_mtime_kept_is_decoded_again(tmp_path):
    """The cache was keyed by the source's path, size and mtime: a tarball swapped for one of the same size with
    its mtime put back was served the old arrays (labels 3 for a file that says 5). It is keyed by SHA-256 now."""
    tar = tmp_path / "mnist_m" / "mnist_m.tar.gz"
    fake_mnistm(tar, label=3, compress=False)  # uncompressed: the same size whatever the label digit
    with pytest.warns(UncheckedDataWarning):
        assert readers.load_mnist_m("test", root=tmp_path)[1].tolist() == [3, 3]
    st = tar.stat()
    fake_mnistm(tar, label=5, compress=False)
    os.utime(tar, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert tar.stat().st_size == st.st_size
    readers._cached.cache_clear()
    assert readers.load_mnist_m("test", root=tmp_path)[1].tolist() == [5, 5]


def test_a_doctored_image_folder_cache_is_discarded_and_the_folder_named(tmp_path):
    """Office / DomainNet: the folder read is named (no checksum is published), and a cache whose labels were
    edited is discarded and decoded again (it was served as is)."""
    from fedlib.data.domains import image_folders

    for i, cls in enumerate(["back_pack", "bike"] * 2):
        d = tmp_path / "office31" / "amazon" / "images" / cls
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(d / f"{i}.png")
    folder = tmp_path / "office31" / "amazon" / "images"
    with pytest.warns(UncheckedDataWarning, match=f"{folder} has no published checksum"):
        x, y, _ = image_folders._read_domain("office31", "amazon", 8, tmp_path)
    (cache,) = _caches(tmp_path)
    with np.load(cache) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["y"] = (arrays["y"] + 1) % 31
    np.savez(cache, **arrays)
    with pytest.warns(RuntimeWarning, match=f"image cache {cache} does not match its digest"):
        x2, y2, _ = image_folders._read_domain("office31", "amazon", 8, tmp_path)
    np.testing.assert_array_equal(y2, y)
    np.testing.assert_array_equal(x2, x)
