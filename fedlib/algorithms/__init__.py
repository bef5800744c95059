"""Registry of FL methods: name -> an entry with NAME, USES (the RunConfig fields it reads) and build(cfg) -> Algorithm.

New methods register here and are picked up by config validation and the contract tests.
"""
from dataclasses import dataclass
from typing import Callable

from . import fedavg, fedmcsa, fedprox, heurfedamp, local, perfedavg, pfedme


@dataclass(frozen=True)
class Entry:
    NAME: str
    USES: tuple
    build: Callable


ALGORITHMS = {e.NAME: e for e in (
    Entry(fedavg.NAME, fedavg.USES, fedavg.build),
    Entry(fedprox.NAME, fedprox.USES, fedprox.build),
    Entry("fedmcsa", fedmcsa.USES, fedmcsa.build),
    Entry("fedmcsa-mcsa", fedmcsa.USES, fedmcsa.build_minus_mcsa),
    Entry("fedavg+mcsa", ("lr", "momentum", "weight_decay", "clients_per_round", "fraction", "sigma"),
          fedmcsa.build_fedavg_plus_mcsa),
    Entry(heurfedamp.NAME, heurfedamp.USES, heurfedamp.build),
    Entry(local.NAME, local.USES, local.build),
    Entry("pfedme", pfedme.USES, pfedme.build),
    Entry("pfedme+mcsa", pfedme.USES + ("sigma",), pfedme.build_plus_mcsa),
    Entry("perfedavg", perfedavg.USES, perfedavg.build_fo),
    Entry("perfedavg-hf", perfedavg.USES, perfedavg.build_hf),
)}


def build_algorithm(cfg):
    if cfg.algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={cfg.algorithm!r} is not one of: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[cfg.algorithm].build(cfg)
