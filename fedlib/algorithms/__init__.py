"""Registry of FL methods. Each module defines NAME, USES (the RunConfig fields it reads) and build(cfg) -> Algorithm.

New methods register here and are picked up by config validation and the contract tests.
"""
from . import fedavg, fedprox

ALGORITHMS = {m.NAME: m for m in (fedavg, fedprox)}


def build_algorithm(cfg):
    if cfg.algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={cfg.algorithm!r} is not one of: {', '.join(ALGORITHMS)}")
    return ALGORITHMS[cfg.algorithm].build(cfg)
