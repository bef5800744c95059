"""Named experiments at three profiles: 'smoke' (CI, seconds), 'quick' (CPU, minutes), 'paper' (the papers' settings).

The grids live with their papers (``fedlib.papers.fedmcsa``, ``.adafl``, ``.pfedla``); this module collects them
into one registry, ``EXPERIMENTS``: name -> ``grid(profile, available) -> (base config, grid cells)``, a pure function
of the profile and of which data sets are present (``Available``). Nothing here reads the results store: an
experiment built from other runs' results (FedMCSA Table 1's second stage) names that step in ``STEPS`` and takes
its output as an argument (``get(name, profile, winners=...)``); ``fedlib.experiment`` runs the step.

A notebook or a script asks for ``fedlib.experiment(name, profile)`` (``fedlib.experiments``), which uses ``get``
and ``available_cells``; so no notebook carries its own hyperparameters.
"""

from __future__ import annotations

from fedlib.config.run import RunConfig, flat_name, resolve_profile
from fedlib.data.available import Available
from fedlib.papers import adafl, fedmcsa, pfedla


# The quickstart (not a paper experiment): FedAvg vs FedProx on Synthetic(0.5, 0.5), DNN 60-20-10, FedMCSA's optimiser
# settings (lr 0.02, |D| = 20, R = 20, S = 20 of N = 100). 'paper' is FedMCSA's T = 800.
def quickstart(profile: str, available: Available | None = None):
    base = RunConfig.of(model="dnn", hidden=(20,))
    return {
        "smoke": (
            base.replace(n_clients=10, clients_per_round=5, rounds=5, local_steps=5),
            [{"algorithm": "fedavg"}, {"algorithm": "fedprox", "mu": 0.1}],
        ),
        "quick": (
            base.replace(rounds=150),
            [{"algorithm": "fedavg", "seed": [0, 1]}, {"algorithm": "fedprox", "mu": 0.1, "seed": [0, 1]}],
        ),
        "paper": (
            base.replace(rounds=800),
            [{"algorithm": "fedavg", "seed": [0, 1, 2]}, {"algorithm": "fedprox", "mu": 0.1, "seed": [0, 1, 2]}],
        ),
    }[profile]


EXPERIMENTS = {"quickstart": quickstart, **fedmcsa.EXPERIMENTS, **adafl.EXPERIMENTS, **pfedla.EXPERIMENTS}
# experiment -> (the experiment whose runs its step reads, the keyword the grid takes, step(configs, store))
STEPS = {**fedmcsa.STEPS}


def get(
    name: str, profile: str | None = None, available: Available | None = None, **inputs
) -> tuple[RunConfig, list[dict]]:
    """(base config, grid) of experiment ``name`` at ``profile`` (explicit beats env FEDLIB_PROFILE; default 'quick') for the
    data ``available`` (default: what is under the data root now). An experiment with a step (``STEPS``) takes the
    step's output by its keyword, e.g. ``get('fedmcsa_table1', 'paper', winners=...)``."""
    if name not in EXPERIMENTS:
        raise ValueError(f"experiment={name!r} is not one of: {', '.join(EXPERIMENTS)}")
    profile = resolve_profile(profile)
    available = available if available is not None else Available.scan()
    if name in STEPS:
        after, keyword, step = STEPS[name]
        if keyword not in inputs:
            raise ValueError(
                f"experiment={name!r} takes {keyword}=..., the output of the step "
                f"{step.__module__}.{step.__name__} over {after!r}'s runs (fedlib.experiment runs it)"
            )
    return EXPERIMENTS[name](profile, available, **inputs)


def flat_cells(grid: list[dict]) -> list[dict]:
    """Grid cells with dotted names (``method.mu``) under their flat names (``mu``); unknown names are an error."""
    out = []
    for cell in grid:
        flat = {}
        for k, v in cell.items():
            f = flat_name(k)
            if f in flat:
                raise ValueError(f"grid cell names {f!r} twice ({k!r} and another spelling): {cell}")
            flat[f] = v
        out.append(flat)
    return out


def available_cells(
    grid: list[dict], base: RunConfig, available: Available | None = None
) -> tuple[list[dict], list[str]]:
    """The grid cells whose data set is present, and the names of the absent data sets. A cell that names no data
    set uses ``base``'s (AdaFL's cells take MNIST from the base config), and a cell that names no domains uses
    ``base``'s domains (pFedLA's digits cells run on the domains present, which ``base`` lists)."""
    from fedlib.data import domains

    available = available if available is not None else Available.scan()
    keep, missing = [], set()
    for cell in grid:
        d = cell.get("dataset", base.data.dataset)
        if d in domains.DOMAINS:
            present = available.domains_of(d)
            doms = cell.get("domains", base.data.domains if d == base.data.dataset else None) or domains.DOMAINS[d]
            if set(doms) <= set(present) and present:
                keep.append(cell)
            else:
                missing.add(d)
        elif available.has(d):
            keep.append(cell)
        else:
            missing.add(d)
    return keep, sorted(missing)


# Kept for tests/test_fedmix.py, which reads AdaFL's labels from here; new code: fedlib.papers.adafl.
adafl_label = adafl.label
