"""Label-skewed partitions: pFedMe / FedMCSA's k labels per client, and Dirichlet label skew.

Each has a ``*_sizes`` twin that draws the clients' sizes from the class counts alone, with the same draws, so a
run's config can be checked against the sizes before its data loads.
"""

from __future__ import annotations

import math

import numpy as np

from fedlib.data.partition.checks import _int, _labels, _sorted_parts


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
