"""The partitioners' argument checks: each raises ``ValueError("<param>=<value>: <what is allowed>")``.

They run before any random draw, so a bad argument never yields a partial or differently seeded split.
"""

from __future__ import annotations

import numpy as np


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
