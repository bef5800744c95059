"""Clients that fail or lag: each round a share of the selected clients drops out (uploads nothing) and another
share straggles (finishes only part of its local work).

The federated-learning literature's "systems heterogeneity" (Li et al., "Federated Optimization in Heterogeneous
Networks" (FedProx), MLSys 2020, whose experiments make a given share of each round's selected devices stragglers
that do fewer local updates; Wang et al., "Tackling the Objective Inconsistency Problem in Heterogeneous Federated Optimization"
(FedNova), NeurIPS 2020: clients that take different numbers of local steps) as options of a run:

- ``dropout``: the share of the round's m selected clients that upload nothing;
- ``stragglers``: the share of them that upload after only part of their local work;
- ``work``: the share of its local steps a straggler completes (``RunConfig.straggler_work``).

How many. As FedProx's experiments pick their stragglers, a fixed count a round, not a coin per client:
round-half-up(dropout * m) clients drop and round-half-up(stragglers * m) of the others straggle (at most the
m - dropped left), so the shares hold every round and the recorded counts are known in advance. With few clients a
round the rounding is coarse: dropout = 0.3 of m = 1 drops nobody, dropout = 0.5 of m = 1 drops the one client
every round (the counts are recorded, so a run shows it).

Which. From a random stream of its own, seeded by (seed, t) (``FAILURE_STREAM``): a permutation of the round's
selected clients, whose first ones drop and whose next ones straggle. The selection's stream and the mini-batches'
are untouched (the round still draws its plan for every selected client, then sets the dropped ones' columns
aside), so dropout = stragglers = 0 is the run it always was, bit for bit, the clients that do train see the batches
they would have seen without failures, and a resumed run draws the same failures (the stream has no state to save).

What a dropped client is: one that did no work at all in the round. It was selected (the selection's bookkeeping
counts it: AdaFL's score history records the scores it was drawn from, Power-of-Choice the loss it reported as a
candidate), but it does not train, so nothing of its own advances (its model, SCAFFOLD's c_i, Ditto's v_k,
pFedMe's theta_i, a personalised model it received and has not trained from yet stays fresh), and it uploads
nothing: the server aggregates the uploads of the others (FedAvg's mean, FedMCSA's attention among them), and the
selection stage observes only them (AdaFL's Eq. 2 redistributes the uploaders' score mass among the uploaders; a
dropped client's score stays). Methods that train every client (FedMCSA, pFedMe) still train the clients that
were not selected. A round whose every selected client dropped has no upload: the server does nothing (the global
model, a server optimiser's momentum and the personalised models stay as they were), and the round is evaluated and
recorded as any other.

What a straggler is: a client that ran out of time. Its batch plan keeps its first ceil(work * R_k) local steps of
its R_k (``truncate``: R_k = ``local_steps``, or the steps its ``local_epochs`` take; a Per-FedAvg step of several
mini-batches is kept or cut whole), marked through the plan's ``active`` mask, so every method and both executors
see the partial work as they see a small client's finished epochs: every pass of a method's client procedure over
the round's plan stops there (FedRep's head and body passes, Ditto's two models, pFedMe's outer steps), SCAFFOLD's
option II divides by the steps the client took, and a method that normalises by each client's steps (FedNova) reads
them from the plan (``steps_taken``). It uploads what it has, as every other uploader.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fedlib.data.federated import BatchPlan

FAILURE_STREAM = 4  # the failures' stream of (seed, t); 3 is the new clients' fine-tuning (``callbacks.new_clients``)


def share_of(share: float, m: int) -> int:
    """round-half-up(share * m), float noise removed first (0.29 * 50 is 14.499999999999998, which rounds to 15), as
    ``selection.clients_for`` rounds a fraction."""
    return math.floor(round(share * m, 9) + 0.5)


@dataclass(frozen=True)
class RoundFailures:
    """Round t's failures: the selected clients that ``dropped`` (uploaded nothing) and the ``stragglers`` (did part
    of their work), disjoint, each sorted."""

    dropped: np.ndarray
    stragglers: np.ndarray


NONE = RoundFailures(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


@dataclass(frozen=True)
class Failures:
    """The run's failure options (``module docstring``): ``dropout`` in [0, 1), ``stragglers`` in [0, 1] with
    ``dropout + stragglers`` <= 1, ``work`` in (0, 1]. All off by default."""

    dropout: float = 0.0
    stragglers: float = 0.0
    work: float = 0.5

    def __post_init__(self) -> None:
        for name, v, ok, allowed in (
            ("dropout", self.dropout, lambda x: 0 <= x < 1, "[0, 1)"),
            ("stragglers", self.stragglers, lambda x: 0 <= x <= 1, "[0, 1]"),
            ("straggler_work", self.work, lambda x: 0 < x <= 1, "(0, 1]"),
        ):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not ok(v):
                raise ValueError(f"Failures: {name}={v!r} must be a number in {allowed}")
        if round(self.dropout + self.stragglers, 9) > 1:
            raise ValueError(
                f"Failures: dropout={self.dropout} + stragglers={self.stragglers} must be at most 1 (they are shares "
                "of the same selected clients, none both)"
            )

    @property
    def on(self) -> bool:
        """Whether any client can fail (off: the round loop takes its path without failures, bit for bit)."""
        return self.dropout > 0 or self.stragglers > 0

    def counts(self, m: int) -> tuple[int, int]:
        """(dropped, stragglers) of m selected clients."""
        dropped = min(m, share_of(self.dropout, m))
        return dropped, min(m - dropped, share_of(self.stragglers, m))

    def draw(self, seed: int, t: int, selected: np.ndarray) -> RoundFailures:
        """Round t's failures among ``selected``, from the stream of (seed, t)."""
        selected = np.asarray(selected, dtype=np.int64)
        n_drop, n_strag = self.counts(len(selected))
        if n_drop + n_strag == 0:
            return NONE
        rng = np.random.default_rng(np.random.SeedSequence((seed, t, FAILURE_STREAM)))
        order = selected[rng.permutation(len(selected))]
        return RoundFailures(np.sort(order[:n_drop]), np.sort(order[n_drop : n_drop + n_strag]))


def steps_taken(plan: BatchPlan) -> torch.Tensor:
    """(K,) the plan steps each client takes: ``plan.steps`` for all, or its active steps (epochs of unequal clients,
    a straggler's cut plan)."""
    if plan.active is None:
        return torch.full((plan.index.shape[1],), plan.steps, dtype=torch.long, device=plan.index.device)
    return plan.active.sum(0)


def truncate(plan: BatchPlan, positions: np.ndarray, work: float, batches_per_step: int = 1) -> BatchPlan:
    """``plan`` with the clients at ``positions`` (of its K) cut to their first ceil(work * R_k) local steps.

    R_k: client k's local steps in the plan, its active plan steps over ``batches_per_step`` (a Per-FedAvg step takes
    2 or 3 mini-batches, and a step is kept or cut whole). The cut steps become inactive (``BatchPlan.active``: the
    executors skip them, as a small client's steps after its epochs end); the plan's rows are not changed, so what
    is drawn from them (FedMix's pairs) stays. At least one step is kept (work > 0)."""
    positions = np.asarray(positions, dtype=np.int64)
    if not len(positions):
        return plan
    active = (
        torch.ones(plan.index.shape[:2], dtype=torch.bool, device=plan.index.device)
        if plan.active is None
        else plan.active.clone()
    )
    p = torch.as_tensor(positions, device=active.device)
    mine = active[:, p]
    have = mine.sum(0).cpu().numpy()  # each straggler's active plan steps, R_k * batches_per_step
    local = -(-have // batches_per_step)  # R_k
    kept = np.maximum(1, np.ceil(np.round(work * local, 9))).astype(np.int64) * batches_per_step
    cut = torch.cumsum(mine.to(torch.long), 0) <= torch.as_tensor(kept, device=active.device)[None, :]
    active[:, p] = mine & cut
    return BatchPlan(plan.index, plan.weight, active)
