"""Federated data: generators, readers, partitioners, and ``load_federated`` which builds a run's data from its config.

Recipes (documented here because notebooks print them):
- Synthetic: ``synthetic(alpha, beta, N, seed)`` clients as generated (pFedMe), each split 75/25.
- 'labels' (pFedMe/FedMCSA MNIST, FMNIST, CIFAR-10): the train and test sets are pooled
  (FedMCSA: "the complete dataset ... 70,000 instances"), pixels standardised per pixel
  over the pool ((x - mean) / (std + 0.001), as pFedMe's script), client u holds labels
  (u + j) mod 10 for j < k (``label_stride`` s: (s u + j) mod 10; FedMCSA's copy of the script
  has s = k), and each client's samples are split 75/25.
- 'shards' (McMahan et al.; AdaFL): the 60,000 training images sorted by label, 2 shards of
  ``shard_size`` per client; the official test set is kept as a global test set.
- 'iid', 'dirichlet': over the training set, official test set kept as global test set.
- 'domains' (feature shift: digits, office31, officehome, domainnet; pFedLA after FedBN): one
  client per domain, each with its own train and test split; recipes in ``fedlib.data.domains``.
- data sets of your own (``register_dataset``; ``from_tensors``, ``from_torch``, ``from_hf``): ``fedlib.data.own``.
"""

from __future__ import annotations

import functools

import numpy as np

from fedlib.data import domains, holdout, own, partition, readers
from fedlib.data.federated import BatchPlan, FederatedData, Split, sample_epochs, sample_steps
from fedlib.data.own import register_dataset, unregister_dataset
from fedlib.data.synthetic import synthetic
from fedlib.data.tensors import from_hf, from_tensors, from_torch

__all__ = [
    "BatchPlan",
    "FederatedData",
    "Split",
    "sample_epochs",
    "sample_steps",
    "synthetic",
    "load_federated",
    "partition_summary",
    "partition",
    "readers",
    "domains",
    "from_tensors",
    "from_torch",
    "from_hf",
    "register_dataset",
    "unregister_dataset",
]

_IMAGE_LOADERS = {"mnist": "load_mnist", "fmnist": "load_fashion_mnist", "cifar10": "load_cifar10"}


def _as_float(x: np.ndarray) -> np.ndarray:
    """Images in torch's (n, C, H, W) layout: colour ones from (n, H, W, C), grey ones (MNIST, Fashion-MNIST's
    (n, H, W)) with one channel, so that a conv net takes them as it takes any image (a Linear chain flattens
    either way)."""
    x = x.astype(np.float32)
    return x.transpose(0, 3, 1, 2) if x.ndim == 4 else x[:, None] if x.ndim == 3 else x


def _normalise(x: np.ndarray, how: str, ref: np.ndarray | None = None) -> np.ndarray:
    """x / 255, or per-pixel standardisation with the statistics of ``ref`` (default: x itself)."""
    x = _as_float(x)
    if how == "unit":
        return x / 255.0
    r = x if ref is None else _as_float(ref)
    return (x - r.mean(0)) / (r.std(0) + 0.001)


@functools.lru_cache(maxsize=8)
def _load_cached(
    dataset,
    partition_name,
    n_clients,
    s_alpha,
    s_beta,
    k,
    stride,
    shard_size,
    d_alpha,
    train_frac,
    normalize,
    seed,
    root,
) -> tuple[FederatedData, object]:
    if dataset == "synthetic":
        xs, ys = synthetic(s_alpha, s_beta, n_clients, seed)
        local = [np.arange(len(y)) for y in ys]
        tr, te = partition.split_train_test(local, train_frac, seed)
        fd = FederatedData.from_clients(f"synthetic({s_alpha},{s_beta})", xs, ys, tr, te, n_classes=10)
        labels = np.concatenate(ys)
        base = np.concatenate([[0], np.cumsum([len(y) for y in ys])[:-1]])
        summ = partition.summary(
            [p + base[i] for i, p in enumerate(tr)], labels, [p + base[i] for i, p in enumerate(te)]
        )
        return fd, summ
    load = getattr(readers, _IMAGE_LOADERS[dataset])
    x_tr, y_tr = load("train", root=root)
    x_te, y_te = load("test", root=root)
    global_test = None
    if partition_name == "labels":
        x = _normalise(np.concatenate([x_tr, x_te]), normalize)
        y = np.concatenate([y_tr, y_te])
        parts = partition.labels_per_client(y, n_clients, k, seed=seed, label_stride=stride)
    else:
        x = _normalise(x_tr, normalize)
        y = np.asarray(y_tr)
        global_test = (_normalise(x_te, normalize, ref=x_tr), y_te)  # test standardised with training statistics
        if partition_name == "shards":
            parts = partition.shards(y, n_clients, 2, shard_size, seed=seed)
        elif partition_name == "iid":
            parts = partition.iid(len(y), n_clients, seed=seed)
        else:
            parts = partition.dirichlet(y, n_clients, d_alpha, seed=seed)
    tr, te = partition.split_train_test(parts, train_frac, seed)
    fd = FederatedData.from_parts(f"{dataset}/{partition_name}", x, y, tr, te, n_classes=10, global_test=global_test)
    return fd, partition.summary(tr, y, te)


def load_federated(cfg, root=None) -> FederatedData:
    """The federated data set a ``RunConfig`` names (cached in-process, so a grid loads it once), with the clients
    and validation rows its evaluation protocols hold out (``fedlib.data.holdout``)."""
    d = cfg.data
    return holdout.apply(_load(cfg, root)[0], d.val_frac, d.new_client_frac, d.data_seed)


def partition_summary(cfg, root=None):
    """Per-client table (sizes, labels) of the data set a ``RunConfig`` names."""
    return _load(cfg, root)[1]


def _load(cfg, root):
    d = cfg.data
    if d.dataset in own.USER_DATASETS:  # a data set of the user's: in memory, cut per config (``own.load``)
        return _with_summary(own.load(d))
    root = str(readers.data_root(root))
    if d.dataset in domains.DOMAINS:  # feature-shift data: one client per domain
        return _load_domains_cached(d.dataset, d.domains, d.domain_percent, d.data_seed, root)
    return _load_cached(
        d.dataset,
        d.partition,
        d.n_clients,
        d.synthetic_alpha,
        d.synthetic_beta,
        d.labels_per_client,
        d.label_stride,
        d.shard_size,
        d.dirichlet_alpha,
        d.train_frac,
        d.normalize,
        d.data_seed,
        root,
    )


@functools.lru_cache(maxsize=2)  # image data sets are large (Office-Home at 224 is gigabytes of float32)
def _load_domains_cached(dataset, domain_list, percent, seed, root) -> tuple[FederatedData, object]:
    return _with_summary(domains.load(dataset, domain_list, percent, seed, root))


def _with_summary(fd: FederatedData) -> tuple[FederatedData, object]:
    # Clients are stored domain after domain: train rows first, then test rows, in one label vector.
    labels = np.concatenate([fd.train.y.numpy(), fd.test.y.numpy()])
    n_train = len(fd.train.y)
    rows = lambda s, base: [
        np.arange(int(a), int(a) + int(n), dtype=np.int64) + base for a, n in zip(s.offsets, s.sizes)
    ]
    return fd, partition.summary(rows(fd.train, 0), labels, rows(fd.test, n_train))
