"""Office-31, Office-Home, DomainNet (:func:`office31`, :func:`officehome`, :func:`domainnet`): image folders.

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

Decoding: images are decoded and resized once and cached as uint8 ``.npz`` under
:func:`fedlib.data.readers.cache_dir` (``$FEDLIB_CACHE``), keyed by the data set, domain,
size and the SHA-256 of every image file (with its class folder and name), and checked against
its own digest before it is served, so a second load only reads (and hashes) the files and the
cache. No checksum is published for these releases: the folder read is named in a warning.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from fedlib.data import readers
from fedlib.data.domains.registry import CLASSES, DEFAULT_SIZE, TEST_FRAC, _check_percent, _norm, domain_names
from fedlib.data.domains.sampling import _federated, _rng, _stratified_split, _subset
from fedlib.data.federated import FederatedData
from fedlib.data.readers import DatasetFormatError, DatasetNotFoundError
from fedlib.data.readers.checksums import _warn_unchecked
from fedlib.data.readers.decode_cache import read_cache, source_digest, write_cache

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
_CACHE_VERSION = "2"  # bump when decoding/resizing changes, so stale caches are not trusted


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
    """Decoded, resized images of one domain: (x uint8 (n, size, size, 3), y int64, paths), cached on disk.

    No checksum is published for these releases, so the folder is named in a warning (once per process) and gets
    the format checks only; the decode cache is keyed by the SHA-256 of every image (with its class folder and
    name) and checked against its own digest on read (:mod:`fedlib.data.readers.decode_cache`)."""
    folder, files = _scan(dataset, domain, root)
    _warn_unchecked(folder, f"the {dataset} release publishes none")
    parts: list[tuple[str, Path | bytes]] = [(f"{_CACHE_VERSION}|{dataset}|{domain}|{size}", b"")]
    parts += [(f"{rel}|{label}", folder / rel) for rel, label in files]
    digest = source_digest(parts)
    cached = readers.cache_dir() / f"{dataset}-{_norm(domain)}-{size}-{digest[:24]}.npz"

    def problem(z: dict) -> str | None:
        x, y = z.get("x"), z.get("y")
        if x is None or y is None or "paths" not in z:
            return "does not hold this domain's decoded images"
        if x.shape == (len(files), size, size, 3) and x.dtype == np.uint8 and y.shape == (len(files),):
            return None
        return "does not hold this domain's decoded images"

    # a damaged cache must not stop a run: it is named and the folder decoded again (the cache is then rewritten)
    z = read_cache(cached, digest, f"image cache {{cached}} {{problem}}; decoding {folder} again", problem)
    if z is not None:
        return z["x"], z["y"], [str(p) for p in z["paths"]]
    workers = max(1, min(8, os.cpu_count() or 1))
    x = np.empty((len(files), size, size, 3), dtype=np.uint8)
    with ThreadPoolExecutor(workers) as pool:  # PIL releases the GIL while decoding and resizing
        for i, img in enumerate(pool.map(lambda t: _decode(folder / t[0], size), files)):
            x[i] = img
    y = np.array([lab for _, lab in files], dtype=np.int64)
    paths = [rel for rel, _ in files]
    write_cache(cached, digest, {"x": x, "y": y, "paths": np.array(paths)})
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
