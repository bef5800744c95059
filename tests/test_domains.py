"""Feature-shift data sets (fedlib.data.domains): digits from the real offline files (skipped when
absent), Office-31 / Office-Home / DomainNet from tiny generated image folders, and the RunConfig
integration."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlib.config.run import RunConfig
from fedlib.data import domains, load_federated, partition_summary, readers
from fedlib.data.domains import image_folders, sampling
from fedlib.data.readers import DatasetNotFoundError

SHARED = Path(os.environ.get("FEDLIB_DATA", Path(__file__).resolve().parents[1] / ".." / "shared" / "data"))


def need(*rel: str) -> Path:
    missing = [r for r in rel if not (SHARED / r).exists()]
    if missing:
        pytest.skip(f"real data not available: {', '.join(missing)} missing under {SHARED}")
    return SHARED


MNIST = ("MNIST/raw/train-images-idx3-ubyte.gz", "MNIST/raw/t10k-labels-idx1-ubyte.gz")
USPS = ("usps/usps.h5",)
MNISTM = ("mnist_m/mnist_m_subset.tar.gz",)


@pytest.fixture(autouse=True, scope="module")
def _forget_in_process_memos():
    """Reader arrays stay memoised within this module (fast); afterwards they are dropped, so later
    modules see a fresh process state (test_readers checks that MNIST-M is decoded into its own cache)."""
    yield
    import fedlib.data as data

    readers._cached.cache_clear()
    data._load_domains_cached.cache_clear()


def rows(x: torch.Tensor) -> set[bytes]:
    return {hashlib.sha1(r.numpy().tobytes()).digest() for r in x}


# --------------------------------------------------------------------------- digits (real files)


def test_digits_fedbn_protocol_counts_shapes_values():
    root = need(*MNIST, *USPS)
    fd = domains.digits(("mnist", "usps"), root=root)
    assert fd.n_clients == 2 and fd.n_classes == 10 and fd.input_shape == (3, 28, 28)
    assert fd.train.sizes.tolist() == [743, 743]  # FedBN: 10 % = floor(743.8) per domain
    assert fd.test.sizes.tolist() == [10000, 2007]  # full official test sets
    assert fd.train.x.shape == (1486, 3, 28, 28) and fd.train.x.dtype == torch.float32
    assert fd.test.x.shape[1:] == (3, 28, 28) and fd.global_test is None
    assert float(fd.train.x.min()) == -1.0 and float(fd.train.x.max()) == 1.0  # (x/255 - 0.5)/0.5
    assert torch.equal(fd.train.x[:, 0], fd.train.x[:, 2])  # grey replicated to 3 channels
    assert set(fd.train.y.unique().tolist()) == set(range(10))

    # the exact recipe: MNIST rows are the seeded draw, normalised, no resize at 28x28
    x_raw, y_raw = readers.load_mnist("train", root=root)
    idx = sampling._subset(np.arange(60000), 743, sampling._rng(0, "mnist", 1))
    xm, ym = fd.train.client(0)
    np.testing.assert_array_equal(ym.numpy(), y_raw[idx])
    expect = (x_raw[idx].astype(np.float32) / np.float32(255) - np.float32(0.5)) / np.float32(0.5)
    np.testing.assert_array_equal(xm[:, 1].numpy(), expect)

    # USPS: truncated to uint8, PIL-bilinear resized 16 -> 28, as FedBN's transform_usps
    from PIL import Image

    xu_raw, yu_raw = readers.load_usps("train", root=root)
    iu = sampling._subset(np.arange(7291), 743, sampling._rng(0, "usps", 1))
    xu, yu = fd.train.client(1)
    np.testing.assert_array_equal(yu.numpy(), yu_raw[iu])
    img = Image.fromarray((xu_raw[iu[0]] * np.float32(255)).astype(np.uint8)).resize((28, 28), Image.BILINEAR)
    np.testing.assert_allclose(xu[0, 0].numpy(), np.asarray(img, np.float32) / 127.5 - 1, atol=1e-6)


def test_digits_determinism_percent_and_split():
    root = need(*USPS)
    a = domains.digits(("usps",), seed=0, root=root)
    b = domains.digits(("usps",), seed=0, root=root)
    c = domains.digits(("usps",), seed=1, root=root)
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.train.y, b.train.y)
    assert not torch.equal(a.train.x, c.train.x)
    assert torch.equal(a.test.x, c.test.x)  # official test set: no draw
    # percent: floor(7438 p), nested (a larger share keeps the smaller one's images), capped at the pool
    assert [domains.train_count(p) for p in (0.05, 0.1, 0.2, 0.5, 0.7, 1.0)] == [371, 743, 1487, 3719, 5206, 7438]
    d = domains.digits(("usps",), percent=0.2, root=root)
    assert d.train.sizes.tolist() == [1487] and rows(a.train.x) <= rows(d.train.x)
    assert domains.digits(("usps",), percent=1.0, root=root).train.sizes.tolist() == [7291]  # official pool
    # FedBN's own split: pool train+test, stratified 80/20 -> 7438 / 1860 for USPS
    f = domains.digits(("usps",), percent=1.0, split="fedbn", root=root)
    assert f.train.sizes.tolist() == [7438] and f.test.sizes.tolist() == [1860]
    _, y_all = readers.load_usps("all", root=root)
    per_class = np.bincount(y_all, minlength=10)
    assert np.all(np.abs(np.bincount(f.test.y.numpy(), minlength=10) - 0.2 * per_class) < 1)  # stratified
    assert domains.digits(("usps",), split="fedbn", root=root).train.sizes.tolist() == [743]


def test_digits_domain_order_and_independence():
    root = need(*MNIST, *USPS)
    ab = domains.digits(("mnist", "usps"), root=root)
    ba = domains.digits(("usps", "mnist"), root=root)
    assert ba.name == "digits(usps,mnist)"
    assert torch.equal(ab.train.client(1)[0], ba.train.client(0)[0])  # a domain's draw ignores the others


def test_digits_missing_domain_names_files_and_root(tmp_path):
    with pytest.raises(DatasetNotFoundError) as exc:
        domains.digits(("svhn",), root=tmp_path)
    msg = str(exc.value)
    assert "svhn/train_32x32.mat" in msg and str(tmp_path) in msg and "'svhn'" in msg
    with pytest.raises(DatasetNotFoundError, match="synth_digits/synth_train_32x32.mat"):
        domains.digits(("synthdigits",), root=tmp_path)
    assert domains.digits_available(tmp_path) == ()
    with pytest.raises(ValueError, match="allowed: mnist, svhn, usps, synthdigits, mnist_m"):
        domains.digits(("mnistm",), root=tmp_path)
    with pytest.raises(ValueError, match="percent=0: must be in"):
        domains.digits(("mnist",), percent=0, root=tmp_path)


def test_digits_available_on_shared():
    need(*MNIST, *USPS, *MNISTM)
    assert set(domains.digits_available(SHARED)) >= {"mnist", "usps", "mnist_m"}


# --------------------------------------------------------------------------- image folders (generated)


def colour(label: int, i: int) -> tuple[int, int, int]:
    return (10 + 3 * label, 40 + 20 * i, 200)  # identifies (class, image) after JPEG round trip


def make_folder(base: Path, classes, n=5, ext=".jpg", shape=(30, 40)):
    """Solid-colour images ``base/<class>/img<i><ext>``; class colour from its index in ``classes``' dataset list."""
    from PIL import Image

    for name, label in classes:
        (base / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.new("RGB", (shape[1], shape[0]), colour(label, i)).save(base / name / f"img{i}{ext}")


OFFICE_CLASSES = [("back_pack", 0), ("mug", 17), ("trash_can", 30)]


def check_colours(fd, client):
    x, y = fd.train.client(client)
    xt, yt = fd.test.client(client)
    for xs, ys in ((x, y), (xt, yt)):
        for img, lab in zip(xs, ys):
            r = float(img[0].mean()) * 255
            assert abs(r - (10 + 3 * int(lab))) < 1.5  # the label is the image's own class


def test_office31_layout_labels_resize_split(tmp_path):
    make_folder(tmp_path / "office31" / "amazon" / "images", OFFICE_CLASSES)  # original release layout
    make_folder(tmp_path / "office31" / "webcam", OFFICE_CLASSES[:2], n=10)  # flattened layout
    (tmp_path / "office31" / "amazon" / "images" / "not_a_class").mkdir()  # ignored
    fd = domains.office31(("webcam", "amazon"), size=16, root=tmp_path)
    assert fd.name == "office31(webcam,amazon)" and fd.n_classes == 31 and fd.input_shape == (3, 16, 16)
    assert fd.train.x.shape[1:] == (3, 16, 16) and fd.train.x.dtype == torch.float32
    assert 0.0 <= float(fd.train.x.min()) and float(fd.train.x.max()) <= 1.0  # x / 255
    # 80/20 stratified: webcam 2 x 10 -> 2 test per class; amazon 3 x 5 -> 1 test per class
    assert fd.train.sizes.tolist() == [16, 12] and fd.test.sizes.tolist() == [4, 3]
    assert sorted(fd.test.client(1)[1].tolist()) == [0, 17, 30]
    assert sorted(set(fd.train.client(1)[1].tolist())) == [0, 17, 30]
    check_colours(fd, 0), check_colours(fd, 1)
    assert domains.CLASSES["office31"][17] == "mug"
    # determinism, seed, nested percent
    again = domains.office31(("webcam", "amazon"), size=16, root=tmp_path)
    assert torch.equal(fd.train.x, again.train.x) and torch.equal(fd.test.y, again.test.y)
    other = [domains.office31(("webcam",), size=16, seed=s, root=tmp_path).test.x for s in range(1, 4)]
    assert any(not torch.equal(fd.test.client(0)[0], o) for o in other)
    half = domains.office31(("webcam", "amazon"), size=16, percent=0.5, root=tmp_path)
    assert half.train.sizes.tolist() == [8, 6] and torch.equal(half.test.x, fd.test.x)
    assert rows(half.train.x) <= rows(fd.train.x)


def test_office_cache_makes_second_load_decode_free(tmp_path, monkeypatch):
    make_folder(tmp_path / "Office-31" / "dslr", OFFICE_CLASSES, n=3)
    first = domains.office31(("dslr",), size=8, root=tmp_path)
    assert len(list(readers.cache_dir().glob("office31-dslr-8-*.npz"))) == 1

    def no_decode(*a, **k):
        raise AssertionError("decoded again despite the cache")

    monkeypatch.setattr(image_folders, "_decode", no_decode)  # where _read_domain looks it up
    second = domains.office31(("dslr",), size=8, root=tmp_path)
    assert torch.equal(first.train.x, second.train.x)
    with pytest.raises(AssertionError):  # another size is another cache entry
        domains.office31(("dslr",), size=9, root=tmp_path)


def test_officehome_variants_and_class_order(tmp_path):
    nested = tmp_path / "OfficeHome" / "OfficeHomeDataset_10072016"
    classes = [("TV", 58), ("Table", 59), ("Alarm_Clock", 0)]
    make_folder(nested / "Real_World", classes, ext=".png")
    make_folder(nested / "Art", classes[:1], ext=".JPG")
    fd = domains.officehome(("Real World", "Art"), size=12, root=tmp_path)
    assert fd.n_classes == 65 and fd.train.sizes.tolist() == [12, 4] and fd.test.sizes.tolist() == [3, 1]
    assert domains.CLASSES["officehome"][58:60] == ("TV", "Table")  # sorted (ImageFolder) order
    check_colours(fd, 0), check_colours(fd, 1)
    assert domains.available(tmp_path)["officehome"] == ("Art", "Real World")


def test_domainnet_top10_and_official_split(tmp_path):
    base = tmp_path / "DomainNet"
    make_folder(base / "clipart", [("bird", 0), ("zebra", 9)], n=5)
    make_folder(base / "clipart", [("aircraft_carrier", 0)], n=2)  # not one of FedBN's ten: ignored
    make_folder(base / "sketch", [("whale", 6)], n=5)
    fd = domains.domainnet(("clipart", "sketch"), size=8, root=tmp_path)
    assert fd.n_classes == 10 and fd.input_shape == (3, 8, 8)
    assert fd.train.sizes.tolist() == [8, 4] and fd.test.sizes.tolist() == [2, 1]
    assert set(fd.train.client(0)[1].tolist()) == {0, 9} and set(fd.test.client(1)[1].tolist()) == {6}
    # the release's lists (lines '<domain>/<class>/<file> <label>'), filtered to the ten classes
    (base / "splits").mkdir()
    for dom, cls in (("clipart", ("bird", "zebra", "aircraft_carrier")), ("sketch", ("whale",))):
        tr = [f"{dom}/{c}/img{i}.jpg {k}" for k, c in enumerate(cls) for i in range(4)]
        te = [f"{dom}/{c}/img4.jpg {k}" for k, c in enumerate(cls)]
        (base / "splits" / f"{dom}_train.txt").write_text("\n".join(tr) + "\n")
        (base / "splits" / f"{dom}_test.txt").write_text("\n".join(te) + "\n")
    off = domains.domainnet(("clipart", "sketch"), size=8, root=tmp_path, split="official")
    assert off.train.sizes.tolist() == [8, 4] and off.test.sizes.tolist() == [2, 1]
    assert off.test.client(0)[1].tolist() == [0, 9]
    assert domains.available(tmp_path)["domainnet"] == ("clipart", "sketch")


def test_missing_image_dataset_names_dataset_layout_and_root(tmp_path):
    with pytest.raises(DatasetNotFoundError) as exc:
        domains.office31(("amazon",), root=tmp_path)
    msg = str(exc.value)
    assert "'office31'" in msg and "office31/amazon/images/<class>/*.jpg" in msg and str(tmp_path) in msg
    make_folder(tmp_path / "office31" / "amazon", [("not_a_class", 0)], n=1)
    with pytest.raises(DatasetNotFoundError, match="office31/webcam"):
        domains.office31(("webcam",), root=tmp_path)
    with pytest.raises(DatasetNotFoundError, match="'domainnet'.*domainnet/real/<class>/\\*.jpg"):
        domains.domainnet(("real",), root=tmp_path)
    assert domains.available(tmp_path) == {"digits": (), "office31": (), "officehome": (), "domainnet": ()}


# --------------------------------------------------------------------------- RunConfig integration


@pytest.mark.parametrize(
    "change, message",
    [
        (
            dict(domains=("mnist", "cifar")),
            "RunConfig.domains=.*must be None or a tuple of distinct digits domains from: "
            "mnist, svhn, usps, synthdigits, mnist_m",
        ),
        (dict(domains="mnist", n_clients=1), "RunConfig.domains='mnist' must be None or a tuple"),
        (dict(domains=("usps", "usps"), n_clients=2), "RunConfig.domains=.*distinct"),
        (dict(domain_percent=0.0), "RunConfig.domain_percent=0.0 must be None or in \\(0, 1\\]"),
        (dict(domain_percent=1.5), "RunConfig.domain_percent=1.5 must be None or in \\(0, 1\\]"),
        (dict(n_clients=3), "RunConfig.n_clients=3 must equal the number of domains \\(5.*RunConfig.domains=None"),
        (dict(domains=("mnist", "usps"), n_clients=3), "RunConfig.n_clients=3 must equal the number of domains \\(2"),
        (dict(partition="labels"), "RunConfig.partition='labels' is not one of: domains"),
    ],
)
def test_config_validation(change, message):
    base = RunConfig(dataset="digits", partition="domains", n_clients=5, clients_per_round=None, fraction=1.0)
    base.validate()
    with pytest.raises(ValueError, match=message):
        base.replace(**change).validate()


def test_config_domains_only_for_feature_shift_data():
    RunConfig(dataset="office31", partition="domains", n_clients=3, clients_per_round=None, fraction=1.0).validate()
    RunConfig(
        dataset="officehome",
        partition="domains",
        domains=("Real World",),
        n_clients=1,
        clients_per_round=None,
        fraction=1.0,
    ).validate()
    with pytest.raises(ValueError, match="allowed|from: clipart, infograph, painting, quickdraw, real, sketch"):
        RunConfig(
            dataset="domainnet",
            partition="domains",
            domains=("amazon",),
            n_clients=1,
            clients_per_round=None,
            fraction=1.0,
        ).validate()
    with pytest.raises(ValueError, match="domains/domain_percent set but dataset='mnist'"):
        RunConfig(dataset="mnist", partition="iid", domains=("mnist",)).validate()
    with pytest.raises(ValueError, match="domains/domain_percent set but dataset='synthetic'"):
        RunConfig(domain_percent=0.5).validate()
    assert RunConfig().key() == "7c68ff863f437620"  # new fields at their defaults keep stored keys


def test_load_federated_digits_three_clients():
    root = need(*MNIST, *USPS, *MNISTM)
    cfg = RunConfig(
        dataset="digits",
        partition="domains",
        domains=("mnist", "usps", "mnist_m"),
        n_clients=3,
        clients_per_round=None,
        fraction=1.0,
    ).validate()
    fd = load_federated(cfg, root=root)
    assert fd.n_clients == 3 and fd.input_shape == (3, 28, 28)
    assert fd.train.sizes.tolist() == [743, 743, 743] and fd.test.sizes.tolist() == [10000, 2007, 9001]
    assert load_federated(cfg, root=root) is fd  # cached in-process
    summ = partition_summary(cfg, root=root)
    assert summ["n_train"].tolist() == [743] * 3 and summ["n_test"].tolist() == [10000, 2007, 9001]
    more = load_federated(cfg.replace(domain_percent=0.2), root=root)
    assert more.train.sizes.tolist() == [1487] * 3


def test_load_federated_office31_from_generated_folder(tmp_path):
    make_folder(tmp_path / "office31" / "amazon" / "images", OFFICE_CLASSES, n=5, shape=(12, 10))
    cfg = RunConfig(
        dataset="office31",
        partition="domains",
        domains=("amazon",),
        n_clients=1,
        domain_percent=1.0,
        fraction=1.0,
        clients_per_round=None,
    ).validate()
    fd = load_federated(cfg, root=tmp_path)
    assert fd.n_clients == 1 and fd.input_shape == (3, 224, 224) and fd.n_classes == 31
    assert fd.train.sizes.tolist() == [12] and fd.test.sizes.tolist() == [3]
