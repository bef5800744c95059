"""Per-client tables and one-line statistics of a partition (what notebooks and logs print)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedlib.data.partition.checks import _labels, _part

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
