"""fedlib: the reproducible companion to FedMCSA, AdaFL and pFedLA.

A federated round is a composition of stages (selection, start models, local update, aggregation, evaluation);
all clients of a round train as one stacked model. Start with ``RunConfig`` and ``run`` (one run), ``run_grid``
(a grid) or ``experiment`` (a named experiment of a paper); see docs/user-guide.md and notebooks/00_quickstart.ipynb.
Bring your own model, data or method with ``register_model``, ``register_dataset`` and ``register_method``.

The package is in layers, each importing only those below it: ``config``, ``data`` and ``models`` at the bottom,
then ``executors``, ``core`` (the round), ``algorithms``, ``runs`` (training configs, the store), ``papers`` and
``experiments`` at the top.
"""

__version__ = "0.2.0"

from fedlib.config.options import register as register_method
from fedlib.config.run import PROFILES, RunConfig, resolve_profile
from fedlib.data.own import register_dataset
from fedlib.models.registry import register_model
from fedlib.runs.grids import expand, results_frame, run_configs, run_grid
from fedlib.runs.results import Results
from fedlib.runs.store import Store
from fedlib.runs.train import run, train

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
    "Results",
    "Store",
    "PROFILES",
    "resolve_profile",
    "register_model",
    "register_dataset",
    "register_method",
    "__version__",
]


def __getattr__(name: str):
    # ``experiment`` imports every paper's grids: on first use, so that ``import fedlib`` stays light
    if name in ("experiment", "Experiment"):
        from fedlib.experiments import named

        return getattr(named, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
