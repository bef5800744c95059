"""FedRep: Collins, Hassani, Mokhtari, Shakkottai, "Exploiting Shared Representations for Personalized Federated
Learning", ICML 2021.

Algorithm 1 (FedRep), paper symbols -> ``RunConfig`` / options:
    phi (global representation, the body)  -> every parameter outside the model's declared ``head`` group
    h_i (client i's local head)             -> the ``head`` group (``fedlib.models.groups.head``), never uploaded
    tau (local head updates), then the      -> ``head_passes`` passes over the round's batches with the body frozen,
    representation update(s)                   then one pass with the head frozen (``local_steps``/``local_epochs``)
    eta                                     -> ``lr`` (both phases; the paper uses one step size)
    phi^{t+1} = (1/n) sum_i phi_i^{t}       -> FedAvg's weighted mean over the selected clients' bodies
Each selected client starts from the global body and its own head, first trains the head with the body frozen,
then the body with its new head frozen, and uploads the body; clients are evaluated with the global body under
their own heads (as FedPer).

Choices: the paper's experiments train the head for 10 local epochs and the body for one, so ``head_passes`` is 10
by default, and each head pass re-uses the round's mini-batches (the round's one ``BatchPlan``: the two phases see
the same samples, which keeps the stacked and loop executors and a resumed run on one random stream). The paper
averages uniformly (1/n); fedlib keeps FedAvg's sample-weighted mean, as its FedPer and LG-FedAvg do, so the three
split methods differ only in the split. A frozen part takes no step at all: its gradient is cut
(``FrozenParts``), and momentum buffers start at zero each phase, so it stays bit for bit; weight decay would
still shrink it on the stacked executor, and the paper's procedure has none, so ``weight_decay`` is refused.
A model whose only layer is its head (MLR) has no body to share: refused at validate (``fedper.check_split``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from fedlib.algorithms.fedavg import FedAvg
from fedlib.algorithms.fedper import check_split
from fedlib.config.options import MethodOptions, option, register
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm, ClientWork, Params
from fedlib.executors.objectives import Context, CrossEntropy, Forward, Objective
from fedlib.models.groups import HEAD, param_groups


@dataclass(frozen=True)
class FrozenParts(Objective):
    """The cross-entropy with the parameters ``frozen`` held constant: their gradient is cut (``detach``), so an
    SGD step moves only the others (on the loop executor they get no gradient at all, on the stacked one a zero).
    A value without context: batched runs' equal phases train as one call (``MERGES``)."""

    MERGES = True

    frozen: frozenset[str]

    def loss(self, forward: Forward, params: Params, x, y, w, ctx: Context):  # noqa: ANN001 (the Objective interface)
        held = {n: t.detach() if n in self.frozen else t for n, t in params.items()}
        return CrossEntropy().loss(forward, held, x, y, w, ctx)


@dataclass
class FedRepClient:
    """Head first (``head_passes`` passes, body frozen), then the body (one pass, head frozen); uploads all of it
    (the engine keeps the head off the server: ``local_groups``)."""

    head_passes: int

    def __call__(self, work: ClientWork) -> Params:
        groups = param_groups(work.model)
        head = frozenset(n for n, g in groups.items() if g == HEAD)
        body = frozenset(n for n in work.start if n not in head)
        p = work.start
        for _ in range(self.head_passes):
            p = work.train(p, objective=FrozenParts(body))
        return work.train(p, objective=FrozenParts(head))


@register
@dataclass(frozen=True)
class FedRep(MethodOptions):
    NAME = "fedrep"
    LOCAL_GROUPS = (HEAD,)
    head_passes: int = option(
        10, ge=1, le=1000, doc="tau: passes over the round's batches training the head (body frozen) before the body"
    )

    def check_with(self, cfg: RunSpec) -> None:
        check_split(self.NAME, cfg, frozen="the body and the head in turn")

    def build(self, cfg: RunSpec) -> Algorithm:
        """FedAvg's round (selection, server mean) over the bodies, with FedRep's two-phase client procedure."""
        return dataclasses.replace(
            FedAvg().build(cfg),
            name=self.NAME,
            local_update=FedRepClient(self.head_passes),
            local_groups=self.LOCAL_GROUPS,
        )
