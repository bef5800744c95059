"""The stacked executor: all clients of a group take each local step together.

Parameters carry a leading client axis. Clients are processed in groups whose parameters fit in cache, running
all local steps of one group before the next (local steps of different clients never interact, so the order
across clients is free). Per group it takes the fast path registered for (the model's kernel, the objective's
type) (``executors.kernels``; ``executors.chain``: Flatten/Linear/ReLU chains with the cross-entropy or a MAFL
objective), else the generic path below: ``torch.func.vmap(grad(objective.loss))`` over ``functional_call``,
for any buffer-free model and any objective, followed by the same in-place SGD update.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedlib.data.federated import BatchPlan, ShrinkingPlan, Split, gather_rows
from fedlib.executors import evaluation
from fedlib.executors.graphs import GroupGraphs, graphs_from_env
from fedlib.executors.hardware import cache_bytes
from fedlib.executors.kernels import FastPath, Group, fast_path
from fedlib.executors.objectives import CrossEntropy, Objective
from fedlib.executors.sgd import LocalSGD, Params, RunsSGD, _check, _sgd_update, restrict
from fedlib.models.registry import kernel_of, linear_chain

# the cache one process's client groups may fill: half this machine's L3 for parameters and buffers (see
# ``StackedExecutor``); 16 MiB where the machine does not say
PROCESS_CACHE_BYTES = (cache_bytes(3) or 32 << 20) // 2
# a Linear chain's group: one step's mini-batch inputs within a core's own cache, its L2 (1 MiB where it is not said)
CORE_CACHE_BYTES = cache_bytes(2) or 1 << 20

STACKED_KERNELS = ("chain", "vmap")


class FunctionalForward:
    """``forward`` for objectives on the vmap path: ``functional_call`` with the given parameters, input gradients
    by ``torch.func.grad`` (composes with the outer ``grad`` over the parameters and ``vmap`` over clients)."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __call__(self, params, x):
        return torch.func.functional_call(self.model, params, (x,))

    @staticmethod
    def input_grad(fn, z):
        return torch.func.grad(fn, has_aux=True)(z)


class StackedExecutor:
    """All clients of a group take a step at once. ``group_bytes`` bounds a group's working set (default
    ``PROCESS_CACHE_BYTES``); ``max_group`` caps the clients of a group; ``kernel`` forces a path ("chain": the
    registered fast path, "vmap": the generic one; default: the model's own kernel, ``models.kernel_of``); ``graphs``:
    on a GPU, replay each client group's loop as a CUDA graph where it can (``executors.graphs``; None: as the
    ``FEDLIB_CUDA_GRAPHS`` environment variable says, off when unset).

    Groups of parameters and update buffers that fill about half the machine's L3 run fastest: smaller groups make
    the batched matmuls too thin, larger ones spill the shared L3 (``python -m benchmarks``; docs/performance.md).
    Hence the budget: half the L3, read from the machine (``PROCESS_CACHE_BYTES``), not a fixed size: a fixed one
    tuned on a CPU with a small L3 cuts the groups needlessly thin on one with a large L3. That budget is for one
    process. Processes training side by side share the L3, so a grid run with ``jobs`` worker processes gives each
    ``PROCESS_CACHE_BYTES / jobs`` (``make_executor(..., group_bytes=)``): two processes each filling the whole budget
    run markedly slower than with half of it each.
    The grouping changes no result on one thread: each client's matmuls have the same shapes in any group (groups
    of different sizes give bit-identical float32 parameters and metrics). With two threads a reduction may be split
    between the threads as the group's size says, which can move a float32 loss in its last digits.

    Small Linear chains have a second bound: a group's mini-batch inputs of one step within a core's L2
    (``CORE_CACHE_BYTES``, the L2 read from the machine). Many runs' Synthetic clients batched as one call
    (``fedlib.runs.batching``) train fastest in groups whose inputs of a step fill the L2 (neither the byte budget
    alone, which gives groups of all the clients, nor much smaller groups); models bounded by their parameters, as
    an MLP with momentum and mu, keep the groups the L3 budget gives.
    """

    name = "stacked"

    def evaluate(
        self, model: nn.Module, params: Params, split: Split, per_client: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(correct, loss sum, rows) per client of ``split`` (``fedlib.executors.evaluation.evaluate``)."""
        return evaluation.evaluate(model, params, split, per_client)

    def __init__(
        self,
        group_bytes: int | None = None,
        max_group: int | None = None,
        kernel: str | None = None,
        graphs: bool | None = None,
    ):
        self.group_bytes = PROCESS_CACHE_BYTES if group_bytes is None else group_bytes
        # CUDA graphs of the client groups' loops (``executors.graphs``); None: as FEDLIB_CUDA_GRAPHS says
        self.graphs = GroupGraphs() if (graphs_from_env() if graphs is None else graphs) else None
        self.max_group = max_group
        if kernel is not None and kernel not in STACKED_KERNELS:
            raise ValueError(f"StackedExecutor(kernel={kernel!r}): one of {', '.join(STACKED_KERNELS)} or None")
        self.kernel = kernel

    @staticmethod
    def supports(model: nn.Module) -> bool:
        return kernel_of(model) in STACKED_KERNELS

    def kernel_for(self, model: nn.Module) -> str:
        """The kernel this executor runs ``model`` under: the forced one, else the model's."""
        kernel = kernel_of(model)
        if kernel not in STACKED_KERNELS and self.kernel == "vmap":
            return "vmap-buffers"  # per-client buffers passed explicitly (``_vmap_buffers_path``), on request only
        if kernel not in STACKED_KERNELS:
            raise NotImplementedError(
                f"{type(model).__name__} has buffers (e.g. BatchNorm): use the loop executor, or "
                "StackedExecutor(kernel='vmap') (per-client buffers)"
            )
        if self.kernel is None:
            return kernel
        if self.kernel == "chain" and kernel != "chain":
            raise ValueError(
                f"StackedExecutor(kernel='chain'): {type(model).__name__} is not a Flatten/Linear/ReLU chain"
            )
        return self.kernel

    def group_size(
        self, model: nn.Module, k: int, plan: BatchPlan | None, opt: LocalSGD | RunsSGD, device: torch.device | str
    ) -> int:
        if self.max_group is not None:
            return max(1, min(k, self.max_group))
        if torch.device(device).type != "cpu":
            return k  # on a GPU the bigger the batched matmul the better
        per_client = sum(p.numel() * p.element_size() for p in model.parameters())
        copies = 2 + (opt.momentum > 0) + (opt.mu > 0)  # params, grads/update, momentum, anchor
        g = max(1, min(k, self.group_bytes // max(1, per_client * copies)))
        if plan is not None and kernel_of(model) == "chain":
            layers = linear_chain(model)
            assert layers is not None  # a "chain" model is a Linear chain
            first = model.get_submodule(layers[0]).weight  # (out, in)
            assert isinstance(first, torch.Tensor)
            g = max(1, min(g, CORE_CACHE_BYTES // (plan.index.shape[2] * first.shape[1] * first.element_size())))
        n_groups = -(-k // g)
        return -(-k // n_groups)  # equal groups: 20 clients as 10 + 10, not 17 + 3 (a thin group is slow)

    def train(
        self,
        model: nn.Module,
        params: Params,
        plan: BatchPlan,
        data: Split,
        opt: LocalSGD | RunsSGD,
        anchor: Params | None = None,
        drift: Params | None = None,
        *,
        objective: Objective | None = None,
    ) -> Params:
        """Every client minimises ``objective`` (default: mean cross-entropy) plus the generic terms (weight decay,
        momentum, mu/2 ||w - anchor_i||^2, the constant ``drift`` added to every gradient): what
        ``LoopExecutor.train`` computes, in client groups. ``opt``: one ``LocalSGD`` for all clients, or a
        ``RunsSGD`` (several runs' clients side by side, each run its own)."""
        k = _check(params, plan, anchor, opt)
        objective = CrossEntropy() if objective is None else objective
        kernel = self.kernel_for(model)
        path = _vmap_buffers_path if kernel == "vmap-buffers" else (fast_path(kernel, objective) or _vmap_path)
        if plan.active is not None:
            return self._train_shrinking(model, params, plan, data, opt, anchor, drift, objective, path)
        out = {n: t.clone() for n, t in params.items()}
        dev = next(iter(out.values())).device
        g = self.group_size(model, k, plan, opt, dev)
        for a in range(0, k, g):
            sl = slice(a, min(k, a + g))
            p = {n: t[sl] for n, t in out.items()}  # views: updates land in ``out``
            anc = None if anchor is None else {n: t[sl] for n, t in anchor.items()}
            dr = None if drift is None else {n: t[sl] for n, t in drift.items()}
            self._group(path, Group(model, p, plan.clients(sl), data, restrict(opt, sl), anc, dr, objective, sl))
        return out

    def _group(self, path: FastPath, g: Group) -> None:
        """One client group through ``path``, replayed as a CUDA graph where this executor records them."""
        if self.graphs is not None and GroupGraphs.eligible(path, g.plan, g.opt, g.objective, g.p):
            return self.graphs.run(path, g)
        path(g)

    def _train_shrinking(self, model, params, plan, data, opt, anchor, drift, objective, path) -> Params:
        """A plan with inactive steps (epoch-based training of unequal clients): no work for them.

        Each client's active steps are moved to the front, in their order (``ShrinkingPlan``), and the clients are
        sorted by their number of active steps, largest first; groups are cut from that order (clients of similar
        step counts together) and, within a group, step s runs the clients that still have a step s: a prefix of the
        group, so every tensor of the step is a view of the group's leading rows. A client's computation is the one
        it had in lock-step (same batches in the same order, same update arithmetic): local steps of different
        clients never interact. The work is each client's own steps, not the largest client's."""
        act = plan.active.cpu()
        count = act.sum(0)
        order = torch.argsort(count, descending=True, stable=True)
        steps = torch.arange(act.shape[0])
        # src[j, i]: the plan step of the j-th active step of client order[i] (inactive steps sort last)
        src = torch.where(act, steps[:, None], act.shape[0]).sort(dim=0).values[:, order]
        src.clamp_(max=act.shape[0] - 1)
        count = count[order]
        dev = plan.index.device
        src_d, order_d = src.to(dev), order.to(dev)
        index = plan.index[src_d, order_d[None, :]]
        weight = None if plan.weight is None else plan.weight[src_d, order_d[None, :]]
        pick = lambda d: None if d is None else {n: t[order_d] for n, t in d.items()}
        out = {n: t[order_d] for n, t in params.items()}  # gathers: copies in the sorted order
        anchor, drift = pick(anchor), pick(drift)
        opt = restrict(opt, order)
        k = len(order)
        g = self.group_size(model, k, plan, opt, index.device)
        for a in range(0, k, g):
            sl = slice(a, min(k, a + g))
            n_steps = int(count[a])
            if n_steps == 0:
                break  # sorted: the rest have no step either
            live = tuple(int(c) for c in (count[sl, None] > torch.arange(n_steps)[None, :]).sum(0))
            sub = ShrinkingPlan(
                index[:n_steps, sl],
                None if weight is None else weight[:n_steps, sl],
                live=live,
                src=src_d[:n_steps, sl],
            )
            p = {n: t[sl] for n, t in out.items()}
            anc = None if anchor is None else {n: t[sl] for n, t in anchor.items()}
            dr = None if drift is None else {n: t[sl] for n, t in drift.items()}
            self._group(path, Group(model, p, sub, data, restrict(opt, sl), anc, dr, objective, order_d[sl]))
        result = {n: torch.empty_like(t) for n, t in params.items()}
        for n, t in out.items():
            result[n][order_d] = t
        return result


def _vmap_path(g: Group) -> None:
    """Any buffer-free model, any objective: ``vmap(grad(objective.loss))`` over ``functional_call``."""
    model, p, plan, data, opt, anchor, drift, objective, clients = g
    from torch.func import grad, vmap

    names = [n for n, _ in model.named_parameters()]
    forward = FunctionalForward(model)
    model.train()

    def loss(params, x, y, w, ctx):
        return objective.loss(forward, params, x, y, w, ctx)

    g_fn = vmap(grad(loss), randomness="different")  # dropout (FedMix CNN): independent masks per client
    G, B = plan.index.shape[1], plan.index.shape[2]
    dtype = p[names[0]].dtype
    bufs = {n: torch.zeros_like(p[n]) for n in names} if opt.momentum else None
    ones = torch.ones(G, B, dtype=dtype, device=p[names[0]].device)
    for s in range(plan.steps):
        k = plan.live_at(s)  # the clients of this step: the group's first k (all G but in a shrinking plan)
        rows = plan.index[s, :k]
        x = gather_rows(data.x, rows).to(dtype)
        y = gather_rows(data.y, rows)
        w = ones[:k] if plan.weight is None else plan.weight[s, :k].to(dtype)
        grads = g_fn({n: p[n][:k] for n in names}, x, y, w, plan.context(objective, s, clients, k, dtype))
        act = None if plan.active is None else plan.active[s]
        for n in names:
            a = None if anchor is None or not opt.mu else anchor[n][:k]
            c = None if drift is None or n not in drift else drift[n][:k]
            _sgd_update(p[n][:k], grads[n], None if bufs is None else bufs[n][:k], a, opt, act, c)


def _vmap_buffers_path(g: Group) -> None:
    """Models with buffers (BatchNorm: pFedLA's LeNet-BN, AlexNet-BN, MobileNetV2, FedBN's local statistics):
    ``vmap(grad(objective.loss))`` over ``functional_call(model, (parameters, buffers))`` with every client's own
    buffers, which BatchNorm updates in place (running mean and variance, ``num_batches_tracked``) per client.

    Batch statistics are over a client's real rows only, as the loop's ``rows[keep]``: at a step where some clients
    have a short batch (the last of an epoch), the clients with a full batch step together and each short one
    steps alone on its own rows. Selected with ``StackedExecutor(kernel="vmap")``; ``make_executor("auto")`` keeps
    such models on the loop (whose float32 results the stored runs hold)."""
    from torch.func import grad, vmap

    model, p, plan, data, opt, anchor, drift, objective, clients = g

    names = [n for n, _ in model.named_parameters()]
    bnames = [n for n, _ in model.named_buffers()]
    forward = FunctionalForward(model)
    model.train()

    def loss(params, buffers, x, y, w, ctx):
        return objective.loss(forward, {**params, **buffers}, x, y, w, ctx)

    g_fn = vmap(grad(loss), randomness="different")
    dtype = p[names[0]].dtype
    bufs = {n: torch.zeros_like(p[n]) for n in names} if opt.momentum else None

    def step(J, rows, w, ctx):
        """One step of the clients ``J`` (a slice: views, updated in place; or an index tensor: gathered, then
        written back) on ``rows`` (|J|, b) with row weights ``w``."""
        take = lambda t: None if t is None else t[J]
        o = opt if isinstance(J, slice) else restrict(opt, J)  # a slice is the group's first k: the update cuts it
        pp, bb = {n: p[n][J] for n in names}, {n: p[n][J] for n in bnames}
        mom = {n: take(None if bufs is None else bufs[n]) for n in names}
        x = gather_rows(data.x, rows).to(dtype)
        y = gather_rows(data.y, rows)
        grads = g_fn(pp, bb, x, y, w, ctx)  # BatchNorm updates bb in place, per client
        for n in names:
            a = None if anchor is None or not opt.mu else take(anchor[n])
            c = None if drift is None or n not in drift else take(drift[n])
            _sgd_update(pp[n], grads[n], mom[n], a, o, None, c)
        if not isinstance(J, slice):
            for n in names:
                p[n][J] = pp[n]
                m = mom[n]
                if bufs is not None and m is not None:  # mom holds bufs' rows where there are buffers
                    bufs[n][J] = m
            for n in bnames:
                p[n][J] = bb[n]

    assert plan.active is None  # ``train`` hands plans with idle clients over as shrinking plans
    for s in range(plan.steps):
        k = plan.live_at(s)  # the clients of this step: the group's first k
        rows, ctx = plan.index[s, :k], plan.context(objective, s, clients, k, dtype)
        keep = None if plan.weight is None else plan.weight[s, :k] > 0
        short = [] if keep is None else (~keep.all(1)).cpu().nonzero().flatten().tolist()
        if not short:
            step(slice(0, k), rows, torch.ones(rows.shape, dtype=dtype, device=rows.device), ctx)
            continue
        assert keep is not None  # short batches come from a plan's weights
        J = keep.all(1).nonzero().flatten()  # the full batches together
        if len(J):
            step(
                J,
                rows[J],
                torch.ones(rows[J].shape, dtype=dtype, device=rows.device),
                {n: t[J] for n, t in ctx.items()},
            )
        for j in short:  # the short batches (an epoch's last) alone, on their own rows
            r = rows[j][keep[j]][None]
            one = torch.ones(r.shape, dtype=dtype, device=r.device)
            step(torch.tensor([j], device=r.device), r, one, {n: t[j : j + 1][:, keep[j]] for n, t in ctx.items()})
