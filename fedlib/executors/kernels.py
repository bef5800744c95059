"""The stacked executor's fast paths, keyed by (kernel, objective type).

Kernels are what ``fedlib.models.registry.kernel_of`` says a model supports (``fedlib.models.registry.KERNELS``): "chain" (a
Flatten/Linear/ReLU chain: hand-written batched matmuls), "vmap" (buffer-free: ``torch.func.vmap`` over
``functional_call``), "loop" (anything, e.g. BatchNorm: the per-client loop executor only). A fast path is a function
``path(group: Group) -> None`` that trains one client group in place. Fast paths live in this
package (``executors.chain`` registers its own on import); for any other (kernel, objective) the stacked
executor takes its generic ``vmap(grad(objective.loss))`` path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple

if TYPE_CHECKING:
    import torch
    from torch import nn

    from fedlib.data.federated import BatchPlan, Split
    from fedlib.executors.objectives import Objective
    from fedlib.executors.sgd import LocalSGD, Params, RunsSGD


class Group(NamedTuple):
    """One client group's training as a fast path receives it: ``p`` (trained in place), ``anchor`` and ``drift``
    are the group's rows, ``plan`` the group's plan and ``clients`` the group's slice of the full plan (for
    ``objective.context``)."""

    model: nn.Module
    p: Params
    plan: BatchPlan
    data: Split
    opt: LocalSGD | RunsSGD
    anchor: Params | None
    drift: Params | None
    objective: Objective
    clients: slice | torch.Tensor


FAST_PATHS: dict[tuple[str, type], FastPath] = {}
FastPath = Callable[[Group], None]  # trains the group's ``p`` in place (``chain.chain_cross_entropy``)


def register_fast_path(kernel: str, *objective_types: type) -> Callable[[FastPath], FastPath]:
    """Decorator: ``path`` trains a client group of a ``kernel`` model on any of ``objective_types``."""

    def deco(path: FastPath) -> FastPath:
        for t in objective_types:
            FAST_PATHS[(kernel, t)] = path
        return path

    return deco


def fast_path(kernel: str, objective: object) -> FastPath | None:
    """The fast path registered for (kernel, type(objective)), None if there is none. The exact type: a subclass
    may change the loss, which a hand-written path would not see."""
    return FAST_PATHS.get((kernel, type(objective)))
