"""The per-client loop executor: one ``nn.Module`` and one ``torch.optim.SGD`` per client, a Python loop over
clients and steps. Obviously right, slow; the float64 reference the stacked paths are tested against, and the
executor for any model (BatchNorm included) and any objective."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fedlib.data.federated import BatchPlan, Split
from fedlib.executors import evaluation
from fedlib.executors.objectives import CrossEntropy, Objective
from fedlib.executors.sgd import LocalSGD, Params, RunsSGD, _check, client_opt


class ModuleForward:
    """``forward`` for objectives on the loop path: the module holds the parameters (``params`` is its own
    ``named_parameters()``), input gradients by ``torch.autograd.grad(..., create_graph=True)``. An objective that
    substitutes some of them (FedRep's ``FrozenParts`` holds a part constant with ``detach``) is run on what it
    passes (``functional_call``), as on the stacked executor; the module's own buffers are used and updated."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.own = dict(module.named_parameters())  # load_state_dict copies into these: they stay the module's

    def __call__(self, params, x):
        if len(params) == len(self.own) and all(params.get(n) is p for n, p in self.own.items()):
            return self.module(x)
        return torch.func.functional_call(self.module, params, (x,), strict=False)

    @staticmethod
    def input_grad(fn, z):
        if not z.requires_grad:
            z = z.requires_grad_(True)
        value, aux = fn(z)
        (g,) = torch.autograd.grad(value, z, create_graph=True)
        return g, aux


def _as_inputs(x: torch.Tensor, dtype) -> torch.Tensor:
    return x.to(dtype) if x.is_floating_point() else x


class LoopExecutor:
    """Per-client reference: ``nn.Module`` + ``torch.optim.SGD``, one client after another."""

    name = "loop"

    def evaluate(
        self, model: nn.Module, params: Params, split: Split, per_client: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(correct, loss sum, rows) per client of ``split`` (``fedlib.executors.evaluation.evaluate``)."""
        return evaluation.evaluate(model, params, split, per_client)

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
        """Client i minimises ``objective`` (default: mean cross-entropy) plus the generic terms: weight decay and
        momentum (``torch.optim.SGD``), mu/2 ||w - anchor_i||^2 (``opt.mu``) and <drift_i, w> (the constant
        drift_i added to every gradient: SCAFFOLD's c - c_i). ``opt`` a ``RunsSGD``: client i takes its run's."""
        _check(params, plan, anchor, opt)
        objective = CrossEntropy() if objective is None else objective
        dtype = next(model.parameters()).dtype  # load_state_dict copies into these tensors: their dtype stays
        forward = ModuleForward(model)

        def step_loss(module, trainable, s, i, keep):
            rows = plan.index[s, i]
            ctx = objective.context(s, i, dtype)
            if keep is not None:
                rows = rows[keep]
                ctx = {n: t[keep] for n, t in ctx.items()}
            return objective.loss(forward, trainable, _as_inputs(data.x[rows], dtype), data.y[rows], None, ctx)

        def generic_terms(trainable, i):
            """The gradients of <drift_i, w> (SCAFFOLD's c - c_i, FedDyn's -g_k) and of mu/2 ||w - anchor_i||^2,
            added to the data loss's in that order: drift_i, then mu (w - anchor_i), each rounded as autograd rounded
            them when they were terms of the loss (bit for bit: (mu / 2) (2 (w - a)) is mu (w - a) exactly, and the
            data loss's gradient plus one term adds the same two numbers in either order). With both terms (FedDyn)
            the order is the stacked update's (``sgd._sgd_update``: the drift first). Autograd through the
            terms would cost a few small operations per parameter tensor a step, forward and backward: for a conv
            model with dozens of tensors, a tenth or more of a pFedMe or Ditto round (``python -m benchmarks
            --e2e``)."""
            if drift is not None:
                names = [n for n in trainable if n in drift]
                _add_grads([trainable[n] for n in names], [drift[n][i] for n in names])
            mu = client_opt(opt, i).mu
            if mu:  # one call per operation for all tensors (torch.optim's foreach ops: the same arithmetic)
                assert anchor is not None  # ``_check``: a proximal term needs an anchor
                names = list(trainable)
                pull = torch._foreach_sub([trainable[n].detach() for n in names], [anchor[n][i] for n in names])
                torch._foreach_mul_(pull, mu)
                _add_grads([trainable[n] for n in names], pull)

        terms = generic_terms if drift is not None or any(o.mu for o in _opts(opt)) else None
        return self.each_client(model, params, plan, opt, step_loss, terms)

    @staticmethod
    def each_client(
        model: nn.Module, params: Params, plan: BatchPlan, opt: LocalSGD | RunsSGD, step_loss, terms=None
    ) -> Params:
        """The loop itself: client i loads its row of ``params`` into ``model`` and takes the plan's steps with
        ``torch.optim.SGD`` on ``step_loss(module, trainable, s, i, keep)``; ``keep`` masks the padded rows of
        step s (None: no padding). ``terms(trainable, i)``, if given, adds gradients after each backward pass."""
        out = {n: t.clone() for n, t in params.items()}
        module = model.train()
        for i in range(plan.index.shape[1]):
            module.load_state_dict({n: t[i] for n, t in params.items()})
            trainable = dict(module.named_parameters())
            o = client_opt(opt, i)
            sgd = torch.optim.SGD(trainable.values(), lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
            for s in range(plan.steps):
                if plan.active is not None and not bool(plan.active[s, i]):
                    continue  # this client has finished its epochs: it does not step
                keep = None if plan.weight is None else plan.weight[s, i] > 0
                loss = step_loss(module, trainable, s, i, keep)
                sgd.zero_grad(set_to_none=True)
                loss.backward()
                if terms is not None:
                    terms(trainable, i)
                sgd.step()
            for n, t in module.state_dict().items():
                out[n][i] = t.detach()
        return out


def _opts(opt: LocalSGD | RunsSGD) -> list[LocalSGD]:
    return [opt] if isinstance(opt, LocalSGD) else [o for *_, o in opt.parts]


def _add_grads(params: list[torch.Tensor], terms: Sequence[torch.Tensor]) -> None:
    """p.grad += g for every pair (p.grad = g where the data loss did not reach p), as autograd accumulates a second
    term."""
    reached = [j for j, p in enumerate(params) if p.grad is not None]
    if reached:  # the foreach ops refuse empty lists
        grads = [params[j].grad for j in reached]  # not None: ``reached``
        # mypy reads these grads as Optional and torch's foreach overloads take the terms for scalars
        torch._foreach_add_(grads, [terms[j] for j in reached])  # type: ignore[arg-type,misc]
    for j, p in enumerate(params):
        if p.grad is None:
            p.grad = terms[j].clone()
