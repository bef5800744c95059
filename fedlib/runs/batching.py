"""Grids as one model: runs that share their data and model shape train together, as one stacked model with the
runs' clients side by side on the client axis.

Each run keeps its own round loop (``fedlib.core.simulation.simulate`` in a thread of its own: its selection, batch
plans, aggregation, lr schedule, random streams, snapshots and store entry are exactly its solo run's). What the runs
share is the arithmetic: their executor is a ``GangExecutor``, whose ``train`` and ``evaluate`` calls wait at a barrier
until every live run of the gang has made its next call, and then run as one call per kind, in the thread that called
``run_together`` (with torch's threads; each run thread computes its own part on one: ``fedlib.runs.openmp``):

- ``train``: the runs' client stacks concatenated on the client axis (run r's K_r clients after run r-1's) through
  the real executor once, and split back. Calls merge when they ask the same arithmetic of different rows: same
  model shapes, data split, objective, plan shape (steps, batch, padding) and the same generic terms; others run
  one by one (correct, only not batched). Each run keeps its own optimiser numbers (``LocalSGD``: lr, momentum,
  weight decay, mu): when they differ, the call takes a ``executors.sgd.RunsSGD``, whose update runs per run on
  the CPU (each run's slice, its solo arithmetic) and per row elsewhere. On the CPU, runs of different optimisers
  do not merge on plans with idle steps (epochs of unequal clients), whose shrinking stacks interleave the runs.
- ``evaluate``: the runs' models stacked on a run axis, per block of clients (``evaluation.personal_chain``; the
  blocks' forwards run by run over the block's shared rows, one softmax and loss reduction for all runs) or per
  chunk of rows for a global model (``evaluation.global_chain``). Linear chains; other models are evaluated one run
  at a time.

No result depends on which calls merged: every client's matmuls have the shapes they have alone, and the merged
arithmetic is the solo one slice by slice (on the CPU, float32 included: a batched matmul's slices do not depend on
how many there are, a softmax over the classes gives a client's rows the same values whatever the other clients
and runs (by class, along the rows; ``executors.class_softmax`` where the logits come rows first), and losses are
summed per run). ``tests/test_batching.py`` checks batched = solo exactly, in float32 and float64, for every method
registered, with runs of another lr and mu among them. The one exception is off the CPU: runs of different optimiser
numbers merged per row (``RunsSGD``) differ from their solo runs in float32's last bits (float64: < 1e-10). Calls of
different arithmetic (FedMix's per-run objective, other plan shapes) run one after another.

Why threads and a barrier rather than a run axis written into the round loop: every method's client procedure
(pFedMe's inner loop, Per-FedAvg's three steps, SCAFFOLD's drift, Ditto's two models) is a sequence of
``executor.train`` calls, so merging at that one interface batches every method without touching any of them.
The threads take turns (``Gang``), so their own Python (selection, plans, aggregation) costs what it costs one
by one. What batching gains on a CPU is small: a client's matmuls have the same thin shapes merged or not, and
the ``--e2e`` benchmark's W6c line measures the ceiling (the grid one by one over its floor with training merged).
"""

from __future__ import annotations

import collections
import queue
import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from fedlib.data.federated import BatchPlan
from fedlib.executors import evaluation
from fedlib.executors.objectives import CrossEntropy
from fedlib.executors.sgd import RunsSGD
from fedlib.models.registry import linear_chain
from fedlib.runs.checkpoint import DeferredInterrupt
from fedlib.runs.openmp import single_threaded_here


@dataclass(eq=False)
class _Call:
    kind: str  # "train" | "evaluate"
    key: tuple | None  # calls with equal keys merge; None: runs alone
    args: tuple
    kwargs: dict
    result: object = None
    error: BaseException | None = None
    turn: threading.Event = field(default_factory=threading.Event)  # set when its thread may go on


class Gang:
    """``members`` runs training together. Each run's thread calls ``enter()`` first, then uses ``member()`` as its
    executor, and calls ``leave()`` when its run ends, however it ends (a run that diverged or failed leaves; the
    others go on).

    The threads take turns: one runs its own Python (selection, plans, aggregation) until its next call reaches
    the barrier, then hands the turn to the next. Were all the run threads runnable at once, every operation that
    releases the GIL would hand it to another thread, and the batched grid would gain little or nothing over its
    runs one by one (``python -m benchmarks --e2e``'s W6x line measures it); taking turns, no two run threads want
    the GIL."""

    def __init__(self, executor, members: int, engine=None):
        self.executor = executor
        self.engine = engine  # runs a batch of calls: run_together's calling thread; None: the arriving thread
        self.live = members
        self.pending: list[_Call] = []
        self.lock = threading.Lock()
        self.queue: collections.deque[threading.Event] = collections.deque()  # threads ready to go on, in order
        self.running = False  # whether a thread has the turn
        self.merged = {"train": [0, 0], "evaluate": [0, 0]}  # kind -> [calls made, merged calls run]

    def member(self) -> "GangExecutor":
        return GangExecutor(self)

    def enter(self) -> None:
        """A member thread's start: wait for its first turn."""
        turn = threading.Event()
        with self.lock:
            self.queue.append(turn)
            if not self.running:
                self._pass()
        turn.wait()

    def leave(self) -> None:
        with self.lock:
            self.live -= 1
        self._arrive(None)

    def submit(self, call: _Call):
        self._arrive(call)
        call.turn.wait()
        if call.error is not None:
            raise call.error
        return call.result

    def _arrive(self, call: _Call | None) -> None:
        """This thread's turn ends at the barrier (with ``call``, or leaving): once every live run has a call
        pending, run them (through ``engine``, else in this thread) and queue their threads; then hand the turn on."""
        with self.lock:
            if call is not None:
                self.pending.append(call)
            batch = []
            if self.pending and len(self.pending) >= self.live:
                batch, self.pending = self.pending, []
        self._run(batch)
        with self.lock:
            self.queue.extend(c.turn for c in batch)
            self._pass()

    def _pass(self) -> None:
        """(Under the lock.) Give the turn to the next thread queued, if any."""
        self.running = bool(self.queue)
        if self.queue:
            self.queue.popleft().set()

    def _run(self, batch: list[_Call]) -> None:
        if batch and self.engine is not None:
            return self.engine(batch)
        self.run_batch(batch)

    def run_batch(self, batch: list[_Call]) -> None:
        """The merged calls of ``batch``, in this thread."""
        groups: dict = {}
        for c in batch:
            groups.setdefault((c.kind, c.key) if c.key is not None else (c.kind, id(c)), []).append(c)
        for (kind, _), calls in groups.items():
            try:
                results = (merged_train if kind == "train" else merged_evaluate)(self.executor, calls)
                for c, r in zip(calls, results):
                    c.result = r
            except BaseException as e:  # every run of the merged call sees the failure
                for c in calls:
                    c.error = e
            self.merged[kind][0] += len(calls)
            self.merged[kind][1] += 1


class GangExecutor:
    """A run's executor in a ``Gang``: ``train`` and ``evaluate`` go through the gang's barrier; anything else is
    the real executor's (its ``name`` is what the run's metadata records)."""

    def __init__(self, gang: Gang):
        self.gang = gang

    def __getattr__(self, name):
        return getattr(self.gang.executor, name)

    def train(self, model, params, plan, data, opt, anchor=None, drift=None, *, objective=None):
        key = _train_key(model, params, plan, data, opt, anchor, drift, objective)
        return self.gang.submit(
            _Call("train", key, (model, params, plan, data, opt, anchor, drift), {"objective": objective})
        )

    def evaluate(self, model, params, split, per_client):
        key = _evaluate_key(model, params, split, per_client)
        return self.gang.submit(_Call("evaluate", key, (model, params, split, per_client), {}))


def _shapes(params) -> tuple:
    return tuple((n, tuple(t.shape[1:]), t.dtype, t.device.type) for n, t in params.items())


def _per_row(params) -> bool:
    """How a merged call applies its runs' different optimisers (``RunsSGD``): per-row columns off the CPU (one
    kernel for all runs), per-run slices on it (each run's solo arithmetic)."""
    return next(iter(params.values())).device.type != "cpu"


def _train_key(model, params, plan: BatchPlan, data, opt, anchor, drift, objective) -> tuple | None:
    own = objective is not None and type(objective) is not CrossEntropy
    if own and not getattr(objective, "MERGES", False):  # undeclared: it may hold per-call context
        return None  # objectives with per-call context (FedMix's pairs and means) run alone
    # runs of different optimisers (lr, mu, momentum, weight decay) merge with their own numbers (``RunsSGD``), but
    # not on the CPU's shrinking stacks: they sort the clients by step count, which interleaves the runs, and the
    # per-run update would become a call per client
    merge_opts = plan.active is None or _per_row(params)
    return (
        type(model), _shapes(params), id(data), None if merge_opts else opt, anchor is None, drift is None,
        plan.steps, tuple(plan.index.shape[2:]), plan.weight is None, plan.active is None, objective if own else None,
    )  # fmt: skip


def _evaluate_key(model, params, split, per_client) -> tuple | None:
    if linear_chain(model) is None:
        return None
    return (type(model), _shapes(params) if per_client else tuple((n, t.shape, t.dtype) for n, t in params.items()),
            id(split), per_client)  # fmt: skip


def _cat(dicts: list) -> dict | None:
    return None if dicts[0] is None else {n: torch.cat([d[n] for d in dicts]) for n in dicts[0]}


def merged_train(executor, calls: list[_Call]) -> list:
    """One ``executor.train`` over the calls' clients side by side; each call's rows of the result."""
    if len(calls) == 1:
        c = calls[0]
        return [executor.train(*c.args, **c.kwargs)]
    model, _, _, data, _, _, _ = calls[0].args
    params = _cat([c.args[1] for c in calls])
    plans = [c.args[2] for c in calls]
    # one LocalSGD when the runs share it; else each run its own (``_per_row``)
    opt = RunsSGD.of([p.index.shape[1] for p in plans], [c.args[4] for c in calls], per_row=_per_row(params))
    cat = lambda ts: None if ts[0] is None else torch.cat(ts, dim=1)
    plan = BatchPlan(cat([p.index for p in plans]), cat([p.weight for p in plans]), cat([p.active for p in plans]))
    out = executor.train(
        model, params, plan, data, opt, _cat([c.args[5] for c in calls]), _cat([c.args[6] for c in calls]),
        objective=calls[0].kwargs["objective"],
    )  # fmt: skip
    sizes = [p.index.shape[1] for p in plans]
    parts = {n: t.split(sizes) for n, t in out.items()}
    return [{n: parts[n][i] for n in out} for i in range(len(calls))]


@torch.no_grad()
def merged_evaluate(executor, calls: list[_Call]) -> list:
    """``evaluation.evaluate`` of every call, the runs' models stacked on a run axis: per block of clients
    (``evaluation.personal_chain``: each run's forward over the block's shared rows, then one softmax and reduction
    for all runs), or per chunk of rows for one global model (``evaluation.global_chain``: one batched forward for
    all runs). ``evaluation.evaluate`` runs the same functions with one run, so each run gets its solo values (a row's
    logits and loss do not depend on the run axis)."""
    if len(calls) == 1:
        return [evaluation.evaluate(*calls[0].args)]
    model, _, split, per_client = calls[0].args
    layers = linear_chain(model)
    stacked = {n: torch.stack([c.args[1][n] for c in calls]) for n in calls[0].args[1]}  # (R, [N,] ...)
    correct, loss = (
        evaluation.personal_chain(layers, stacked, split)
        if per_client
        else evaluation.global_chain(layers, stacked, split)
    )
    n = split.sizes.cpu().numpy().astype(np.float64)
    correct, loss = correct.cpu().numpy(), loss.cpu().numpy()
    return [(correct[r], loss[r], n) for r in range(len(calls))]


@dataclass
class StopFlag:
    """A Ctrl-C for runs in threads (only the main thread takes signals): ``simulate`` finishes the round, snapshots
    and stops when ``requested`` is set."""

    requested: bool = False


_POLL = 0.2  # seconds between the calling thread's looks at a Ctrl-C while the runs compute


def run_together(fns: list, executor) -> tuple[list, Gang]:
    """Call ``fns[r](member_executor, stop_flag)`` for every run r in a thread of its own, their executors one
    ``Gang``; returns (per run: its return value or the exception it raised, the gang). The merged calls run in
    this (the calling) thread with torch's threads, each run thread's own work on one thread (``fedlib.runs.openmp``:
    one OpenMP team in the process). Ctrl-C in the calling thread asks every run to stop after its round (with a
    snapshot); a second ends the runs whose merged call it interrupts."""
    work: queue.SimpleQueue = queue.SimpleQueue()

    def engine(batch):  # in a run thread: hand the batch to the calling thread and wait for it
        done = threading.Event()
        work.put((batch, done))
        done.wait()

    gang, stop = Gang(executor, len(fns), engine), StopFlag()
    out: list = [None] * len(fns)
    process_threads = torch.get_num_threads()

    def body(r):
        try:
            single_threaded_here(process_threads)
            gang.enter()
            out[r] = fns[r](gang.member(), stop)
        except BaseException as e:  # reported per run by the caller
            out[r] = e
        finally:
            gang.leave()
            work.put(None)  # wakes the calling thread to see that this run has ended

    threads = [threading.Thread(target=body, args=(r,), daemon=True, name=f"fedlib-run-{r}") for r in range(len(fns))]
    for t in threads:
        t.start()

    ended = 0

    def serve(ctrl_c=None) -> None:
        """Run the batches the run threads hand over until every run thread has ended."""
        nonlocal ended
        while ended < len(threads):
            if ctrl_c is not None:
                stop.requested = stop.requested or ctrl_c.requested
            try:
                item = work.get(timeout=_POLL)
            except queue.Empty:
                continue
            if item is None:  # a run thread's last act
                ended += 1
                continue
            batch, done = item
            try:
                gang.run_batch(batch)
            except BaseException as e:  # a second Ctrl-C between merged calls: their runs end with it
                for c in batch:
                    c.error = c.error or (e if c.result is None else None)
                raise
            finally:
                done.set()

    try:
        # the first Ctrl-C asks the runs to stop, also where SIGINT was ignored: a grid's pool worker, which its
        # parent signals once, stops its batched unit after the round instead of training it to its end
        with DeferredInterrupt() as ctrl_c:
            serve(ctrl_c)
    except KeyboardInterrupt:
        stop.requested = True
        serve()
    for t in threads:
        t.join()
    return out, gang


__all__ = ["Gang", "GangExecutor", "StopFlag", "run_together", "merged_train", "merged_evaluate"]
