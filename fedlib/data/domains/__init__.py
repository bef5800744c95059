"""Feature-shift data sets (pFedLA Sections 4.2-4.3, after FedBN): one client per domain.

Every loader returns a :class:`~fedlib.data.federated.FederatedData` whose client ``i`` is
domain ``domains[i]`` (in the order given), images float32 ``(N, 3, size, size)``, with the
domain's own train and test splits and no global test set. Subset selection and splits are
pure functions of ``seed`` and the files; a domain's draw depends on its name, not on its
position or on which other domains are loaded.

Through ``RunConfig`` (``dataset=... , partition="domains"``), ``domains`` picks the clients
and ``domain_percent`` is the ``percent`` of all four data sets. Its default, None, is each data set's own
(``DEFAULT_PERCENT``): 0.1 for the digits (FedBN's protocol) and 1.0 for Office-31 / Office-Home / DomainNet, as in
pFedLA Table 3 (Figure 4(c): 0.1 ... 1.0). Through ``RunConfig`` the sizes are the
defaults (``DEFAULT_SIZE``) and the splits are the seeded ones (``split="official"`` / ``"fedbn"`` are
options of the loader functions only).

Modules: :mod:`~fedlib.data.domains.registry` (the data sets, their domains, classes and defaults),
:mod:`~fedlib.data.domains.sampling` (the seeded draws and the float tensors they become),
:mod:`~fedlib.data.domains.digit_domains` (the digits benchmark and its recipe) and
:mod:`~fedlib.data.domains.image_folders` (Office-31, Office-Home, DomainNet: layouts, decoding, cache).
A private name is looked up in the module that defines it: patch it there.
"""

from __future__ import annotations

from fedlib.data import readers
from fedlib.data.domains.digit_domains import digits, digits_available, train_count
from fedlib.data.domains.image_folders import _image_domains, _scan, domainnet, office31, officehome
from fedlib.data.domains.registry import (
    CLASSES,
    DATASETS,
    DEFAULT_PERCENT,
    DEFAULT_SIZE,
    DOMAINS,
    FEDBN_TRAIN_BASE,
    TEST_FRAC,
    domain_names,
)
from fedlib.data.federated import FederatedData
from fedlib.data.readers import DatasetNotFoundError


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
