"""Local training of many clients: what a client computes (an objective) apart from how clients are mapped
(an executor).

Every executor takes the clients' models as a state dict whose tensors carry a leading client axis
(``params[name]: (K, *shape)``), a ``BatchPlan`` (the rows of every client's mini-batch at every step), a
``LocalSGD`` (the optimiser and the generic terms; or a ``RunsSGD``, one ``LocalSGD`` per run, when several runs'
clients train side by side, ``fedlib.runs.batching``) and an ``objective`` (``objectives.Objective``; default
``CrossEntropy``), and returns the trained state dict:

    executor.train(model, params, plan, split, opt, anchor=None, drift=None, *, objective=None) -> params

``anchor`` is the model of FedProx's proximal term (``opt.mu``); ``drift`` (per client like the parameters) is
a constant added to every step's gradient: SCAFFOLD's correction c - c_i. Both, and weight decay, are applied
by every executor to any objective. Given the same plan the executors compute the same thing;
``tests/test_executors.py`` and ``tests/test_fedmix.py`` check that in float64 to 1e-10.

Modules:
- ``objectives``: ``Objective``, ``CrossEntropy``, and the MAFL objectives ``FedMixObjective`` / ``NaiveMixObjective``.
- ``loop``: ``LoopExecutor``, one ``nn.Module`` and one ``torch.optim.SGD`` per client (the reference; any model).
- ``stacked``: ``StackedExecutor``, client groups, the generic ``vmap(grad(objective.loss))`` path.
- ``chain``: ``chain_forward`` (the one Linear/ReLU-chain forward pass, also used by ``metrics.evaluate``) and the
  hand-written chain fast paths for (chain, CrossEntropy) and (chain, FedMixObjective / NaiveMixObjective).
- ``kernels``: the fast-path registry, keyed by (``models.kernel_of(model)``, objective type).
- ``sgd``: ``LocalSGD``, ``RunsSGD`` and the in-place SGD updates of the stacked paths (private to this package).
"""

from __future__ import annotations

from torch import nn

from fedlib.executors import chain  # noqa: F401  (registers the chain fast paths)
from fedlib.executors.chain import chain_forward, class_softmax
from fedlib.executors.kernels import FAST_PATHS, fast_path, register_fast_path
from fedlib.executors.loop import LoopExecutor
from fedlib.executors.objectives import CrossEntropy, FedMixObjective, MixupObjective, NaiveMixObjective, Objective
from fedlib.executors.sgd import LocalSGD, Params, RunsSGD
from fedlib.executors.stacked import PROCESS_CACHE_BYTES, StackedExecutor

EXECUTORS = {"stacked": StackedExecutor, "loop": LoopExecutor}


def make_executor(name: str, model: nn.Module, *, group_bytes: int | None = None) -> StackedExecutor | LoopExecutor:
    """``auto`` picks the stacked executor when it covers the model, else the loop. ``group_bytes``: the stacked
    executor's cache budget per client group (default ``PROCESS_CACHE_BYTES``; parallel workers pass their share)."""
    if name == "auto":
        name = "stacked" if StackedExecutor.supports(model) else "loop"
    if name not in EXECUTORS:
        raise ValueError(f"executor={name!r} is not one of: auto, {', '.join(EXECUTORS)}")
    if name == "stacked" and not StackedExecutor.supports(model):
        raise ValueError(
            f"executor='stacked' does not cover {type(model).__name__} (it has buffers); use 'loop' or 'auto'"
        )
    return StackedExecutor(group_bytes=group_bytes) if name == "stacked" else LoopExecutor()


__all__ = [
    "LocalSGD",
    "RunsSGD",
    "LoopExecutor",
    "StackedExecutor",
    "make_executor",
    "EXECUTORS",
    "PROCESS_CACHE_BYTES",
    "Params",
    "Objective",
    "CrossEntropy",
    "MixupObjective",
    "FedMixObjective",
    "NaiveMixObjective",
    "chain_forward",
    "class_softmax",
    "register_fast_path",
    "fast_path",
    "FAST_PATHS",
]
