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
so both executors run it. Evaluation (``adapt_eval``; FedMCSA's comparison runs pFedMe's code):
- ``'paper'`` (the default: every stored run): every client adapts the global model with one step of SGD (rate
  alpha) on a mini-batch of its *training* data, as the paper's evaluation (one step of gradient descent), and the
  adapted models are tested.
- ``'code'``: what pFedMe's code does (``UserPerAvg.train_one_step``, called by ``evaluate_one_step`` on every
  client): two plain SGD steps from the global model, the first at alpha, the second at beta from the first's
  result (no meta-gradient: the model is not restored between them), each on a mini-batch of the client's *test*
  data, so the scored model has seen test labels. The code walks the unshuffled test set batch by batch; here the
  two batches are drawn at random from the client's test rows (with replacement, as training's), from the
  evaluation stream. A client without test rows is scored on none, so its adapted model does not count; a data set
  with no client test rows at all (AdaFL's setting) is refused.
``test_acc`` is the adapted models', ``gm_test_acc`` the global model's.
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
from fedlib.data.federated import BatchPlan, FederatedData, Split, sample_steps
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


ADAPT_EVAL = ("paper", "code")


@dataclass
class AdaptBeforeEval:
    """Every client adapts the global model before it is scored: ``mode='paper'``, one SGD step (rate alpha) on one
    training mini-batch; ``mode='code'``, pFedMe's code's two SGD steps, at alpha then at beta, each on one mini-batch
    of the client's test rows (module docstring)."""

    alpha: float
    batch_size: int
    beta: float = 0.0  # the second step's rate under mode='code'
    mode: str = "paper"

    def __call__(
        self, executor: Executor, model: nn.Module, state: State, data: FederatedData, generator: torch.Generator
    ) -> None:
        self.apply(executor, model, state, data, self.draw(data, generator))

    def _split(self, data: FederatedData) -> Split:
        if self.mode not in ADAPT_EVAL:
            raise ValueError(f"AdaptBeforeEval.mode={self.mode!r} is not one of: {', '.join(ADAPT_EVAL)}")
        return data.train if self.mode == "paper" else data.test

    def draw(self, data: FederatedData, generator: torch.Generator) -> BatchPlan:
        """The adaptation's mini-batches (steps, N, B) from ``generator``, each client's rows numbered within its own
        rows of the split it adapts on; ``data`` may hold only the splits' sizes (``Split.layout``)."""
        split = self._split(data)
        if self.mode == "code" and int(split.sizes.sum()) == 0:
            raise ValueError(
                "adapt_eval='code' adapts on the clients' test rows, and this data set has none "
                "(use adapt_eval='paper', which adapts on training rows)"
            )
        own = Split(split.x[:0], split.y[:0], torch.zeros_like(split.sizes.cpu()), split.sizes.cpu())
        return sample_steps(own, torch.arange(len(split.sizes)), 1 if self.mode == "paper" else 2, self.batch_size,
                            generator)  # fmt: skip

    def apply(self, executor: Executor, model: nn.Module, state: State, data: FederatedData, plan: BatchPlan) -> None:
        """Every client of ``data`` adapts the global model on its rows of ``plan`` (``draw``'s)."""
        split = self._split(data)
        n, steps = len(split.sizes), plan.steps
        # a client without test rows draws a row not its own: it is scored on none
        index = (plan.index + split.offsets.cpu()[None, :, None]).clamp_min(0)
        plan = BatchPlan(index.to(split.x.device))
        p = {k: v.unsqueeze(0).expand(n, *v.shape).clone() for k, v in state.global_params.items()}
        for s, lr in zip(range(steps), (self.alpha, self.beta)):
            p = executor.train(model, p, plan.at_steps(slice(s, s + 1)), split, LocalSGD(lr=lr))
        state.extra[AdaptedModels.KEY] = AdaptedModels(p)


def _build(
    cfg: RunSpec, name: str, beta: float, hessian_free: bool, delta: float = 1e-3, adapt_eval: str = "paper"
) -> Algorithm:
    return Algorithm(
        name=name,
        local=local_sgd(cfg),
        aggregate=WeightedMean("samples"),
        local_update=PerFedAvgClient(beta, hessian_free, delta),
        batches_per_step=3 if hessian_free else 2,
        evaluate="personal",
        personal=AdaptedModels,
        report_global=True,
        before_eval=AdaptBeforeEval(cfg.local.lr, cfg.local.batch_size, beta, adapt_eval),
    )


_BETA: dict[str, Any] = dict(gt=0, doc="outer (meta) step size beta")
_ADAPT: dict[str, Any] = dict(
    choices=ADAPT_EVAL,
    doc="the adaptation before scoring: 'paper', one SGD step at alpha on a training batch (the paper's), or "
    "'code', two SGD steps (alpha, then beta) on test batches (what pFedMe's code does)",
)


@register
@dataclass(frozen=True)
class PerFedAvg(MethodOptions):
    """First-order Per-FedAvg (alpha = ``lr``)."""

    NAME = "perfedavg"
    SGD_EXTRAS = False
    beta: float = option(1.0, **_BETA)
    adapt_eval: str = option("paper", **_ADAPT)

    def build(self, cfg: RunSpec) -> Algorithm:
        return _build(cfg, self.NAME, self.beta, False, adapt_eval=self.adapt_eval)


@register
@dataclass(frozen=True)
class PerFedAvgHF(MethodOptions):
    """Hessian-free Per-FedAvg."""

    NAME = "perfedavg-hf"
    SGD_EXTRAS = False
    beta: float = option(1.0, **_BETA)
    hf_delta: float = option(1e-3, gt=0, doc="finite-difference step delta")
    adapt_eval: str = option("paper", **_ADAPT)

    def build(self, cfg: RunSpec) -> Algorithm:
        return _build(cfg, self.NAME, self.beta, True, self.hf_delta, self.adapt_eval)
