"""pFedMe: Dinh et al., "Personalized Federated Learning with Moreau Envelopes", NeurIPS 2020 (Algorithm 1).

Each local step r of client i, on a fresh mini-batch D:
    theta_i ~= argmin_theta f_i(theta; D) + lambda/2 ||theta - w_i||^2     (K gradient steps, rate eta_p)
    w_i <- w_i - eta lambda (w_i - theta_i)
after R steps the client uploads w_i; the server sets
    w <- (1 - beta) w + beta sum_{i in S} (n_i / n_S) w_i.
Paper symbols -> ``RunConfig``: lambda -> ``lam``, K -> ``inner_steps``, eta_p -> ``personal_lr``,
eta -> ``lr``, beta -> ``beta``, R -> ``local_steps``, |D| -> ``batch_size``, S -> ``clients_per_round``.

As in pFedMe's code (GUIDE section 2), every client trains each round from the global model and
only the sampled ones are aggregated. The inner problem is solved by K steps of SGD with the
proximal pull toward w_i on the *same* mini-batch, which is exactly ``LocalSGD(eta_p, mu=lambda)``
run on a plan repeating that batch K times; theta_i carries over from one local step to the
next, as in the authors' code. The personalised model (PM) is theta_i after the last step
(``test_acc``); the global model (GM) is reported too (``gm_test_acc``).

``pfedme+mcsa`` (FedMCSA Table 2): the server's average is replaced by FedMCSA's attention
among the sampled clients; a sampled client starts its next round from its personalised W_i.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..data.federated import BatchPlan
from ..executors import LocalSGD
from ..stages import Algorithm, Mixing, UniformSelection, WeightedMean
from .fedmcsa import MCSAttention

USES = ("lr", "clients_per_round", "fraction", "lam", "inner_steps", "personal_lr", "beta")


@dataclass
class PFedMeClient:
    """pFedMe's client procedure over a plan of R steps; stores theta_i in ``state.extra['theta']``."""
    lr: float
    personal_lr: float
    lam: float
    inner_steps: int

    def __call__(self, executor, model, start, anchor, plan: BatchPlan, split, state, clients):
        w = {n: t.clone() for n, t in start.items()}
        theta = {n: t.clone() for n, t in start.items()}
        inner = LocalSGD(lr=self.personal_lr, mu=self.lam)
        for r in range(plan.steps):
            same_batch = plan.at_steps(torch.full((self.inner_steps,), r))  # K steps on batch r
            theta = executor.train(model, theta, same_batch, split, inner, anchor=w)
            for n, t in w.items():
                if t.is_floating_point():
                    if plan.active is None:
                        t.lerp_(theta[n], self.lr * self.lam)  # w - eta lambda (w - theta)
                    else:  # a client past the end of its epoch does not step
                        m = plan.active[r].view(-1, *([1] * (t.dim() - 1)))
                        t.copy_(torch.where(m, torch.lerp(t, theta[n], self.lr * self.lam), t))
        store = state.extra.setdefault("theta", {n: v.clone() for n, v in state.client_params.items()})
        for n, t in theta.items():
            store[n][clients] = t
        return w


@dataclass
class PFedMeServer:
    """Sample-weighted mean of the uploads, mixed into the old global model with beta."""
    beta: float

    def __call__(self, uploads, n_samples, clients) -> Mixing:
        m = WeightedMean("samples")(uploads, n_samples, clients)
        return Mixing(to_global=m.to_global, beta=self.beta)


def _client(cfg) -> PFedMeClient:
    return PFedMeClient(cfg.lr, cfg.personal_lr, cfg.lam, cfg.inner_steps)


def build(cfg) -> Algorithm:
    return Algorithm(name="pfedme", select=UniformSelection(cfg.clients_per_round, cfg.fraction),
                     local=LocalSGD(lr=cfg.lr), aggregate=PFedMeServer(cfg.beta), trains="all",
                     start="global", evaluate="personal", local_update=_client(cfg), personal_key="theta",
                     report_global=True)


def build_plus_mcsa(cfg) -> Algorithm:
    return Algorithm(name="pfedme+mcsa", select=UniformSelection(cfg.clients_per_round, cfg.fraction),
                     local=LocalSGD(lr=cfg.lr), aggregate=MCSAttention(cfg.sigma), trains="all",
                     start="personal", evaluate="personal", local_update=_client(cfg), personal_key="theta")
