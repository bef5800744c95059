"""Which data sets are under the data root: the only input an experiment's grid takes besides the profile."""

from __future__ import annotations

from dataclasses import dataclass

from fedlib.data import domains, readers


@dataclass(frozen=True)
class Available:
    """Which data sets are under the data root: the only input an experiment's grid takes besides the profile.
    ``datasets``: the data sets present (Synthetic is generated, so always); ``domains``: for each feature-shift data
    set, the domains present (empty: absent)."""

    datasets: frozenset = frozenset({"synthetic"})
    domains: tuple = ()  # ((data set, (domain, ...)), ...)

    @classmethod
    def scan(cls, root=None) -> "Available":
        """What is under the data root now (``FEDLIB_DATA`` or ``data/``); nothing is decoded."""
        flat = {d for d in ("mnist", "fmnist", "cifar10") if readers.available(d, root)}
        present = domains.available(root) if root is not None else domains.available()
        return cls(
            frozenset({"synthetic"} | flat | {d for d, doms in present.items() if doms}),
            tuple((d, tuple(doms)) for d, doms in present.items()),
        )

    def domains_of(self, dataset: str) -> tuple:
        """The domains of a feature-shift data set that are present (empty when it is absent)."""
        return dict(self.domains).get(dataset, ())

    def has(self, dataset: str) -> bool:
        return dataset in self.datasets
