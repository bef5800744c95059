"""The Flower path's evaluation-side methods and data (``fedlib.flower.evaluation``) compute what the simulation does.

APFL (the mixture of v_i with the current global model), FedBABU (every client fine-tunes before evaluation, on
mini-batches the server draws from the fine-tuning stream), FedRoD (generic plus personal head), Per-FedAvg and
Per-FedAvg-HF (the adaptation's mini-batches drawn by the server from the evaluation stream), Local (no server
aggregation), a global test set the server evaluates on and held-out new clients: the message protocol
(``rounds.drive``) and the Flower apps (``apps.simulate``, engine 'local') equal ``fedlib.train`` in float64.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import small_synthetic
from test_flower import IMAGES, VECTORS, _images, flower_apps, referenced

from fedlib.config.run import RunConfig
from fedlib.core.state import NEW_COLUMNS
from fedlib.data import holdout
from fedlib.data.federated import FederatedData


def _global_images(n_clients=4, rows=16) -> FederatedData:
    """Small image clients with no test rows of their own and a global test set (AdaFL's image setting)."""
    g = np.random.default_rng(1)
    x = g.normal(size=(n_clients * rows, 1, 28, 28)).astype(np.float32)
    y = g.integers(0, 10, n_clients * rows)
    tr = [np.arange(i * rows, (i + 1) * rows) for i in range(n_clients)]
    te = [np.zeros(0, dtype=np.int64)] * n_clients
    gt = (g.normal(size=(20, 1, 28, 28)).astype(np.float32), g.integers(0, 10, 20))
    return FederatedData.from_parts("images", x, y, tr, te, 10, global_test=gt).to("cpu", torch.float64)


def _new_clients():
    return holdout.hold_out_clients(small_synthetic(n_clients=6, rows=60), 1 / 3, 0)


def _new_image_clients():
    return holdout.hold_out_clients(_images(n_clients=6), 1 / 3, 0)


CASES = {
    "apfl": (VECTORS, {"algorithm": "apfl"}, None),
    "fedbabu": (VECTORS, {"algorithm": "fedbabu", "babu_finetune_epochs": 2}, None),
    "fedbabu-head": (VECTORS, {"algorithm": "fedbabu", "babu_finetune_epochs": 1, "babu_finetune": "head"}, None),
    "fedrod": (VECTORS, {"algorithm": "fedrod"}, None),
    "perfedavg": (VECTORS, {"algorithm": "perfedavg", "beta": 0.05}, None),
    "perfedavg-code": (VECTORS, {"algorithm": "perfedavg", "beta": 0.05, "adapt_eval": "code"}, None),
    "perfedavg-hf": (VECTORS, {"algorithm": "perfedavg-hf", "beta": 0.05}, None),
    "local": (VECTORS, {"algorithm": "local", "clients_per_round": None}, None),
    "global-test": (IMAGES, {"selection": "attention"}, _global_images),
    "new-clients": (VECTORS, {"n_clients": 6, "new_client_frac": 1 / 3, "new_client_finetune_epochs": 2}, _new_clients),
    # a new client's local parameters (FedBN's BN) are the model's initial ones
    "new-clients-fedbn": (IMAGES, {"algorithm": "fedbn", "n_clients": 6, "new_client_frac": 1 / 3}, _new_image_clients),
}


def _case(name):
    base, kw, make = CASES[name]
    cfg = RunConfig(executor="loop", dtype="float64", **{**base, **kw})
    data = make() if make is not None else small_synthetic(n_clients=5, rows=80)
    return cfg, data


_reference = referenced(_case)


def _same(ref, server, uploads=True):
    """``test_flower._same``, with the columns these cases add (global test set, new clients) and without its
    uploads-are-counted check where nothing is uploaded (Local)."""
    got, m = pd.DataFrame(server.rows), ref.metrics
    assert list(got["round"]) == list(m["round"])
    assert np.array_equal(got.selected, m.selected) and np.array_equal(got.uploads, m.uploads)
    cols = ["test_acc", "test_acc_mean", "test_loss", "gm_test_acc", "global_test_acc"]
    cols += [c for c in NEW_COLUMNS if c in m]
    for col in cols:
        assert col in got, col
        np.testing.assert_allclose(got[col], m[col], rtol=0, atol=1e-10, equal_nan=True, err_msg=col)
    np.testing.assert_allclose(np.array(server.client_acc), ref.client_acc, rtol=0, atol=1e-10, equal_nan=True)
    assert list(got.bytes_up) == list(m.bytes_up) and list(got.bytes_down) == list(m.bytes_down)
    if uploads:
        assert (m.bytes_up > 0).all() and m.bytes_up.is_monotonic_increasing
    assert ref.traces["selected"].shape == (len(m), ref.client_acc.shape[1]) or not uploads


def _check(name, ref, server):
    _same(ref, server, uploads=name != "local")
    m = ref.metrics
    if name == "local":  # nothing travels
        assert (m.bytes_up == 0).all() and (m.bytes_down == 0).all()
    if name == "global-test":
        assert m.global_test_acc.notna().all() and m.test_acc.isna().all()
    if name.startswith("new-clients"):
        assert m.new_ft_test_acc.notna().all()
    if name.startswith(("apfl", "fedrod", "perfedavg", "fedbabu")):  # personal models evaluated beside the global
        assert not np.allclose(m.test_acc, m.gm_test_acc)


@pytest.mark.parametrize("name", sorted(CASES))
def test_message_protocol_equals_simulation(name, monkeypatch):
    from fedlib.flower.rounds import drive

    cfg, data = _case(name)
    ref = _reference(name, monkeypatch)
    _check(name, ref, drive(cfg, data))


@pytest.mark.parametrize("name", sorted(CASES))
def test_flower_apps_equal_simulation(name, monkeypatch):
    cfg, data = _case(name)
    _check(name, _reference(name, monkeypatch), flower_apps(cfg, data))


def test_deployed_server_reads_the_data_it_evaluates(monkeypatch, tmp_path, capsys):
    """A deployed ServerApp reads the data it evaluates itself from its own data root, as its clients do (AdaFL's
    settings: the data set's global test set); a server without a copy says so and evaluates none of it, so those
    columns stay empty instead of holding a number of no model."""
    pytest.importorskip("flwr")
    from fedlib.flower import deploy

    data = _global_images()
    monkeypatch.setattr("fedlib.data.load_federated", lambda cfg, root=None: data)
    assert deploy._held(RunConfig(**IMAGES)) is data
    monkeypatch.undo()
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path))  # no MNIST there
    assert deploy._held(RunConfig(**IMAGES)) is None
    assert "the server has no copy of the data" in capsys.readouterr().out
