"""One OpenMP team per process: a batched grid's run threads compute with one thread each, the thread that runs the
merged arithmetic with all of torch's threads.

GNU OpenMP (torch's CPU wheels) gives every thread that starts a parallel region a team of its own. When more
threads belong to teams than the machine has cores, every team's idle workers stop spinning and sleep (libgomp's
throttled spin count), so each parallel region then pays for waking them: a small ``add_`` in a second thread
beside the main one takes about ten times as long as in the main thread, and a client group's local steps of
Synthetic's MLR more than twice as long (measured: docs/measurements/). A batched grid (``fedlib.runs.batching``)
runs each run in a thread of its own, so with a team per thread its merged training would be slower than the runs
one by one (``python -m benchmarks --e2e --only W6 --threads 2`` measures the two).

``single_threaded_here()`` sets the calling thread's OpenMP and MKL thread counts to 1 (both are per-thread
settings; torch's ``set_num_threads`` is process-wide), so a run thread never starts a team;
``fedlib.runs.batching.run_together`` runs the merged calls in the thread that called it, the process's one team.
Where the runtime is not GNU/LLVM OpenMP with MKL in torch (other builds, other platforms) the missing part is left
as it is: threads then keep the runtime's own teams.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading

import torch

_local = threading.local()


@functools.cache
def _runtime() -> tuple:
    """(omp_set_num_threads, MKL_Set_Num_Threads_Local) of the loaded runtimes, each None where absent."""
    omp = mkl = None
    try:
        omp = ctypes.CDLL(None).omp_set_num_threads
        omp.argtypes, omp.restype = [ctypes.c_int], None
    except (AttributeError, OSError, TypeError):  # TypeError: CDLL(None) where there is no process namespace
        omp = None
    try:  # torch's MKL is linked into libtorch_cpu; the call returns the thread's previous count (0: none set)
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        mkl = lib.MKL_Set_Num_Threads_Local
        mkl.argtypes, mkl.restype = [ctypes.c_int], ctypes.c_int
    except (AttributeError, OSError, TypeError):
        mkl = None
    return omp, mkl


def single_threaded_here(process_threads: int) -> None:
    """This thread's OpenMP and MKL regions run on one thread, without touching the other threads' settings.
    ``process_threads``: the count the process computes with elsewhere, what ``threads()`` reports here (a run's
    metadata records it)."""
    torch.get_num_threads()  # torch sets a thread's count on its first parallel call: let it, then override
    omp, mkl = _runtime()
    if omp is not None:
        omp(1)
    if mkl is not None:
        mkl(1)
    _local.process_threads = process_threads


def threads() -> int:
    """The threads this process computes with: torch's count, or in a thread made single-threaded by
    ``single_threaded_here`` the count it was given."""
    return getattr(_local, "process_threads", None) or torch.get_num_threads()
