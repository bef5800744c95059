"""The stacked executor's fast paths, keyed by (kernel, objective type).

Kernels are what ``fedlib.models.registry.kernel_of`` says a model supports (``fedlib.models.registry.KERNELS``): "chain" (a
Flatten/Linear/ReLU chain: hand-written batched matmuls), "vmap" (buffer-free: ``torch.func.vmap`` over
``functional_call``), "loop" (anything, e.g. BatchNorm: the per-client loop executor only). A fast path is a function

    path(model, params, plan, data, opt, anchor, drift, objective, clients) -> None

that trains one client group in place (``params``, ``anchor``, ``drift``: the group's rows; ``plan``: the group's
plan; ``clients``: the group's slice of the full plan, for ``objective.context``). Fast paths live in this
package (``executors.chain`` registers its own on import); for any other (kernel, objective) the stacked
executor takes its generic ``vmap(grad(objective.loss))`` path.
"""

from __future__ import annotations

from typing import Callable

FAST_PATHS: dict[tuple[str, type], FastPath] = {}


# a fast path: (model, params, plan, data, opt, anchor, drift, objective, clients) -> None, training the client
# group's ``params`` in place (``chain.chain_cross_entropy``)
FastPath = Callable[..., None]


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
