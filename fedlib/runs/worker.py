"""What this process is, when it is one of several training side by side: its share of the cache for client groups
(``group_bytes``), where it reports its rounds (``rounds``) and the parent's "start no more units" (``stop``).
Set once by ``worker_setup`` (a local pool worker: ``pool``; a Ray task: ``ray_backend``), read by ``train``."""

from __future__ import annotations

import threading
import time

import torch

group_bytes: int | None = None  # this process's cache budget for client groups (None: the one-process default)
fixed_threads: int | None = None  # the threads ``worker_setup`` gave this process (None: not a worker)


class RoundReport:
    """A pool worker's rounds trained, sent to the parent's bar (``pool._run_parallel``) as (unit, rounds): the workers
    train with their own bars off, and the parent's would otherwise move only when a whole unit ends (hours, at the
    paper profile). At most one message every ``every`` seconds, so that rounds of milliseconds pay no pipe write
    each; batched runs tick from their own threads."""

    def __init__(self, queue, every: float = 0.5):
        self.queue, self.every = queue, every
        self.unit, self.count, self.last = None, 0, time.monotonic()
        self.lock = threading.Lock()

    def tick(self, *_) -> None:
        with self.lock:
            self.count += 1
            if time.monotonic() - self.last >= self.every:
                self._send()

    def start(self, unit: int) -> None:
        with self.lock:
            self.unit, self.count, self.last = unit, 0, time.monotonic()

    def flush(self) -> None:
        with self.lock:
            self._send()

    def _send(self) -> None:
        if self.count:
            self.queue.put((self.unit, self.count))
            self.count = 0
        self.last = time.monotonic()


rounds: RoundReport | None = None  # a pool worker's report of its rounds (None: not a pool worker)


stop = None  # a pool worker's view of its parent's "start no more units" (a multiprocessing Event)


def worker_setup(jobs: int, threads: int = 1) -> None:
    """Start of one of ``jobs`` worker processes training side by side: ``threads`` threads (one in the local pool;
    a Ray task's ``num_cpus``), and a share of the cache for the stacked executor's client groups (the processes
    share the L3; see ``StackedExecutor``)."""
    from fedlib.executors import PROCESS_CACHE_BYTES

    global group_bytes, fixed_threads
    torch.set_num_threads(threads)
    fixed_threads = threads
    group_bytes = PROCESS_CACHE_BYTES // jobs  # a value handed to each executor this process makes
