"""fedlib: the reproducible companion to FedMCSA, AdaFL and pFedLA.

A federated round is a composition of stages (selection, start models, local update,
aggregation, evaluation); all clients of a round train as one stacked model. Start with
``RunConfig`` and ``run`` (one run) or ``experiment`` (a named experiment of
``fedlib.profiles``); see README.md and notebooks/00_quickstart.ipynb.
"""

__version__ = "0.1.0"

from .config import PROFILES, RunConfig, resolve_profile
from .runner import expand, results_frame, run, run_configs, run_grid, train
from .store import Store

__all__ = [
    "experiment",
    "Experiment",
    "RunConfig",
    "run",
    "run_grid",
    "run_configs",
    "train",
    "expand",
    "results_frame",
    "Store",
    "PROFILES",
    "resolve_profile",
    "__version__",
]


def __getattr__(name: str):
    # ``experiment`` (the entry point of the notebooks and the CLI) is imported on first use: imported here eagerly,
    # ``python -m fedlib.experiments`` would find its own module already loaded by the package and warn
    if name in ("experiment", "Experiment"):
        from . import experiments

        return getattr(experiments, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
