"""FedFomo on the Flower path: each training client downloads the models the server chose for it and weighs them on
its own held-out rows; equal to the simulation in float64, its downloads counted alike."""

import numpy as np
import pandas as pd
from helpers import small_synthetic
from test_flower import VECTORS, _same, _simulated, flower_apps

from fedlib.config.run import RunConfig

FOMO = dict(VECTORS, algorithm="fedfomo", fomo_m=2)


def _fomo(**kw):
    return RunConfig(**{"executor": "loop", "dtype": "float64", **FOMO, **kw}), small_synthetic(n_clients=5, rows=80)


def test_fedfomo_message_protocol_equals_simulation(monkeypatch):
    from fedlib.flower.rounds import drive

    cfg, data = _fomo()
    ref = _simulated(cfg, data, monkeypatch)
    server = drive(cfg, data)
    _same(ref, server)
    assert server.refused == []


def test_fedfomo_flower_apps_equal_simulation(monkeypatch):
    cfg, data = _fomo(rounds=2)
    _same(_simulated(cfg, data, monkeypatch), flower_apps(cfg, data))


def test_fedfomo_bytes_by_hand(monkeypatch):
    """bytes_down: each selected client downloads min(M, others uploaded before) models (start='personal': no global
    model, no personalised one); bytes_up: each uploads its model and its M weights w_n (float64)."""
    cfg, data = _fomo()
    ref = _simulated(cfg, data, monkeypatch)
    model = (100 * 60 + 100 + 10 * 100 + 10) * 8  # the dnn's float64 tensors: one upload, one downloaded model
    uploaded, down, up = np.zeros(5, dtype=bool), [], []
    for row in ref.traces["selected"]:
        got = sum(model * min(2, int(uploaded.sum() - uploaded[i])) for i in np.flatnonzero(row))
        down.append((down[-1] if down else 0) + got)
        up.append((up[-1] if up else 0) + int(row.sum()) * (model + 2 * 8))
        uploaded |= row
    assert down == [0, 6 * model, 12 * model]  # 3 clients a round, 2 models each once 3 others uploaded
    assert list(ref.metrics.bytes_down) == down and list(ref.metrics.bytes_up) == up


def test_fedfomo_weighs_on_the_data_validation_split(monkeypatch):
    """With a validation split (val_frac > 0) FedFomo weighs on it, on both sides, and the stacked executor too (M = 3:
    several positive weights, so weighing on other rows changes the mixture and fails this test)."""
    from fedlib.data import holdout
    from fedlib.flower.rounds import drive

    cfg, data = _fomo(val_frac=0.25, executor="stacked", fomo_m=3)
    data = holdout.validation_split(data, 0.25, 0)
    ref = _simulated(cfg, data, monkeypatch)
    server = drive(cfg, data)
    _same(ref, server)
    assert np.isfinite(ref.metrics.val_acc).all()
    np.testing.assert_allclose(pd.DataFrame(server.rows).val_acc, ref.metrics.val_acc, rtol=0, atol=1e-10)
