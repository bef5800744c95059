"""Split a labelled dataset among federated clients.

Every partitioner is pure numpy and deterministic given an integer ``seed``
(``np.random.default_rng(seed)``).  It returns a list with one entry per
client: a sorted ``int64`` array of indices into the dataset.  Sorting makes
the output canonical (easy to compare and hash); shuffling for training is the
data loader's job, and :func:`split_train_test` does its own seeded shuffle.

Invalid arguments raise ``ValueError("<param>=<value>: <what is allowed>")``
before any random draw is made.

Recipes:

* :func:`labels_per_client` -- pFedMe / FedMCSA "k labels per client" split.
* :func:`shards`            -- McMahan et al. 2017 pathological non-IID shards.
* :func:`iid`               -- uniform random split.
* :func:`dirichlet`         -- Hsu et al. 2019 / Yurochkin et al. 2019 Dir(alpha).
* :func:`labels_per_client_sizes`, :func:`dirichlet_sizes` -- the clients' sizes those
  two draw, from the class counts alone (what a run's config is checked against
  before its data loads: ``fedlib.runs.feasibility.check``).
* :func:`by_domain`         -- one client per domain (multi-domain datasets).
* :func:`split_train_test`  -- per-client train/test split (pFedMe rule).
* :func:`summary`, :func:`describe` -- tables and one-line statistics.

Modules: :mod:`~fedlib.data.partition.label_skew` (k labels per client, Dirichlet),
:mod:`~fedlib.data.partition.splits` (shards, IID, by domain, train/test),
:mod:`~fedlib.data.partition.report` (tables and statistics) and
:mod:`~fedlib.data.partition.checks` (the argument checks they share).
"""

from __future__ import annotations

from fedlib.data.partition.label_skew import dirichlet, dirichlet_sizes, labels_per_client, labels_per_client_sizes
from fedlib.data.partition.report import describe, summary
from fedlib.data.partition.splits import by_domain, iid, shards, split_train_test
