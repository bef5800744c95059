"""FedMCSA: Guo et al., "FedMCSA: Personalized Federated Learning via Model Components Self-Attention".

Algorithm 1, paper symbols -> ``RunConfig`` fields:
    N clients, S sampled per round       -> ``n_clients``, ``clients_per_round``
    R local steps, |D| batch, eta        -> ``local_steps``, ``batch_size``, ``lr``
    sigma (attention scale), lambda      -> ``sigma``, ``lam``
    T rounds                             -> ``rounds``

Every round the server runs model-components self-attention (``attention.mcsa_weights``,
Eq. 6-7) among the S sampled clients' models and sends each its personalised model W_i;
every client (all N) then takes R SGD steps on f_i(Theta) + lambda/2 ||Theta - W_local||^2,
starting from W_i if it just received one (else from its own Theta_i), where W_local is the
last W_i it received (lines 5-14). The personalised models Theta_i are evaluated.

Order of stages: the paper's round t attends over Theta^{t-1} and then trains; ours trains and
then attends over Theta^t, which is the same sequence shifted by half a round (the paper's
first attention acts on identical initial models and is the identity). It is also the order of
the authors' code (train all, select, evaluate personalised, aggregate).

Variants (Table 2 and the authors'-code switch), each registered under its own name:
- ``fedmcsa-mcsa`` (FedMCSA^{-MCSA}): attention replaced by averaging: every sampled client
  receives the equal-weight mean of the sampled models (what sigma = 0 gives; with lambda = 0
  and full participation this is FedAvg with equal weights, tested).
- ``fedavg+mcsa`` (FedAvg^{+MCSA}): FedAvg's clients (only the sampled train, plain SGD) with
  the server's averaging replaced by the attention; each client keeps its personalised model.
- ``mcsa_code=True``: "as in the authors' code": attention rows multiplied by the sampled
  clients' data-size shares and renormalised, and no effective proximal term (their anchor is
  overwritten with the current weights each step, so local training is plain SGD). The
  authors' code also uses sigma = 1000 and lambda = 15 by default; set those explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..attention import mcsa_weights
from ..options import MethodOptions, option, register
from ..stages import Algorithm, Mixing, local_sgd


@dataclass
class MCSAttention:
    """Aggregator: per-component attention among the uploads -> personalised models (``Mixing.to_personal``)."""

    sigma: float
    by_data_size: bool = False

    def __call__(self, uploads, n_samples: torch.Tensor, clients: np.ndarray) -> Mixing:
        return Mixing(to_personal=mcsa_weights(uploads, self.sigma, n_samples if self.by_data_size else None))


@dataclass
class UniformToPersonal:
    """Aggregator: every uploader receives the equal-weight mean of the uploads (FedMCSA^{-MCSA})."""

    def __call__(self, uploads, n_samples: torch.Tensor, clients: np.ndarray) -> Mixing:
        k = len(clients)
        return Mixing(to_personal=torch.full((k, k), 1.0 / k, dtype=torch.float64))


def _fedmcsa_round(cfg, name: str, lam: float, mcsa_code: bool, aggregate) -> Algorithm:
    """Algorithm 1's round with a given server aggregation: all clients train, prox toward the last W_i
    (no effective prox "as in the authors' code")."""
    return Algorithm(
        name=name,
        local=local_sgd(cfg, mu=0.0 if mcsa_code else lam),
        aggregate=aggregate,
        trains="all",
        start="personal",
        anchor="received",
        evaluate="personal",
    )


_SIGMA = dict(ge=0, doc="attention scale sigma (FedMCSA default 50)")
_LAM = dict(ge=0, doc="client proximal strength lambda (FedMCSA default 5)")
_CODE = dict(doc="as in the authors' code: data-size reweighting, no effective prox")


@register
@dataclass(frozen=True)
class FedMCSA(MethodOptions):
    NAME = "fedmcsa"
    sigma: float = option(50.0, **_SIGMA)
    lam: float = option(5.0, **_LAM)
    mcsa_code: bool = option(False, **_CODE)

    def build(self, cfg) -> Algorithm:
        return _fedmcsa_round(cfg, self.NAME, self.lam, self.mcsa_code, MCSAttention(self.sigma, self.mcsa_code))


@register
@dataclass(frozen=True)
class FedMCSAMinusMCSA(MethodOptions):
    """FedMCSA^{-MCSA}: no attention, so no sigma."""

    NAME = "fedmcsa-mcsa"
    lam: float = option(5.0, **_LAM)
    mcsa_code: bool = option(False, **_CODE)

    def build(self, cfg) -> Algorithm:
        return _fedmcsa_round(cfg, self.NAME, self.lam, self.mcsa_code, UniformToPersonal())


@register
@dataclass(frozen=True)
class FedAvgPlusMCSA(MethodOptions):
    """FedAvg^{+MCSA}: FedAvg's clients (plain SGD, only the sampled train), the server's attention."""

    NAME = "fedavg+mcsa"
    sigma: float = option(50.0, **_SIGMA)

    def build(self, cfg) -> Algorithm:
        return Algorithm(
            name=self.NAME,
            local=local_sgd(cfg),
            aggregate=MCSAttention(self.sigma),
            trains="selected",
            start="personal",
            evaluate="personal",
        )
