"""McMahan et al.'s shards, the IID split, one client per domain, and the per-client train/test split.

Each cuts one ordering of the samples into pieces: sorted by label (shards), a seeded permutation (IID, and each
client's own for train/test) or the stored order (domains).
"""

from __future__ import annotations

import numpy as np

from fedlib.data.partition.checks import _int, _labels, _part, _sorted_parts


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
