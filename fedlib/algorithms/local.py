"""Local: every client trains alone on its own data and never communicates.

Not in the three papers, but the yardstick a personalised method must beat: with the FedMCSA authors' code on
Synthetic(0.5, 0.5), sigma -> inf (each client attending only to itself) beats sigma = 50. All N clients take R SGD steps per round from their own model; the
server selects nobody and aggregates nothing; each client's own model is evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedlib.config.options import MethodOptions, register
from fedlib.core.protocols import RunSpec, Selector
from fedlib.core.stages import Algorithm, Mixing, Params, local_sgd


class NoSelection(Selector):
    """Nobody uploads."""

    def select(self, t: int, n_clients: int, rng: np.random.Generator) -> np.ndarray:
        return np.zeros(0, dtype=np.int64)


def no_aggregation(uploads: Params, n_samples: torch.Tensor, clients: np.ndarray) -> Mixing:
    return Mixing()


@register
@dataclass(frozen=True)
class Local(MethodOptions):
    """No options; selects nobody (``SELECTS = False``: selection options do not apply)."""

    NAME = "local"
    SELECTS = False

    def build(self, cfg: RunSpec) -> Algorithm:
        return Algorithm(
            name=self.NAME,
            select=NoSelection(),
            local=local_sgd(cfg),
            aggregate=no_aggregation,
            trains="all",
            start="personal",
            evaluate="personal",
        )
