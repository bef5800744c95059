"""Tampered data folders: every fault is a DatasetFormatError naming the file (and the line) before anything trains,
nothing is read from outside a split's own folder, and the decoded-data caches never serve what a bad file gave.

MNIST-M's folder layout is built from the offline subset's real PNGs (labels: MNIST's at the same index, as the
MANIFEST says) when the shared data is present, else from generated images; Office-31 and DomainNet from tiny
generated image folders (no offline copy exists)."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from fedlib.data import domains, readers
from fedlib.data.readers import DatasetFormatError
from fedlib.experiments.cli import DATA_ERRORS

Image = pytest.importorskip("PIL.Image")

SHARED = Path(os.environ.get("FEDLIB_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data"))
LABELS = "mnist_m/mnist_m_train_labels.txt"


@pytest.fixture(autouse=True)
def _fresh_memos():
    """Each load below reads the files (or the on-disk cache), never the in-process memo of an earlier test."""
    readers._cached.cache_clear()
    yield
    readers._cached.cache_clear()


def _real_pngs(n: int):
    """The first ``n`` training PNGs of the offline MNIST-M subset with their labels, or None when it is absent."""
    tar, labels = SHARED / "mnist_m" / "mnist_m_subset.tar.gz", SHARED / "MNIST" / "raw" / "train-labels-idx1-ubyte.gz"
    if not (tar.is_file() and labels.is_file()):
        return None
    with gzip.open(labels, "rb") as f:
        mnist_y = np.frombuffer(f.read(), np.uint8, offset=8)
    out = []
    with tarfile.open(tar, "r:gz") as tf:
        for m in tf:
            p = Path(m.name)
            if m.isfile() and p.parent.name == "mnist_m_train" and p.suffix == ".png":
                out.append((p.name, tf.extractfile(m).read(), int(mnist_y[int(p.stem)])))
                if len(out) == n:
                    return out
    return None


def make_mnistm(root: Path, n: int = 4):
    """MNIST-M's training split as folders under ``root``: (names, x, y) of what it holds."""
    rows = _real_pngs(n)
    if rows is None:
        rng = np.random.default_rng(0)
        rows = []
        for i in range(n):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, "PNG")
            rows.append((f"{i:08d}.png", buf.getvalue(), int(rng.integers(0, 10))))
    folder = root / "mnist_m" / "mnist_m_train"
    folder.mkdir(parents=True)
    for name, data, _ in rows:
        (folder / name).write_bytes(data)
    (root / LABELS).write_text("".join(f"{name} {lab}\n" for name, _, lab in rows))
    x = np.stack([np.asarray(Image.open(io.BytesIO(data)).convert("RGB")) for _, data, _ in rows])
    return [r[0] for r in rows], x, np.array([r[2] for r in rows], np.int64)


@pytest.fixture
def mnistm(tmp_path):
    root = tmp_path / "data"
    names, x, y = make_mnistm(root)
    return root, names, x, y


def _as_tar(root: Path) -> Path:
    """The folder layout under ``root`` packed as mnist_m/mnist_m.tar.gz in a fresh root (read in place)."""
    other = root.parent / "tar_root"
    (other / "mnist_m").mkdir(parents=True)
    tar = other / "mnist_m" / "mnist_m.tar.gz"
    with tarfile.open(tar, "w:gz") as tf:
        tf.add(root / "mnist_m" / "mnist_m_train", arcname="mnist_m/mnist_m_train")
        tf.add(root / LABELS, arcname=LABELS)
    return other


def _caches() -> list[Path]:
    return sorted(readers.cache_dir().glob("*.npz"))


def _load(root: Path, layout: str):
    root = _as_tar(root) if layout == "tar" else root
    where = f"{root / 'mnist_m' / 'mnist_m.tar.gz'} [{LABELS}]" if layout == "tar" else str(root / LABELS)
    return where, lambda: readers.load_mnist_m("train", root=root)


# --------------------------------------------------------------------------- MNIST-M labels file


@pytest.mark.parametrize("layout", ["folder", "tar"])
def test_mnistm_labels_file_not_utf8_is_named_with_its_line(mnistm, layout):
    """Folder layout: a bare UnicodeDecodeError naming no file; tar: decoded with replacement characters, which then
    named images that do not exist (a DatasetNotFoundError, the wrong diagnosis)."""
    root, names, _, _ = mnistm
    (root / LABELS).write_bytes(f"{names[0]} 7\n".encode() + b"\xff\xfe.png 2\n")
    where, load = _load(root, layout)
    with pytest.raises(DatasetFormatError) as err:
        load()
    assert str(err.value).startswith(f"{where}: is not UTF-8 text (line 2: byte 0xff at offset {len(names[0]) + 3})")
    assert not _caches()


@pytest.mark.parametrize("where", ["absolute", "../ inside the root", "../ outside the root", "a subfolder"])
def test_mnistm_labels_naming_files_outside_the_split_folder_are_refused(mnistm, where):
    """A labels line with an absolute path or ``..`` was read from wherever it pointed (``folder / f``), the data
    root's outside included: here a real image planted there loaded as a training sample."""
    root, names, _, _ = mnistm
    png = (root / "mnist_m" / "mnist_m_train" / names[0]).read_bytes()
    outside = root.parent / "elsewhere" / "planted.png"
    inside = root / "planted.png"
    nested = root / "mnist_m" / "mnist_m_train" / "sub" / "planted.png"
    for p in (outside, inside, nested):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(png)
    line = {
        "absolute": str(outside),
        "../ inside the root": "../../planted.png",
        "../ outside the root": "../../../elsewhere/planted.png",
        "a subfolder": "sub/planted.png",
    }[where]
    (root / LABELS).write_text(f"{names[0]} 1\n{line} 3\n")
    with pytest.raises(DatasetFormatError) as err:
        readers.load_mnist_m("train", root=root)
    assert str(err.value).startswith(
        f"{root / LABELS}: line 2 names {line!r}, not a file name: an image is named by its bare file name, read "
        "from the split's own folder (no folder part, no '..', not an absolute path)"
    )
    assert not _caches()


@pytest.mark.parametrize("layout", ["folder", "tar"])
def test_mnistm_an_image_listed_twice_is_refused(mnistm, layout):
    """It was decoded once and counted twice (a duplicated training sample)."""
    root, names, _, _ = mnistm
    (root / LABELS).write_text(f"{names[0]} 1\n{names[1]} 2\n{names[0]} 1\n")
    where, load = _load(root, layout)
    with pytest.raises(DatasetFormatError) as err:
        load()
    assert str(err.value).startswith(f"{where}: line 3 lists {names[0]!r} again (first on line 1): each image once")
    assert not _caches()


@pytest.mark.parametrize("layout", ["folder", "tar"])
@pytest.mark.parametrize("text", ["", "\n \n\t\n"])
def test_mnistm_a_labels_file_listing_nothing_is_refused(mnistm, layout, text):
    """It loaded 0 training images; a run then failed in round 1 with 'cannot reshape tensor of 0 elements'."""
    root, _, _, _ = mnistm
    (root / LABELS).write_text(text)
    where, load = _load(root, layout)
    with pytest.raises(DatasetFormatError) as err:
        load()
    assert str(err.value).startswith(f"{where}: lists no images (no '<file> <label>' line)")


def test_mnistm_a_label_in_non_ascii_digits_is_a_format_error(mnistm):
    """'\u00b2'.isdigit() is true but int() refuses it: a bare ValueError naming no file."""
    root, names, _, _ = mnistm
    (root / LABELS).write_text(f"{names[0]} \u00b2\n")
    with pytest.raises(DatasetFormatError, match=r"line 1 is .*, not '<file> <label>'"):
        readers.load_mnist_m("train", root=root)


# --------------------------------------------------------------------------- MNIST-M decoded cache


def test_mnistm_cache_is_not_served_once_an_image_is_replaced_by_a_bad_one(mnistm):
    """The cache was keyed by the labels file only: an image replaced under it kept being served from the cache,
    decoded from the old file, and the damage went unnoticed."""
    root, names, x, y = mnistm
    got_x, got_y = readers.load_mnist_m("train", root=root)
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, y)
    assert len(_caches()) == 1
    image = root / "mnist_m" / "mnist_m_train" / names[1]
    good = image.read_bytes()
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    readers._cached.cache_clear()
    with pytest.raises(DatasetFormatError) as err:
        readers.load_mnist_m("train", root=root)
    assert str(err.value).startswith(f"{image}: not a readable image")
    image.write_bytes(good)  # repaired: decoded again and served
    readers._cached.cache_clear()
    np.testing.assert_array_equal(readers.load_mnist_m("train", root=root)[0], x)


def test_mnistm_cache_is_not_served_once_the_labels_file_went_bad(mnistm):
    """A labels file changed without changing its size or mtime (same-length lines, mtime put back) hit the cache made
    from its earlier contents: the checks on the labels file never ran. They now run before any cache is read."""
    root, names, _, _ = mnistm
    readers.load_mnist_m("train", root=root)
    labels = root / LABELS
    st = labels.stat()
    lines = labels.read_text().splitlines()
    lines[1] = names[0] + lines[1][len(names[1]) :]  # the first image again, same length
    labels.write_text("\n".join(lines) + "\n")
    os.utime(labels, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert labels.stat().st_size == st.st_size and labels.stat().st_mtime_ns == st.st_mtime_ns
    readers._cached.cache_clear()
    with pytest.raises(DatasetFormatError, match=f"line 2 lists {names[0]!r} again"):
        readers.load_mnist_m("train", root=root)


# --------------------------------------------------------------------------- image-folder domains


def _office(root: Path, n: int = 3) -> Path:
    for cls in ("back_pack", "mug"):
        (root / "office31" / "amazon" / "images" / cls).mkdir(parents=True)
        for i in range(n):
            Image.new("RGB", (40, 30), (10, 40 * i, 200)).save(
                root / "office31" / "amazon" / "images" / cls / f"{i}.jpg"
            )
    return root / "office31" / "amazon" / "images" / "mug" / "1.jpg"


@pytest.mark.parametrize("damage", ["not an image", "truncated", "empty"])
def test_office_corrupt_image_is_a_data_error_naming_the_file(tmp_path, damage):
    """PIL's UnidentifiedImageError (or OSError for a truncated JPEG) escaped: it is not one of the data errors the
    command line catches, so a run ended in a traceback."""
    image = _office(tmp_path)
    data = image.read_bytes()
    image.write_bytes(
        {"not an image": b"this is not a JPEG", "truncated": data[: len(data) // 2], "empty": b""}[damage]
    )
    with pytest.raises(DatasetFormatError) as err:
        domains.office31(("amazon",), size=8, root=tmp_path)
    assert isinstance(err.value, DATA_ERRORS)
    assert str(err.value).startswith(f"{image}: not a readable image (")
    assert not _caches()  # nothing decoded from the bad folder is kept


def test_domainnet_split_list_not_utf8_is_named(tmp_path):
    """``split='official'`` read the release's lists with read_text(): a bare UnicodeDecodeError naming no file."""
    base = tmp_path / "domainnet"
    for cls in ("bird", "zebra"):
        (base / "clipart" / cls).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (20, 20), (30 * i, 90, 10)).save(base / "clipart" / cls / f"{i}.jpg")
    (base / "clipart_test.txt").write_text("clipart/bird/0.jpg 0\nclipart/zebra/0.jpg 9\n")
    (base / "clipart_train.txt").write_bytes(b"clipart/bird/1.jpg 0\nclipart/zebra/\xe9.jpg 9\n")
    with pytest.raises(DatasetFormatError) as err:
        domains.domainnet(("clipart",), size=8, root=tmp_path, split="official")
    assert str(err.value).startswith(f"{base / 'clipart_train.txt'}: is not UTF-8 text (line 2: byte 0xe9")
