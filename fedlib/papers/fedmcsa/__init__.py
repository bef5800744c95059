"""FedMCSA: its experiment grids, Table 1's tuning protocol, its tables and figures.

Personalized federated learning via model-component self-attention (FedMCSA): each client's personalised model is a
per-component attention mix of the sampled clients' uploads (Sec. 3-4, Algorithm 1); experiments Sec. 5 (Synthetic,
MNIST, FMNIST, CIFAR-10; MLR and DNN; Tables 1-2, Figures 3-5). Published numbers:
``fedlib/papers/paper_data/fedmcsa.csv`` (``published()``).

The package keeps apart what runs from what reads and what draws, so that a grid never depends on the store and a
figure never runs an experiment:

- ``paper``: the paper's settings (Sec. 5.1), its published numbers, the two label partitions;
- ``grids``: the experiment grids, pure functions of ``(profile, available)``, with ``EXPERIMENTS`` and ``STEPS``;
- ``tuning``: Table 1's protocol, the step that picks each row's winner from the stored first-stage runs;
- ``tables``: the store read into the tables the notebooks show (both readings, both partitions, FedMCSA^-MCSA);
- ``figures``: the matplotlib drawing.

The names the notebooks and the experiments use are re-exported here: ``from fedlib.papers import fedmcsa; fedmcsa.X``
reaches them without knowing which module holds them; the others are read from their module (``fedmcsa.grids.X``).
"""

from __future__ import annotations

from fedlib.papers.fedmcsa.figures import (
    FIGURES,
    figure_3_4,
    figure_experiment,
    plot_attention_matrices,
    plot_minus_mcsa,
    plot_paper_by_partition,
    plot_readings_sigma,
    plot_sigma_study,
    plot_switches,
    plot_tuning_gain,
    spectral_order,
)
from fedlib.papers.fedmcsa.grids import (
    EXPERIMENTS,
    IMAGE_GRID,
    READINGS_IMAGES,
    STEPS,
    TABLE1_SEEDS,
    code_eval_winners,
    partition_winners,
    readings_images,
)
from fedlib.papers.fedmcsa.paper import DATA, FEDMCSA_PARTITION, PARTITIONS, base, partition_label, published
from fedlib.papers.fedmcsa.tables import (
    by_partition,
    figure_margins,
    mcsa_gain,
    method_frame,
    minus_mcsa_table,
    paper_by_partition,
    plus_mcsa,
    reading,
    readings_table,
    switched_eval,
    switches,
)
from fedlib.papers.fedmcsa.tuning import (
    ROWS,
    TABLE1_KNOBS,
    TABLE1_LRS,
    grid_frame,
    select,
    setting,
    status,
    table1_runs,
    table1_vs_paper,
    table1_winners,
)
