"""Named experiments: ``experiment(name)`` runs (or draws from the store) a paper's grid at a profile; ``profiles``
holds every experiment's configs; ``python -m fedlib.experiments`` is the command line; ``verify`` retrains stored
runs and compares."""

from fedlib.experiments.named import Experiment, NothingStoredError, configs, experiment, status

__all__ = ["Experiment", "NothingStoredError", "configs", "experiment", "status"]
