"""FedPer: Arivazhagan, Aggarwal, Singh, Choudhary, "Federated Learning with Personalization Layers", arXiv:1912.00818
(2019).

FedAvg over the base layers only: each client's personalisation layers never leave it (Section 3: "the base layers
are trained in a federated manner ... the personalization layers are trained locally"). fedlib splits a model at
the classifier layer(s) every registered model declares as its ``head`` group (``fedlib.models.groups.head``), so
the base layers are the body and the personalisation layers are the head; each client starts a round from the
global body and its own head, trains both (Algorithm 1: one SGD pass over all the client's parameters) and uploads
the body. It is evaluated with that combination (the global body under its own head).
Paper symbols -> ``RunConfig``: K_B (base layers) -> every parameter outside the head, K_P (personalisation layers)
-> the head group, E -> ``local_epochs`` (or ``local_steps``), B -> ``batch_size``, eta -> ``lr``.

Choice: the paper places one or two layers in K_P (ResNet/MobileNet, Section 4); fedlib's head is the last Linear
layer of each model, the one layer producing the logits (the contract tests check that), so every model splits the
same way. A model whose only layer is its head (MLR) has no body to share, and FedPer on it
would be Local with a selection: refused at validate (``check_split``), as is a user model declaring no head.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fedlib.algorithms.fedavg import FedAvg
from fedlib.config.options import MethodOptions, register
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm
from fedlib.models.groups import HEAD
from fedlib.models.registry import MODELS, groups_of


def check_split(name: str, cfg: RunSpec, frozen: str = "") -> None:
    """Refuse a split-model method ``name`` (FedPer, FedRep, LG-FedAvg, ...) on a model it cannot split: one that
    declares no head (``fedlib.models.groups.head``), or one whose every parameter is its head (no body: the split
    would make the method Local or FedAvg). ``frozen``: what the method holds frozen (FedRep, FedBABU), for which
    weight decay is refused too, since it would still shrink the frozen part on the stacked executor. Raised by
    ``RunConfig.validate``, before any data is read."""
    if frozen and cfg.local.weight_decay:
        raise ValueError(
            f"RunConfig: weight_decay={cfg.local.weight_decay} set but algorithm={name!r} freezes {frozen}, and "
            "weight decay would still shrink the frozen part; use weight_decay=0"
        )
    m = cfg.model
    groups = groups_of(m.name, m.hidden, m.attention)
    if HEAD not in groups:
        raise ValueError(
            f"RunConfig: algorithm={name!r} splits the model at its declared head, but model={m.name!r} declares none "
            "(register it with groups=('head',), its classifier layer wrapped in fedlib.models.groups.head)"
        )
    if not groups - {HEAD, "attn"}:
        having = ", ".join(n for n in MODELS if groups_of(n) - {HEAD, "attn"})
        raise ValueError(
            f"RunConfig: algorithm={name!r} splits the model into a shared and a local part, but model={m.name!r} "
            f"as configured is its head alone (no body to split off); models with a body: {having}"
        )


@register
@dataclass(frozen=True)
class FedPer(MethodOptions):
    """No options of its own: FedAvg with the model's ``head`` group kept on its client."""

    NAME = "fedper"
    LOCAL_GROUPS = (HEAD,)

    def check_with(self, cfg: RunSpec) -> None:
        check_split(self.NAME, cfg)

    def build(self, cfg: RunSpec) -> Algorithm:
        return dataclasses.replace(FedAvg().build(cfg), name=self.NAME, local_groups=self.LOCAL_GROUPS)
