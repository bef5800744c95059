"""FedProx: Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020.

Algorithm 2: each selected client k approximately minimises
    h_k(w; w^t) = F_k(w) + mu/2 ||w - w^t||^2
starting from the global model w^t, then the server averages as FedAvg does.
Paper symbols -> ``RunConfig`` fields: mu -> ``mu``; the inexact local solver is ``local_steps``
(or ``local_epochs``) of SGD with ``lr``. With ``mu = 0`` FedProx is FedAvg (tested).
We keep FedAvg's sample-weighted average; FedProx's paper averages uniformly over devices
sampled with probability p_k = n_k / n, which has the same expectation.
"""

from dataclasses import dataclass

from fedlib.config.options import MethodOptions, option, register
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm, WeightedMean, local_sgd


@register
@dataclass(frozen=True)
class FedProx(MethodOptions):
    NAME = "fedprox"
    mu: float = option(0.0, ge=0, doc="FedProx proximal strength mu")

    def build(self, cfg: RunSpec) -> Algorithm:
        return Algorithm(
            name=self.NAME, local=local_sgd(cfg, mu=self.mu), aggregate=WeightedMean("samples"), anchor="start"
        )  # the proximal centre is w^t, the global model the client received
