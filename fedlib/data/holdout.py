"""Evaluation protocols that hold data out of training: a validation split per client, and new clients.

Both are cut from a run's ``FederatedData`` after it is loaded, seeded by the data seed alone, so every run of a
data config (every seed and method, batched or not) holds out the same samples and clients:

- ``hold_out_clients``: ``round(new_client_frac * N)`` clients, drawn as
  ``np.random.default_rng((data_seed, NEW_STREAM)).choice(N, n_new, replace=False)`` and sorted, leave the federation. They never
  train (the run's data has the other N - n_new clients only, so no selection rule and no method that trains every
  client can reach them) and are evaluated on their own test splits with the global model, then after fine-tuning
  it on their own training data (PFLlib's and FL-bench's new-client / fine-tune evaluation). Drawn on the clients'
  indices, not taken as the last ones: a partition that orders clients by label or domain would otherwise hold out
  one kind of client.
- ``validation_split``: each training client moves ``floor(val_frac * n_i)`` of its n_i training rows (at most
  n_i - 1: it keeps one to train on) to its validation split, the rows at the first positions of
  ``np.random.default_rng(child_i).permutation(n_i)`` with ``child_i`` the i-th of
  ``np.random.SeedSequence((data_seed, VAL_STREAM)).spawn(N)`` over the clients that train. At random rather than the last rows:
  the training rows are stored sorted by index, and a partition's indices can follow the labels. Picking the best
  round on these rows selects without looking at the test split, which the papers' best round does (FedMCSA's BMTA).

The streams are the data seed's own (``NEW_STREAM``, ``VAL_STREAM``), apart from the one that splits each client's
samples into train and test (``partition.split_train_test`` spawns from the bare seed): the same bits drawn twice
would tie the validation rows to the test rows.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from fedlib.data.federated import FederatedData, Split

NEW_STREAM, VAL_STREAM = 2, 1  # the data seed's streams for the new clients' draw and the validation rows


def new_client_count(frac: float, n_clients: int) -> int:
    """How many of ``n_clients`` clients a ``new_client_frac`` of ``frac`` holds out: ``round(frac * n_clients)``."""
    return int(round(frac * n_clients)) if frac > 0 else 0


def new_client_ids(frac: float, n_clients: int, seed: int) -> np.ndarray:
    """The held-out clients' indices (sorted; see the module's docstring for the draw)."""
    n_new = new_client_count(frac, n_clients)
    if n_new == 0:
        return np.zeros(0, dtype=np.int64)
    return np.sort(np.random.default_rng((seed, NEW_STREAM)).choice(n_clients, n_new, replace=False)).astype(np.int64)


def rows_of(split: Split, clients: np.ndarray) -> Split:
    """The clients ``clients`` of ``split`` (in that order) as a split of their own."""
    sizes = split.sizes[torch.as_tensor(clients, dtype=torch.long)]
    starts = split.offsets[torch.as_tensor(clients, dtype=torch.long)]
    idx = torch.cat([torch.arange(int(a), int(a) + int(n)) for a, n in zip(starts, sizes)] or [torch.zeros(0).long()])
    offsets = torch.cat([sizes.new_zeros(1), torch.cumsum(sizes, 0)[:-1]]) if len(sizes) else sizes
    return Split(split.x[idx.to(split.x.device)], split.y[idx.to(split.y.device)], offsets, sizes.clone())


def hold_out_clients(fd: FederatedData, frac: float, seed: int) -> FederatedData:
    """``fd`` without the held-out clients, which it keeps as ``new_clients`` (their ids in ``new_ids``)."""
    ids = new_client_ids(frac, fd.n_clients, seed)
    if len(ids) == 0:
        return fd
    keep = np.setdiff1d(np.arange(fd.n_clients), ids)
    new = FederatedData(
        fd.name, rows_of(fd.train, ids), rows_of(fd.test, ids), fd.n_classes, fd.input_shape, global_test=None
    )
    return dataclasses.replace(
        fd, train=rows_of(fd.train, keep), test=rows_of(fd.test, keep), new_clients=new, new_ids=tuple(ids.tolist())
    )


def validation_rows(sizes: np.ndarray, frac: float, seed: int) -> list[np.ndarray]:
    """Per client, the positions (sorted, within its training rows) that go to validation."""
    out = []
    for n, child in zip(sizes, np.random.SeedSequence((seed, VAL_STREAM)).spawn(len(sizes))):
        k = min(math.floor(frac * int(n)), int(n) - 1)
        out.append(np.sort(np.random.default_rng(child).permutation(int(n))[:k]) if k > 0 else np.zeros(0, np.int64))
    return out


def validation_split(fd: FederatedData, frac: float, seed: int) -> FederatedData:
    """``fd`` with each client's validation rows moved from ``train`` to ``val``."""
    if frac <= 0:
        return fd
    sizes = fd.train.sizes.cpu().numpy()
    picks = validation_rows(sizes, frac, seed)
    offsets = fd.train.offsets.cpu().numpy()
    val_idx, train_idx = [], []
    for a, n, p in zip(offsets, sizes, picks):
        mask = np.zeros(int(n), bool)
        mask[p] = True
        val_idx.append(a + np.flatnonzero(mask))
        train_idx.append(a + np.flatnonzero(~mask))

    def part(parts: list[np.ndarray]) -> Split:
        s = torch.tensor([len(p) for p in parts], dtype=torch.long)
        idx = torch.from_numpy(np.concatenate(parts).astype(np.int64))
        off = torch.cat([s.new_zeros(1), torch.cumsum(s, 0)[:-1]])
        return Split(fd.train.x[idx], fd.train.y[idx], off, s)

    return dataclasses.replace(fd, train=part(train_idx), val=part(val_idx))


def apply(fd: FederatedData, val_frac: float, new_client_frac: float, seed: int) -> FederatedData:
    """The protocols a data config asks for: new clients held out first, then the validation split of the others."""
    return validation_split(hold_out_clients(fd, new_client_frac, seed), val_frac, seed)
