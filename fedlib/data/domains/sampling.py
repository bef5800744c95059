"""The seeded draws of the feature-shift data sets and the float tensors they become.

A domain's generator is seeded from its name, not its position, so choosing other domains changes nothing;
every draw is a function of the seed and the labels only.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import torch

from fedlib.data.federated import FederatedData, Split


def _rng(seed: int, name: str, stream: int) -> np.random.Generator:
    # Depends on the domain's name, not its position: choosing other domains changes nothing.
    return np.random.default_rng([int(seed), zlib.crc32(name.encode()), stream])


def _stratified_split(labels: np.ndarray, test_frac: float, rng: np.random.Generator):
    """Seeded stratified split: ``ceil(test_frac * n)`` test rows, allocated to classes by
    largest remainder (ties: lower class first). Returns sorted (train, test) index arrays."""
    labels = np.asarray(labels)
    classes, counts = np.unique(labels, return_counts=True)
    n_test = math.ceil(test_frac * len(labels) - 1e-9)
    exact = test_frac * counts
    take = np.floor(exact + 1e-9).astype(np.int64)
    extra = n_test - int(take.sum())
    if extra > 0:
        order = np.argsort(-(exact - take), kind="stable")
        take[order[:extra]] += 1
    train, test = [], []
    for c, k in zip(classes, take):
        idx = rng.permutation(np.flatnonzero(labels == c))
        test.append(idx[:k])
        train.append(idx[k:])
    cat = lambda parts: np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
    return cat(train), cat(test)


def _subset(pool: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` of ``pool`` without replacement; the first ``n`` of one seeded permutation, so
    a larger ``n`` keeps every row a smaller one took."""
    return np.sort(pool[rng.permutation(len(pool))[:n]])


def _to_split(parts: list[tuple[np.ndarray, np.ndarray]], mean: float, std: float) -> Split:
    """uint8 (n, H, W, 3) blocks -> one float32 (N, 3, H, W) tensor, ``(x / 255 - mean) / std``."""
    sizes = np.array([len(y) for _, y in parts], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    h, w = next((x.shape[1:3] for x, _ in parts if len(x)), (0, 0))
    out = np.empty((int(sizes.sum()), 3, h, w), dtype=np.float32)
    a = 0
    for x, _ in parts:
        for s in range(0, len(x), 1024):  # chunks bound the float temporary
            c = x[s : s + 1024].transpose(0, 3, 1, 2).astype(np.float32)
            out[a + s : a + s + len(c)] = (c / np.float32(255) - np.float32(mean)) / np.float32(std)
        a += len(x)
    y = np.concatenate([np.asarray(y, dtype=np.int64) for _, y in parts]) if parts else np.zeros(0, np.int64)
    return Split(torch.from_numpy(out), torch.from_numpy(y), torch.from_numpy(offsets), torch.from_numpy(sizes))


def _federated(name, train_parts, test_parts, n_classes, size, mean, std) -> FederatedData:
    return FederatedData(
        name, _to_split(train_parts, mean, std), _to_split(test_parts, mean, std), n_classes, (3, size, size), None
    )
