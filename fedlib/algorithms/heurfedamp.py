"""HeurFedAMP: Huang et al., "Personalized Cross-Silo Federated Learning on Non-IID Data", AAAI 2021 (Sec. 4.3).

The server builds client i's cloud model u_i = xi_ii w_i + sum_{j != i} xi_ij w_j, with
xi_ij proportional to exp(sigma cos(w_i, w_j)) over the other sampled clients and normalised
to 1 - xi_ii (``attention.heurfedamp_weights``, whole flattened models); clients train with
the proximal pull lambda/2 ||w - u_i||^2 toward the last u_i they received, as in FedMCSA,
so the two differ only in the attention (FedMCSA Sec. 4 compares exactly this).
Paper symbols -> ``RunConfig``: sigma -> ``sigma``, xi_ii -> ``amp_self_weight``, lambda -> ``lam``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedlib.config.options import MethodOptions, option, register
from fedlib.core.attention import heurfedamp_weights
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Aggregate, Algorithm, Mixing, Params, local_sgd
from fedlib.executors.sgd import LocalSGD


@dataclass
class WholeModelAttention:
    sigma: float
    self_weight: float

    def __call__(self, uploads: Params, n_samples: torch.Tensor, clients: np.ndarray) -> Mixing:
        return Mixing(to_personal=heurfedamp_weights(uploads, self.sigma, self.self_weight))


@register
@dataclass(frozen=True)
class HeurFedAMP(MethodOptions):
    NAME = "heurfedamp"
    sigma: float = option(50.0, ge=0, doc="attention scale sigma")
    lam: float = option(5.0, ge=0, doc="client proximal strength lambda")
    amp_self_weight: float = option(0.5, ge=0, le=1, doc="self-attention weight xi_ii")

    def build(self, cfg: RunSpec) -> Algorithm:
        return amp_round(self.NAME, local_sgd(cfg, mu=self.lam), WholeModelAttention(self.sigma, self.amp_self_weight))


def amp_round(name: str, local: LocalSGD, aggregate: Aggregate) -> Algorithm:
    """The round HeurFedAMP and FedAMP (``fedlib.algorithms.fedamp``) share: every client trains with ``local``'s
    proximal pull toward the last cloud model u_i it received, starting from u_i when one arrived since it last
    trained; the server sends each uploader its u_i (``aggregate``'s ``Mixing.to_personal``); the clients' own
    models are evaluated and the weights traced (``attention``)."""
    return Algorithm(
        name=name,
        local=local,
        aggregate=aggregate,
        trains="all",
        start="personal",
        anchor="received",
        evaluate="personal",
        traces=("attention",),
    )
