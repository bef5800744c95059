"""Evaluation and the papers' summary metrics.

Per round we evaluate every client's model on its own test split and keep per-client
accuracy and loss. Two means of client accuracies, because the papers differ:
- ``weighted``: sum(correct) / sum(samples) over clients, as the pFedMe-lineage code that
  FedMCSA forks computes its "mean test accuracy";
- ``unweighted``: the plain average of per-client accuracies, as FedMCSA's text defines it.
Summary metrics: best mean accuracy over rounds (FedMCSA's BMTA, AdaFL's "best"), the
average of the last l rounds (AdaFL, l = 10), rounds to reach a target (AdaFL: the first
round at which the mean of the last 5 rounds exceeds the target), communication cost
(AdaFL: model uploads, sum over rounds of gamma^(t) M).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

# a per-round sequence: a pandas Series (``RunResult.metrics`` columns), an array or a list of numbers
Series = np.ndarray | Iterable[float]


def weighted_mean(values: np.ndarray, n: np.ndarray) -> float:
    """sum(values * n) / sum(n): for accuracies, sum(correct) / sum(samples) (pFedMe code)."""
    n = np.asarray(n, dtype=float)
    return float(np.nansum(np.asarray(values) * n) / n[n > 0].sum()) if (n > 0).any() else math.nan


def unweighted_mean(values: np.ndarray, n: np.ndarray | None = None) -> float:
    """The plain average of per-client values over clients that have data (FedMCSA's text)."""
    values = np.asarray(values, dtype=float)
    keep = np.ones(len(values), bool) if n is None else np.asarray(n) > 0
    return float(values[keep].mean()) if keep.any() else math.nan


def best(series: Series) -> float:
    """Highest value over rounds: FedMCSA's BMTA when ``series`` is mean test accuracy."""
    s = np.asarray(series, dtype=float)
    return float(np.nanmax(s)) if s.size and not np.isnan(s).all() else math.nan


def at_best(select: Series, report: Series) -> float:
    """``report`` in the round where ``select`` is highest (the first such round; NaN rounds of ``select`` never
    win): test accuracy at the round best on a validation split, the choice that does not peek at the test set as
    the papers' best round (FedMCSA's BMTA) does."""
    s, r = np.asarray(select, dtype=float), np.asarray(report, dtype=float)
    return float(r[int(np.nanargmax(s))]) if s.size and not np.isnan(s).all() else math.nan


def last_mean(series: Series, last: int = 10) -> float:
    """Average of the last ``last`` values (AdaFL Tables 1-4, l = 10)."""
    s = np.asarray(series, dtype=float)
    return float(s[-last:].mean()) if s.size else math.nan


def rounds_to_target(series: Series, target: float, window: int = 5) -> int | None:
    """First round (1-based) at which the mean of the last ``window`` rounds exceeds ``target``; None if never.

    AdaFL's stopping rule. Before ``window`` rounds exist there is no full window, so the
    earliest possible answer is round ``window``.
    """
    s = np.asarray(series, dtype=float)
    if s.size < window:
        return None
    means = np.convolve(s, np.ones(window) / window, mode="valid")  # means[j] covers rounds j..j+window-1
    hit = np.nonzero(means > target)[0]
    return int(hit[0] + window) if hit.size else None


def communication_cost(uploads_per_round: Series, upto: int | None = None) -> int:
    """Model uploads summed over rounds 1..``upto`` (all when None): AdaFL's sum_t gamma^(t) M."""
    u = np.asarray(uploads_per_round)
    return int(u[:upto].sum() if upto is not None else u.sum())
