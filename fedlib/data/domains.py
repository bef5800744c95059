"""Feature-shift data sets (pFedLA Sections 4.2-4.3, after FedBN): one client per domain.

Every loader returns a :class:`~fedlib.data.federated.FederatedData` whose client ``i`` is
domain ``domains[i]`` (in the order given), images float32 ``(N, 3, size, size)``, with the
domain's own train and test splits and no global test set. Subset selection and splits are
pure functions of ``seed`` and the files; a domain's draw depends on its name, not on its
position or on which other domains are loaded.

Digits (:func:`digits`) -- the FedBN benchmark as pFedLA Table 1 uses it
--------------------------------------------------------------------------
Domains, in FedBN's / pFedLA's order: ``mnist, svhn, usps, synthdigits, mnist_m``, read with
:mod:`fedlib.data.readers` (``load_mnist``, ``load_svhn``, ``load_usps``,
``load_synthdigits``, ``load_mnist_m``; their files and layouts are listed there).

Source: FedBN code (github.com/med-air/FedBN, ``utils/data_preprocess.py``,
``utils/data_utils.py`` ``DigitsDataset``, ``federated/fed_digits.py``):

* FedBN pools each domain's official train and test sets, splits the pool 80/20 stratified
  by label (``StratifiedShuffleSplit(test_size=0.2, random_state=0)``), and cuts the
  training part into ten partitions of 743.8 images (``train_part{k}`` =
  ``[int(743.8 k), int(743.8 (k+1)))``: 10 % of USPS's 7,438 pooled training images, the
  smallest domain). ``--percent 0.1`` (the default, and the paper setting) trains on
  ``train_part0`` = **743 images per domain, every domain**; percent ``k/10`` concatenates
  parts ``0..k-1`` (1487, 2231, 2975, 3719, 4462, 5206, 5950, 6694, 7438).
* FedBN's test sets are the full 20 % stratified parts of the pools: MNIST 14,000,
  SVHN 19,858, USPS 1,860, SynthDigits 97,791, MNIST-M 14,000 (its MNIST-M is a 28x28
  regeneration with 70,000 images; the original release used here is 32x32, 59,001 train +
  9,001 test).
* Transforms: grey domains replicated to 3 channels (``Grayscale(3)``); SVHN, USPS and
  SynthDigits ``Resize([28, 28])`` (PIL bilinear, which low-pass filters when shrinking,
  i.e. antialiased); ``ToTensor`` then ``Normalize((0.5,)*3, (0.5,)*3)``, so pixels are
  ``(x / 255 - 0.5) / 0.5`` in ``[-1, 1]``. No augmentation. USPS is quantised to uint8 by
  truncation (``(x * 255).astype(uint8)``) before resizing, as FedBN's preprocessing does.

Here (``split="official"``, the default): the training pool is the domain's official
training set and the test split is its **full official test set** (MNIST 10,000, SVHN
26,032, USPS 2,007, SynthDigits 9,553, MNIST-M 9,001). The client trains on
``floor(7438 * percent)`` images drawn without replacement from the pool (seeded; a larger
percent keeps the smaller one's images): 743 at the default 10 %, the same count for every
domain as FedBN. This equals FedBN's partition sizes at every multiple of 10 %; below 10 %
FedBN keeps ``floor(743 * 10 * percent)`` (at most one image fewer). The count is capped at
the pool size (USPS's official training set has 7,291 images, so above 98 % USPS keeps all).
``split="fedbn"`` instead pools train and test and splits them 80/20 stratified by label
(largest-remainder allocation, total test ``ceil(0.2 n)``: FedBN's split sizes, a seeded
draw of our own, not sklearn's), then draws the training images from the 80 % part.
Resizing: PIL ``Image.resize((size, size), BILINEAR)`` per image (exactly what torchvision's
``Resize`` does on PIL images); MNIST (and any image already ``size``) is not resized.

Office-31, Office-Home, DomainNet (:func:`office31`, :func:`officehome`, :func:`domainnet`)
-------------------------------------------------------------------------------------------
Folder layouts, relative to the data root (folder names are matched ignoring case, spaces,
``-`` and ``_``, so ``Office-31``, ``office_31``, ``Real_World`` ... all match)::

    office31/<domain>/images/<class>/*.jpg       original release (domain_adaptation_images)
    office31/<domain>/<class>/*.jpg              flattened copies
    officehome/<Domain>/<Class>/*.jpg            OfficeHomeDataset_10072016; domains Art,
                                                 Clipart, Product, "Real World" (or Real_World)
    domainnet/<domain>/<class>/*.jpg             the DomainNet zips, unpacked side by side
                                                 (+ optional <domain>_{train,test}.txt lists)

The dataset folder may also be ``Office31``, ``office-31``, ``OfficeHome``, ``office_home``,
``OfficeHomeDataset_10072016``, ``DomainNet``, ``domain_net``, and the domain folders may sit
one level deeper inside it (e.g. ``office31/domain_adaptation_images/amazon``). Images:
``.jpg``, ``.jpeg``, ``.png`` (any case). Class folders that are not classes of the data set
are ignored (DomainNet: only FedBN's ten classes are read).

Labels are indices into the sorted class list (:data:`CLASSES`; Office-31 31 classes,
Office-Home 65, DomainNet FedBN's ten: bird, feather, headphones, ice_cream, teapot, tiger,
whale, windmill, wine_glass, zebra), the same in every domain even when a domain lacks a
class. Note that pFedLA's Table 8 AlexNet ends in FC(4096, 10) for all three data sets (copied
from FedBN's 10-class Office-Caltech-10 / DomainNet-10 setting); Office-31 and Office-Home
have 31 and 65 classes, and ``n_classes`` says so.

Resizing (pFedLA appendix: "For the Office-31 and Office-Home datasets, all images are
resized to 224x224x3, and for DomainNet dataset, all images are resized to 256x256x3"): the
whole image is resized to ``size x size`` (aspect ratio not kept, no crop), PIL bilinear,
exactly FedBN's ``transforms.Resize([256, 256])``. Defaults: 224 (Office-31, Office-Home),
256 (DomainNet); smaller sizes give CPU-sized runs. Pixels are ``x / 255`` in ``[0, 1]``
(FedBN's ``ToTensor``, no normalisation); FedBN's training-time flips and rotations are
augmentation, not data, and are not applied here. Grey or palette images are converted to RGB.

Splits: FedBN ships its Office-Caltech-10 and DomainNet per-domain train/test lists as
pickles without the code that drew them, so they cannot be re-derived. Here each domain is
split **80/20 stratified by class**, seeded (total test ``ceil(0.2 n)``, largest-remainder
allocation over classes), and the client trains on ``max(1, floor(percent * n_train))``
images of its 80 % drawn without replacement (nested in percent: pFedLA Figure 4(c) varies
this share from 10 % to 100 % on Office-31; Table 3 uses 100 %). DomainNet can instead use
the release's official lists (``split="official"``: ``<domain>_train.txt`` /
``<domain>_test.txt`` in the DomainNet folder or its ``splits/`` subfolder, filtered to the
ten classes). (FedBN's own scripts further truncate every domain's training list to 50 %
(Office) or 5 % (DomainNet) of the smallest domain's and hold out a validation tail; pFedLA
does not say it does so, and neither do we.)

Through ``RunConfig`` (``dataset=... , partition="domains"``), ``domains`` picks the clients
and ``domain_percent`` is the ``percent`` of all four data sets. Its default, None, is each data set's own
(``DEFAULT_PERCENT``): 0.1 for the digits (FedBN's protocol) and 1.0 for Office-31 / Office-Home / DomainNet, as in
pFedLA Table 3 (Figure 4(c): 0.1 ... 1.0). Through ``RunConfig`` the sizes are the
defaults above and the splits are the seeded ones (``split="official"`` / ``"fedbn"`` are
options of the functions here only).

Decoding: images are decoded and resized once and cached as uint8 ``.npz`` under
:func:`fedlib.data.readers.cache_dir` (``$FEDLIB_CACHE``), keyed by the data set, domain,
size and every image file's path, size and mtime, so a second load only reads the cache.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import warnings
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from fedlib.data import readers
from fedlib.data.federated import FederatedData, Split
from fedlib.data.readers import DatasetFormatError, DatasetNotFoundError

__all__ = [
    "DATASETS",
    "DOMAINS",
    "CLASSES",
    "DEFAULT_SIZE",
    "DEFAULT_PERCENT",
    "FEDBN_TRAIN_BASE",
    "digits",
    "digits_available",
    "office31",
    "officehome",
    "domainnet",
    "load",
    "available",
    "domain_names",
    "train_count",
]

DOMAINS: dict[str, tuple[str, ...]] = {
    "digits": ("mnist", "svhn", "usps", "synthdigits", "mnist_m"),
    "office31": ("amazon", "dslr", "webcam"),
    "officehome": ("Art", "Clipart", "Product", "Real World"),
    "domainnet": ("clipart", "infograph", "painting", "quickdraw", "real", "sketch"),
}
DATASETS = tuple(DOMAINS)

CLASSES: dict[str, tuple[str, ...]] = {
    "digits": tuple(str(d) for d in range(10)),
    "office31": tuple(
        sorted(
            (
                "back_pack",
                "bike",
                "bike_helmet",
                "bookcase",
                "bottle",
                "calculator",
                "desk_chair",
                "desk_lamp",
                "desktop_computer",
                "file_cabinet",
                "headphones",
                "keyboard",
                "laptop_computer",
                "letter_tray",
                "mobile_phone",
                "monitor",
                "mouse",
                "mug",
                "paper_notebook",
                "pen",
                "phone",
                "printer",
                "projector",
                "punchers",
                "ring_binder",
                "ruler",
                "scissors",
                "speaker",
                "stapler",
                "tape_dispenser",
                "trash_can",
            )
        )
    ),
    "officehome": tuple(
        sorted(
            (
                "Alarm_Clock",
                "Backpack",
                "Batteries",
                "Bed",
                "Bike",
                "Bottle",
                "Bucket",
                "Calculator",
                "Calendar",
                "Candles",
                "Chair",
                "Clipboards",
                "Computer",
                "Couch",
                "Curtains",
                "Desk_Lamp",
                "Drill",
                "Eraser",
                "Exit_Sign",
                "Fan",
                "File_Cabinet",
                "Flipflops",
                "Flowers",
                "Folder",
                "Fork",
                "Glasses",
                "Hammer",
                "Helmet",
                "Kettle",
                "Keyboard",
                "Knives",
                "Lamp_Shade",
                "Laptop",
                "Marker",
                "Monitor",
                "Mop",
                "Mouse",
                "Mug",
                "Notebook",
                "Oven",
                "Pan",
                "Paper_Clip",
                "Pen",
                "Pencil",
                "Postit_Notes",
                "Printer",
                "Push_Pin",
                "Radio",
                "Refrigerator",
                "Ruler",
                "Scissors",
                "Screwdriver",
                "Shelf",
                "Sink",
                "Sneakers",
                "Soda",
                "Speaker",
                "Spoon",
                "TV",
                "Table",
                "Telephone",
                "ToothBrush",
                "Toys",
                "Trash_Can",
                "Webcam",
            )
        )
    ),
    # FedBN's DomainNet label_dict (utils/data_utils.py), its "top 10 most common classes".
    "domainnet": (
        "bird",
        "feather",
        "headphones",
        "ice_cream",
        "teapot",
        "tiger",
        "whale",
        "windmill",
        "wine_glass",
        "zebra",
    ),
}
assert len(CLASSES["office31"]) == 31 and len(CLASSES["officehome"]) == 65

DEFAULT_SIZE = {"digits": 28, "office31": 224, "officehome": 224, "domainnet": 256}
DEFAULT_PERCENT = {"digits": 0.1, "office31": 1.0, "officehome": 1.0, "domainnet": 1.0}
FEDBN_TRAIN_BASE = 7438  # USPS pooled training images: FedBN's per-domain 100 % (10 % = 743)
TEST_FRAC = 0.2  # per-domain test share where we split (FedBN digits preprocessing: 0.2)

_DIGIT_READERS = {"mnist": "mnist", "svhn": "svhn", "usps": "usps", "synthdigits": "synthdigits", "mnist_m": "mnistm"}
_FOLDER_ALIASES = {  # normalised dataset folder names accepted under the root
    "office31": ("office31", "office", "domainadaptationimages"),
    "officehome": ("officehome", "officehomedataset10072016"),
    "domainnet": ("domainnet",),
}
_LAYOUT = {
    "office31": ["office31/<domain>/images/<class>/*.jpg", "office31/<domain>/<class>/*.jpg"],
    "officehome": ["officehome/<Domain>/<Class>/*.jpg (OfficeHomeDataset_10072016 layout)"],
    "domainnet": ["domainnet/<domain>/<class>/*.jpg"],
}
_IMAGE_EXT = (".jpg", ".jpeg", ".png")
_CACHE_VERSION = "1"  # bump when decoding/resizing changes, so stale caches are not trusted


# --------------------------------------------------------------------------- shared helpers


def _norm(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())


def domain_names(dataset: str, domains=None) -> tuple[str, ...]:
    """The domains (clients, in order) a load of ``dataset`` with ``domains`` gives; checks the names."""
    if dataset not in DOMAINS:
        raise ValueError(f"dataset={dataset!r}: must be one of {', '.join(DATASETS)}")
    if domains is None:
        return DOMAINS[dataset]
    if isinstance(domains, str) or not isinstance(domains, (tuple, list)) or len(domains) == 0:
        raise ValueError(
            f"domains={domains!r}: must be a non-empty tuple of {dataset} domains: {', '.join(DOMAINS[dataset])}"
        )
    bad = [d for d in domains if d not in DOMAINS[dataset]]
    if bad:
        raise ValueError(
            f"domains={tuple(domains)!r}: unknown {dataset} domain(s) {', '.join(map(repr, bad))}; "
            f"allowed: {', '.join(DOMAINS[dataset])}"
        )
    if len(set(domains)) != len(domains):
        raise ValueError(f"domains={tuple(domains)!r}: a domain may appear only once")
    return tuple(domains)


def _check_percent(percent) -> float:
    if isinstance(percent, bool) or not isinstance(percent, (int, float)) or not 0 < percent <= 1:
        raise ValueError(f"percent={percent!r}: must be in (0, 1]")
    return float(percent)


def _rng(seed: int, name: str, stream: int) -> np.random.Generator:
    # Depends on the domain's name, not its position: choosing other domains changes nothing.
    return np.random.default_rng([int(seed), zlib.crc32(name.encode()), stream])


def _stratified_split(labels: np.ndarray, test_frac: float, rng: np.random.Generator):
    """Seeded stratified split: ``ceil(test_frac * n)`` test rows, allocated to classes by
    largest remainder (ties: lower class first). Returns sorted (train, test) index arrays."""
    labels = np.asarray(labels)
    classes, counts = np.unique(labels, return_counts=True)
    n_test = math.ceil(test_frac * len(labels) - 1e-9)
    exact = test_frac * counts
    take = np.floor(exact + 1e-9).astype(np.int64)
    extra = n_test - int(take.sum())
    if extra > 0:
        order = np.argsort(-(exact - take), kind="stable")
        take[order[:extra]] += 1
    train, test = [], []
    for c, k in zip(classes, take):
        idx = rng.permutation(np.flatnonzero(labels == c))
        test.append(idx[:k])
        train.append(idx[k:])
    cat = lambda parts: np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
    return cat(train), cat(test)


def _subset(pool: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` of ``pool`` without replacement; the first ``n`` of one seeded permutation, so
    a larger ``n`` keeps every row a smaller one took."""
    return np.sort(pool[rng.permutation(len(pool))[:n]])


def _to_split(parts: list[tuple[np.ndarray, np.ndarray]], mean: float, std: float) -> Split:
    """uint8 (n, H, W, 3) blocks -> one float32 (N, 3, H, W) tensor, ``(x / 255 - mean) / std``."""
    sizes = np.array([len(y) for _, y in parts], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    h, w = next((x.shape[1:3] for x, _ in parts if len(x)), (0, 0))
    out = np.empty((int(sizes.sum()), 3, h, w), dtype=np.float32)
    a = 0
    for x, _ in parts:
        for s in range(0, len(x), 1024):  # chunks bound the float temporary
            c = x[s : s + 1024].transpose(0, 3, 1, 2).astype(np.float32)
            out[a + s : a + s + len(c)] = (c / np.float32(255) - np.float32(mean)) / np.float32(std)
        a += len(x)
    y = np.concatenate([np.asarray(y, dtype=np.int64) for _, y in parts]) if parts else np.zeros(0, np.int64)
    return Split(torch.from_numpy(out), torch.from_numpy(y), torch.from_numpy(offsets), torch.from_numpy(sizes))


def _federated(name, train_parts, test_parts, n_classes, size, mean, std) -> FederatedData:
    return FederatedData(
        name, _to_split(train_parts, mean, std), _to_split(test_parts, mean, std), n_classes, (3, size, size), None
    )


# --------------------------------------------------------------------------- digits


def train_count(percent: float, pool: int | None = None) -> int:
    """Digits training images per domain: ``floor(7438 * percent)`` (FedBN: 743 at 10 %), capped at ``pool``."""
    n = max(1, int(FEDBN_TRAIN_BASE * _check_percent(percent) + 1e-6))
    return n if pool is None else min(n, pool)


def _resize_uint8(x: np.ndarray, size: int) -> np.ndarray:
    """(n, h, w) or (n, h, w, 3) uint8 -> (n, size, size, 3) uint8: PIL bilinear per image
    (what torchvision's Resize does on PIL images), grey replicated to 3 channels."""
    from PIL import Image

    if x.shape[1:3] != (size, size):
        out = np.empty((len(x), size, size) + x.shape[3:], dtype=np.uint8)
        for i in range(len(x)):
            out[i] = np.asarray(Image.fromarray(x[i]).resize((size, size), Image.BILINEAR))
        x = out
    if x.ndim == 3:
        x = np.repeat(x[..., None], 3, axis=3)
    return np.ascontiguousarray(x)


def _digit_split(domain: str, split: str, root):
    name = _DIGIT_READERS[domain]
    try:
        x, y = readers.load(name, split, root=root)
    except DatasetNotFoundError as e:
        # Re-raised with the domain named; the reader's message already names the files and the root
        # (its "download=True" advice refers to fedlib.data.readers.load(..., download=True)).
        raise DatasetNotFoundError(
            e.dataset,
            e.root,
            e.expected,
            f"(needed by the digits domain {domain!r}; download=True means fedlib.data.readers.load("
            f"{name!r}, download=True); fedlib.data.domains.digits_available() lists the domains present)",
        ) from None
    if domain == "usps":  # floats in [0, 1] -> uint8 by truncation, as FedBN's preprocessing
        x = (x.astype(np.float32) * np.float32(255)).astype(np.uint8)
    return x, y


def digits(
    domains=None, percent: float = 0.1, size: int = 28, seed: int = 0, root=None, split: str = "official"
) -> FederatedData:
    """The digits benchmark (FedBN / pFedLA Table 1): one client per domain, in ``domains``' order.

    ``domains``: subset of ``mnist, svhn, usps, synthdigits, mnist_m`` (None: all five).
    Each client trains on ``train_count(percent)`` images (743 at the default 10 %, as
    FedBN) drawn (seeded) from the domain's official training set, capped at its size, and
    tests on the full official test set (``split="official"``) or on FedBN's pooled
    stratified 20 % (``split="fedbn"``). Images are (3, size, size) float32 in [-1, 1]
    (``(x/255 - 0.5)/0.5``), grey replicated to 3 channels, resized with PIL bilinear. See
    the module docstring for the recipe and its source. A missing domain raises
    :class:`~fedlib.data.readers.DatasetNotFoundError` naming its files and the root.
    """
    names = domain_names("digits", domains)
    _check_percent(percent)
    if split not in ("official", "fedbn"):
        raise ValueError(f"split={split!r}: must be 'official' or 'fedbn'")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size={size!r}: must be a positive integer")
    train_parts, test_parts = [], []
    for d in names:
        x_tr, y_tr = _digit_split(d, "train", root)
        x_te, y_te = _digit_split(d, "test", root)
        if split == "official":
            pool_idx, (x_pool, y_pool) = np.arange(len(y_tr)), (x_tr, y_tr)
            test_x, test_y = x_te, y_te
        else:
            x_pool, y_pool = np.concatenate([x_tr, x_te]), np.concatenate([y_tr, y_te])
            pool_idx, test_idx = _stratified_split(y_pool, TEST_FRAC, _rng(seed, d, 0))
            test_x, test_y = x_pool[test_idx], y_pool[test_idx]
        idx = _subset(pool_idx, train_count(percent, len(pool_idx)), _rng(seed, d, 1))
        train_parts.append((_resize_uint8(x_pool[idx], size), y_pool[idx]))
        test_parts.append((_resize_uint8(test_x, size), np.asarray(test_y)))
    return _federated(f"digits({','.join(names)})", train_parts, test_parts, 10, size, 0.5, 0.5)


def digits_available(root=None) -> tuple[str, ...]:
    """The digits domains whose files (both splits) are under the data root, in canonical order."""
    return tuple(d for d in DOMAINS["digits"] if readers.available(_DIGIT_READERS[d], root=root))


# --------------------------------------------------------------------------- image folders


def _children(path: Path) -> list[Path]:
    try:
        return sorted(p for p in path.iterdir() if p.is_dir())
    except OSError:
        return []


def _dataset_dirs(dataset: str, root: Path) -> list[Path]:
    """Candidate dataset folders under ``root`` (aliases, any case), each with its subfolders."""
    aliases = _FOLDER_ALIASES[dataset]
    tops = [p for p in _children(root) if _norm(p.name) in aliases]
    return [c for top in tops for c in [top, *_children(top)]]


def _domain_dir(dataset: str, domain: str, root: Path) -> Path | None:
    want = _norm(domain)
    for base in _dataset_dirs(dataset, root):
        for d in _children(base):
            if _norm(d.name) == want:
                images = [c for c in _children(d) if _norm(c.name) == "images"]
                return images[0] if images else d
    return None


def _scan(dataset: str, domain: str, root: Path):
    """(domain folder, sorted [(relative path 'class/file', label)]) or DatasetNotFoundError."""
    folder = _domain_dir(dataset, domain, root)
    index = {_norm(c): i for i, c in enumerate(CLASSES[dataset])}
    files = []
    if folder is not None:
        for cdir in _children(folder):
            label = index.get(_norm(cdir.name))
            if label is None:
                continue
            files += [
                (f"{cdir.name}/{f.name}", label)
                for f in sorted(cdir.iterdir())
                if f.suffix.lower() in _IMAGE_EXT and f.is_file()
            ]
    if not files:
        searched = ", ".join(str(p) for p in _dataset_dirs(dataset, root)) or "no matching dataset folder"
        raise DatasetNotFoundError(
            dataset,
            root,
            [p.replace("<domain>", domain).replace("<Domain>", domain) for p in _LAYOUT[dataset]],
            f"No images of domain {domain!r} found (searched: {searched}). Dataset folder names are matched "
            f"ignoring case, spaces, '-' and '_' (e.g. {', '.join(_FOLDER_ALIASES[dataset])}); domain folders may "
            f"sit one level deeper; class folders must be {dataset} classes.",
        )
    files.sort(key=lambda t: (t[1], t[0]))
    return folder, files


_IMAGE_LAYOUT = "an image file PIL can read (.jpg, .jpeg or .png), any size, grey, palette or RGB"


def _decode(path: Path, size: int) -> np.ndarray:
    """One image, RGB, resized to ``size``; a file PIL cannot read is a DatasetFormatError naming it (PIL's own
    errors, UnidentifiedImageError, OSError for a truncated file, ..., are not the data errors callers catch)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
            if im.size != (size, size):
                im = im.resize((size, size), Image.BILINEAR)
            return np.asarray(im, dtype=np.uint8)
    except Exception as e:  # PIL raises many types (UnidentifiedImageError, OSError, SyntaxError, ...) on bad data
        raise DatasetFormatError(path, f"not a readable image ({type(e).__name__}: {e})", _IMAGE_LAYOUT) from None


def _read_domain(dataset: str, domain: str, size: int, root: Path):
    """Decoded, resized images of one domain: (x uint8 (n, size, size, 3), y int64, paths), cached on disk."""
    folder, files = _scan(dataset, domain, root)
    h = hashlib.sha1(f"{_CACHE_VERSION}|{dataset}|{domain}|{size}|{folder.resolve()}".encode())
    for rel, _ in files:
        st = (folder / rel).stat()
        h.update(f"|{rel}|{st.st_size}|{st.st_mtime_ns}".encode())
    cached = readers.cache_dir() / f"{dataset}-{_norm(domain)}-{size}-{h.hexdigest()[:20]}.npz"
    if cached.is_file():
        try:  # allow_pickle=False: a cache holds arrays only, never code
            with np.load(cached, allow_pickle=False) as z:
                x, y, paths = z["x"], z["y"], [str(p) for p in z["paths"]]
            if x.shape == (len(files), size, size, 3) and x.dtype == np.uint8 and y.shape == (len(files),):
                return x, y, paths
            problem = "does not hold this domain's decoded images"
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
            problem = f"is unreadable ({type(e).__name__}: {e})"
        # a damaged cache must not stop a run: say which file and decode again (it is then rewritten)
        warnings.warn(f"image cache {cached} {problem}; decoding {folder} again", RuntimeWarning, stacklevel=2)
    workers = max(1, min(8, os.cpu_count() or 1))
    x = np.empty((len(files), size, size, 3), dtype=np.uint8)
    with ThreadPoolExecutor(workers) as pool:  # PIL releases the GIL while decoding and resizing
        for i, img in enumerate(pool.map(lambda t: _decode(folder / t[0], size), files)):
            x[i] = img
    y = np.array([lab for _, lab in files], dtype=np.int64)
    paths = [rel for rel, _ in files]
    tmp = cached.with_suffix(f".{os.getpid()}.tmp.npz")
    np.savez(tmp, x=x, y=y, paths=np.array(paths))
    os.replace(tmp, cached)  # atomic: a crash never leaves a truncated cache
    return x, y, paths


def _split_list(path: Path) -> set[str]:
    """A DomainNet split list's images as 'class/file' (each line '<path> <label>'; only the last two parts of the
    path are kept, to match the scanned folder, so nothing is read from the path); not UTF-8: DatasetFormatError."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DatasetFormatError(
            path,
            f"is not UTF-8 text (line {line}: byte 0x{data[e.start]:02x} at offset {e.start})",
            "DomainNet's split list: one '<domain>/<class>/<file> <label>' line per image",
        ) from None
    return {"/".join(Path(line.split()[0]).parts[-2:]) for line in text.splitlines() if line.strip()}


def _official_lists(domain: str, root: Path):
    """DomainNet's ``<domain>_{train,test}.txt`` (in the DomainNet folder or its ``splits/``) as sets of 'class/file'."""
    for base in _dataset_dirs("domainnet", root):
        for folder in (base, base / "splits"):
            tr, te = folder / f"{domain}_train.txt", folder / f"{domain}_test.txt"
            if tr.is_file() and te.is_file():
                return _split_list(tr), _split_list(te)
    raise DatasetNotFoundError(
        "domainnet",
        root,
        [f"domainnet/{domain}_train.txt", f"domainnet/{domain}_test.txt"],
        "split='official' needs the release's split lists (or use split='random').",
    )


def _image_domains(dataset: str, domains, percent, size, seed, root, split="random") -> FederatedData:
    names = domain_names(dataset, domains)
    percent = _check_percent(percent)
    size = DEFAULT_SIZE[dataset] if size is None else size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size={size!r}: must be a positive integer")
    if split not in ("random", "official") or (split == "official" and dataset != "domainnet"):
        raise ValueError(f"split={split!r}: must be 'random'" + (" or 'official'" if dataset == "domainnet" else ""))
    r = readers.data_root(root)
    train_parts, test_parts = [], []
    for d in names:
        x, y, paths = _read_domain(dataset, d, size, r)
        if split == "official":
            tr_set, te_set = _official_lists(d, r)
            keys = ["/".join(Path(p).parts[-2:]) for p in paths]
            pool = np.array([i for i, k in enumerate(keys) if k in tr_set], dtype=np.int64)
            test = np.array([i for i, k in enumerate(keys) if k in te_set], dtype=np.int64)
        else:
            pool, test = _stratified_split(y, TEST_FRAC, _rng(seed, d, 0))
        if len(pool) == 0:
            raise ValueError(f"{dataset} domain {d!r}: no training images after the split ({len(y)} images)")
        n = max(1, int(percent * len(pool) + 1e-6))
        idx = _subset(pool, n, _rng(seed, d, 1))
        train_parts.append((x[idx], y[idx]))
        test_parts.append((x[test], y[test]))
    return _federated(f"{dataset}({','.join(names)})", train_parts, test_parts, len(CLASSES[dataset]), size, 0.0, 1.0)


def office31(domains=None, percent: float = 1.0, size: int = 224, seed: int = 0, root=None) -> FederatedData:
    """Office-31 (amazon, dslr, webcam): one client per domain, 31 classes, (3, size, size) in [0, 1].

    Per domain: seeded 80/20 split stratified by class; the client trains on
    ``floor(percent * n_train)`` of its 80 % (pFedLA Figure 4(c) varies ``percent``).
    Layout and recipe: module docstring.
    """
    return _image_domains("office31", domains, percent, size, seed, root)


def officehome(domains=None, percent: float = 1.0, size: int = 224, seed: int = 0, root=None) -> FederatedData:
    """Office-Home (Art, Clipart, Product, Real World): as :func:`office31`, 65 classes."""
    return _image_domains("officehome", domains, percent, size, seed, root)


def domainnet(
    domains=None, percent: float = 1.0, size: int = 256, seed: int = 0, root=None, split: str = "random"
) -> FederatedData:
    """DomainNet restricted to FedBN's ten classes (clipart, infograph, painting, quickdraw, real,
    sketch): as :func:`office31`; ``split="official"`` uses the release's train/test lists."""
    return _image_domains("domainnet", domains, percent, size, seed, root, split)


# --------------------------------------------------------------------------- dispatch


def load(
    dataset: str, domains=None, percent: float | None = None, seed: int = 0, root=None, size: int | None = None
) -> FederatedData:
    """Any of :data:`DATASETS` with its defaults (size: 28 / 224 / 224 / 256; percent: 0.1 for
    digits, 1.0 otherwise). ``fedlib.data.load_federated`` calls this for these data sets."""
    names = domain_names(dataset, domains)
    percent = DEFAULT_PERCENT[dataset] if percent is None else percent
    size = DEFAULT_SIZE[dataset] if size is None else size
    if dataset == "digits":
        return digits(names, percent, size, seed, root)
    return _image_domains(dataset, names, percent, size, seed, root)


def available(root=None) -> dict[str, tuple[str, ...]]:
    """For each feature-shift data set, the domains present under the data root (empty: absent).

    Digits: both splits' files of the domain; the image-folder data sets: at least one image of
    a known class in the domain's folder. Nothing is decoded.
    """
    r = readers.data_root(root)
    out = {"digits": digits_available(r)}
    for ds in ("office31", "officehome", "domainnet"):
        present = []
        for d in DOMAINS[ds]:
            try:
                _scan(ds, d, r)
                present.append(d)
            except DatasetNotFoundError:
                pass
        out[ds] = tuple(present)
    return out
