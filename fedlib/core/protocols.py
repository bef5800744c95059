"""The two collaborators a round is handed: the ``Executor`` that computes the clients' local work, and the
``Selector`` that picks who uploads. Both are ``typing.Protocol``s: any object with these methods serves, and a
class that subclasses one inherits the optional hooks' defaults (a selector that keeps no state needs no
``state_dict``), so the round calls every hook it needs without asking whether it exists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np
import torch
from torch import nn

from fedlib.executors.sgd import LocalSGD, RunsSGD

if TYPE_CHECKING:
    from fedlib.core.stages import Algorithm
    from fedlib.data.federated import BatchPlan, Split

Params = dict[str, torch.Tensor]


class Executor(Protocol):
    """How the clients' local work is computed: ``LoopExecutor`` (one client after another, the float64 reference),
    ``StackedExecutor`` (all clients of a round as one stacked model), a batched run's ``GangExecutor``."""

    name: str  # recorded in the run's metadata

    def train(
        self,
        model: nn.Module,
        params: Params,
        plan: BatchPlan,
        data: Split,
        opt: LocalSGD | RunsSGD,
        anchor: Params | None = None,
        drift: Params | None = None,
        *,
        objective: object | None = None,
    ) -> Params:
        """Each client of ``params`` (name -> (K, ...)) trains on its rows of ``plan`` with the optimiser ``opt``
        (``LocalSGD``), the proximal ``anchor`` and SCAFFOLD's ``drift``; returns the trained (K, ...) models."""
        ...

    def evaluate(
        self, model: nn.Module, params: Params, split: Split, per_client: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(correct, loss sum, rows) per client of ``split``: one model for all (``per_client=False``) or each
        client's own (``params[name]`` (N, ...))."""
        ...


class Selector(Protocol):
    """Which clients upload in round t. ``select`` is required; the rest are hooks with defaults:

    - ``observes``: whether the round calls ``observe(selected, uploads, reference)`` after aggregating (AdaFL's
      attention scores read the distance of each upload to what the server made of it);
    - ``probes``: whether ``select`` needs the candidates' losses; the round then calls ``select(t, n_clients, rng,
      losses=f)``, where ``f(clients)`` returns each client's mean training loss on the model it would start the
      round from (Power-of-Choice ranks its candidates by it); the evaluation is work the clients do, so a selector
      that probes records whom it asked (its ``traces``);
    - ``traces(rounds)``: per-round records the stage keeps for the result (AdaFL: ``selection_scores``);
    - ``state_dict()`` / ``load_state_dict(d)``: what a snapshot must hold to resume the stage (plain data).
    """

    observes: ClassVar[bool] = False
    probes: ClassVar[bool] = False

    def select(self, t: int, n_clients: int, rng: np.random.Generator) -> np.ndarray: ...

    def observe(self, selected: np.ndarray, uploads: Params, reference: Params) -> object:
        return None

    def traces(self, rounds: int) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, d: dict) -> None:
        return None


# -- what the core and the methods read of a run config ------------------------------------------------------------
# ``fedlib.config.run.RunConfig`` sits above these layers (it validates against the methods' registry), so they
# cannot name it; they name the parts of it they read, as read-only protocols that the run config satisfies.
class LocalSpec(Protocol):
    """The run config's local optimisation part (``RunConfig.local``) as the methods read it."""

    @property
    def lr(self) -> float: ...
    @property
    def momentum(self) -> float: ...
    @property
    def weight_decay(self) -> float: ...
    @property
    def batch_size(self) -> int: ...


class SelectionSpec(Protocol):
    """The run config's selection part (``RunConfig.selection``)."""

    @property
    def rule(self) -> str: ...
    @property
    def clients_per_round(self) -> int | None: ...
    @property
    def fraction(self) -> float | None: ...
    @property
    def fraction_schedule(self) -> tuple | None: ...
    @property
    def attn_decay(self) -> float: ...
    @property
    def poc_candidates(self) -> int | None: ...
    @property
    def poc_loss(self) -> str: ...


class ModelSpec(Protocol):
    """The run config's model part (``RunConfig.model``): the registry name and widths (the split-model methods check
    the built model's groups), whether pFedLA's attention is there and kept local."""

    @property
    def name(self) -> str: ...
    @property
    def hidden(self) -> tuple | None: ...
    @property
    def attention(self) -> str: ...
    @property
    def attention_local(self) -> bool: ...


class MethodSpec(Protocol):
    """A method's options (``fedlib.config.options.MethodOptions``): whether it selects, and its ``Algorithm``."""

    SELECTS: ClassVar[bool]

    def build(self, cfg: RunSpec) -> Algorithm: ...


class RunSpec(Protocol):
    """What ``fedlib.config.run.RunConfig`` holds that the round's stages and the methods' ``build`` read."""

    @property
    def rounds(self) -> int: ...
    @property
    def local(self) -> LocalSpec: ...
    @property
    def selection(self) -> SelectionSpec: ...
    @property
    def model(self) -> ModelSpec: ...
    @property
    def method(self) -> MethodSpec: ...
