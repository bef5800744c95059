"""Which kernel a model runs under, and the stacked executor's fast paths keyed by (kernel, objective type).

Kernels (``fedlib.models.KERNELS``): "chain" (a Flatten/Linear/ReLU chain: hand-written batched matmuls),
"vmap" (buffer-free: ``torch.func.vmap`` over ``functional_call``), "loop" (anything, e.g. BatchNorm: the
per-client loop executor only). A fast path is a function

    path(model, params, plan, data, opt, anchor, drift, objective, clients) -> None

that trains one client group in place (``params``, ``anchor``, ``drift``: the group's rows; ``plan``: the group's
plan; ``clients``: the group's slice of the full plan, for ``objective.context``). Fast paths live in this
package (``executors.chain`` registers its own on import); for any other (kernel, objective) the stacked
executor takes its generic ``vmap(grad(objective.loss))`` path.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

from ..models import linear_chain

try:
    from ..models import kernel_of  # declared by the model (``ModelSpec.kernel``)
except ImportError:  # until models.kernel_of lands: the structural rule it falls back to
    kernel_of = None


def model_kernel(model: nn.Module) -> str:
    """ "chain", "vmap" or "loop": ``models.kernel_of`` when it exists, else the structural rule."""
    if kernel_of is not None:
        return kernel_of(model)
    if linear_chain(model) is not None:
        return "chain"
    return "vmap" if next(model.buffers(), None) is None else "loop"


FAST_PATHS: dict[tuple[str, type], Callable] = {}


def register_fast_path(kernel: str, *objective_types: type):
    """Decorator: ``path`` trains a client group of a ``kernel`` model on any of ``objective_types``."""

    def deco(path):
        for t in objective_types:
            FAST_PATHS[(kernel, t)] = path
        return path

    return deco


def fast_path(kernel: str, objective) -> Callable | None:
    """The fast path registered for (kernel, type(objective)), None if there is none. The exact type: a subclass
    may change the loss, which a hand-written path would not see."""
    return FAST_PATHS.get((kernel, type(objective)))
