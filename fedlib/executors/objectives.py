"""Client objectives: what a client computes, apart from how the executors map it over clients.

An objective is the data loss of parameters on one client's mini-batch (fedjax's ``for_each_client`` split:
the method supplies the per-client function, the executor maps it). Every executor consumes any objective:

- the loop executor calls ``loss`` per client on an ``nn.Module`` (``forward`` runs the module; the float64
  reference),
- the stacked executor calls it inside ``torch.func.vmap(grad(...))`` over ``functional_call`` (any
  buffer-free model), unless a fast path is registered for (the model's kernel, the objective's type)
  (``executors.kernels``; e.g. the hand-written Linear/ReLU-chain kernels of ``executors.chain``).

The generic terms are not part of an objective: weight decay, FedProx's proximal pull (``LocalSGD.mu`` toward
``anchor``) and the drift correction (SCAFFOLD's ``drift``) are applied by every executor to any objective.

Interface (``Objective``):

    context(step, clients, dtype) -> dict of per-sample extra batch data of that step (FedMix: the paired
        means), for ``clients`` = one client (an int: tensors (B, ...)) or a group (a slice of the plan's
        client axis: (G, B, ...)); default none.
    loss(forward, params, x, y, w, ctx) -> scalar: the loss of one client's batch. ``forward(params, x)`` runs
        the model; ``forward.input_grad(fn, z)`` is d fn(z)[0] / dz (and fn(z)[1]), differentiable in the
        parameters (FedMix's Taylor term). ``w``: None (every row counts: the mean over rows) or (B,) row
        weights (0 for padding: the weighted mean sum(l w) / max(sum w, 1)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Protocol

import torch
import torch.nn.functional as F

from fedlib.data.federated import gather_rows

Params = dict[str, torch.Tensor]
Context = dict[str, torch.Tensor]  # what an objective reads at a step besides the batch (``Objective.context``)


class Forward(Protocol):
    """The model as an objective calls it: ``forward(params, x)`` -> logits, and ``input_grad(fn, z)`` -> (dfn/dz,
    aux) for ``fn(z) -> (scalar, aux)`` (autograd on the loop executor, ``torch.func.grad`` on the vmap path)."""

    def __call__(self, params: Params, x: torch.Tensor) -> torch.Tensor: ...

    def input_grad(
        self, fn: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]], z: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class Objective:
    """Base class of client objectives (see the module docstring). ``MERGES``: the objective has no per-call context
    and is a hashable value, so the calls of several batched runs with equal objectives train as one call
    (``fedlib.runs.batching``; FedRep's ``FrozenParts``); objectives with context (FedMix's pairs) run alone."""

    MERGES: ClassVar[bool] = False

    def context(self, step: int, clients: int | slice | torch.Tensor, dtype: torch.dtype) -> Context:
        return {}

    def loss(
        self, forward: Forward, params: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None, ctx: Context
    ) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def rows(w: torch.Tensor | None, y: torch.Tensor) -> int | torch.Tensor:
        """The number of rows that count: len(y) (w None) or max(sum w, 1) (a tensor)."""
        return len(y) if w is None else w.sum().clamp_min(1)

    @staticmethod
    def reduce(
        per_sample: torch.Tensor, w: torch.Tensor | None, n_rows: int | torch.Tensor | None = None
    ) -> torch.Tensor:
        """The mean over rows (w None) or the weighted mean sum(l w) / max(sum w, 1) (``n_rows``: that
        denominator, ``rows(w, y)``, when the caller has it already)."""
        if w is None:
            return per_sample.mean()
        return (per_sample * w).sum() / (w.sum().clamp_min(1) if n_rows is None else n_rows)


class CrossEntropy(Objective):
    """The mean cross-entropy of the batch: every executor's default objective (FedAvg's client)."""

    def loss(
        self, forward: Forward, params: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None, ctx: Context
    ) -> torch.Tensor:
        out = forward(params, x)
        if w is None:
            return F.cross_entropy(out, y)
        return (F.cross_entropy(out, y, reduction="none") * w).sum() / w.sum().clamp_min(1)


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy with a soft label: -sum_c target_c log softmax_c."""
    return -(target * F.log_softmax(logits, dim=-1)).sum(-1)


@dataclass(frozen=True, eq=False)
class MixupObjective(Objective):
    """Mixup with received means (MAFL, Yoon et al. 2021; ``fedlib.algorithms.fedmix``): sample i of step s of
    client k is paired with mean ``pair[s, k, i]`` of the mean set (``means_x`` (J, *input), ``means_y`` (J, C)
    soft labels). ``lam``: the mixing weight. Subclasses: ``FedMixObjective``, ``NaiveMixObjective``."""

    lam: float
    means_x: torch.Tensor
    means_y: torch.Tensor
    pair: torch.Tensor  # (steps, K, B) indices into the mean set

    def context(self, step: int, clients: int | slice | torch.Tensor, dtype: torch.dtype) -> Context:
        j = self.pair[step, clients]
        pick = lambda m: gather_rows(m, j).to(dtype)
        return {"xm": pick(self.means_x), "ym": pick(self.means_y)}


@dataclass(frozen=True, eq=False)
class NaiveMixObjective(MixupObjective):
    """l = (1 - lam) l(f(z), y_i) + lam l(f(z), ybar_j), z = (1 - lam) x_i + lam xbar_j: plain Mixup with a mean."""

    def loss(
        self, forward: Forward, params: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None, ctx: Context
    ) -> torch.Tensor:
        lam, ym = self.lam, ctx["ym"]
        out = forward(params, (1 - lam) * x + lam * ctx["xm"])
        per = (1 - lam) * F.cross_entropy(out, y, reduction="none") + lam * soft_cross_entropy(out, ym)
        return self.reduce(per, w)


@dataclass(frozen=True, eq=False)
class FedMixObjective(MixupObjective):
    """FedMix's first-order approximation of global Mixup, per sample, with z = (1 - lam) x_i:

        l = (1 - lam) l(f(z), y_i) + lam l(f(z), ybar_j) + lam t <d l(f(z), y_i) / dz, xbar_j>

    ``taylor_scale``: "sample" (t = 1, the equation) or "batch" (t = (1 - lam) / B, B the client's rows that
    count that step: the public codes take the input gradient of the batch-mean loss)."""

    taylor_scale: str = "sample"

    def __post_init__(self) -> None:
        if self.taylor_scale not in ("sample", "batch"):
            raise ValueError(f"taylor_scale={self.taylor_scale!r} is not one of: sample, batch")

    def tscale(self, n_rows: int | torch.Tensor) -> float | torch.Tensor:
        """Factor t on the Taylor term: 1 or (1 - lam) / n_rows."""
        if self.taylor_scale == "sample":
            return 1.0
        return (1 - self.lam) / n_rows

    def loss(
        self, forward: Forward, params: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None, ctx: Context
    ) -> torch.Tensor:
        lam, xm, ym = self.lam, ctx["xm"], ctx["ym"]

        def ce_sum(
            z: torch.Tensor,
        ) -> tuple[torch.Tensor, torch.Tensor]:  # summed, so that its input gradient is each sample's own
            logits = forward(params, z)
            return F.cross_entropy(logits, y, reduction="sum"), logits

        gz, out = forward.input_grad(ce_sum, (1 - lam) * x)
        taylor = (gz * xm).reshape(gz.shape[0], -1).sum(1)
        n = self.rows(w, y)
        per = (
            (1 - lam) * F.cross_entropy(out, y, reduction="none")
            + lam * soft_cross_entropy(out, ym)
            + lam * self.tscale(n) * taylor
        )
        return self.reduce(per, w, n)
