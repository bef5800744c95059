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

Every public name of these modules is re-exported here, so ``from fedlib.papers import adafl; adafl.X`` reaches it
without knowing which module holds it.
"""

from __future__ import annotations

from fedlib.papers.adafl.figures import plot_accuracy_vs_cost, plot_fraction_schedules, plot_selection_dynamics
from fedlib.papers.adafl.grids import (
    ABLATION,
    CIFAR,
    COMBINED,
    COMBINED_LABELS,
    EXPERIMENTS,
    FEDMIX_SCALE_LABELS,
    FIG3_LABELS,
    MNIST_BASE,
    NAMES,
    SCAFFOLD_CONTROL_LABELS,
    SCAFFOLD_CONTROL_SEEDS,
    cells,
    dynamics,
    fedmix_scale,
    fig3,
    label,
    scaffold_control,
    table1,
    table3,
)
from fedlib.papers.adafl.tables import (
    TARGETS,
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

__all__ = [
    "ABLATION",
    "CIFAR",
    "COMBINED",
    "COMBINED_LABELS",
    "EXPERIMENTS",
    "FEDMIX_SCALE_LABELS",
    "FIG3_LABELS",
    "MNIST_BASE",
    "NAMES",
    "SCAFFOLD_CONTROL_LABELS",
    "SCAFFOLD_CONTROL_SEEDS",
    "cells",
    "dynamics",
    "fedmix_scale",
    "fig3",
    "label",
    "scaffold_control",
    "table1",
    "table3",
    "TARGETS",
    "blocks",
    "cost_check",
    "frame",
    "labelled",
    "pairs",
    "paper_vs_ours",
    "published",
    "run_metrics",
    "with_counterparts",
    "plot_accuracy_vs_cost",
    "plot_fraction_schedules",
    "plot_selection_dynamics",
]
