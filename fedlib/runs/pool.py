"""Training units in fresh worker processes side by side (``run_configs(jobs=N)``): each worker trains one unit
(a run alone, or a batch of runs as one model) at a time and stores it as soon as it finishes; the parent shows the
rounds the workers report, stops the grid on Ctrl-C (each worker snapshots its round) and the workers stop when
their parent dies.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import threading
import time

from tqdm.auto import tqdm

from fedlib.config.run import RunConfig
from fedlib.runs import worker
from fedlib.runs.scheduling import _weight
from fedlib.runs.store import Store
from fedlib.runs.train import run, train_together


def _pool_worker_setup(jobs: int, rounds=None, stop=None) -> None:
    """``worker.worker_setup`` for a process of the local pool, which also follows its parent: Ctrl-C in the terminal
    reaches every process of the group, so an idle worker ignores it (the parent stops the grid) and a training one
    snapshots at the end of its round and stops (``fedlib.runs.checkpoint.DeferredInterrupt``); and it stops when its
    parent dies. ``rounds``: the queue its rounds go to (``worker.RoundReport``); ``stop``: set when the parent stops
    the grid. The pool hands a worker its next unit before the parent can cancel it, so a worker checks ``stop``
    before it starts a unit: a stopped grid starts no further run."""
    worker.worker_setup(jobs)
    worker.stop = stop
    if rounds is not None:
        # a worker that exits while its parent no longer reads (a grid stopped by a failure) must not wait on a
        # full pipe to flush progress nobody will show
        rounds.cancel_join_thread()
        worker.rounds = worker.RoundReport(rounds)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, daemon=True, name="fedlib-parent").start()


def _exit_with_parent(grace: float = 20.0) -> None:
    """A worker whose parent died (``kill -9`` of the grid) stops too instead of training on as an orphan: it is
    interrupted like a Ctrl-C (its run snapshots at the end of the round), and exits after ``grace`` seconds."""
    import multiprocessing
    from multiprocessing.connection import wait

    parent = multiprocessing.parent_process()
    if parent is None:
        return
    wait([parent.sentinel])  # ready when the parent process has ended, however it ended
    _thread.interrupt_main(signal.SIGINT)
    time.sleep(grace)
    os._exit(1)


class _RoundsBar:
    """``_run_parallel``'s bar: the rounds its workers report per unit (``worker.RoundReport``), each unit topped up to
    its rounds when it ends (a resumed run trains fewer, a diverged one stops early) and deaf to its reports after;
    the postfix counts the runs stored.

    With ``cost`` (each run's estimated seconds by key, ``fedlib.runs.estimates.seconds``) a unit's round weighs its
    share of the unit's estimate, and the bar shows the share of the work done and the time left. Counted in rounds
    instead, a grid that mixes rounds of seconds (LeNet-BN) with rounds of milliseconds (Synthetic) and trains the
    longest first would foretell many times the time it takes."""

    def __init__(self, units: list[list[RunConfig]], desc: str, progress: bool = True, cost: dict | None = None):
        self.units, self.stored = units, 0
        self.left = {i: sum(c.rounds for c in u) for i, u in enumerate(units)}
        self.per_round = {  # the work a round of unit i does: 1 (rounds), or its share of the unit's estimate
            i: 1 if cost is None else sum(_weight(c, cost) for c in u) / max(1, self.left[i])
            for i, u in enumerate(units)
        }
        total = sum(self.left[i] * self.per_round[i] for i in self.left)
        if cost is None:
            self.bar = tqdm(total=total, desc=desc, unit="round", disable=not progress)
        else:  # the counts are estimated seconds from other versions and machines: only the share is shown
            form = "{l_bar}{bar}| [{elapsed}<{remaining}{postfix}]"
            self.bar = tqdm(total=total, desc=desc, bar_format=form, disable=not progress)

    def add(self, i: int, n: int) -> None:
        n = min(n, self.left.get(i, 0))
        if n:
            self.left[i] -= n
            # the estimates' float sums must not pass the total (tqdm warns, and shows a negative time left)
            self.bar.update(min(n * self.per_round[i], self.bar.total - self.bar.n))

    def end(self, i: int) -> None:
        self.add(i, self.left[i])
        u = self.units[i]
        self.stored += len(u)
        self.bar.set_postfix_str(f"{self.stored}/{sum(map(len, self.units))} runs stored")

    def close(self) -> None:
        self.bar.close()


def _run_in_worker(unit: list[RunConfig], where: tuple, data_root, uid: int = 0) -> None:
    if worker.stop is not None and worker.stop.is_set():  # the grid stopped while this unit waited in the pool's queue
        return
    if worker.rounds is not None:
        worker.rounds.start(uid)
    try:
        if len(unit) > 1:
            train_together(unit, Store(*where), progress=False, data_root=data_root)
        else:
            run(unit[0], Store(*where), progress=False, data_root=data_root)
    finally:
        if worker.rounds is not None:
            worker.rounds.flush()


@contextlib.contextmanager
def _main_for_spawn():
    """A script read from standard input (``python - <<EOF``, as batch job scripts do) has ``__main__.__file__`` =
    ``'<stdin>'``, which each spawned worker tries to run as a file: FileNotFoundError there, BrokenProcessPool here.
    The workers import what they run by module name and need nothing from ``__main__``, so such a pseudo-path is
    hidden while the pool starts them."""
    import sys

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    hide = isinstance(path, str) and path.startswith("<") and path.endswith(">")  # '<stdin>', '<string>'
    if hide:
        del main.__file__
    try:
        yield
    finally:
        if hide:
            main.__file__ = path


def _run_parallel(
    units: list[list[RunConfig]], store: Store, jobs: int, progress: bool, data_root, cost: dict | None = None
) -> None:
    """Train ``units`` (runs alone, or batches of runs as one model) in ``jobs`` fresh processes (spawned: no forked
    torch state). A failed (or interrupted) unit raises once the units already going have finished and been stored;
    those not started are dropped."""
    import multiprocessing
    import queue
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    ctx = multiprocessing.get_context("spawn")
    todo = [c for u in units for c in u]
    reports, stop = ctx.Queue(), ctx.Event()  # (unit, rounds) from the workers (worker.RoundReport); no more units
    with (
        _main_for_spawn(),
        ProcessPoolExecutor(
            max_workers=min(jobs, len(units)),
            mp_context=ctx,
            initializer=_pool_worker_setup,
            initargs=(jobs, reports, stop),
        ) as pool,
    ):
        futures = {
            pool.submit(_run_in_worker, u, (store.root, store.reads), data_root, i): i for i, u in enumerate(units)
        }
        bar = _RoundsBar(units, f"training ({jobs} processes)", progress, cost)
        try:
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                with contextlib.suppress(queue.Empty):
                    while True:
                        bar.add(*reports.get_nowait())
                for f in finished:
                    f.result()
                    bar.end(futures[f])
        except KeyboardInterrupt:
            stop.set()
            for f in futures:  # units not yet started are dropped; those running snapshot their last round and stop
                f.cancel()
            for p in list(getattr(pool, "_processes", {}).values()):  # also when only this process got the signal
                with contextlib.suppress(OSError):
                    os.kill(p.pid, signal.SIGINT)
            pool.shutdown(wait=True)
            stored = sum(store.has(c) for c in todo)
            kept = sum(store.checkpoint(c).info() is not None for c in todo if not store.has(c))
            print(f"interrupted: {stored} of {len(todo)} runs stored, {kept} snapshots kept (run again to resume)")
            raise
        except BaseException:
            stop.set()
            for f in futures:  # units not yet started are dropped; those running finish and are stored
                f.cancel()
            raise
        finally:
            bar.close()
