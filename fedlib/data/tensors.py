"""Federated data from your own arrays: ``from_tensors``, ``from_torch`` (a torch ``Dataset``) and ``from_hf`` (a
Hugging Face ``datasets.Dataset``, optionally cut by a ``flwr_datasets`` partitioner).

The samples are cut among clients by the library's own partitioners (``fedlib.data.partition``: 'iid', 'dirichlet',
'shards', 'labels'), exactly as the built-in data sets are, and each client's samples are split into its train and
test parts by ``train_frac`` (``partition.split_train_test``, the pFedMe rule). A ``test=(x_test, y_test)`` set is kept
apart as the global test set (as MNIST's official test set is under 'iid', 'dirichlet' and 'shards'); then every
client's samples train (``train_frac`` defaults to 1), else they keep 25% to test on.

Bad input is refused naming the argument before anything is cut: x and y of different lengths, y not 1-D, labels
that are not integers or lie outside ``[0, n_classes)``, NaN or infinite inputs, more clients than samples, and a
split that leaves a client nothing to train on or the run nothing to test on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedlib.data import partition
from fedlib.data.federated import FederatedData

PARTITIONERS = ("iid", "dirichlet", "shards", "labels")


def _array(v: Any) -> np.ndarray:
    if hasattr(v, "detach"):  # a torch tensor (no import of torch needed to recognise one)
        v = v.detach().cpu().numpy()
    return np.asarray(v)


def check_arrays(x: Any, y: Any, n_classes: int | None = None, name: str = "") -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` as float32 inputs ``(n, *shape)`` and int64 labels ``(n,)``, or a ValueError naming the argument
    (``name``: a prefix, e.g. ``test`` for the test set's)."""
    xn, yn = f"{name}x" if not name else f"{name}[0] (x)", f"{name}y" if not name else f"{name}[1] (y)"
    xa, ya = _array(x), _array(y)
    if xa.ndim < 2 or xa.shape[0] == 0:
        raise ValueError(f"{xn} has shape {xa.shape}: must be (n_samples, *features) with n_samples >= 1")
    if xa.dtype.kind not in "iufb":
        raise ValueError(f"{xn} has dtype {xa.dtype}: must be numbers")
    if ya.ndim != 1:
        raise ValueError(f"{yn} has shape {ya.shape}: must be 1-D (one integer label per sample)")
    if len(ya) != len(xa):
        raise ValueError(f"{xn} has {len(xa)} samples but {yn} has {len(ya)} labels: they must be as long")
    if ya.dtype.kind not in "iu" or ya.dtype == np.bool_:
        raise ValueError(f"{yn} has dtype {ya.dtype}: labels must be integers (class indices 0, 1, ...)")
    xf = xa.astype(np.float32)
    if not np.isfinite(xf).all():
        bad = int((~np.isfinite(xf)).reshape(len(xf), -1).any(1).sum())
        raise ValueError(f"{xn} has NaN or infinite values in {bad} samples: every input must be finite")
    lo, hi = int(ya.min()), int(ya.max())
    if lo < 0 or (n_classes is not None and hi >= n_classes):
        top = f"n_classes - 1 = {n_classes - 1}" if n_classes is not None else "any"
        raise ValueError(f"{yn} has labels in [{lo}, {hi}]: must lie in [0, {top}]")
    return xf, ya.astype(np.int64)


def from_tensors(
    x: Any,
    y: Any,
    *,
    partition: str = "iid",
    n_clients: int = 10,
    seed: int = 0,
    test: tuple[Any, Any] | None = None,
    train_frac: float | None = None,
    n_classes: int | None = None,
    dirichlet_alpha: float = 0.5,
    shard_size: int | None = None,
    labels_per_client: int = 2,
    label_stride: int = 1,
    name: str = "tensors",
) -> FederatedData:
    """A ``FederatedData`` of ``n_clients`` cut from inputs ``x`` ``(n, *shape)`` and labels ``y`` ``(n,)`` (numpy
    arrays, torch tensors or lists) by ``partition``: 'iid' (equal shares), 'dirichlet' (Dir(``dirichlet_alpha``) label
    shares, Hsu et al. 2019; at least 10 samples a client), 'shards' (McMahan et al. 2017: sorted by label, 2 shards of
    ``shard_size`` each, default as large as the data allows) or 'labels' (pFedMe/FedMCSA: ``labels_per_client``
    labels per client). ``seed`` draws the cut and the split. ``test``: a global test set ``(x_test, y_test)``;
    ``train_frac``: each client's share that trains (default 1 with ``test``, else 0.75: the rest is its test
    split). ``n_classes``: default the largest label + 1. Inputs are kept as given (float32): normalise them first."""
    if partition not in PARTITIONERS:
        raise ValueError(f"partition={partition!r} is not one of: {', '.join(PARTITIONERS)}")
    xa, ya = check_arrays(x, y, n_classes)
    test_arrays = None
    if test is not None:
        if not isinstance(test, (tuple, list)) or len(test) != 2:
            raise ValueError(f"test={type(test).__name__}: must be a pair (x_test, y_test)")
        test_arrays = check_arrays(test[0], test[1], n_classes, name="test")
        if test_arrays[0].shape[1:] != xa.shape[1:]:
            raise ValueError(
                f"test[0] (x) has samples of shape {test_arrays[0].shape[1:]} but x has {xa.shape[1:]}: they must agree"
            )
    if n_classes is None:
        n_classes = int(max(ya.max(), test_arrays[1].max() if test_arrays else 0)) + 1
    elif isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 1:
        raise ValueError(f"n_classes={n_classes!r} must be an integer >= 1")
    if isinstance(n_clients, bool) or not isinstance(n_clients, (int, np.integer)) or n_clients < 1:
        raise ValueError(f"n_clients={n_clients!r} must be an integer >= 1")
    if n_clients > len(ya):
        raise ValueError(f"n_clients={n_clients} is more than the {len(ya)} samples of x: a client needs one at least")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
        raise ValueError(f"seed={seed!r} must be an integer in [0, 2**32)")
    frac = _train_frac(train_frac, test_arrays is not None)
    parts = _cut(ya, partition, int(n_clients), int(seed), dirichlet_alpha, shard_size, labels_per_client, label_stride)
    return from_parts(name, xa, ya, parts, frac, int(seed), n_classes, test_arrays)


def _train_frac(train_frac: Any, has_test: bool) -> float:
    """``train_frac`` checked (default 1 with a test set, else 0.75), or a ValueError naming it."""
    frac = (1.0 if has_test else 0.75) if train_frac is None else train_frac
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
        raise ValueError(f"train_frac={train_frac!r} must be a number in (0, 1]")
    if not has_test and frac >= 1:
        raise ValueError(
            f"train_frac={frac!r} with no test set leaves the run nothing to test on: give test=(x_test, y_test) or "
            "train_frac below 1 (each client's other share is its test split)"
        )
    return float(frac)


def _cut(y, how, n, seed, alpha, shard_size, k, stride) -> list[np.ndarray]:
    if how == "iid":
        return partition.iid(len(y), n, seed=seed)
    if how == "dirichlet":
        return partition.dirichlet(y, n, alpha, seed=seed)
    if how == "shards":
        size = len(y) // (2 * n) if shard_size is None else shard_size
        if size < 1:
            raise ValueError(f"n_clients={n} is too many for partition='shards': 2 shards a client of {len(y)} samples")
        return partition.shards(y, n, 2, size, seed=seed)
    return partition.labels_per_client(y, n, k, seed=seed, label_stride=stride)


def from_parts(name, x, y, parts, train_frac, seed, n_classes, test=None) -> FederatedData:
    """Each client's samples ``parts`` split ``train_frac`` / rest into its train and test splits (a ValueError naming
    ``train_frac`` or ``n_clients`` where a client would have nothing to train on)."""
    sizes = np.array([len(p) for p in parts])
    if (sizes == 0).any():
        raise ValueError(
            f"n_clients={len(parts)} leaves {int((sizes == 0).sum())} client(s) no sample under this partition: lower n_clients"
        )
    tr, te = partition.split_train_test(parts, train_frac, seed)
    short = [i for i, p in enumerate(tr) if len(p) == 0]
    if short:
        i = short[0]
        raise ValueError(
            f"train_frac={train_frac!r} leaves client {i} of its {sizes[i]} samples none to train on: raise train_frac "
            "or lower n_clients"
        )
    return FederatedData.from_parts(name, x, y, tr, te, n_classes=n_classes, global_test=test)


def from_torch(dataset: Any, **kwargs: Any) -> FederatedData:
    """``from_tensors`` over a map-style torch ``Dataset`` whose items are ``(input, label)`` pairs (a torchvision
    data set with ``transform=ToTensor()``, a ``TensorDataset``); ``kwargs`` are ``from_tensors``'s (``test`` may be
    a ``Dataset`` too). Every item is read once, into memory."""
    x, y = _stack_items(dataset, "dataset")
    test = kwargs.pop("test", None)
    if test is not None and not isinstance(test, (tuple, list)):
        test = _stack_items(test, "test")
    return from_tensors(x, y, test=test, **kwargs)


def _stack_items(dataset: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise TypeError(f"{name}={type(dataset).__name__}: must be a map-style torch Dataset (len() and [i])")
    if len(dataset) == 0:
        raise ValueError(f"{name} is empty: it must hold at least one (input, label) item")
    xs, ys = [], []
    for i in range(len(dataset)):
        item = dataset[i]
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise ValueError(f"{name}[{i}] is a {type(item).__name__}: items must be (input, label) pairs")
        xs.append(_array(item[0]))
        ys.append(_array(item[1]).reshape(-1)[0] if _array(item[1]).size == 1 else item[1])
    return np.stack(xs), np.asarray(ys)


def from_hf(
    dataset_or_name: Any,
    *,
    image: str = "image",
    label: str = "label",
    split: str = "train",
    test_split: str | None = None,
    partitioner: Any = None,
    **kwargs: Any,
) -> FederatedData:
    """Federated data from a Hugging Face ``datasets.Dataset`` (or a ``DatasetDict``, or a name for
    ``datasets.load_dataset``, which may download): column ``image`` holds the inputs (PIL images, arrays or lists;
    integer pixels are scaled to [0, 1], images laid out (C, H, W)), column ``label`` the integer labels. ``split`` (and
    ``test_split``, as the global test set) pick a ``DatasetDict``'s splits.

    Without ``partitioner`` the samples are cut by ``from_tensors(..., **kwargs)``. With a ``flwr_datasets``
    partitioner (``IidPartitioner(num_partitions=10)``, ...) its partitions are the clients, each split by
    ``train_frac`` (``kwargs``: ``train_frac``, ``seed``, ``n_classes``, ``name``; a partition other keywords would
    set is the partitioner's). Needs ``pip install 'fedlib[hf]'``."""
    try:
        import datasets
    except ImportError as e:
        raise ImportError("from_hf needs the Hugging Face datasets package: pip install 'fedlib[hf]'") from e
    ds = datasets.load_dataset(dataset_or_name) if isinstance(dataset_or_name, str) else dataset_or_name
    test_ds = None
    if isinstance(ds, datasets.DatasetDict):
        for s in (split, test_split):
            if s is not None and s not in ds:
                raise ValueError(f"split={s!r} is not a split of the DatasetDict (its splits: {', '.join(ds)})")
        test_ds = ds[test_split] if test_split is not None else None
        ds = ds[split]
    elif test_split is not None:
        raise ValueError(f"test_split={test_split!r} needs a DatasetDict; give test=(x_test, y_test) instead")
    if not isinstance(ds, datasets.Dataset):
        raise TypeError(f"dataset_or_name={type(ds).__name__}: must be a datasets.Dataset, DatasetDict or a name")
    for col, what in ((image, "image"), (label, "label")):
        if col not in ds.column_names:
            raise ValueError(
                f"{what}={col!r} is not a column of the dataset (its columns: {', '.join(ds.column_names)})"
            )
    if test_ds is not None:
        kwargs["test"] = _hf_arrays(test_ds, image, label)
    if partitioner is None:
        return from_tensors(*_hf_arrays(ds, image, label), **kwargs)
    bad = sorted(set(kwargs) - {"train_frac", "seed", "n_classes", "name", "test"})
    if bad:
        raise ValueError(f"from_hf: {', '.join(bad)} given with a partitioner, which decides the clients itself")
    partitioner.dataset = ds
    xs, ys = zip(*(_hf_arrays(partitioner.load_partition(i), image, label) for i in range(partitioner.num_partitions)))
    x, y = np.concatenate(xs), np.concatenate(ys)
    bounds = np.cumsum([0, *(len(v) for v in ys)])
    parts = [np.arange(a, b, dtype=np.int64) for a, b in zip(bounds[:-1], bounds[1:])]
    xa, ya = check_arrays(x, y, kwargs.get("n_classes"))
    test = kwargs.get("test")
    test = check_arrays(*test, kwargs.get("n_classes"), name="test") if test is not None else None
    frac = _train_frac(kwargs.get("train_frac"), test is not None)
    n_classes = kwargs.get("n_classes") or int(max(ya.max(), test[1].max() if test else 0)) + 1
    return from_parts(kwargs.get("name", "hf"), xa, ya, parts, frac, int(kwargs.get("seed", 0)), n_classes, test)


def _hf_arrays(ds: Any, image: str, label: str) -> tuple[np.ndarray, np.ndarray]:
    """A Hugging Face split's inputs and labels: images as float32 (C, H, W) (grey (H, W) ones get a channel, (H, W, C)
    ones are transposed), integer pixels (PIL images, uint8 or integer lists) scaled by 1/255."""
    x = np.stack([np.asarray(v) for v in ds[image]])
    pixels = x.dtype.kind in "iu"
    x = x.astype(np.float32) / (255.0 if pixels else 1.0)
    if x.ndim == 3:  # (n, H, W) grey images: one channel
        x = x[:, None]
    elif x.ndim == 4 and x.shape[-1] in (1, 3, 4) and x.shape[1] not in (1, 3, 4):  # (n, H, W, C) -> (n, C, H, W)
        x = x.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(x), np.asarray(ds[label])
