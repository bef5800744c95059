"""CUDA graphs for the stacked executor's client groups.

On a GPU a local step of these small models is a few dozen short kernels, and the launches, not the arithmetic,
bound a round (an AdaFL MNIST run: 2.5 minutes on an H100 for seconds of arithmetic). A CUDA graph records a
client group's whole local-step loop once (every step's kernels, ``torch.cuda.graph``) and replays it with one
launch. A replay runs the kernels it recorded, at the addresses it recorded: the eager loop's arithmetic, though
cuBLAS may pick another algorithm under capture (``tests/test_cuda.py``; on an H100, whole float32 runs of eight
methods were identical to their eager runs, and a float64 FedAvg run differed by 8.9e-16).

What a recording fixes, and so what keys it (``_key``): the path, the model, the group's parameter shapes, the
plan's shapes (steps, clients, batch) and which clients step at each step (a ``ShrinkingPlan``'s ``live``), the
``LocalSGD``'s numbers (Python floats baked into the kernels: a decaying lr is a new key each round), which of
anchor and drift are given, and the training data's tensor. Everything else the loop reads (the parameters, the
plan's rows and weights, the anchor, the drift) is copied into the recording's own input tensors before each
replay, and the trained parameters are copied out after it.

A key is recorded the second time it is seen (the first call runs eagerly, which also warms up cuBLAS for the
recording), so a group shape seen once (AdaFL's growing participation, a decaying lr) never pays for a recording;
the recording itself runs the loop once more on a side stream first (torch's advice for capture) and then records.
Only the cross-entropy fast path of Linear chains (``chain.chain_cross_entropy``) with one ``LocalSGD`` is
recorded: it makes no host synchronisation and draws no random numbers. Other paths (``vmap``, dropout, FedMix's
context, a ``RunsSGD``'s per-run columns) run eagerly.

Opt-in: ``StackedExecutor(graphs=True)``, or ``FEDLIB_CUDA_GRAPHS=1`` in the environment for every executor a run
makes (the CLI, ``run_grid``, ``python -m benchmarks``). Like the device, it is not part of a run's key. Off by
default: what it saves on whole runs has not been measured.
"""

from __future__ import annotations

import dataclasses
import os
from collections import OrderedDict

import torch

from fedlib.data.federated import BatchPlan, ShrinkingPlan
from fedlib.executors.chain import chain_cross_entropy
from fedlib.executors.kernels import FastPath, Group
from fedlib.executors.objectives import CrossEntropy, Objective
from fedlib.executors.sgd import LocalSGD, Params, RunsSGD

ENV = "FEDLIB_CUDA_GRAPHS"


def graphs_from_env() -> bool:
    """``FEDLIB_CUDA_GRAPHS``: '1' / 'true' / 'yes' / 'on' records client groups as CUDA graphs; unset, '0', 'false',
    'no', 'off': not. Anything else is an error that names the variable."""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{ENV}={os.environ[ENV]!r}: one of 1, true, yes, on (record) or 0, false, no, off (do not)")


def _tensors(d: Params | None) -> tuple | None:
    return None if d is None else tuple((n, tuple(t.shape), t.dtype) for n, t in d.items())


class GroupGraphs:
    """Recorded local-step loops of client groups, by key (module docstring), the ``capacity`` most recently used
    kept (each holds its own GPU memory: one eager loop's peak). ``hits`` / ``recorded`` / ``eager``: calls replayed,
    recordings made, calls run eagerly."""

    SEEN = 1024  # keys remembered as seen (a decaying lr makes a new key every round: without a bound, a leak)

    def __init__(self, capacity: int = 16):
        self.capacity = capacity
        self.graphs: OrderedDict = OrderedDict()
        self.seen: OrderedDict = OrderedDict()  # keys seen, the ``SEEN`` most recent
        self.hits = self.recorded = self.eager = 0

    @staticmethod
    def eligible(
        path: FastPath, plan: BatchPlan, opt: LocalSGD | RunsSGD, objective: Objective, params: Params
    ) -> bool:
        dev = next(iter(params.values())).device
        return (
            dev.type == "cuda"
            and path is chain_cross_entropy
            and type(objective) is CrossEntropy
            and isinstance(opt, LocalSGD)
            and plan.active is None
        )

    @staticmethod
    def _key(path: FastPath, g: Group) -> tuple:
        plan, data = g.plan, g.data
        live = plan.live if isinstance(plan, ShrinkingPlan) else None
        return (
            path,
            id(g.model),
            _tensors(g.p),
            tuple(plan.index.shape),
            plan.weight is None,
            live,
            g.opt,
            _tensors(g.anchor),
            _tensors(g.drift),
            (data.x.data_ptr(), tuple(data.x.shape), data.x.dtype, data.y.data_ptr(), tuple(data.y.shape)),
        )

    def run(self, path: FastPath, g: Group) -> None:
        """Train the group as ``path`` would (in place in ``g.p``): replayed, recorded then replayed, or eagerly."""
        key = self._key(path, g)
        entry = self.graphs.get(key)
        if entry is None and key not in self.seen:
            self.seen[key] = None
            while len(self.seen) > self.SEEN:
                self.seen.popitem(last=False)
            self.eager += 1
            return path(g)
        if entry is None:
            entry = self._record(path, g)
            self.graphs[key] = entry
            self.recorded += 1
            while len(self.graphs) > self.capacity:
                self.graphs.popitem(last=False)
        else:
            self.graphs.move_to_end(key)
            self.hits += 1
        graph, static = entry
        _copy_in(static.p, g.p)
        _copy_in(static.anchor, g.anchor)
        _copy_in(static.drift, g.drift)
        static.plan.index.copy_(g.plan.index)
        if g.plan.weight is not None:
            assert static.plan.weight is not None  # the key holds whether the plan has weights
            static.plan.weight.copy_(g.plan.weight)
        graph.replay()
        for n, t in g.p.items():
            t.copy_(static.p[n])

    @staticmethod
    def _record(path: FastPath, g: Group) -> tuple[torch.cuda.CUDAGraph, Group]:
        """The group's loop recorded on the recording's own input tensors (the key's second sighting)."""
        clone = lambda d: None if d is None else {n: t.clone() for n, t in d.items()}
        weight = None if g.plan.weight is None else g.plan.weight.clone()
        plan = dataclasses.replace(g.plan, index=g.plan.index.clone(), weight=weight)  # a ShrinkingPlan keeps ``live``
        static = g._replace(
            p={n: t.clone() for n, t in g.p.items()}, plan=plan, anchor=clone(g.anchor), drift=clone(g.drift)
        )
        side = torch.cuda.Stream()  # a warm-up on a side stream first, as torch's CUDA graph notes ask
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            path(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            path(static)
        return graph, static


def _copy_in(static: Params | None, given: Params | None) -> None:
    if static is not None:
        assert given is not None  # a static copy is recorded for what the call was given
        for n, t in static.items():
            t.copy_(given[n])
