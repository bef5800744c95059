"""The Flower path for methods whose server and clients exchange more than the model (``Algorithm.exchange``):
SCAFFOLD's control variates, FedDyn's h, FedNova's steps. A Flower run and the message protocol equal the simulation
in float64 (``test_flower._same``: accuracies, per-client accuracies, selections, bytes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import small_synthetic
from test_flower import VECTORS, _same, _simulated

from fedlib import RunConfig

CASES = {
    "scaffold": {"algorithm": "scaffold"},
    "feddyn": {"algorithm": "feddyn", "dyn_alpha": 0.1},
    "fednova": {"algorithm": "fednova", "momentum": 0.5, "local_steps": None, "local_epochs": 1},
}


def _case(name):
    kw = {**VECTORS, **CASES[name]}
    cfg = RunConfig(executor="loop", dtype="float64", **kw)
    # unequal client sizes: FedNova's steps differ between clients (epochs of ceil(n_i / B) steps)
    data = small_synthetic(n_clients=5, rows=80 if name != "fednova" else 120)
    return cfg, data


@pytest.mark.parametrize("name", sorted(CASES))
def test_message_protocol_equals_simulation(name, monkeypatch):
    from fedlib.flower.rounds import drive

    cfg, data = _case(name)
    _same(_simulated(cfg, data, monkeypatch), drive(cfg, data))
