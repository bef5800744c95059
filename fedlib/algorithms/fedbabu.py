"""FedBABU: Oh, Kim, Yun, "FedBABU: Toward Enhanced Representation for Federated Image Classification", ICLR 2022.

FedAvg over the body with the head frozen at its random initialisation (the paper's abstract: during federated
training "the head is randomly initialized and never updated"; only the body is trained and aggregated), and
personalisation by fine-tuning at evaluation time (each client fine-tunes the global model on its own training data
for tau_f epochs and is evaluated with the fine-tuned model). Paper symbols -> ``RunConfig``:
theta_ext (the body) -> every parameter outside the model's declared ``head`` group, theta_cls (the head) -> the
``head`` group (``fedlib.models.groups.head``), tau (local epochs) -> ``local_epochs`` (or ``local_steps``), B ->
``batch_size``, eta -> ``lr``, tau_f (fine-tuning epochs) -> ``babu_finetune_epochs``.

Rules as implemented:
- Training: each selected client starts from the global body and the head's initial value, trains the body with the
  head held constant (its gradient cut: FedRep's ``FrozenParts``, so it stays bit for bit) and uploads the body; the
  server takes FedAvg's sample-weighted mean of the bodies. The head is a local group (``local_groups``): it never
  travels, and since no client ever changes it, every client's copy and the global one are the seed's one initial
  head (every client of the paper shares one random initialisation, the server's).
- Evaluation: with ``babu_finetune_epochs`` = tau_f > 0, before each evaluation every client fine-tunes the global
  model (the averaged body under the initial head) for tau_f epochs of its own training rows, and ``test_acc`` (and
  ``val_acc``) are the fine-tuned models'; ``gm_test_acc`` is the global model's, not fine-tuned. The fine-tuned
  copies are only evaluated, never kept: the next round's clients start from the global body and the initial head,
  as in the paper, whose fine-tuning is an evaluation protocol, not part of training. tau_f = 0 evaluates the global
  model as is (FedAvg's evaluation).
- The fine-tuning is the engine's one (``Algorithm.finetune`` -> ``fedlib.core.callbacks.fine_tune``, the same as a
  new client's, ``new_client_finetune_epochs``): plain SGD with the run's optimiser at the round's lr, batches of
  ``batch_size`` from a random stream of its own (the training's stream is untouched, so fine-tuning changes no
  trained parameter, and a resumed run draws the same batches).

Choices: the paper fine-tunes the whole network for its personalisation results, hence ``babu_finetune="all"``; ``"head"`` tunes the head only, the body held constant.
``babu_finetune_epochs`` defaults to 5, the fine-tuning epochs of the paper's personalisation results (and of
Flower's baseline of the paper, which fine-tunes the whole network with the training's optimiser, as here). Cost:
fine-tuning is tau_f epochs of local training for every client (all N, not only the round's selected ones) at each
evaluation, several rounds' worth of training when N is much larger than the clients per round; ``eval_every``
evaluates (and fine-tunes) every k rounds only, and tau_f = 0 skips it. A frozen head takes no step at all: its
gradient is cut and momentum buffers start at zero, but weight decay would still shrink it on the stacked executor
(a head at lr 0, as Flower's baseline of the paper freezes it, stays put), so ``weight_decay`` is refused, as FedRep refuses it. A model whose
only layer is its head (MLR) has no body to train: refused at validate (``fedper.check_split``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import nn

from fedlib.algorithms.fedavg import FedAvg
from fedlib.algorithms.fedper import check_split
from fedlib.algorithms.fedrep import FrozenParts
from fedlib.config.options import MethodOptions, option, register
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm, ClientWork, FineTune, Params
from fedlib.models.groups import HEAD, param_groups

PARTS = ("all", "head")  # what the evaluation's fine-tuning trains: the whole model, or the head (body frozen)


def _heads(model: nn.Module) -> frozenset[str]:
    return frozenset(n for n, g in param_groups(model).items() if g == HEAD)


def body_frozen(model: nn.Module) -> FrozenParts:
    """The fine-tuning objective of ``babu_finetune='head'``: the cross-entropy with the body held constant."""
    return FrozenParts(frozenset(model.state_dict()) - _heads(model))


@dataclass
class FedBABUClient:
    """The body trained with the head held constant; uploads all of it (the engine keeps the head off the server:
    ``local_groups``)."""

    def __call__(self, work: ClientWork) -> Params:
        return work.train(work.start, objective=FrozenParts(_heads(work.model)))


@register
@dataclass(frozen=True)
class FedBABU(MethodOptions):
    NAME = "fedbabu"
    LOCAL_GROUPS = (HEAD,)
    babu_finetune_epochs: int = option(
        5, ge=0, le=1000, doc="tau_f: epochs each client fine-tunes the global model before evaluation (0: none)"
    )
    babu_finetune: str = option(
        "all",
        choices=PARTS,
        doc="what the evaluation's fine-tuning trains: 'all' (the paper's) or 'head' (body frozen)",
    )

    def check_with(self, cfg: RunSpec) -> None:
        check_split(self.NAME, cfg, frozen="the head")

    def build(self, cfg: RunSpec) -> Algorithm:
        """FedAvg's round (selection, server mean) over the bodies, the head frozen, evaluated after fine-tuning."""
        tune = None
        if self.babu_finetune_epochs:
            tune = FineTune(self.babu_finetune_epochs, body_frozen if self.babu_finetune == "head" else None)
        return dataclasses.replace(
            FedAvg().build(cfg),
            name=self.NAME,
            local_update=FedBABUClient(),
            local_groups=self.LOCAL_GROUPS,
            finetune=tune,
            report_global=tune is not None,
        )
