"""Digits (:func:`digits`): the FedBN benchmark as pFedLA Table 1 uses it, one client per digits domain.

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
"""

from __future__ import annotations

import numpy as np

from fedlib.data import readers
from fedlib.data.domains.registry import DOMAINS, FEDBN_TRAIN_BASE, TEST_FRAC, _check_percent, domain_names
from fedlib.data.domains.sampling import _federated, _rng, _stratified_split, _subset
from fedlib.data.federated import FederatedData
from fedlib.data.readers import DatasetNotFoundError

_DIGIT_READERS = {"mnist": "mnist", "svhn": "svhn", "usps": "usps", "synthdigits": "synthdigits", "mnist_m": "mnistm"}


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
