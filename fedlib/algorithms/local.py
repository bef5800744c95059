"""Local: every client trains alone on its own data and never communicates.

Not in the three papers, but the yardstick a personalised method must beat (GUIDE section 2:
with the authors' code on Synthetic(0.5, 0.5), sigma -> inf, i.e. each client attending only to
itself, beat sigma = 50). All N clients take R SGD steps per round from their own model; the
server selects nobody and aggregates nothing; each client's own model is evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..options import MethodOptions, register
from ..stages import Algorithm, Mixing, local_sgd


class NoSelection:
    def select(self, t: int, n_clients: int, rng: np.random.Generator) -> np.ndarray:
        return np.zeros(0, dtype=np.int64)


def no_aggregation(uploads, n_samples, clients) -> Mixing:
    return Mixing()


@register
@dataclass(frozen=True)
class Local(MethodOptions):
    """No options; selects nobody (``SELECTS = False``: selection options do not apply)."""

    NAME = "local"
    SELECTS = False

    def build(self, cfg) -> Algorithm:
        return Algorithm(
            name=self.NAME,
            select=NoSelection(),
            local=local_sgd(cfg),
            aggregate=no_aggregation,
            trains="all",
            start="personal",
            evaluate="personal",
        )
