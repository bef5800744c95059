"""Per-FedAvg: Fallah et al., "Personalized Federated Learning with Theoretical Guarantees: A Model-Agnostic
Meta-Learning Approach", NeurIPS 2020 (Algorithm 1, Sec. 5).

Each local step of a selected client, with independent mini-batches D, D', D'':
    w~ = w - alpha grad f(w; D)
    FO:  w <- w - beta grad f(w~; D')
    HF:  w <- w - beta (I - alpha H(w; D'')) grad f(w~; D'),
         H(w) v ~= [grad f(w + delta v) - grad f(w - delta v)] / (2 delta)   (the paper's Hessian-free estimate)
Server: FedAvg's sample-weighted average. Paper symbols -> ``RunConfig``: alpha -> ``lr``,
beta -> ``beta`` (pFedMe's code reuses the same argument), delta -> ``hf_delta``, tau -> ``local_steps``.

Every piece is one step of ``executor.train``: a gradient at p on a batch is p - SGD(p, lr=1),
so both executors run it. Evaluation (FedMCSA's comparison, via pFedMe's code): every client
adapts the global model with one step of SGD (rate alpha) on a mini-batch of its *training*
data, as the paper's evaluation (one step of gradient descent), and the adapted models are tested. pFedMe's code
(``UserPerAvg.train_one_step``) takes two steps instead, one at alpha and one at beta, each on a batch of the *test*
data, which leaks test labels; we do neither. ``test_acc`` is the adapted models', ``gm_test_acc`` the
global model's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fedlib.config.options import MethodOptions, option, register
from fedlib.core.protocols import Executor, RunSpec
from fedlib.core.stages import Algorithm, ClientWork, MethodState, Params, WeightedMean, local_sgd
from fedlib.core.state import State
from fedlib.data.federated import BatchPlan, Split, sample_steps
from fedlib.executors import LocalSGD


def _one_step(work: ClientWork, params: Params, s: int, lr: float) -> Params:
    return work.train(params, work.plan.at_steps(slice(s, s + 1)), LocalSGD(lr=lr))


def _grad(work: ClientWork, params: Params, s: int) -> Params:
    """grad f(params; batch s) as params - SGD(params, lr=1)."""
    out = _one_step(work, params, s, 1.0)
    return {n: params[n] - out[n] for n in params if params[n].is_floating_point()}


@dataclass
class PerFedAvgClient:
    """alpha is the run's lr, stepped on the engine's schedule (``local.lr``); beta is not scheduled."""

    beta: float
    hessian_free: bool = False
    delta: float = 1e-3

    def __call__(self, work: ClientWork) -> Params:
        per = 3 if self.hessian_free else 2
        alpha = work.local.lr
        w = {n: t.clone() for n, t in work.start.items()}
        for r in range(work.plan.steps // per):
            s = r * per
            w_tilde = _one_step(work, w, s, alpha)
            g = _grad(work, w_tilde, s + 1)
            if self.hessian_free:
                plus = {n: w[n] + self.delta * g[n] if n in g else w[n] for n in w}
                minus = {n: w[n] - self.delta * g[n] if n in g else w[n] for n in w}
                gp, gm = _grad(work, plus, s + 2), _grad(work, minus, s + 2)
                g = {n: g[n] - alpha * (gp[n] - gm[n]) / (2 * self.delta) for n in g}
            for n in g:
                w[n] = w[n] - self.beta * g[n]
        return w


@dataclass(eq=False)
class AdaptedModels(MethodState):
    """Every client's one-step adaptation of the global model (N, ...), made before each evaluation and evaluated."""

    KEY = "perfedavg"
    adapted: Params

    def personal(self) -> Params:
        return self.adapted


@dataclass
class AdaptBeforeEval:
    """Every client adapts the global model with one SGD step (rate alpha) on one training mini-batch."""

    alpha: float
    batch_size: int

    def __call__(
        self, executor: Executor, model: nn.Module, state: State, split: Split, generator: torch.Generator
    ) -> None:
        n = len(split.sizes)
        plan = sample_steps(split.layout(), torch.arange(n), 1, self.batch_size, generator)
        plan = BatchPlan(plan.index.to(split.x.device))
        g = {k: v.unsqueeze(0).expand(n, *v.shape).clone() for k, v in state.global_params.items()}
        state.extra[AdaptedModels.KEY] = AdaptedModels(executor.train(model, g, plan, split, LocalSGD(lr=self.alpha)))


def _build(cfg: RunSpec, name: str, beta: float, hessian_free: bool, delta: float = 1e-3) -> Algorithm:
    return Algorithm(
        name=name,
        local=local_sgd(cfg),
        aggregate=WeightedMean("samples"),
        local_update=PerFedAvgClient(beta, hessian_free, delta),
        batches_per_step=3 if hessian_free else 2,
        evaluate="personal",
        personal=AdaptedModels,
        report_global=True,
        before_eval=AdaptBeforeEval(cfg.local.lr, cfg.local.batch_size),
    )


_BETA: dict[str, Any] = dict(gt=0, doc="outer (meta) step size beta")


@register
@dataclass(frozen=True)
class PerFedAvg(MethodOptions):
    """First-order Per-FedAvg (alpha = ``lr``)."""

    NAME = "perfedavg"
    SGD_EXTRAS = False
    beta: float = option(1.0, **_BETA)

    def build(self, cfg: RunSpec) -> Algorithm:
        return _build(cfg, self.NAME, self.beta, False)


@register
@dataclass(frozen=True)
class PerFedAvgHF(MethodOptions):
    """Hessian-free Per-FedAvg."""

    NAME = "perfedavg-hf"
    SGD_EXTRAS = False
    beta: float = option(1.0, **_BETA)
    hf_delta: float = option(1e-3, gt=0, doc="finite-difference step delta")

    def build(self, cfg: RunSpec) -> Algorithm:
        return _build(cfg, self.NAME, self.beta, True, self.hf_delta)
