"""LG-FedAvg: Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov, Morency, "Think Locally, Act Globally:
Federated Learning with Local and Global Representations", arXiv:2001.01523 (2020).

The reverse of FedPer's split: each client keeps its own local representation (the layers below the classifier) and
the server averages only the global layers on top (Algorithm 1: "the server ... averages the global parameters
theta^g"; "local models l_m" never leave the clients). fedlib splits a model at the classifier layer(s) every
registered model declares as its ``head`` group (``fedlib.models.groups.head``): the head is shared and averaged as
in FedAvg; every other parameter (the body, BatchNorm included) stays on its client. Each client starts a round
from its own body under the global head, trains both and uploads the head; it is evaluated with that combination.
Paper symbols -> ``RunConfig``: theta^g (global layers) -> the head group, theta^l_m (local representation of device
m) -> every parameter outside the head, E -> ``local_epochs`` (or ``local_steps``), B -> ``batch_size``, eta -> ``lr``.

Choices: the paper trains the local representation with an auxiliary objective of its own in some experiments
(Section 3.2: supervised, or unsupervised/adversarial variants); fedlib trains it on the client's cross-entropy
through the head, the supervised case. The paper starts from a FedAvg-trained model; here every client's body starts
from the seed's one initial model (as every method's). pFedLA's attention modules are part of the body but follow
pFedLA's own switch (local unless ``attention_local=False``), so the attention ablation keeps its meaning. A model
whose only layer is its head (MLR) is refused at validate (LG-FedAvg on it is FedAvg), as is a user model
declaring no head (``fedper.check_split``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fedlib.algorithms.fedavg import FedAvg
from fedlib.algorithms.fedper import check_split
from fedlib.config.options import MethodOptions, register
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm

BODY = ("", "bn")  # the groups outside the head (``param_groups``): ungrouped parameters and backbone BatchNorm


@register
@dataclass(frozen=True)
class LGFedAvg(MethodOptions):
    """No options of its own: FedAvg with everything but the model's ``head`` group kept on its client."""

    NAME = "lgfedavg"

    def check_with(self, cfg: RunSpec) -> None:
        check_split(self.NAME, cfg)

    def build(self, cfg: RunSpec) -> Algorithm:
        return dataclasses.replace(FedAvg().build(cfg), name=self.NAME, local_groups=BODY)
