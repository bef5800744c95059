"""Tests for fedlib.data.readers: real offline data (skipped when absent) and tiny generated layouts."""

from __future__ import annotations

import gzip
import os
import struct
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

from fedlib.data import readers
from fedlib.data.readers import DATASETS, DatasetChecksumError, DatasetNotFoundError, idx, mnistm

SHARED = Path(os.environ.get("FEDLIB_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data"))


@pytest.fixture
def shared() -> Path:
    return SHARED


def need(shared: Path, *rel: str) -> None:
    missing = [r for r in rel if not (shared / r).exists()]
    if missing:
        pytest.skip(f"real data not available: {', '.join(missing)} missing under {shared}")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    # Never write decoded arrays into the user's home cache.
    monkeypatch.setenv("FEDLIB_CACHE", str(tmp_path / "cache"))


# --------------------------------------------------------------------------- helpers for generated data


def idx_bytes(a: np.ndarray) -> bytes:
    # Magic: two zero bytes, type code 0x08 (unsigned byte), number of dims; then big-endian dims.
    return bytes([0, 0, 0x08, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape) + a.astype(np.uint8).tobytes()


def write_idx_layout(root: Path, folder="MNIST", gz=True, seed=0):
    rng = np.random.default_rng(seed)
    data = {}
    for prefix, n in (("train", 5), ("t10k", 3)):
        x = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        y = rng.integers(0, 10, size=n).astype(np.uint8)
        for stem, a in ((f"{prefix}-images-idx3-ubyte", x), (f"{prefix}-labels-idx1-ubyte", y)):
            path = root / folder / "raw" / (stem + (".gz" if gz else ""))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(gzip.compress(idx_bytes(a)) if gz else idx_bytes(a))
        data["train" if prefix == "train" else "test"] = (x, y.astype(np.int64))
    return data


def write_mnistm_folder(root: Path):
    from PIL import Image

    rng = np.random.default_rng(1)
    data = {}
    for split, labels in (("train", [7, 2, 9]), ("test", [0, 4])):
        folder = root / "mnist_m" / f"mnist_m_{split}"
        folder.mkdir(parents=True)
        xs, lines = [], []
        for i, lab in enumerate(labels):
            img = rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
            Image.fromarray(img).save(folder / f"{i:08d}.png")
            xs.append(img)
            lines.append(f"{i:08d}.png {lab}")
        (root / "mnist_m" / f"mnist_m_{split}_labels.txt").write_text("\n".join(lines) + "\n")
        data[split] = (np.stack(xs), np.array(labels, dtype=np.int64))
    return data


# --------------------------------------------------------------------------- real data


def test_real_mnist(shared):
    need(shared, "MNIST/raw/train-images-idx3-ubyte.gz", "MNIST/raw/t10k-labels-idx1-ubyte.gz")
    x, y = readers.load_mnist("train", root=shared)
    assert x.shape == (60000, 28, 28) and x.dtype == np.uint8
    assert y.shape == (60000,) and y.dtype == np.int64
    assert y[0] == 5 and y[:5].tolist() == [5, 0, 4, 1, 9]
    assert sorted(np.unique(y).tolist()) == list(range(10))
    assert x.max() == 255 and x.min() == 0
    xt, yt = readers.load_mnist("test", root=shared)
    assert xt.shape == (10000, 28, 28) and yt.shape == (10000,) and yt[0] == 7
    xa, ya = readers.load("mnist", "all", root=shared)
    assert xa.shape == (70000, 28, 28)
    np.testing.assert_array_equal(ya[:60000], y)
    np.testing.assert_array_equal(ya[60000:], yt)
    # Memoised: the same (read-only) object comes back.
    assert readers.load("mnist", root=shared)[0] is x
    assert readers.available("mnist", root=shared)


def test_real_fashion_mnist(shared):
    need(shared, "FashionMNIST/raw/train-images-idx3-ubyte.gz", "FashionMNIST/raw/t10k-labels-idx1-ubyte.gz")
    x, y = readers.load_fashion_mnist("train", root=shared)
    xt, yt = readers.load("fmnist", "test", root=shared)
    assert x.shape == (60000, 28, 28) and xt.shape == (10000, 28, 28) and x.dtype == np.uint8
    assert y[0] == 9 and yt[0] == 9  # both splits start with an ankle boot
    assert np.bincount(y).tolist() == [6000] * 10
    assert np.bincount(yt).tolist() == [1000] * 10


def test_real_usps(shared):
    need(shared, "usps/usps.h5")
    x, y = readers.load_usps("train", root=shared)
    xt, yt = readers.load_usps("test", root=shared)
    assert x.shape == (7291, 16, 16) and xt.shape == (2007, 16, 16)
    assert x.dtype == np.float32 and y.dtype == np.int64
    assert x.min() == 0.0 and x.max() == 1.0
    assert y[:5].tolist() == [6, 5, 4, 7, 3] and yt[:5].tolist() == [9, 6, 3, 6, 6]
    assert readers.load("usps", "all", root=shared)[0].shape == (9298, 16, 16)


def test_real_mnist_m(shared, tmp_path):
    need(shared, "mnist_m/mnist_m_subset.tar.gz", "MNIST/raw/train-labels-idx1-ubyte.gz")
    # decoded here, not taken from the process's memo of an earlier test's load (a digits run in the same worker
    # left this test's cache empty)
    readers._cached.cache_clear()
    x, y = readers.load_mnist_m("train", root=shared)
    xt, yt = readers.load_mnist_m("test", root=shared)
    assert x.shape == (10000, 32, 32, 3) and xt.shape == (9001, 32, 32, 3)
    assert x.dtype == np.uint8 and y.dtype == np.int64
    assert sorted(np.unique(yt).tolist()) == list(range(10))
    # The manifest: MNIST-M labels equal MNIST's at the same index.
    _, y_mnist = readers.load_mnist("train", root=shared)
    np.testing.assert_array_equal(y, y_mnist[:10000])
    # Decoded once into the (test) cache, never into the read-only data root.
    assert len(list((tmp_path / "cache").glob("mnist_m-*.npz"))) == 1


# --------------------------------------------------------------------------- generated data


@pytest.mark.parametrize("gz", [True, False])
def test_idx_roundtrip(tmp_path, gz):
    data = write_idx_layout(tmp_path, gz=gz)
    for split in ("train", "test"):
        x, y = readers.load_mnist(split, root=tmp_path, verify=False)
        assert x.dtype == np.uint8 and y.dtype == np.int64
        np.testing.assert_array_equal(x, data[split][0])
        np.testing.assert_array_equal(y, data[split][1])
    x, y = readers.load_mnist("all", root=tmp_path, verify=False)
    assert x.shape == (8, 28, 28)
    np.testing.assert_array_equal(y, np.concatenate([data["train"][1], data["test"][1]]))


def test_fashion_mnist_folder(tmp_path):
    data = write_idx_layout(tmp_path, folder="FashionMNIST", seed=3)
    x, y = readers.load_fashion_mnist("test", root=tmp_path, verify=False)
    np.testing.assert_array_equal(x, data["test"][0])
    with pytest.raises(DatasetNotFoundError):  # the MNIST folder is not a fallback
        readers.load_mnist("test", root=tmp_path, verify=False)


def test_read_idx_rejects_bad_magic(tmp_path):
    bad = tmp_path / "bad-idx"
    bad.write_bytes(b"\x01\x02\x08\x01" + struct.pack(">I", 1) + b"\x00")
    with pytest.raises(ValueError, match="magic"):
        idx._read_idx(bad)
    short = tmp_path / "short-idx"
    short.write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 5) + b"\x00\x01")
    with pytest.raises(ValueError, match="payload"):
        idx._read_idx(short)


def test_tampered_gz_fails_md5(tmp_path):
    pytest.importorskip("torchvision")
    write_idx_layout(tmp_path)
    with pytest.raises(DatasetChecksumError) as exc:
        readers.load_mnist("train", root=tmp_path)
    msg = str(exc.value)
    assert "train-images-idx3-ubyte.gz" in msg
    assert "f68b3c2dcbeaaa9fbdd348bbdeb94873" in msg  # torchvision's expected md5
    import hashlib

    actual = hashlib.md5((tmp_path / "MNIST/raw/train-images-idx3-ubyte.gz").read_bytes()).hexdigest()
    assert actual in msg


def test_mnist_m_folder_and_tar_agree(tmp_path, monkeypatch):
    pytest.importorskip("PIL")
    folder_root = tmp_path / "folder"
    data = write_mnistm_folder(folder_root)
    for split in ("train", "test"):
        x, y = readers.load_mnist_m(split, root=folder_root)
        assert x.shape == data[split][0].shape and x.dtype == np.uint8
        np.testing.assert_array_equal(x, data[split][0])  # PNG is lossless
        np.testing.assert_array_equal(y, data[split][1])

    # Same layout as tarballs, in both accepted places.
    for rel in ("mnist_m/mnist_m_subset.tar.gz", "mnist_m_full.tar.gz"):
        tar_root = tmp_path / rel.replace("/", "_")
        (tar_root / rel).parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(tar_root / rel, "w:gz") as tf:
            tf.add(folder_root / "mnist_m", arcname="mnist_m")
        # not the MANIFEST's archive (its MD5 differs), so without the MD5 check
        xa, ya = readers.load_mnist_m("all", root=tar_root, verify=False)
        np.testing.assert_array_equal(xa, np.concatenate([data["train"][0], data["test"][0]]))
        np.testing.assert_array_equal(ya, [7, 2, 9, 0, 4])
        assert not (tar_root / "mnist_m" / "mnist_m_train").exists()  # read in place, not extracted

    # The second process-level load comes from the .npz cache: decoding is not called again.
    # patched where _read_mnist_m looks it up
    monkeypatch.setattr(mnistm, "_decode_mnistm", lambda *a: pytest.fail("decoded again"))
    readers._cached.cache_clear()
    x, y = readers.load_mnist_m("test", root=folder_root)
    np.testing.assert_array_equal(x, data["test"][0])


def test_mnist_m_cache_invalidated_when_source_changes(tmp_path):
    pytest.importorskip("PIL")
    write_mnistm_folder(tmp_path)
    assert readers.load_mnist_m("train", root=tmp_path)[1].tolist() == [7, 2, 9]
    labels = tmp_path / "mnist_m" / "mnist_m_train_labels.txt"
    labels.write_text("00000000.png 1\n00000001.png 1\n")
    os.utime(labels, ns=(time.time_ns(), time.time_ns() + 10**9))
    readers._cached.cache_clear()
    x, y = readers.load_mnist_m("train", root=tmp_path)
    assert y.tolist() == [1, 1] and x.shape == (2, 32, 32, 3)


def test_usps_h5(tmp_path):
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(2)
    data = {"train": rng.random((4, 256), dtype=np.float32), "test": rng.random((2, 256), dtype=np.float32)}
    targets = {"train": [1, 0, 7, 3], "test": [9, 8]}
    (tmp_path / "usps").mkdir()
    with h5py.File(tmp_path / "usps" / "usps.h5", "w") as f:
        for split in data:
            f.create_dataset(f"{split}/data", data=data[split])
            f.create_dataset(f"{split}/target", data=np.array(targets[split], dtype=np.int32))
    # a generated file is not the Kaggle usps.h5 (MD5 in readers.MD5): read without the MD5 check
    x, y = readers.load_usps("train", root=tmp_path, verify=False)
    assert x.shape == (4, 16, 16) and x.dtype == np.float32 and y.dtype == np.int64
    np.testing.assert_array_equal(x[2], data["train"][2].reshape(16, 16))  # row-major 16x16
    assert y.tolist() == [1, 0, 7, 3]
    assert readers.load("usps", "all", root=tmp_path, verify=False)[1].tolist() == [1, 0, 7, 3, 9, 8]
    with pytest.raises(DatasetChecksumError, match="usps.h5 has md5"):
        readers.load_usps("train", root=tmp_path)


def test_synthdigits_v73_mat(tmp_path):
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(4)
    x = rng.integers(0, 256, size=(3, 32, 32, 3), dtype=np.uint8)
    (tmp_path / "synth_digits").mkdir()
    for split in ("train", "test"):
        # MATLAB X is (32,32,3,n), y is (n,1); v7.3 (HDF5) stores them with dims reversed.
        with h5py.File(tmp_path / "synth_digits" / f"synth_{split}_32x32.mat", "w") as f:
            f["X"] = x.transpose(1, 2, 3, 0).T
            f["y"] = np.array([[10, 3, 9]], dtype=np.float64)
    xs, ys = readers.load_synthdigits("train", root=tmp_path)
    assert xs.shape == (3, 32, 32, 3) and xs.dtype == np.uint8
    np.testing.assert_array_equal(xs, x)
    assert ys.tolist() == [0, 3, 9]  # label 10 means digit 0


def test_missing_data_messages(tmp_path):
    expected = {
        "mnist": "MNIST/raw/train-images-idx3-ubyte.gz",
        "fmnist": "FashionMNIST/raw/train-images-idx3-ubyte.gz",
        "cifar10": "cifar-10-batches-py/data_batch_1",
        "usps": "usps/usps.h5",
        "mnistm": "mnist_m/mnist_m_train_labels.txt",
        "svhn": "svhn/train_32x32.mat",
        "synthdigits": "synth_digits/synth_train_32x32.mat",
    }
    assert set(expected) == set(DATASETS)
    for name in DATASETS:
        with pytest.raises(DatasetNotFoundError) as exc:
            readers.load(name, "train", root=tmp_path)
        msg = str(exc.value)
        assert repr(name) in msg and expected[name] in msg and str(tmp_path.resolve()) in msg
        assert "FEDLIB_DATA" in msg
        call = f"fedlib.data.readers.load({name!r}, 'train', download=True)"  # a call that exists, not an argument
        assert (call in msg) == ("download=True" in msg) == (name in ("mnist", "fmnist", "cifar10", "svhn"))
        assert exc.value.dataset == name and isinstance(exc.value, FileNotFoundError)
        assert not readers.available(name, root=tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing was written into the root


def test_available_true_for_present_layout(tmp_path):
    write_idx_layout(tmp_path)
    assert readers.available("mnist", root=tmp_path)
    assert not readers.available("fmnist", root=tmp_path)
    (tmp_path / "MNIST/raw/t10k-labels-idx1-ubyte.gz").unlink()
    assert not readers.available("mnist", root=tmp_path)  # both splits are required


def test_bad_name_and_split(tmp_path):
    with pytest.raises(ValueError, match="name must be one of.*'mnist'.*'synthdigits'"):
        readers.load("nope", root=tmp_path)
    with pytest.raises(ValueError, match=r"split must be one of \('train', 'test', 'all'\), got 'val'"):
        readers.load("mnist", "val", root=tmp_path)
    for fn in (readers.load_usps, readers.load_mnist_m, readers.load_svhn, readers.load_cifar10):
        with pytest.raises(ValueError, match="split"):
            fn("val", root=tmp_path)


def test_arrays_are_read_only(tmp_path):
    write_idx_layout(tmp_path)
    for split in ("train", "all"):
        x, y = readers.load_mnist(split, root=tmp_path, verify=False)
        before = int(x[0, 0, 0])
        with pytest.raises(ValueError, match="read-only"):
            x[0, 0, 0] = 1
        with pytest.raises(ValueError, match="read-only"):
            y[0] = 1
        assert int(readers.load_mnist(split, root=tmp_path, verify=False)[0][0, 0, 0]) == before


def test_data_root_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path / "env"))
    assert readers.data_root(tmp_path / "arg") == tmp_path / "arg"
    assert readers.data_root() == tmp_path / "env"
    monkeypatch.delenv("FEDLIB_DATA")
    project = Path(readers.__file__).resolve().parents[3]  # fedlib/data/readers/__init__.py -> the checkout
    assert (project / "pyproject.toml").is_file()  # we run from the source checkout
    assert readers.data_root() == project / "data"


def test_cache_dir_env(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_CACHE", str(tmp_path / "a" / "b"))
    assert readers.cache_dir() == tmp_path / "a" / "b"
    assert (tmp_path / "a" / "b").is_dir()


def test_missing_data_error_survives_pickling():
    """Worker processes (``run_configs(jobs=N)``) send it back pickled: message and fields intact."""
    import pickle
    from pathlib import Path

    from fedlib.data.readers import DatasetNotFoundError

    e = DatasetNotFoundError(
        "mnist", Path("/nowhere"), ["MNIST/raw/train-images-idx3-ubyte.gz"], hint="see data/README.md"
    )
    back = pickle.loads(pickle.dumps(e))
    assert str(back) == str(e) and back.dataset == "mnist" and back.expected == e.expected
