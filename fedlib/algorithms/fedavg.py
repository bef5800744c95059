"""FedAvg: McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data", AISTATS 2017.

Algorithm 1 (FederatedAveraging), paper symbols -> ``RunConfig`` fields:
    K clients, fraction C            -> ``n_clients``, ``fraction`` (or ``clients_per_round`` = max(C K, 1))
    E local epochs, B batch size     -> ``local_epochs`` (or fixed ``local_steps``), ``batch_size``
    eta learning rate                -> ``lr`` (plus ``momentum``, ``weight_decay`` for the later papers' optimisers)
    w_{t+1} = sum_k n_k / n w^k_{t+1} -> ``WeightedMean(by='samples')`` over the selected clients

Every selected client starts from the global model; the global model is what is evaluated,
on every client's test split.
"""

from dataclasses import dataclass

from fedlib.config.options import MethodOptions, register
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm, WeightedMean, local_sgd


@register
@dataclass(frozen=True)
class FedAvg(MethodOptions):
    """FedAvg has no options of its own."""

    NAME = "fedavg"

    def build(self, cfg: RunSpec) -> Algorithm:
        return Algorithm(name=self.NAME, local=local_sgd(cfg), aggregate=WeightedMean("samples"))
