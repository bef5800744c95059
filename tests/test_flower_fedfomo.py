"""FedFomo on the Flower path: each training client downloads the models the server chose for it and weighs them on
its own held-out rows; equal to the simulation in float64, its downloads counted alike."""

import numpy as np
import pytest
from helpers import small_synthetic
from test_flower import VECTORS, _same, _simulated

from fedlib.config.run import RunConfig

FOMO = dict(VECTORS, algorithm="fedfomo", fomo_m=2)


def _fomo(**kw):
    return RunConfig(executor="loop", dtype="float64", **{**FOMO, **kw}), small_synthetic(n_clients=5, rows=80)


def test_fedfomo_message_protocol_equals_simulation(monkeypatch):
    from fedlib.flower.rounds import drive

    cfg, data = _fomo()
    ref = _simulated(cfg, data, monkeypatch)
    server = drive(cfg, data)
    _same(ref, server)
    assert server.refused == []


def test_fedfomo_flower_apps_equal_simulation(monkeypatch):
    pytest.importorskip("flwr")
    from fedlib.flower.apps import simulate

    cfg, data = _fomo(rounds=2)
    ref = _simulated(cfg, data, monkeypatch)
    server = simulate(cfg, data)
    _same(ref, server)
    assert server.refused == []
