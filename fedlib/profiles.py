"""Named experiments at three profiles: 'smoke' (CI, seconds), 'quick' (CPU, minutes), 'paper' (the papers' settings).

A notebook asks for ``(base, grid) = profiles.get(name, profile)`` and hands them to
``run_grid``; the same presets serve scripts and papermill grids, so no notebook carries its
own hyperparameters. Each entry says which paper setting its 'paper' profile follows.
"""
from __future__ import annotations

from .config import RunConfig, resolve_profile

# Quickstart: FedAvg vs FedProx on Synthetic(0.5, 0.5), DNN 60-20-10, FedMCSA's optimiser settings
# (lr 0.02, |D| = 20, R = 20, S = 20 of N = 100). 'paper' is FedMCSA's T = 800.
_QUICKSTART_BASE = RunConfig(model="dnn", hidden=(20,))
QUICKSTART = {
    "smoke": (_QUICKSTART_BASE.replace(n_clients=10, clients_per_round=5, rounds=5, local_steps=5),
              [{"algorithm": "fedavg"}, {"algorithm": "fedprox", "mu": 0.1}]),
    "quick": (_QUICKSTART_BASE.replace(rounds=150),
              [{"algorithm": "fedavg", "seed": [0, 1]}, {"algorithm": "fedprox", "mu": 0.1, "seed": [0, 1]}]),
    "paper": (_QUICKSTART_BASE.replace(rounds=800),
              [{"algorithm": "fedavg", "seed": [0, 1, 2]}, {"algorithm": "fedprox", "mu": 0.1, "seed": [0, 1, 2]}]),
}

# FedMCSA (Sec. 5.1): lr 0.02, |D| = 20, R = 20, sigma = 50, lambda = 5, T = 800; Synthetic N = 100, S = 20, DNN
# hidden 20; MNIST/FMNIST N = 20 (2 labels per client, the pFedMe recipe, seed 1), S = 10, DNN hidden 100.
# pFedMe's own settings where FedMCSA gives none: K = 5, eta_p = 0.01, beta = 1, lambda = FedMCSA's 5.
FEDMCSA_DATA = {
    "synthetic": dict(dataset="synthetic", partition="natural", n_clients=100, clients_per_round=20),
    "mnist": dict(dataset="mnist", partition="labels", n_clients=20, clients_per_round=10, data_seed=1),
    "fmnist": dict(dataset="fmnist", partition="labels", n_clients=20, clients_per_round=10, data_seed=1),
}
FEDMCSA_HIDDEN = {"synthetic": (20,), "mnist": (100,), "fmnist": (100,)}
TABLE2_ALGORITHMS = ["fedmcsa", "fedmcsa-mcsa", "fedavg", "fedavg+mcsa", "pfedme", "pfedme+mcsa", "local"]


def _fedmcsa_base(rounds: int) -> RunConfig:
    """FedMCSA's optimiser settings (Sec. 5.1) at ``rounds`` rounds."""
    return RunConfig(lr=0.02, batch_size=20, local_steps=20, rounds=rounds)


def _smoke(cells: list[dict]) -> list[dict]:
    """CI size: a few clients, a few local steps."""
    return [{**c, "n_clients": 6, "clients_per_round": 3, "local_steps": 3} for c in cells]


def _fedmcsa_cells(datasets, models, **extra) -> list[dict]:
    cells = []
    for d in datasets:
        for m in models:
            cells.append({**FEDMCSA_DATA[d], "model": m, "hidden": FEDMCSA_HIDDEN[d] if m == "dnn" else None, **extra})
    return cells


def _table2(datasets, rounds, seeds, smoke=False):
    cells = _fedmcsa_cells(datasets, ["mlr", "dnn"], algorithm=TABLE2_ALGORITHMS, seed=seeds)
    return _fedmcsa_base(rounds), _smoke(cells) if smoke else cells


FEDMCSA_TABLE2 = {
    "smoke": _table2(["synthetic"], 3, [0], smoke=True),
    "quick": _table2(["synthetic", "mnist"], 200, [0]),
    "paper": _table2(["synthetic", "mnist", "fmnist"], 800, [0, 1, 2]),
}

# Figure 5: sigma on Synthetic, MLR and DNN, everything else at the defaults; the sweep goes on to the
# local limit (sigma -> inf: each client attends only to itself) and the Local baseline is drawn beside it.
SIGMAS = [0.0, 10.0, 30.0, 50.0, 70.0, 100.0, 1000.0, 100000.0]


def _fig5(rounds, sigmas, seeds, smoke=False):
    cells = (_fedmcsa_cells(["synthetic"], ["mlr", "dnn"], algorithm="fedmcsa", sigma=sigmas, seed=seeds)
             + _fedmcsa_cells(["synthetic"], ["mlr", "dnn"], algorithm="local", seed=seeds))
    return _fedmcsa_base(rounds), _smoke(cells) if smoke else cells


FEDMCSA_SIGMA = {
    "smoke": _fig5(3, [0.0, 50.0, 100000.0], [0], smoke=True),
    "quick": _fig5(200, SIGMAS, [0]),
    "paper": _fig5(800, SIGMAS, [0]),
}

# Figures 3 (MLR) and 4 (DNN): every method "with the same hyperparameters" (lr 0.02, |D| = 20, R = 20, T = 800) on
# Synthetic and MNIST. The paper gives no values for the baselines' own knobs; ours: FedProx mu = 0.01; Per-FedAvg
# beta = 0.001 (pFedMe's README command for Per-FedAvg), alpha = lr; pFedMe as in Table 2; HeurFedAMP sigma = 50
# (FedMCSA's), xi_ii = 0.5, lambda = 5. pFedMe gives both PM and GM from one run.
FIGURE_METHODS = [{"algorithm": "fedavg"}, {"algorithm": "fedprox", "mu": 0.01},
                  {"algorithm": "perfedavg", "beta": 0.001}, {"algorithm": "pfedme"},
                  {"algorithm": "heurfedamp"}, {"algorithm": "fedmcsa"}, {"algorithm": "local"}]


def _figure(model, datasets, rounds, smoke=False):
    cells = [{**cell, **m} for cell in _fedmcsa_cells(datasets, [model]) for m in FIGURE_METHODS]
    return _fedmcsa_base(rounds), _smoke(cells) if smoke else cells


FEDMCSA_FIG3 = {"smoke": _figure("mlr", ["synthetic"], 3, True), "quick": _figure("mlr", ["synthetic", "mnist"], 200),
                "paper": _figure("mlr", ["synthetic", "mnist"], 800)}
FEDMCSA_FIG4 = {"smoke": _figure("dnn", ["synthetic"], 3, True), "quick": _figure("dnn", ["synthetic", "mnist"], 200),
                "paper": _figure("dnn", ["synthetic", "mnist"], 800)}

EXPERIMENTS = {"quickstart": QUICKSTART, "fedmcsa_fig3": FEDMCSA_FIG3, "fedmcsa_fig4": FEDMCSA_FIG4,
               "fedmcsa_table2": FEDMCSA_TABLE2, "fedmcsa_sigma": FEDMCSA_SIGMA}


def available_cells(grid: list[dict]) -> tuple[list[dict], list[str]]:
    """The grid cells whose data set is present, and the names of the absent data sets."""
    from .data import readers
    keep, missing = [], set()
    for cell in grid:
        d = cell.get("dataset", "synthetic")
        if d == "synthetic" or readers.available(d):
            keep.append(cell)
        else:
            missing.add(d)
    return keep, sorted(missing)


def get(name: str, profile: str | None = None) -> tuple[RunConfig, list[dict]]:
    """(base config, grid) of experiment ``name`` at ``profile`` (env FEDLIB_PROFILE wins, default 'quick')."""
    if name not in EXPERIMENTS:
        raise ValueError(f"experiment={name!r} is not one of: {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name][resolve_profile(profile)]
