"""pFedLA: its experiment grids, published numbers, tables and figures.

Liang, Tian, Yang, Zhang, "Personalized Federated Learning with Local Attention" (pFedLA): client-local attention
modules (SE, ECA, CA and their learned hybrid) after each conv layer, on top of any FL method (FedAvg, FedProx,
FedBN, pFedMe, Ditto); experiments Sec. 4 (digits, Sec. 4.2: Table 1; Office-31 / Office-Home / DomainNet, Sec. 4.3:
Table 3 and Figures 3-4, which notebooks 32 and 35 also draw on the digits, offline; the hybrid's weights: Tables 5
and 11).

The server averages the base layers as each method does, weighted by the clients' training sizes (FedAvg's
n_k / n), where pFedLA's Sec. 3 and Algorithm 1 take the plain mean 1/N over the clients: on the digits at the
paper's 10% every domain has 743 training images, so the two are the same; at Figure 4(c)'s 100% the weights are
0.336 / 0.329 / 0.336 for MNIST / USPS / MNIST-M; on Office-31 they would be 0.685 / 0.121 / 0.194.
The paper repeats each configuration five times (Sec. 4.1): Table 1 here takes 5 seeds, Figure 4's analyses and the
Office grids 3 (the paper shows those figures without a spread). Published numbers:
``fedlib/papers/paper_data/pfedla.csv`` (``published()``).

The package keeps apart what runs from what reads and what draws, so that a grid never depends on the store and a
figure never runs an experiment:

- ``grids``: the experiment grids, pure functions of ``(profile, available)``, with ``EXPERIMENTS``;
- ``tables``: the store read into per-domain accuracies, paper-vs-ours frames and paired gains;
- ``figures``: the matplotlib drawing;
- ``params``: Tables 2 and 4, the parameter counts, recomputed from the nets.

The names the notebooks and the experiments use are re-exported here: ``from fedlib.papers import pfedla; pfedla.X``
reaches them without knowing which module holds them; the others are read from their module (``pfedla.grids.X``).
"""

from __future__ import annotations

from fedlib.papers.pfedla import params
from fedlib.papers.pfedla.figures import (
    plot_fig3,
    plot_fig4,
    plot_gain_intervals,
    plot_gains,
    plot_hybrid_weights,
    plot_init_effect,
    plot_table1,
)
from fedlib.papers.pfedla.grids import EXPERIMENTS, OFFICE_SETS, digits_base, digits_domains
from fedlib.papers.pfedla.params import overhead_table, parameter_table, readings
from fedlib.papers.pfedla.tables import curves, frame, gains, init_effect, paper_vs_ours, published
