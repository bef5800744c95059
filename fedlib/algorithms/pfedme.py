"""pFedMe: Dinh et al., "Personalized Federated Learning with Moreau Envelopes", NeurIPS 2020 (Algorithm 1).

Each local step r of client i, on a fresh mini-batch D:
    theta_i ~= argmin_theta f_i(theta; D) + lambda/2 ||theta - w_i||^2     (K gradient steps, rate eta_p)
    w_i <- w_i - eta lambda (w_i - theta_i)
after R steps the client uploads w_i; the server sets
    w <- (1 - beta) w + beta sum_{i in S} (n_i / n_S) w_i.
Algorithm 1 averages the uploads uniformly (1 / S); the weights n_i / n_S are those of pFedMe's code
(``persionalized_aggregate_parameters`` weighs each sampled user by ``train_samples / total_train``, the uniform line
commented out), whose comparisons FedMCSA's code forks. The two differ as client sizes do (FedMCSA's Synthetic:
187 to 19,357 training samples a client; its MNIST: 1,523 to 4,634).
Paper symbols -> ``RunConfig``: lambda -> ``lam``, K -> ``inner_steps``, eta_p -> ``personal_lr``,
eta -> ``lr``, beta -> ``beta``, R -> ``local_steps``, |D| -> ``batch_size``, S -> ``clients_per_round``.

As in pFedMe's code, every client trains each round from the global model and
only the sampled ones are aggregated. The inner problem is solved by K steps of SGD with the
proximal pull toward w_i on the *same* mini-batch, which is exactly ``LocalSGD(eta_p, mu=lambda)``
run on a plan repeating that batch K times; theta_i carries over from one local step to the
next, as in the authors' code. That code's inner optimiser (``pFedMeOptimizer``) also adds a weight decay of
``mu = 0.001`` to each inner step (its default, which the users keep); the paper's inner problem has none, nor
do these runs (``weight_decay`` is refused here: ``SGD_EXTRAS = False``). The personalised model (PM) is by default theta_i
after the last step (``test_acc``); the global model (GM) is reported too (``gm_test_acc``).

Which model is scored as "personalised" (``personal_eval``). The paper's PM is theta_i, the solution of the
personalised problem (``'theta'``, the default: every stored run). pFedMe's code scores the local model w_i instead:
its inner optimiser's step returns the model's own parameter tensors, kept as ``persionalized_model_bar``, and the
client's last act (``update_parameters(self.local_model)``) writes w_i into those very tensors, so
``evaluate_personalized_model`` tests w_i after the round's R steps (before aggregation; all clients train).
``personal_eval='local'`` scores that: every client's trained w_i (``client_params``), theta_i not kept.

``pfedme+mcsa`` (FedMCSA Table 2): the server's average is replaced by FedMCSA's attention
among the sampled clients; a sampled client starts its next round from its personalised W_i.
``by_data_size=True`` is its "as in the authors' code" reading: the attention rows reweighted by the sampled
clients' data-size shares and renormalised, as the FedMCSA code's one aggregation routine does for every Table 2
row (``fedlib.algorithms.fedmcsa``). The other switch of ``fedmcsa``'s ``mcsa_code``, dropping the proximal anchor
toward the received model, has no counterpart here: pFedMe's clients pull toward their own local w_i (the Moreau
envelope, pFedMe's method, which the code keeps), so the reweighting alone is the code's reading.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedlib.algorithms.fedmcsa import _COMPONENT, _PLUS_BY_SIZE, MCSAttention
from fedlib.config.options import MethodOptions, option, register
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm, ClientWork, MethodState, Mixing, Params, WeightedMean, local_sgd
from fedlib.executors import LocalSGD


@dataclass(eq=False)
class PersonalizedModels(MethodState):
    """pFedMe's theta_i for every client (N, ...): the personalised models (PM) evaluated."""

    KEY = "pfedme"
    theta: Params

    def personal(self) -> Params:
        return self.theta


@dataclass
class PFedMeClient:
    """pFedMe's client procedure over a plan of R steps; keeps theta_i in ``PersonalizedModels``."""

    personal_lr: float
    lam: float
    inner_steps: int
    keep_theta: bool = True  # False: theta_i is not scored (``personal_eval='local'``), so not kept either

    def __call__(self, work: ClientWork) -> Params:
        plan, state = work.plan, work.state
        w = {n: t.clone() for n, t in work.start.items()}
        theta = {n: t.clone() for n, t in work.start.items()}
        inner = LocalSGD(lr=self.personal_lr, mu=self.lam)
        step = work.local.lr * self.lam  # eta_t lambda (the round's lr; eta_p is not scheduled)
        for r in range(plan.steps):
            same_batch = plan.at_steps(torch.full((self.inner_steps,), r))  # K steps on batch r
            theta = work.train(theta, same_batch, inner, anchor=w)
            for n, t in w.items():
                if t.is_floating_point():
                    if plan.active is None:
                        t.lerp_(theta[n], step)  # w - eta lambda (w - theta)
                    else:  # a client past the end of its epoch does not step
                        m = plan.active[r].view(-1, *([1] * (t.dim() - 1)))
                        t.copy_(torch.where(m, torch.lerp(t, theta[n], step), t))
        if not self.keep_theta:
            return w
        store = PersonalizedModels.of(
            state, lambda: PersonalizedModels({n: v.clone() for n, v in state.client_params.items()})
        ).theta
        for n, t in theta.items():
            store[n][work.clients] = t
        return w


@dataclass
class PFedMeServer:
    """Sample-weighted mean of the uploads, mixed into the old global model with beta."""

    beta: float

    def __call__(self, uploads: Params, n_samples: torch.Tensor, clients: np.ndarray) -> Mixing:
        m = WeightedMean("samples")(uploads, n_samples, clients)
        return Mixing(to_global=m.to_global, beta=self.beta)


_LAM: dict[str, Any] = dict(ge=0, doc="lambda: strength of the Moreau envelope's pull")
_K: dict[str, Any] = dict(ge=1, doc="K steps solving the personalised problem")
_ETA_P: dict[str, Any] = dict(gt=0, doc="personal learning rate eta_p")
_EVAL: dict[str, Any] = dict(
    choices=("theta", "local"),
    doc="the model scored as personalised (test_acc): 'theta', the personal theta_i (the paper's PM), or 'local', "
    "the local model w_i (what pFedMe's code scores)",
)


def _client(opts: PFedMe | PFedMePlusMCSA) -> PFedMeClient:
    return PFedMeClient(opts.personal_lr, opts.lam, opts.inner_steps, keep_theta=opts.personal_eval == "theta")


def _personal(opts: PFedMe | PFedMePlusMCSA) -> type[PersonalizedModels] | None:
    """The method state whose models are scored: theta_i, or none (the clients' own trained w_i)."""
    return PersonalizedModels if opts.personal_eval == "theta" else None


@register
@dataclass(frozen=True)
class PFedMe(MethodOptions):
    NAME = "pfedme"
    SGD_EXTRAS = False  # its steps are the Moreau-envelope updates, no momentum or weight decay
    lam: float = option(5.0, **_LAM)
    inner_steps: int = option(5, **_K)
    personal_lr: float = option(0.01, **_ETA_P)
    beta: float = option(1.0, ge=0, doc="server mixing beta (1: plain average)")
    personal_eval: str = option("theta", **_EVAL)

    def build(self, cfg: RunSpec) -> Algorithm:
        return Algorithm(
            name=self.NAME,
            local=local_sgd(cfg),
            aggregate=PFedMeServer(self.beta),
            trains="all",
            start="global",
            evaluate="personal",
            local_update=_client(self),
            personal=_personal(self),
            report_global=True,
        )


@register
@dataclass(frozen=True)
class PFedMePlusMCSA(MethodOptions):
    """pFedMe^{+MCSA}: the server's average replaced by FedMCSA's attention (so no beta); ``by_data_size``: the
    attention as in the authors' code; ``personal_eval``: as on ``pfedme`` (module docstring)."""

    NAME = "pfedme+mcsa"
    SGD_EXTRAS = False
    lam: float = option(5.0, **_LAM)
    inner_steps: int = option(5, **_K)
    personal_lr: float = option(0.01, **_ETA_P)
    sigma: float = option(50.0, ge=0, doc="FedMCSA's attention scale sigma")
    by_data_size: bool = option(False, **_PLUS_BY_SIZE)
    component: str = option("tensor", **_COMPONENT)
    personal_eval: str = option("theta", **_EVAL)

    def build(self, cfg: RunSpec) -> Algorithm:
        return Algorithm(
            name=self.NAME,
            local=local_sgd(cfg),
            aggregate=MCSAttention(self.sigma, self.by_data_size, self.component),
            trains="all",
            start="personal",
            evaluate="personal",
            local_update=_client(self),
            personal=_personal(self),
            traces=("attention",),
        )
