"""Keep freed memory inside the process (glibc), so that a round's large tensors are not faulted in afresh.

glibc serves every allocation above its mmap threshold (32 MiB at most) with a fresh ``mmap`` and gives it back
to the kernel on ``free``. A stacked round allocates its clients' parameters anew every round (the executor's
output; AdaFL's MLP for 100 clients: a 100 x 200 x 784 first-layer weight, 63 MB), so that tensor is faulted in
page by page every round: 15,300 minor faults, which take several times as long as copying the same bytes into
memory already touched. With mmap switched off and the heap's top kept (trim threshold 1 GiB), a freed block is
reused by a later round's allocation of the same size without faults (after the first one or two rounds, which
grow the heap; ``tests/test_malloc.py`` counts the faults). ``python -m benchmarks --only c --repeats 9``, runs
alternating with and without, measures it: the stacked round is faster with it, and its spread narrower; cases (a)
and (b), whose tensors stay below the threshold, do not change (measured: docs/measurements/). The cost: a
process's resident memory stays at its peak.

Called by ``fedlib.runs.train.train`` for CPU runs and by the benchmark; ``FEDLIB_MALLOC=default`` leaves glibc as it
is. No-op (returns False) off Linux/glibc (e.g. musl, macOS, Windows).
"""

from __future__ import annotations

import ctypes
import os
import sys

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
ENV = "FEDLIB_MALLOC"
_applied: bool | None = None


def mode() -> str:
    """``FEDLIB_MALLOC``: "reuse" (the default) or "default"; anything else a ``ValueError`` naming the variable.
    ``fedlib.runs.train.run`` and ``fedlib.runs.grids.run_configs`` ask before anything trains (the workers of a grid
    would each fail on it)."""
    value = os.environ.get(ENV, "reuse")
    if value not in ("reuse", "default"):
        raise ValueError(f"{ENV}={value!r} is not one of: reuse, default (unset it for the default, reuse)")
    return value


def keep_freed_memory() -> bool:
    """Switch glibc's mmap path off and keep the heap's top (idempotent). True if glibc accepted the settings."""
    global _applied
    if _applied is not None:
        return _applied
    setting = mode()
    _applied = False
    if setting == "default" or not sys.platform.startswith("linux"):
        return _applied
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return _applied
    _applied = all(
        mallopt(p, v) == 1 for p, v in ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 1 << 30), (M_TOP_PAD, 256 << 20))
    )
    return _applied
