"""AdaFL: its experiment grids, published numbers, tables and figures.

AdaFL: adaptive client selection by attention over the clients' model divergence (Eq. 1-2) with a dynamic
participation fraction (0.1 -> 0.5 in F steps over T rounds, Sec. 2-3); experiments Sec. 3 (non-IID MNIST with an
MLP, CIFAR-10 with a CNN; Tables 1-4, Figures 2-3). Published numbers: ``fedlib/papers/paper_data/adafl.csv``
(``published()``).

The package keeps apart what runs from what reads and what draws, so that a grid never depends on the store and a
figure never runs an experiment:

- ``grids``: the experiment grids, pure functions of ``(profile, available)``, with ``EXPERIMENTS``, and the
  paper's label of a config (``label``);
- ``tables``: the store read into the paper's metrics, paired comparisons and paper-vs-ours frames;
- ``figures``: the matplotlib drawing.

The names the notebooks and the experiments use are re-exported here: ``from fedlib.papers import adafl; adafl.X``
reaches them without knowing which module holds them; the others are read from their module (``adafl.grids.X``).
"""

from __future__ import annotations

from fedlib.papers.adafl.figures import plot_accuracy_vs_cost, plot_fraction_schedules, plot_selection_dynamics
from fedlib.papers.adafl.grids import EXPERIMENTS, MNIST_BASE, NAMES, label
from fedlib.papers.adafl.tables import (
    blocks,
    cost_check,
    frame,
    labelled,
    pairs,
    paper_vs_ours,
    published,
    run_metrics,
    with_counterparts,
)
