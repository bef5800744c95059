"""FedAMP: Huang et al., "Personalized Cross-Silo Federated Learning on Non-IID Data", AAAI 2021 (Sec. 3, Alg. 1).

The paper minimises G(W) = sum_i F_i(w_i) + lambda sum_{i<j} A(||w_i - w_j||^2) with A(x) = 1 - exp(-x / sigma)
by alternating two steps each iteration k:

- attentive message passing on the server (Eq. 4-5): the cloud model of client i is
  u_i = xi_ii w_i + sum_{j != i} xi_ij w_j, with xi_ij = alpha_k A'(||w_i - w_j||^2) = alpha_k exp(-||w_i -
  w_j||^2 / sigma) / sigma and xi_ii = 1 - sum_{j != i} xi_ij (``attention.fedamp_weights``, whole models);
- a proximal step on each client (Eq. 6): w_i = argmin_w F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2, taken as the
  run's local SGD steps from u_i with the proximal pull mu = lambda / alpha_k toward u_i.

Paper symbols -> ``RunConfig``: alpha_k -> ``amp_alpha`` (one step for every iteration k, as the PFLlib code's
constant ``alphaK``; the paper's analysis lets alpha_k depend on k, a schedule this option does not offer),
sigma -> ``amp_sigma``, lambda -> ``amp_lambda``. The defaults, 1, 1 and 1, are PFLlib's (``alphaK``, ``sigma``,
``lamda``), the public code most comparisons run FedAMP with; the paper tunes them per data set. The round is HeurFedAMP's (``heurfedamp.amp_round``): the two differ in the weights, as the paper's
Sec. 4.3 presents HeurFedAMP as FedAMP with xi from a cosine softmax.

Which clients enter the sums: the paper's cross-silo Algorithm 1 has every client upload every iteration, so its
sums run over all clients. Under partial participation the server has this round's uploads only and the sums run
over the round's selected clients (as PFLlib's server, which sums over the uploaded models); each selected client
receives its u_i. Every client takes its proximal step each round (``trains='all'``, as in the paper, where every
client steps every iteration), toward the last u_i it received, which is HeurFedAMP's and FedMCSA's rule too; with
full participation this is the paper's algorithm exactly.

Reduction (tested): as sigma -> 0 the weights xi_ij vanish for any two distinct models (exactly 0 in floating
point once ||w_i - w_j||^2 / sigma exceeds about 745), u_i = w_i, and with full participation FedAMP is local
training with a proximal pull mu = lambda / alpha toward the model each client starts the round from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedlib.algorithms.heurfedamp import amp_round
from fedlib.config.options import MethodOptions, option, register
from fedlib.core.attention import fedamp_weights
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm, Mixing, Params, local_sgd


@dataclass
class MessagePassing:
    """Aggregator: FedAMP's cloud models u_i of the uploaders (``Mixing.to_personal``)."""

    alpha: float
    sigma: float

    def __call__(self, uploads: Params, n_samples: torch.Tensor, clients: np.ndarray) -> Mixing:
        return Mixing(to_personal=fedamp_weights(uploads, self.alpha, self.sigma))


@register
@dataclass(frozen=True)
class FedAMP(MethodOptions):
    NAME = "fedamp"
    amp_alpha: float = option(1.0, gt=0, le=1e6, doc="alpha_k: the message-passing step (xi_ij = alpha A'(d_ij))")
    amp_sigma: float = option(1.0, gt=0, le=1e12, doc="sigma: distance scale of A(x) = 1 - exp(-x / sigma)")
    amp_lambda: float = option(
        1.0, ge=0, le=1e6, doc="lambda: strength of the attention term; clients pull toward u_i with lambda / alpha"
    )

    def build(self, cfg: RunSpec) -> Algorithm:
        local = local_sgd(cfg, mu=self.amp_lambda / self.amp_alpha)
        return amp_round(self.NAME, local, MessagePassing(self.amp_alpha, self.amp_sigma))
