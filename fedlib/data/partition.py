"""Split a labelled dataset among federated clients.

Every partitioner is pure numpy and deterministic given an integer ``seed``
(``np.random.default_rng(seed)``).  It returns a list with one entry per
client: a sorted ``int64`` array of indices into the dataset.  Sorting makes
the output canonical (easy to compare and hash); shuffling for training is the
data loader's job, and :func:`split_train_test` does its own seeded shuffle.

Invalid arguments raise ``ValueError("<param>=<value>: <what is allowed>")``
before any random draw is made.

Recipes:

* :func:`labels_per_client` -- pFedMe / FedMCSA "k labels per client" split.
* :func:`shards`            -- McMahan et al. 2017 pathological non-IID shards.
* :func:`iid`               -- uniform random split.
* :func:`dirichlet`         -- Hsu et al. 2019 / Yurochkin et al. 2019 Dir(alpha).
* :func:`labels_per_client_sizes`, :func:`dirichlet_sizes` -- the clients' sizes those
  two draw, from the class counts alone (what a run's config is checked against
  before its data loads: ``fedlib.runs.feasibility.check``).
* :func:`by_domain`         -- one client per domain (multi-domain datasets).
* :func:`split_train_test`  -- per-client train/test split (pFedMe rule).
* :func:`summary`, :func:`describe` -- tables and one-line statistics.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = [
    "labels_per_client",
    "labels_per_client_sizes",
    "shards",
    "iid",
    "dirichlet",
    "dirichlet_sizes",
    "by_domain",
    "split_train_test",
    "summary",
    "describe",
]


# --------------------------------------------------------------------------
# argument checks (all raise ValueError naming the parameter)
# --------------------------------------------------------------------------
def _int(name, value, lo=None, hi=None):
    """Return ``value`` as int, checking lo <= value <= hi."""
    # bool is an int subclass, but n_clients=True is surely a mistake.
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}={value!r}: must be an integer")
    value = int(value)
    if lo is not None and hi is not None and not lo <= value <= hi:
        raise ValueError(f"{name}={value}: must be in [{lo}, {hi}]")
    if lo is not None and value < lo:
        raise ValueError(f"{name}={value}: must be >= {lo}")
    if hi is not None and value > hi:
        raise ValueError(f"{name}={value}: must be <= {hi}")
    return value


def _labels(labels):
    arr = np.asarray(labels)
    if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
        raise ValueError(f"labels=<array shape={arr.shape} dtype={arr.dtype}>: must be a non-empty 1-D integer array")
    return arr


def _part(name, part, n=None):
    """A client's index array: 1-D integers, in [0, n) when n is given."""
    arr = np.asarray(part)
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)  # also covers [] (float dtype)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"{name}=<array shape={arr.shape} dtype={arr.dtype}>: must be a 1-D integer index array")
    if n is not None and (arr.min() < 0 or arr.max() >= n):
        raise ValueError(f"{name}: indices span [{arr.min()}, {arr.max()}], must lie in [0, {n - 1}]")
    return arr.astype(np.int64)


def _sorted_parts(parts):
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


# --------------------------------------------------------------------------
# pFedMe / FedMCSA: k labels per client
# --------------------------------------------------------------------------
def _progressive_split(rng, total, count):
    """pFedMe's ``ram_dom_gen``: sizes for ``count`` holders of one label.

    Every holder but the last gets ``randint(total // (count + 1), total // 2)``
    of what is still unassigned (``total`` shrinks after each draw); the last
    holder gets the remainder, so the sizes always sum to the original total.
    """
    sizes = []
    for _ in range(count - 1):
        lo, hi = total // (count + 1), total // 2
        # For tiny totals lo == hi and randint(lo, hi) would be an empty range
        # (the original crashes there); take lo, the only sensible value.
        val = int(rng.integers(lo, hi)) if hi > lo else lo
        sizes.append(val)
        total -= val
    sizes.append(total)
    return sizes


def labels_per_client(
    labels,
    n_clients=20,
    k=2,
    seed=1,
    size_range=None,
    max_tries=1000,
    *,
    label_stride=1,
):
    """k labels per client, unbalanced sizes (pFedMe MNIST recipe).

    Follows Dinh, Tran & Nguyen, "Personalized Federated Learning with Moreau
    Envelopes" (pFedMe, NeurIPS 2020), script ``data/Mnist/generate_niid_20users.py``,
    which FedMCSA reuses for MNIST, FMNIST and CIFAR-10 with N=20, k=2.

    Symbols: ``n_clients`` = N (number of users, ``NUM_USERS``), ``k`` =
    labels per user (``NUM_LABELS``), C = number of distinct labels (10 there).
    Labels are taken in sorted order, so "label l" means the l-th smallest
    distinct value of ``labels``.

    Client u holds labels ``(label_stride * u + j) % C`` for j = 0..k-1.
    ``label_stride=1`` is the pFedMe assignment ``(u + j) % C``; FedMCSA's copy
    of the script uses ``(u * NUM_LABELS + j) % 10``, i.e. ``label_stride=k``
    (clients u, u+5, u+10, u+15 then share the same label pair).

    For every label l, its samples in a seeded random order are cut among the
    clients holding l, in order of client id: each holder but the last gets
    ``rng.integers(total // (count + 1), total // 2)`` samples, where ``count``
    is the number of holders of l and ``total`` is what is still unassigned
    (it shrinks after every draw); the last holder gets the remainder.

    Deviation from the published pFedMe script, on purpose: it only assigns a
    share when ``idx + num_samples < len`` (strict), so the last holder's share
    (exactly the remainder, hence ``==``) is silently dropped (that script also
    counts holders with ``(user * NUM_USERS + j) % 10``, which gives counts
    for labels 0 and 1 only).  We implement the intended recipe: every sample
    of every held label is assigned.  FedMCSA's copy uses ``<=`` and agrees.

    ``size_range=(lo, hi)``: redraw the split sizes (fresh draws from the same
    generator) until every client holds between lo and hi samples inclusive,
    at most ``max_tries`` times, else ValueError.  Note FedMCSA's reported
    MNIST range [1165, 3834] matches the *training* sizes ``int(0.75 * n)``,
    not the client totals n (its own script gives totals [1556, 5112]).

    Returns ``n_clients`` sorted int64 index arrays.  Samples of labels held
    by nobody (possible when N + k - 1 < C with stride 1) are left out.
    """
    labels = _labels(labels)
    classes, y = np.unique(labels, return_inverse=True)
    n_cls = len(classes)
    n_clients = _int("n_clients", n_clients, lo=1)
    k = _int("k", k, lo=1, hi=n_cls)
    seed = _int("seed", seed, lo=0)
    max_tries = _int("max_tries", max_tries, lo=1)
    label_stride = _int("label_stride", label_stride, lo=1)

    holders = _label_holders(n_cls, n_clients, k, label_stride)
    members = [np.flatnonzero(y == c) for c in range(n_cls)]

    if size_range is not None:
        if (
            not isinstance(size_range, (tuple, list))
            or len(size_range) != 2
            or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in size_range)
            or not 0 <= size_range[0] <= size_range[1]
        ):
            raise ValueError(f"size_range={size_range!r}: must be a pair (lo, hi) of ints with 0 <= lo <= hi")
        lo, hi = int(size_range[0]), int(size_range[1])
        # Cheap necessary condition: the assigned samples must fit N clients.
        assigned = sum(len(members[c]) for c in range(n_cls) if holders[c])
        if not n_clients * lo <= assigned <= n_clients * hi:
            raise ValueError(
                f"size_range={size_range!r}: unreachable, {assigned} assigned samples "
                f"cannot give {n_clients} clients sizes in [{lo}, {hi}]"
            )

    rng = np.random.default_rng(seed)
    # Draw only the sizes inside the retry loop: cheap, and the sample order
    # below does not affect whether the sizes satisfy size_range.
    for _ in range(max_tries):
        split, sizes = _label_split(rng, [len(m) for m in members], holders, n_clients)
        if size_range is None or (sizes.min() >= lo and sizes.max() <= hi):
            break
    else:
        raise ValueError(
            f"size_range={size_range!r}: unreachable in max_tries={max_tries} draws "
            f"(last draw gave sizes in [{sizes.min()}, {sizes.max()}])"
        )

    parts = [[] for _ in range(n_clients)]
    for c in range(n_cls):
        if not holders[c]:
            continue
        order = rng.permutation(members[c])
        chunks = np.split(order, np.cumsum(split[c])[:-1])
        for u, chunk in zip(holders[c], chunks):
            parts[u].append(chunk)
    return _sorted_parts(np.concatenate(p) for p in parts)


def _label_holders(n_cls, n_clients, k, label_stride):
    """For every label, the clients holding it, in client order (client u holds ``(label_stride * u + j) % C``)."""
    held = [{(label_stride * u + j) % n_cls for j in range(k)} for u in range(n_clients)]
    return [[u for u in range(n_clients) if c in held[u]] for c in range(n_cls)]


def _label_split(rng, counts, holders, n_clients):
    """One draw of every label's split among its holders (``_progressive_split``), and the clients' sizes."""
    split = [_progressive_split(rng, counts[c], len(holders[c])) if holders[c] else [] for c in range(len(counts))]
    sizes = np.zeros(n_clients, dtype=np.int64)
    for c in range(len(counts)):
        sizes[holders[c]] += np.asarray(split[c], dtype=np.int64)
    return split, sizes


def labels_per_client_sizes(class_counts, n_clients=20, k=2, seed=1, *, label_stride=1):
    """The clients' sizes ``labels_per_client(labels, n_clients, k, seed, label_stride=...)`` gives a data set whose
    l-th label has ``class_counts[l]`` samples, from the counts alone: the same draws (no ``size_range``), so the
    same sizes, without the labels. Client u's size is 0 when every holder of its labels before it took all: with
    many clients per label the progressive split runs dry (MNIST, k=2: from a few hundred clients on)."""
    counts = [_int(f"class_counts[{i}]", c, lo=0) for i, c in enumerate(class_counts)]
    if not counts:
        raise ValueError("class_counts=[]: must list at least one class")
    n_clients = _int("n_clients", n_clients, lo=1)
    k = _int("k", k, lo=1, hi=len(counts))
    seed = _int("seed", seed, lo=0)
    label_stride = _int("label_stride", label_stride, lo=1)
    holders = _label_holders(len(counts), n_clients, k, label_stride)
    return _label_split(np.random.default_rng(seed), counts, holders, n_clients)[1]


# --------------------------------------------------------------------------
# McMahan et al. shards
# --------------------------------------------------------------------------
def shards(labels, n_clients=100, shards_per_client=2, shard_size=300, seed=0):
    """Pathological non-IID shards (McMahan et al., AISTATS 2017, FedAvg).

    Symbols: the paper sorts MNIST by digit, cuts it into 200 shards of size
    300 (``shard_size``) and gives each of K=100 clients (``n_clients``) 2
    shards (``shards_per_client``).

    Indices are sorted by label (stable sort, so ties keep index order) and cut
    into ``n_clients * shards_per_client`` shards of ``shard_size``, and each
    client receives ``shards_per_client`` shards drawn without replacement.
    With MNIST's 60,000 training images and the defaults every sample is used
    once (consecutive shards). If the shards cover fewer samples than there
    are, shard j starts at floor(j * n / n_shards) of the sorted order, so the
    shards still span every label (a small CI-sized split is then as non-IID
    as the real one, instead of holding only the smallest labels).  A
    shard can straddle two labels when class sizes are not multiples of
    ``shard_size`` (as in the original), so a client then sees up to
    ``2 * shards_per_client`` labels.
    """
    labels = _labels(labels)
    n_clients = _int("n_clients", n_clients, lo=1)
    shards_per_client = _int("shards_per_client", shards_per_client, lo=1)
    shard_size = _int("shard_size", shard_size, lo=1)
    seed = _int("seed", seed, lo=0)
    n_shards = n_clients * shards_per_client
    if n_shards * shard_size > len(labels):
        raise ValueError(
            f"n_clients*shards_per_client*shard_size={n_clients}*{shards_per_client}*"
            f"{shard_size}={n_shards * shard_size}: must be <= len(labels)={len(labels)}"
        )

    rng = np.random.default_rng(seed)
    by_label = np.argsort(labels, kind="stable")
    starts = (np.arange(n_shards) * len(labels)) // n_shards
    cut = by_label[starts[:, None] + np.arange(shard_size)]
    pick = rng.permutation(n_shards).reshape(n_clients, shards_per_client)
    return _sorted_parts(cut[row].ravel() for row in pick)


# --------------------------------------------------------------------------
# IID
# --------------------------------------------------------------------------
def iid(n_samples: int, n_clients: int, seed=0, sizes=None):
    """IID split: a random permutation of ``range(n_samples)`` cut into parts.

    The usual IID baseline (McMahan et al. 2017; pFedMe's
    ``generate_iid_20users.py``).  Without ``sizes`` the parts differ in size
    by at most one (``np.array_split``; the first ``n_samples % n_clients``
    clients get the extra sample).  With ``sizes`` (one positive int per
    client, sum <= n_samples) client i gets ``sizes[i]`` samples and the
    remainder is unused.  Empty clients are refused: they break
    sample-weighted averaging downstream.
    """
    n_samples = _int("n_samples", n_samples, lo=1)
    n_clients = _int("n_clients", n_clients, lo=1)
    seed = _int("seed", seed, lo=0)
    if sizes is None:
        if n_clients > n_samples:
            raise ValueError(f"n_clients={n_clients}: must be <= n_samples={n_samples}")
    else:
        sizes = list(sizes)
        if len(sizes) != n_clients:
            raise ValueError(f"sizes={sizes}: must have n_clients={n_clients} entries")
        for i, s in enumerate(sizes):
            _int(f"sizes[{i}]", s, lo=1)
        if sum(sizes) > n_samples:
            raise ValueError(f"sizes={sizes}: sum {sum(sizes)} must be <= n_samples={n_samples}")

    perm = np.random.default_rng(seed).permutation(n_samples)
    if sizes is None:
        return _sorted_parts(np.array_split(perm, n_clients))
    return _sorted_parts(np.split(perm[: sum(sizes)], np.cumsum(sizes)[:-1]))


# --------------------------------------------------------------------------
# Dirichlet label skew
# --------------------------------------------------------------------------
def dirichlet(labels, n_clients, alpha=0.5, seed=0, min_size=10, max_tries=1000):
    """Dirichlet label skew (Hsu, Qi & Brown 2019; Yurochkin et al. 2019).

    Symbols: for each class c draw ``p_c ~ Dir(alpha * 1_N)`` with N =
    ``n_clients`` and concentration ``alpha`` (small alpha = more skew), then
    split class c's shuffled indices at the cumulative proportions
    (``np.split(idx, (cumsum(p_c) * n_c).astype(int)[:-1])``).  The whole
    draw is repeated until every client has at least ``min_size`` samples
    (the ``min_require_size`` loop of the FedMA/NIID-Bench code), up to
    ``max_tries`` times, else ValueError.  Unlike that code we do not zero
    the proportions of clients already above N_total/N: plain Dirichlet.
    """
    labels = _labels(labels)
    classes, y = np.unique(labels, return_inverse=True)
    members = [np.flatnonzero(y == c) for c in range(len(classes))]
    cuts = _dirichlet_draw(members, n_clients, alpha, seed, min_size, max_tries)[1]
    parts = [[] for _ in range(n_clients)]
    for idx, cut in cuts:
        for u, chunk in enumerate(np.split(idx, cut)):
            parts[u].append(chunk)
    return _sorted_parts(np.concatenate(p) for p in parts)


def dirichlet_sizes(class_counts, n_clients, alpha=0.5, seed=0, min_size=10, max_tries=1000):
    """The clients' sizes ``dirichlet(labels, n_clients, alpha, seed, min_size, max_tries)`` gives a data set whose
    l-th label has ``class_counts[l]`` samples, from the counts alone: the same draws (a shuffle's draws depend on
    the length shuffled, not on what it holds), so the same sizes, and the same ValueError where none is reached."""
    counts = [_int(f"class_counts[{i}]", c, lo=0) for i, c in enumerate(class_counts)]
    members = [np.arange(c, dtype=np.int64) for c in counts if c > 0]  # np.unique sees only the labels present
    if not members:
        raise ValueError(f"class_counts={list(class_counts)!r}: must hold at least one sample")
    return _dirichlet_draw(members, n_clients, alpha, seed, min_size, max_tries)[0]


def _dirichlet_draw(members, n_clients, alpha, seed, min_size, max_tries):
    """``dirichlet``'s draw for the classes' index arrays ``members``: (the clients' sizes, per class its shuffled
    indices and where they are cut). The clients' sizes are counted from the cuts, and the parts cut only from the
    draw that gives every client ``min_size``."""
    n_clients = _int("n_clients", n_clients, lo=1)
    if (
        isinstance(alpha, bool)
        or not isinstance(alpha, (int, float, np.integer, np.floating))
        or not (math.isfinite(alpha) and alpha > 0)
    ):
        raise ValueError(f"alpha={alpha!r}: must be a finite number > 0")
    seed = _int("seed", seed, lo=0)
    min_size = _int("min_size", min_size, lo=0)
    max_tries = _int("max_tries", max_tries, lo=1)
    n = sum(len(m) for m in members)
    if n_clients * min_size > n:
        raise ValueError(
            f"min_size={min_size}: unreachable, n_clients*min_size={n_clients * min_size} > len(labels)={n}"
        )

    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        sizes, cuts = np.zeros(n_clients, dtype=np.int64), []
        for idx in members:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(n_clients, float(alpha)))
            cut = (np.cumsum(p)[:-1] * len(idx)).astype(int)
            cuts.append((idx, cut))
            sizes += np.diff(np.clip(np.concatenate([[0], cut, [len(idx)]]), 0, len(idx)))  # np.split's chunks
        if sizes.min() >= min_size:
            return sizes, cuts
    raise ValueError(
        f"min_size={min_size}: not reached in max_tries={max_tries} draws "
        f"(alpha={alpha}, n_clients={n_clients}, len(labels)={n})"
    )


# --------------------------------------------------------------------------
# one client per domain
# --------------------------------------------------------------------------
def by_domain(domain_sizes):
    """One client per domain, for datasets stored domain after domain.

    Feature-skew benchmarks (e.g. Digits-5, Office-Caltech, DomainNet as used
    by FedBN / pFedLA) give each client one domain.  If the domains are
    concatenated back to back with sizes ``domain_sizes``, client d gets the
    contiguous range ``[sum(sizes[:d]), sum(sizes[:d+1]))``.  No randomness.
    """
    sizes = list(domain_sizes)
    if not sizes:
        raise ValueError("domain_sizes=[]: must list at least one domain size")
    for i, s in enumerate(sizes):
        _int(f"domain_sizes[{i}]", s, lo=1)
    ends = np.cumsum(sizes)
    return [np.arange(e - s, e, dtype=np.int64) for s, e in zip(sizes, ends)]


# --------------------------------------------------------------------------
# per-client train / test split
# --------------------------------------------------------------------------
def split_train_test(parts, train_frac=0.75, seed=0):
    """Split every client's indices into train and test (pFedMe / FedMCSA rule).

    The pFedMe/FedMCSA scripts shuffle each user's samples and keep the first
    ``train_len = int(0.75 * num_samples)`` for training (``train_frac`` =
    0.75), the rest for testing.  Each client gets its own generator spawned
    from ``seed`` (``np.random.SeedSequence(seed).spawn``), so client i's
    split depends only on (seed, i, its own indices), not on other clients.
    ``train_frac`` must be in (0, 1]; 1 gives empty test sets.

    Returns ``(train_parts, test_parts)``, each a list of sorted int64 arrays.
    """
    if isinstance(parts, np.ndarray) and parts.ndim == 1 and parts.dtype.kind in "iu":
        raise ValueError("parts=<1-D array>: must be a list of per-client index arrays")
    parts = [_part(f"parts[{i}]", p) for i, p in enumerate(parts)]
    if (
        isinstance(train_frac, bool)
        or not isinstance(train_frac, (int, float, np.integer, np.floating))
        or not 0 < train_frac <= 1
    ):
        raise ValueError(f"train_frac={train_frac!r}: must be in (0, 1]")
    seed = _int("seed", seed, lo=0)

    train, test = [], []
    for part, child in zip(parts, np.random.SeedSequence(seed).spawn(len(parts))):
        shuffled = np.random.default_rng(child).permutation(part)
        n_train = int(train_frac * len(part))  # same float rule as the scripts
        train.append(np.sort(shuffled[:n_train]))
        test.append(np.sort(shuffled[n_train:]))
    return train, test


# --------------------------------------------------------------------------
# reporting
# --------------------------------------------------------------------------
_MAX_LABEL_COLUMNS = 20  # beyond this a per-label table is unreadable


def summary(train_parts, labels, test_parts=None):
    """One row per client: sizes, label set, and per-label training counts.

    Columns: ``client``, ``n_train``, ``n_test`` (0 without ``test_parts``),
    ``n_total``, ``n_labels`` (distinct labels over train + test), ``labels``
    (those labels, sorted, comma-separated) and -- only when the dataset has
    at most 20 distinct labels -- ``label_<c>`` = training samples of label c.
    """
    labels = _labels(labels)
    n = len(labels)
    train_parts = [_part(f"train_parts[{i}]", p, n) for i, p in enumerate(train_parts)]
    if test_parts is None:
        test_parts = [np.empty(0, dtype=np.int64)] * len(train_parts)
    else:
        test_parts = [_part(f"test_parts[{i}]", p, n) for i, p in enumerate(test_parts)]
        if len(test_parts) != len(train_parts):
            raise ValueError(f"test_parts=<{len(test_parts)} clients>: must match len(train_parts)={len(train_parts)}")

    classes, y = np.unique(labels, return_inverse=True)
    per_label = len(classes) <= _MAX_LABEL_COLUMNS
    rows = []
    for u, (tr, te) in enumerate(zip(train_parts, test_parts)):
        present = classes[np.unique(y[np.concatenate([tr, te])])]
        row = {
            "client": u,
            "n_train": len(tr),
            "n_test": len(te),
            "n_total": len(tr) + len(te),
            "n_labels": len(present),
            "labels": ",".join(str(c) for c in present),
        }
        if per_label:
            counts = np.bincount(y[tr], minlength=len(classes))
            row.update({f"label_{c}": int(m) for c, m in zip(classes, counts)})
        rows.append(row)
    return pd.DataFrame(rows)


def describe(parts):
    """Client-size statistics for a one-line printout.

    Returns ``{"n_clients", "min", "max", "mean", "std", "total"}`` with plain
    Python numbers; ``std`` is the population standard deviation (ddof=0).
    """
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    if sizes.size == 0:
        raise ValueError("parts=[]: must contain at least one client")
    return {
        "n_clients": int(sizes.size),
        "min": int(sizes.min()),
        "max": int(sizes.max()),
        "mean": float(sizes.mean()),
        "std": float(sizes.std()),
        "total": int(sizes.sum()),
    }
