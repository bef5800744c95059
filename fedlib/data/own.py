"""Data sets of your own, by name: ``register_dataset(name, loader)`` makes ``RunConfig(dataset=name, ...)`` a run
like any other (validated, stored, resumed, batched in grids).

``loader`` is a function of no arguments (called once, on first use, and kept) or the data itself, returning either

- a ``FederatedData`` (e.g. from ``fedlib.data.from_tensors``): its clients are fixed, so the config must say
  ``partition='natural'`` and ``n_clients`` equal to its clients (checked, never ignored), and the fields that would
  cut the data (``train_frac``, ``data_seed``) stay at their defaults; or
- arrays ``(x, y)`` or ``(x, y, x_test, y_test)``: the pool the config cuts, with ``partition`` one of
  ``partitions`` (default 'iid', 'dirichlet', 'shards', 'labels'), ``n_clients``, ``data_seed``, ``train_frac``,
  ``dirichlet_alpha``, ``shard_size``, ``labels_per_client`` and ``label_stride`` read as for MNIST
  (``fedlib.data.tensors.from_tensors``); ``x_test, y_test`` is the global test set ('labels' pools it with the rest,
  as pFedMe's recipe does).

Store keys: a user data set's runs are keyed by its name and a content hash of its arrays (``content_hash``: every
array the runs read, with its dtype and shape), so data that changed under the same name never reads a stale
result, while re-registering the same data (a new process, a re-run notebook) finds its stored runs. The loader's
code is not hashed: what it returns is what the runs see.

Registrations live in the process that made them: worker processes (``run_grid(jobs=N)``) and Ray tasks start
fresh and do not see them, so ``fedlib.runs.grids.run_configs`` refuses those for user data sets and models and
trains them in the calling process (batched, ``batch=``) instead.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from fedlib.data.domains import DOMAINS
from fedlib.data.federated import FederatedData
from fedlib.data.tensors import PARTITIONERS, check_arrays, from_tensors


@dataclass
class Entry:
    """A registered data set: its loader, the partitions it allows, and (after first use) its data and hash."""

    name: str
    loader: Any
    partitions: tuple[str, ...] | None
    doc: str = ""
    _data: Any = None
    _hash: str | None = None
    _cut: dict = field(default_factory=dict)  # partitioned pools by the config fields that cut them

    @property
    def data(self) -> FederatedData | tuple:
        """What the loader returned: a ``FederatedData``, or the pool ``(x, y, test)`` as checked arrays."""
        if self._data is None:
            got = self.loader() if callable(self.loader) else self.loader
            self._data = _checked(self.name, got)
        return self._data

    @property
    def fixed(self) -> bool:
        """Whether the loader's data has its clients (a ``FederatedData``), rather than a pool the config cuts."""
        return isinstance(self.data, FederatedData)

    def allowed(self) -> tuple[str, ...]:
        return ("natural",) if self.fixed else (self.partitions or PARTITIONERS)


USER_DATASETS: dict[str, Entry] = {}
# the library's own data sets (``fedlib.config.parts.DATASETS`` lists them for configs): never replaced
BUILT_IN = ("synthetic", "mnist", "fmnist", "cifar10", *DOMAINS)


def register_dataset(
    name: str,
    loader: Callable[[], Any] | Any,
    *,
    partitions: tuple[str, ...] | None = None,
    doc: str = "",
    replace: bool = False,
) -> None:
    """Register data set ``name`` (see the module's docstring for what ``loader`` returns). ``partitions``: for a pool
    of arrays, which of 'iid', 'dirichlet', 'shards', 'labels' its configs may use (default all). A name already
    registered is refused (``replace=True`` replaces a data set of your own on purpose); so are the built-in names."""
    if not isinstance(name, str) or not name.strip() or name != name.strip() or "/" in name:
        raise ValueError(
            f"register_dataset: name={name!r} must be a non-empty string without '/' or surrounding blanks"
        )
    if name in BUILT_IN:
        raise ValueError(
            f"register_dataset: name={name!r} is a built-in data set ({', '.join(BUILT_IN)}); pick another"
        )
    if name in USER_DATASETS and not replace:
        raise ValueError(f"register_dataset: data set {name!r} is already registered (replace=True to replace it)")
    if partitions is not None:
        bad = [p for p in partitions if p not in PARTITIONERS] if isinstance(partitions, tuple) else [partitions]
        if bad or not partitions:
            raise ValueError(
                f"register_dataset: partitions={partitions!r} must be a non-empty tuple of: {', '.join(PARTITIONERS)}"
            )
    if loader is None:
        raise TypeError(
            "register_dataset: loader must be a function of no arguments, a FederatedData or (x, y[, x_test, y_test])"
        )
    USER_DATASETS[name] = Entry(name, loader, partitions, doc)


def unregister_dataset(name: str) -> None:
    """Remove a data set registered with ``register_dataset``."""
    if name not in USER_DATASETS:
        raise ValueError(f"unregister_dataset: {name!r} is not a registered data set")
    del USER_DATASETS[name]


def _checked(name: str, got: Any) -> FederatedData | tuple:
    where = f"the loader of data set {name!r} returned"
    if isinstance(got, FederatedData):
        return got
    if not isinstance(got, (tuple, list)) or len(got) not in (2, 4):
        raise TypeError(
            f"{where} {type(got).__name__}: it must return a FederatedData, (x, y) or (x, y, x_test, y_test)"
        )
    try:
        x, y = check_arrays(got[0], got[1])
        test = check_arrays(got[2], got[3], name="test") if len(got) == 4 else None
    except ValueError as e:
        raise ValueError(f"{where} bad arrays: {e}") from None
    if test is not None and test[0].shape[1:] != x.shape[1:]:
        raise ValueError(f"{where} x_test of samples {test[0].shape[1:]} but x of {x.shape[1:]}: they must agree")
    return (x, y, test)


def entry(name: str) -> Entry:
    return USER_DATASETS[name]


def info(name: str) -> tuple[tuple[int, ...], int, int]:
    """(input shape, classes, samples) of user data set ``name``: what the run checks are made against."""
    d = USER_DATASETS[name].data
    if isinstance(d, FederatedData):
        n = len(d.train.y) + len(d.test.y) + (len(d.global_test[1]) if d.global_test is not None else 0)
        return tuple(d.input_shape), int(d.n_classes), n
    x, y, test = d
    return tuple(x.shape[1:]), _classes(y, test), len(y) + (len(test[1]) if test is not None else 0)


def _classes(y: np.ndarray, test) -> int:
    return int(max(y.max(), test[1].max() if test is not None else 0)) + 1


def check(d: Any) -> None:
    """What a ``DataConfig`` ``d`` naming a user data set must agree with (``DataConfig.check``): its partition, its
    clients for fixed data, a test set to evaluate on. Raises ValueError naming the field (as users write it)."""
    e = USER_DATASETS[d.dataset]
    if d.partition not in e.allowed():
        raise ValueError(
            f"RunConfig.partition={d.partition!r} is not one of: {', '.join(e.allowed())} (data set {d.dataset!r}"
            + (" has its own clients)" if e.fixed else ")")
        )
    if e.fixed:
        fd = e.data
        if d.n_clients != fd.n_clients:
            raise ValueError(
                f"RunConfig.n_clients={d.n_clients} but data set {d.dataset!r} has {fd.n_clients} clients (its loader "
                f"cut them): set n_clients={fd.n_clients}"
            )
        for f, default in (("train_frac", 0.75), ("data_seed", 0)):
            if getattr(d, f) != default:
                raise ValueError(
                    f"RunConfig.{f}={getattr(d, f)!r} is set but data set {d.dataset!r} comes cut and split by its "
                    "loader (a FederatedData); return arrays from the loader to let the config cut them"
                )
        return
    x, y, test = e.data
    if d.n_clients > len(y):
        raise ValueError(f"RunConfig.n_clients={d.n_clients} exceeds the {len(y)} samples of data set {d.dataset!r}")
    if test is None and d.train_frac >= 1:
        raise ValueError(
            f"RunConfig.train_frac={d.train_frac!r} must be below 1: data set {d.dataset!r} has no test set, so the "
            "clients' test splits (the other 1 - train_frac) are the run's only test data"
        )
    if d.partition == "labels" and d.labels_per_client > _classes(y, test):
        raise ValueError(
            f"RunConfig.labels_per_client={d.labels_per_client} exceeds the {_classes(y, test)} classes of data set "
            f"{d.dataset!r}"
        )


def load(d: Any) -> FederatedData:
    """The federated data a ``DataConfig`` naming a user data set trains on: the loader's own, or its pool cut by
    the config (kept per cut, so a grid cuts it once)."""
    e = USER_DATASETS[d.dataset]
    if e.fixed:
        return e.data
    cut = (d.partition, d.n_clients, d.data_seed, d.train_frac, d.dirichlet_alpha, d.shard_size,
           d.labels_per_client, d.label_stride)  # fmt: skip
    if cut not in e._cut:
        x, y, test = e.data
        kw: dict = {"dirichlet_alpha": d.dirichlet_alpha, "labels_per_client": d.labels_per_client}
        if d.partition == "shards":
            kw["shard_size"] = d.shard_size
        if d.partition == "labels":  # pFedMe's recipe: the train and test sets pooled, each client split
            if test is not None:
                x, y, test = np.concatenate([x, test[0]]), np.concatenate([y, test[1]]), None
            kw["label_stride"] = d.label_stride
        e._cut[cut] = from_tensors(x, y, partition=d.partition, n_clients=d.n_clients, seed=d.data_seed, test=test,
                                   train_frac=d.train_frac, n_classes=_classes(*e.data[1:]),
                                   name=f"{d.dataset}/{d.partition}", **kw)  # fmt: skip
    return e._cut[cut]


def content_hash(name: str) -> str:
    """A hash of every array of user data set ``name`` (values, dtype, shape; the clients' offsets and sizes for
    fixed data) and its class count: 16 hex digits of BLAKE2b, computed once per registration."""
    e = USER_DATASETS[name]
    if e._hash is None:
        h = hashlib.blake2b(digest_size=8)
        d = e.data
        if isinstance(d, FederatedData):
            arrays = [d.train.x, d.train.y, d.train.offsets, d.train.sizes, d.test.x, d.test.y, d.test.offsets,
                      d.test.sizes, *(d.global_test or ())]  # fmt: skip
            h.update(f"fixed {d.n_classes}".encode())
        else:
            x, y, test = d
            arrays = [x, y, *(test or ())]
            h.update(f"pool {_classes(y, test)}".encode())
        for a in arrays:
            a = np.ascontiguousarray(a.detach().cpu().numpy() if hasattr(a, "detach") else a)
            h.update(f"{a.dtype.str}{a.shape}".encode())
            h.update(a.data)
        e._hash = h.hexdigest()
    return e._hash
