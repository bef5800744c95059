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

EXPERIMENTS = {"quickstart": QUICKSTART}


def get(name: str, profile: str | None = None) -> tuple[RunConfig, list[dict]]:
    """(base config, grid) of experiment ``name`` at ``profile`` (env FEDLIB_PROFILE wins, default 'quick')."""
    if name not in EXPERIMENTS:
        raise ValueError(f"experiment={name!r} is not one of: {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name][resolve_profile(profile)]
