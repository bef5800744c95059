"""Ditto: Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through Personalization", ICML 2021.

Algorithm 1, paper symbols -> ``RunConfig`` / state:
    w (global model), v_k (personalised)  -> the global model, ``PersonalModels.v`` (N, ...)
    lambda                                -> ``lam``
    eta (local step size)                 -> ``lr`` (also for v_k; the paper uses one step size)
    local updates / s personal steps      -> ``local_steps`` or ``local_epochs``, the same plan for both
Each selected client k
    1. updates the global objective from w^t with plain local SGD (FedAvg's client step) and uploads it;
    2. updates its personal model with the same number of steps on
           h_k(v; w^t) = F_k(v) + lambda/2 ||v - w^t||^2
       starting from its last v_k (the first time: the initial model).
The server averages the uploads as FedAvg. The personal models v_k are evaluated (``evaluate='personal'``);
the global model is reported beside them (``gm_*`` columns).

Choices: both updates draw the same mini-batches (the paper draws them independently; sharing them
halves the sampling and keeps the stacked and loop executors comparable); only the selected clients
update v_k (Algorithm 1 line 5). lambda -> infinity pins v_k to w^t: with lr * lambda = 1 one step gives
v = w^t - lr grad F_k(v_old) (tested). Parameters the engine keeps local (FedBN's BN, pFedLA's attention)
follow the same rule in both models.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fedlib.algorithms.fedavg import FedAvg
from fedlib.config.options import MethodOptions, option, register
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm, ClientWork, MethodState, Params


@dataclass(eq=False)
class PersonalModels(MethodState):
    """Ditto's v_k for every client (N, ...), starting at the initial model."""

    KEY = "ditto"
    v: Params

    def personal(self) -> Params:
        return self.v


@dataclass
class DittoClient:
    """The global path trains with the round's optimiser ``local``; the personal path with the same one and
    Ditto's proximal pull lam toward the received model."""

    lam: float

    def __call__(self, work: ClientWork) -> Params:
        uploaded = work.train(work.start)
        state, clients = work.state, work.clients
        v = PersonalModels.of(state, lambda: PersonalModels({n: t.clone() for n, t in state.client_params.items()})).v
        own = {n: t[clients] for n, t in v.items()}
        # v_k <- argmin F_k(v) + lam/2 ||v - w^t||^2, w^t the model the client received (``start``)
        personal = work.train(own, opt=dataclasses.replace(work.local, mu=self.lam), anchor=work.start)
        for n, t in personal.items():
            v[n][clients] = t
        return uploaded


@register
@dataclass(frozen=True)
class Ditto(MethodOptions):
    NAME = "ditto"
    lam: float = option(5.0, ge=0, doc="lambda: pull of the personal model toward the global one")

    def build(self, cfg: RunSpec) -> Algorithm:
        """FedAvg's round (selection, server mean) with Ditto's client procedure and the personal models evaluated."""
        return dataclasses.replace(
            FedAvg().build(cfg),
            name=self.NAME,
            local_update=DittoClient(self.lam),
            evaluate="personal",
            personal=PersonalModels,
            report_global=True,
        )
