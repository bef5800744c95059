"""fedlib: the reproducible companion to FedMCSA, AdaFL and pFedLA.

A federated round is a composition of stages (selection, start models, local update,
aggregation, evaluation); all clients of a round train as one stacked model. Start with
``RunConfig`` and ``run``; see README.md and notebooks/00_quickstart.ipynb.
"""
__version__ = "0.1.0"

from .config import PROFILES, RunConfig, resolve_profile
from .runner import expand, results_frame, run, run_configs, run_grid, train
from .store import Store

__all__ = ["RunConfig", "run", "run_grid", "run_configs", "train", "expand", "results_frame", "Store", "PROFILES",
           "resolve_profile", "__version__"]
