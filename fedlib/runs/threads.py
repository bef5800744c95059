"""How many threads a run computes with on a CPU, when neither the user (``threads=``, ``OMP_NUM_THREADS``) nor the
process (a worker of a grid, one thread each: ``fedlib.runs.worker``) has said.

The rule: **the cores no other process is using, at least one**, checked at the start and again every few seconds
of training. The papers' models are small: a client group's local step is a few small matrix products, so a
thread that finds its core taken does not slow down a little, it spins in OpenMP's barrier until the other
process yields. Measured on a 2-core machine (docs/performance.md): with both cores free two threads train 1.1-1.8x
faster than one; with one other process computing, two threads train 6-24x *slower* than one. Threads pay only on
free cores, and a core that is free at the start may not stay free, so ``LoadWatch`` lowers (or raises again) the
count between rounds.

"Other processes' use" is the machine's busy time over a short window (``/proc/stat``) less this process's own
(``time.process_time``), in cores. Where ``/proc/stat`` cannot be read (not Linux), the rule keeps one thread: the
safe side of the two measurements above.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import torch

from fedlib.core.callbacks import Callback
from fedlib.runs import worker

_CHECK_SECONDS = 0.1  # the window over which other processes' use is measured


def _busy_seconds() -> float | None:
    """Seconds of CPU time all processes have used since boot (every core summed), or None where unknown."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    ticks = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def sample() -> tuple[float, float, float] | None:
    """(all processes' busy seconds, this process's CPU seconds, wall seconds) now; None where unknown."""
    busy = _busy_seconds()
    return None if busy is None else (busy, time.process_time(), time.perf_counter())


def _others(since: tuple[float, float, float], now: tuple[float, float, float]) -> float:
    """Cores other processes kept busy between two samples."""
    return max(0.0, (now[0] - since[0]) - (now[1] - since[1])) / max(now[2] - since[2], 1e-9)


def others_busy(window: float = _CHECK_SECONDS, since: tuple[float, float, float] | None = None) -> float | None:
    """Cores other processes keep busy, over at least ``window`` seconds from ``since`` (a ``sample()`` the caller took
    before other work, e.g. loading the data: then only what remains of the window is waited), else from now; None
    where it cannot be measured."""
    since = since or sample()
    if since is None:
        return None
    time.sleep(max(0.0, window - (time.perf_counter() - since[2])))
    now = sample()
    return None if now is None else _others(since, now)


def free_cores(window: float = _CHECK_SECONDS, since: tuple[float, float, float] | None = None) -> int:
    """The cores no other process is using now, at least 1 (1 where that cannot be measured)."""
    busy = others_busy(window, since)
    return 1 if busy is None else _free(busy)


def _free(others: float) -> int:
    return max(1, cores() - round(others))


def chosen_by(threads: int | None) -> str | None:
    """Who set the thread count: ``"threads="``, ``"OMP_NUM_THREADS"``, ``"worker"`` (a grid's worker process), or
    None where fedlib chooses (``free_cores``)."""
    if threads is not None:
        return "threads="
    if os.environ.get("OMP_NUM_THREADS"):
        return "OMP_NUM_THREADS"
    if worker.fixed_threads is not None:
        return "worker"
    return None


def check(threads) -> None:
    """``threads``: None (fedlib chooses) or a whole number of threads, at least 1."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads={threads!r} must be None (fedlib chooses: the free cores) or an int >= 1")


_active: dict | None = None  # the record of the outermost ``computing`` block, process-wide (run threads see it)


@contextlib.contextmanager
def computing(
    threads: int | None = None, device: str = "cpu", since: tuple[float, float, float] | None = None
) -> Iterator[dict]:
    """Within the block torch computes with ``threads`` threads, or where nobody set the count with the free cores
    (on a GPU: torch's own count, the host threads only launch kernels); afterwards the process's count is what it
    was. Yields the record a run's metadata keeps: ``{"threads": n, "threads_by": who}`` (``"fedlib"``: the rule
    above, which ``LoadWatch`` then keeps up to date). Inside another block (``run_grid`` around its runs'
    ``train``) it changes nothing and yields the outer record. ``since``: a ``sample()`` taken before the caller's own
    set-up, so that the free cores are measured over it instead of a wait."""
    global _active
    check(threads)
    if _active is not None:
        yield _active
        return
    before = torch.get_num_threads()
    who = chosen_by(threads)
    if threads is not None:
        torch.set_num_threads(threads)
    elif who is None and device == "cpu":
        torch.set_num_threads(free_cores(since=since))
        who = "fedlib"
    _active = {"threads": torch.get_num_threads(), "threads_by": who or "torch"}
    try:
        yield _active
    finally:
        _active = None
        torch.set_num_threads(before)


class LoadWatch(Callback):
    """Between rounds, at most every ``every`` seconds, sets torch's thread count to the cores other processes left
    free since the last check (``free_cores``'s rule over that span, so training never waits for a measurement): a
    run that started on an idle machine does not spin when other work starts, and gets its threads back when that
    work ends. Only where fedlib chose the count (``computing``'s ``threads_by == "fedlib"``)."""

    def __init__(self, every: float = 5.0):
        self.every, self.last = every, sample()
        self.counts: set[int] = {torch.get_num_threads()}

    def after_round(self, run, out) -> None:
        if self.last is None or time.perf_counter() - self.last[2] < self.every:
            return
        now = sample()
        if now is None:
            return
        n = _free(_others(self.last, now))
        if n != torch.get_num_threads():
            torch.set_num_threads(n)
        self.counts.add(n)
        self.last = now

    def meta(self) -> dict:
        return {"threads_seen": sorted(self.counts)}
