"""Bad-input suite, data files: damaged, tampered or malformed dataset files are refused at load,
before any training, with an error naming the file and the expected layout; nothing read from a data folder
runs code. Real files are copied (or decompressed) from the offline data into tmp_path, never modified in place.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import shutil
import struct
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest

from fedlib.data import readers
from fedlib.data.readers import MD5, DatasetChecksumError, DatasetFormatError, cifar

SHARED = Path(os.environ.get("FEDLIB_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data"))


def need(*rel: str) -> Path:
    missing = [r for r in rel if not (SHARED / r).exists()]
    if missing:
        pytest.skip(f"real data not available: {', '.join(missing)} missing under {SHARED}")
    return SHARED


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    # Decoded caches go to the test's folder; every test reads its files anew (no in-process memo).
    monkeypatch.setenv("FEDLIB_CACHE", str(tmp_path / "cache"))
    readers._cached.cache_clear()
    yield
    readers._cached.cache_clear()


def idx_bytes(a: np.ndarray, code: int = 0x08) -> bytes:
    dtype = {0x08: ">u1", 0x0C: ">i4"}[code]
    return bytes([0, 0, code, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape) + a.astype(dtype).tobytes()


def write_idx(root: Path, x: np.ndarray, y: np.ndarray, prefix="train", folder="MNIST", xcode=0x08, ycode=0x08):
    raw = root / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    (raw / f"{prefix}-images-idx3-ubyte").write_bytes(idx_bytes(x, xcode))
    (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(idx_bytes(y, ycode))


# --------------------------------------------------------------------------- MNIST / Fashion-MNIST


def test_md5_constants_match_torchvision_and_the_archives():
    """The .gz MD5s are torchvision's; the uncompressed ones are the decompressed archives' (recomputed here)."""
    tv = pytest.importorskip("torchvision.datasets")
    for folder, cls in (("MNIST", tv.MNIST), ("FashionMNIST", tv.FashionMNIST)):
        for src, md5 in cls.resources:
            assert MD5[f"{folder}/raw/{src.rsplit('/', 1)[-1]}"] == md5
    for name, md5 in tv.CIFAR10.train_list + tv.CIFAR10.test_list:
        assert MD5[f"cifar-10-batches-py/{name}"] == md5
    assert MD5["cifar-10-batches-py/batches.meta"] == tv.CIFAR10.meta["md5"]
    for split, (_, filename, md5) in tv.SVHN.split_list.items():
        if split in ("train", "test"):
            assert MD5[f"svhn/{filename}"] == md5
    for rel in [k for k in MD5 if k.startswith(("MNIST/", "FashionMNIST/")) and k.endswith(".gz")]:
        if (SHARED / rel).is_file():
            assert hashlib.md5(gzip.decompress((SHARED / rel).read_bytes())).hexdigest() == MD5[rel[:-3]], rel


def uncompressed_labels(tmp_path: Path, folder="MNIST") -> Path:
    """tmp root with the real train images (.gz, linked) and the real train labels decompressed."""
    rel = f"{folder}/raw/train-labels-idx1-ubyte"
    need(rel + ".gz", f"{folder}/raw/train-images-idx3-ubyte.gz")
    raw = tmp_path / folder / "raw"
    raw.mkdir(parents=True)
    os.symlink(SHARED / folder / "raw" / "train-images-idx3-ubyte.gz", raw / "train-images-idx3-ubyte.gz")
    (raw / "train-labels-idx1-ubyte").write_bytes(gzip.decompress((SHARED / (rel + ".gz")).read_bytes()))
    return raw / "train-labels-idx1-ubyte"


@pytest.mark.parametrize("folder", ["MNIST", "FashionMNIST"])
def test_uncompressed_idx_is_md5_checked(tmp_path, folder):
    labels = uncompressed_labels(tmp_path, folder)
    load = readers.load_mnist if folder == "MNIST" else readers.load_fashion_mnist
    y = load("train", root=tmp_path)[1]  # the intact decompressed file passes
    assert y.shape == (60000,)
    readers._cached.cache_clear()
    buf = bytearray(labels.read_bytes())
    buf[8] = 200  # first label -> 200
    labels.write_bytes(bytes(buf))
    with pytest.raises(DatasetChecksumError) as exc:
        load("train", root=tmp_path)
    msg = str(exc.value)
    assert str(labels.resolve()) in msg and MD5[f"{folder}/raw/train-labels-idx1-ubyte"] in msg
    # Without the MD5 check, the label range check still refuses it.
    with pytest.raises(DatasetFormatError, match=r"1 of 60000 labels are outside 0\.\.9 \(values 200\)") as exc:
        load("train", root=tmp_path, verify=False)
    assert str(labels) in str(exc.value) and "IDX" in str(exc.value)


def test_idx_labels_out_of_range_refused(tmp_path):
    x = np.zeros((3, 28, 28), np.uint8)
    write_idx(tmp_path, x, np.array([1, 10, 255]))
    with pytest.raises(DatasetFormatError, match=r"2 of 3 labels are outside 0\.\.9 \(values 10, 255\)") as exc:
        readers.load_mnist("train", root=tmp_path, verify=False)
    assert "train-labels-idx1-ubyte" in str(exc.value)


@pytest.mark.parametrize(
    "case",
    ["images_int32", "labels_int32", "images_2d", "images_30x30", "count_mismatch", "gz_truncated", "gz_garbage"],
)
def test_idx_wrong_layout_refused(tmp_path, case):
    x, y = np.zeros((3, 28, 28), np.uint8), np.array([1, 2, 3])
    bad = "labels" if case in ("labels_int32", "count_mismatch") else "images"
    if case == "images_int32":
        write_idx(tmp_path, x, y, xcode=0x0C)
    elif case == "labels_int32":
        write_idx(tmp_path, x, y, ycode=0x0C)
    elif case == "images_2d":
        write_idx(tmp_path, x.reshape(3, 784), y)
    elif case == "images_30x30":
        write_idx(tmp_path, np.zeros((3, 30, 30), np.uint8), y)
    elif case == "count_mismatch":
        write_idx(tmp_path, x, y[:2])
    else:
        write_idx(tmp_path, x, y)
        path = tmp_path / "MNIST/raw/train-images-idx3-ubyte"
        data = gzip.compress(path.read_bytes())
        path.with_suffix(".gz").write_bytes(data[: len(data) // 2] if case == "gz_truncated" else b"junk" * 9)
        path.unlink()
    with pytest.raises(DatasetFormatError) as exc:
        readers.load_mnist("train", root=tmp_path, verify=False)
    assert f"train-{bad}-idx" in str(exc.value) and "Expected: an IDX file" in str(exc.value)


# --------------------------------------------------------------------------- USPS


def write_usps(root: Path, data=None, target=None, *, drop=None, raw: bytes | None = None) -> Path:
    h5py = pytest.importorskip("h5py")
    path = root / "usps" / "usps.h5"
    path.parent.mkdir(parents=True, exist_ok=True)
    if raw is not None:
        path.write_bytes(raw)
        return path
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        for split, n in (("train", 4), ("test", 2)):
            if drop == split:
                continue
            f.create_dataset(f"{split}/data", data=rng.random((n, 256), dtype=np.float32) if data is None else data)
            if drop != f"{split}/target":
                f.create_dataset(f"{split}/target", data=np.arange(n) if target is None else target)
    return path


USPS_CASES = {
    # case: (writer kwargs, words the message must have)
    "not_hdf5": (dict(raw=b"this is not HDF5\n" * 10), "not an HDF5 file"),
    "missing_group": (dict(drop="train"), "no group 'train'"),
    "missing_target": (dict(drop="train/target"), "has no dataset 'target'"),
    "wrong_shape": (dict(data=np.zeros((4, 255), np.float32)), "train/data is float32 of shape (4, 255)"),
    "transposed": (dict(data=np.zeros((256, 4), np.float32)), "train/data is float32 of shape (256, 4)"),
    "images_16x16": (dict(data=np.zeros((4, 16, 16), np.float32)), "train/data is float32 of shape (4, 16, 16)"),
    "length_mismatch": (dict(target=np.arange(3)), "train/data has 4 images but train/target has shape (3,)"),
    "labels_10_19": (dict(target=np.arange(10, 14)), "4 of 4 labels are outside 0..9"),
    "pixels_0_255": (dict(data=np.full((4, 256), 255.0, np.float32)), "values outside [0, 1]"),
    "pixels_nan": (dict(data=np.full((4, 256), np.nan, np.float32)), "values outside [0, 1]"),
}


@pytest.mark.parametrize("case", sorted(USPS_CASES))
def test_usps_malformed_named(tmp_path, case):
    kwargs, words = USPS_CASES[case]
    path = write_usps(tmp_path, **kwargs)
    with pytest.raises(DatasetFormatError) as exc:
        readers.load_usps("train", root=tmp_path, verify=False)
    msg = str(exc.value)
    assert str(path) in msg and words in msg, msg
    assert "Expected: HDF5 with groups 'train' and 'test'" in msg


def test_usps_md5_checked(tmp_path):
    need("usps/usps.h5")
    path = tmp_path / "usps" / "usps.h5"
    path.parent.mkdir()
    shutil.copyfile(SHARED / "usps/usps.h5", path)
    assert readers.load_usps("test", root=tmp_path)[0].shape == (2007, 16, 16)
    readers._cached.cache_clear()
    write_usps(tmp_path, target=np.arange(10, 14))  # loads "fine" on the old code, then crashes in training
    with pytest.raises(DatasetChecksumError, match="355df6b942eb766252e0340bc019b0b9"):
        readers.load_usps("train", root=tmp_path)


def test_digits_refuses_usps_labels_before_training(tmp_path):
    """Through the feature-shift loader (what a RunConfig uses): refused at load, naming the file."""
    from fedlib.data import domains

    write_usps(tmp_path, target=np.arange(10, 14))
    with pytest.raises((DatasetChecksumError, DatasetFormatError), match="usps.h5"):
        domains.digits(("usps",), root=tmp_path)


# --------------------------------------------------------------------------- MNIST-M


def write_mnistm_tar(path: Path, labels=((7, 2), (0,)), png_bytes=None, label_text=None) -> Path:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    with tarfile.open(path, "w:gz") as tf:

        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))

        for split, labs in zip(("train", "test"), labels):
            lines = []
            for i, lab in enumerate(labs):
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)).save(buf, "PNG")
                add(f"mnist_m/mnist_m_{split}/{i:08d}.png", buf.getvalue() if png_bytes is None else png_bytes)
                lines.append(f"{i:08d}.png {lab}")
            text = "\n".join(lines) + "\n" if label_text is None else label_text
            add(f"mnist_m/mnist_m_{split}_labels.txt", text.encode())
    return path


@pytest.mark.parametrize("case", ["empty", "truncated", "not_tar"])
def test_mnistm_damaged_tar_named(tmp_path, case):
    pytest.importorskip("PIL")
    path = write_mnistm_tar(tmp_path / "mnist_m" / "mnist_m.tar.gz")
    data = path.read_bytes()
    path.write_bytes({"empty": b"", "truncated": data[: len(data) // 2], "not_tar": b"hello " * 100}[case])
    with pytest.raises(DatasetFormatError) as exc:
        readers.load_mnist_m("train", root=tmp_path)
    msg = str(exc.value)
    assert str(path) in msg and "not a complete tar archive" in msg and "Expected: the MNIST-M release layout" in msg


def test_mnistm_real_tar_truncated(tmp_path):
    need("mnist_m/mnist_m_subset.tar.gz")
    path = tmp_path / "mnist_m" / "mnist_m_subset.tar.gz"
    path.parent.mkdir()
    with open(SHARED / "mnist_m/mnist_m_subset.tar.gz", "rb") as f:
        path.write_bytes(f.read(1 << 20))
    with pytest.raises(DatasetChecksumError, match="57cc3aa4cb0968dc078a1983b2c7a708"):
        readers.load_mnist_m("test", root=tmp_path)
    with pytest.raises(DatasetFormatError, match="not a complete tar archive"):
        readers.load_mnist_m("test", root=tmp_path, verify=False)


@pytest.mark.parametrize(
    "case, words",
    [
        ("label_12", "1 of 2 labels are outside 0..9 (values 12)"),
        ("label_text", "line 1 is '00000000.png seven', not '<file> <label>'"),
        ("bad_png", "not a readable image"),
        ("no_labels", "holds no mnist_m_train_labels.txt"),
    ],
)
def test_mnistm_bad_contents_named(tmp_path, case, words):
    pytest.importorskip("PIL")
    path = tmp_path / "mnist_m" / "mnist_m.tar.gz"
    if case == "label_12":
        write_mnistm_tar(path, labels=((7, 12), (0,)))
    elif case == "label_text":
        write_mnistm_tar(path, label_text="00000000.png seven\n")
    elif case == "bad_png":
        write_mnistm_tar(path, png_bytes=b"\x89PNG not really")
    else:
        path.parent.mkdir(parents=True)
        with tarfile.open(path, "w:gz") as tf:
            info = tarfile.TarInfo("mnist_m/readme.txt")
            tf.addfile(info, io.BytesIO(b""))
    with pytest.raises(DatasetFormatError) as exc:
        readers.load_mnist_m("train", root=tmp_path)
    assert str(path) in str(exc.value) and words in str(exc.value)
    assert not list((tmp_path / "cache").glob("*.npz"))  # nothing bad was cached


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong_arrays"])
def test_mnistm_damaged_cache_is_decoded_again(tmp_path, damage):
    pytest.importorskip("PIL")
    write_mnistm_tar(tmp_path / "mnist_m" / "mnist_m.tar.gz")
    x, y = readers.load_mnist_m("train", root=tmp_path)
    (cache,) = (tmp_path / "cache").glob("mnist_m-*.npz")
    if damage == "garbage":
        cache.write_bytes(b"not a zip file at all")
    elif damage == "truncated":
        cache.write_bytes(cache.read_bytes()[:200])
    else:  # a readable .npz that does not hold decoded MNIST-M (labels out of range)
        np.savez(cache, x_train=np.asarray(x), y_train=np.full(len(y), 50, np.int64))
    readers._cached.cache_clear()
    with pytest.warns(RuntimeWarning, match=f"MNIST-M cache {cache}.*decoding .*mnist_m.tar.gz again"):
        x2, y2 = readers.load_mnist_m("train", root=tmp_path)
    np.testing.assert_array_equal(x2, x)
    np.testing.assert_array_equal(y2, y)
    readers._cached.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the cache was rewritten: no warning the next time
        readers.load_mnist_m("train", root=tmp_path)


def test_image_folder_damaged_cache_is_decoded_again(tmp_path):
    """The same for the Office/DomainNet image-folder cache (fedlib.data.domains)."""
    PIL = pytest.importorskip("PIL.Image")
    from fedlib.data.domains import image_folders

    for i, cls in enumerate(["back_pack", "bike"] * 3):
        d = tmp_path / "office31" / "amazon" / "images" / cls
        d.mkdir(parents=True, exist_ok=True)
        PIL.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(d / f"{i}.png")
    x, y, _ = image_folders._read_domain("office31", "amazon", 8, tmp_path)
    (cache,) = (tmp_path / "cache").glob("office31-*.npz")
    cache.write_bytes(cache.read_bytes()[:200])  # a truncated zip: BadZipFile
    with pytest.warns(RuntimeWarning, match=f"cache {cache}"):
        x2, y2, _ = image_folders._read_domain("office31", "amazon", 8, tmp_path)
    np.testing.assert_array_equal(x2, x)
    np.testing.assert_array_equal(y2, y)


# --------------------------------------------------------------------------- CIFAR-10: no code runs


def cifar_batch(n=4, seed=0, labels=None) -> dict:
    rng = np.random.default_rng(seed)
    return {
        b"batch_label": b"training batch 1 of 5",
        b"labels": list(range(n)) if labels is None else labels,
        b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
        b"filenames": [b"x%d.png" % i for i in range(n)],
    }


def write_cifar(root: Path, batches: dict | None = None) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(cifar._CIFAR_FILES):
        obj = (batches or {}).get(name, cifar_batch(seed=i) if name != "batches.meta" else {b"label_names": []})
        (folder / name).write_bytes(obj if isinstance(obj, bytes) else pickle.dumps(obj, protocol=4))
    return folder


class _Payload:
    """Unpickling this calls os.system, which creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def py2_pickle(obj) -> bytes:
    """``obj`` pickled as Python 2's cPickle (protocol 2) wrote the CIFAR-10 batches: byte strings as
    BINSTRING, arrays through numpy.core.multiarray._reconstruct. Python 3 cannot write this itself."""

    def enc(o) -> bytes:
        if isinstance(o, bytes):
            return b"T" + struct.pack("<i", len(o)) + o
        if isinstance(o, bool):
            return b"\x88" if o else b"\x89"
        if isinstance(o, int):
            return b"J" + struct.pack("<i", o)
        if o is None:
            return b"N"
        if isinstance(o, tuple):
            return b"(" + b"".join(map(enc, o)) + b"t"
        if isinstance(o, list):
            return b"](" + b"".join(map(enc, o)) + b"e"
        if isinstance(o, dict):
            return b"}(" + b"".join(enc(k) + enc(v) for k, v in o.items()) + b"u"
        if isinstance(o, np.ndarray):
            assert o.dtype == np.uint8
            # dtype('u1') with its state; c = GLOBAL, R = REDUCE (call), b = BUILD (setstate), ( ... t = tuple
            dtype = b"cnumpy\ndtype\n" + enc((b"u1", 0, 1)) + b"R" + enc((3, b"|", None, None, None, -1, -1, 0)) + b"b"
            ndarray_args = b"(cnumpy\nndarray\n" + enc((0,)) + enc(b"b") + b"t"  # (ndarray, (0,), 'b')
            state = b"(" + enc(1) + enc(o.shape) + dtype + enc(False) + enc(o.tobytes()) + b"t"
            return b"cnumpy.core.multiarray\n_reconstruct\n" + ndarray_args + b"R" + state + b"b"
        raise TypeError(type(o))

    return b"\x80\x02" + enc(obj) + b"."


def test_cifar10_python2_batch_format(tmp_path):
    """The real batches are Python 2 pickles: the restricted unpickler reads that format (no CIFAR-10 offline)."""
    batch = cifar_batch(seed=5)
    assert pickle.loads(py2_pickle(batch), encoding="latin1")["labels"] == [0, 1, 2, 3]  # the builder is right
    write_cifar(tmp_path, {"test_batch": py2_pickle(batch)})
    x, y = readers.load_cifar10("test", root=tmp_path, verify=False)
    np.testing.assert_array_equal(x, batch[b"data"].reshape(4, 3, 32, 32).transpose(0, 2, 3, 1))
    assert y.tolist() == [0, 1, 2, 3]


def test_cifar10_batches_read_without_pickle(tmp_path):
    folder = write_cifar(tmp_path)
    x, y = readers.load_cifar10("test", root=tmp_path, verify=False)
    ref = cifar_batch(seed=5)
    assert x.shape == (4, 32, 32, 3) and x.dtype == np.uint8 and y.tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(x[1, :, :, 2], ref[b"data"][1, 2048:].reshape(32, 32))  # blue plane
    assert readers.load_cifar10("train", root=tmp_path, verify=False)[0].shape == (20, 32, 32, 3)
    with pytest.raises(DatasetChecksumError, match=str(folder / "test_batch")):
        readers.load_cifar10("test", root=tmp_path)


@pytest.mark.parametrize("where", ["top", "inside_labels"])
def test_cifar10_planted_pickle_runs_nothing(tmp_path, where):
    marker = tmp_path / "PWNED"
    payload = _Payload(marker)
    bad = payload if where == "top" else cifar_batch(labels=[0, 1, payload, 3])
    folder = write_cifar(tmp_path, {"test_batch": pickle.dumps(bad, protocol=4)})
    with pytest.raises(DatasetFormatError) as exc:
        readers.load_cifar10("test", root=tmp_path, verify=False)
    assert not marker.exists(), "the planted pickle ran its payload"
    msg = str(exc.value)
    assert str(folder / "test_batch") in msg and "refused to load posix.system" in msg
    assert "Expected: the python version of CIFAR-10" in msg


@pytest.mark.parametrize(
    "case, words",
    [
        ("list", "holds a list, not a dict"),
        ("no_data", "not 'data' and 'labels'"),
        ("data_float", "'data' is float64 of shape (4, 3072)"),
        ("labels_short", "3 labels for 4 images"),
        ("labels_range", "1 of 4 labels are outside 0..9 (values 10)"),
        ("truncated", "not a CIFAR-10 batch"),
    ],
)
def test_cifar10_malformed_named(tmp_path, case, words):
    good = cifar_batch()
    obj = {
        "list": [1, 2],
        "no_data": {b"labels": [1]},
        "data_float": {**good, b"data": good[b"data"].astype(float)},
        "labels_short": {**good, b"labels": [1, 2, 3]},
        "labels_range": {**good, b"labels": [1, 2, 10, 3]},
        "truncated": None,
    }[case]
    data = pickle.dumps(good, protocol=4)[:100] if case == "truncated" else pickle.dumps(obj, protocol=4)
    folder = write_cifar(tmp_path, {"test_batch": data})
    with pytest.raises(DatasetFormatError) as exc:
        readers.load_cifar10("test", root=tmp_path, verify=False)
    assert str(folder / "test_batch") in str(exc.value) and words in str(exc.value)


# --------------------------------------------------------------------------- SVHN and SynthDigits (.mat)


def write_mat(path: Path, x=None, y=None, v73=False, drop=None):
    x = np.random.default_rng(0).integers(0, 256, size=(32, 32, 3, 3), dtype=np.uint8) if x is None else x
    y = np.array([[10], [1], [9]]) if y is None else y
    path.parent.mkdir(parents=True, exist_ok=True)
    mat = {k: v for k, v in {"X": x, "y": y}.items() if k != drop}
    if v73:
        h5py = pytest.importorskip("h5py")
        with h5py.File(path, "w") as f:
            for k, v in mat.items():
                f[k] = np.asarray(v).T  # MATLAB v7.3 stores column-major: dims reversed
    else:
        scipy_io = pytest.importorskip("scipy.io")
        scipy_io.savemat(path, mat)
    return x, y


def test_svhn_mat_read_and_md5_checked(tmp_path):
    x, _ = write_mat(tmp_path / "svhn" / "test_32x32.mat")
    xs, ys = readers.load_svhn("test", root=tmp_path, verify=False)
    np.testing.assert_array_equal(xs, x.transpose(3, 0, 1, 2))
    assert ys.tolist() == [0, 1, 9]  # 10 is digit 0
    with pytest.raises(DatasetChecksumError, match="eb5a983be6a315427106f1b164d9cef3"):
        readers.load_svhn("test", root=tmp_path)


MAT_CASES = {
    "not_mat": (dict(), "not a readable MATLAB file"),
    "no_X": (dict(drop="X"), "has no variable X"),
    "X_shape": (dict(x=np.zeros((28, 28, 3), np.uint8)), "'X' has shape (28, 28, 3)"),
    "y_length": (dict(y=np.array([[1], [2]])), "'y' has shape (2, 1) for 3 images"),
    "y_range": (dict(y=np.array([[1], [11], [12]])), "2 of 3 labels are outside 0..9 (values 11, 12)"),
    "X_range": (dict(x=np.full((32, 32, 3, 3), 300.0)), "pixels (float64) are not all whole numbers in 0..255"),
}


@pytest.mark.parametrize("dataset", ["svhn", "synthdigits"])
@pytest.mark.parametrize("case", sorted(MAT_CASES))
def test_mat_malformed_named(tmp_path, dataset, case):
    kwargs, words = MAT_CASES[case]
    path = tmp_path / ("svhn/test_32x32.mat" if dataset == "svhn" else "synth_digits/synth_test_32x32.mat")
    if case == "not_mat":
        path.parent.mkdir(parents=True)
        path.write_bytes(b"MATLAB 5.0 MAT-file? no, just text" * 8)
    else:  # SynthDigits as MATLAB v7.3 (HDF5: read with h5py, runs without scipy), SVHN as v5 (needs scipy)
        write_mat(path, v73=dataset == "synthdigits", **kwargs)
    with pytest.raises(DatasetFormatError) as exc:
        readers.load(dataset, "test", root=tmp_path, verify=False)
    msg = str(exc.value)
    assert str(path) in msg and words in msg, msg
    assert "Expected: " in msg and "'X' (32, 32, 3, n)" in msg


def test_synthdigits_v73_malformed_named(tmp_path):
    path = tmp_path / "synth_digits" / "synth_train_32x32.mat"
    write_mat(path, v73=True, y=np.array([[10, 3, 19]]))
    with pytest.raises(DatasetFormatError, match=r"1 of 3 labels are outside 0\.\.9 \(values 19\)") as exc:
        readers.load_synthdigits("train", root=tmp_path)
    assert str(path) in str(exc.value)
    write_mat(path, v73=True, drop="y")
    with pytest.raises(DatasetFormatError, match="has no variable y"):
        readers.load_synthdigits("train", root=tmp_path)


def test_format_error_survives_pickling():
    """Worker processes send it back pickled: message and fields intact."""
    e = DatasetFormatError("/x/usps.h5", "not an HDF5 file", "HDF5 with groups")
    back = pickle.loads(pickle.dumps(e))
    assert str(back) == str(e) and back.path == "/x/usps.h5" and isinstance(back, ValueError)
