"""FedBN: Li et al., "FedBN: Federated Learning on Non-IID Features via Local Batch Normalization", ICLR 2021.

FedAvg in which every BatchNorm layer stays on its client: its affine parameters (gamma, beta) and
its running statistics are never uploaded nor averaged (Algorithm 1: "for non-BN layers ... average").
In fedlib that is the engine's shared-vs-local split: FedBN keeps the parameter group ``bn`` local
(``local_groups``), which the model declares by module type (``fedlib.models.groups.param_groups``: every
backbone BatchNorm layer). Each client starts a round from the global non-BN weights and its own BN,
and is evaluated with that combination. A model without BN would make FedBN plain FedAvg, so such a config is
refused (``LOCAL_GROUPS``, checked by ``RunConfig.validate``).
Paper symbols -> ``RunConfig``: E -> ``local_epochs``, B -> ``batch_size``, eta -> ``lr``.
"""

import dataclasses
from dataclasses import dataclass

from fedlib.algorithms.fedavg import FedAvg
from fedlib.config.options import MethodOptions, register
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm


@register
@dataclass(frozen=True)
class FedBN(MethodOptions):
    """No options of its own: FedAvg with the model's ``bn`` parameter group kept on its client."""

    NAME = "fedbn"
    LOCAL_GROUPS = ("bn",)

    def build(self, cfg: RunSpec) -> Algorithm:
        return dataclasses.replace(FedAvg().build(cfg), name=self.NAME, local_groups=self.LOCAL_GROUPS)
