"""The Flower path for methods whose server and clients exchange more than the model (``Algorithm.exchange``):
SCAFFOLD's control variates, FedDyn's h (updated from the uploads), FedNova's steps. A Flower run and the message
protocol equal the simulation in float64 (``test_flower._same``: accuracies, per-client accuracies, selections,
bytes), a client rebuilt from its ``state_dict`` every message gives the same run, a malformed extra tensor is
refused, and the simulation's bytes count what travels (by hand)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_flower import VECTORS, _same, _simulated, flower_apps, referenced

from fedlib import RunConfig
from fedlib.data.federated import FederatedData
from fedlib.data.synthetic import synthetic

CASES = {
    "scaffold": {"algorithm": "scaffold"},
    "feddyn": {"algorithm": "feddyn", "dyn_alpha": 0.1},
    # one epoch of ceil(n_i / B) steps: the clients' tau_i differ, so FedNova is not FedAvg
    "fednova": {"algorithm": "fednova", "momentum": 0.5, "local_steps": None, "local_epochs": 1},
}


def _unequal(n_clients=5):
    """Synthetic(0.5, 0.5) clients of 40, 60, ... rows, split 75/25: unequal sizes, so unequal steps per epoch."""
    xs, ys = synthetic(n_clients=n_clients, seed=0)
    xs, ys = [x[: 40 + 20 * i] for i, x in enumerate(xs)], [y[: 40 + 20 * i] for i, y in enumerate(ys)]
    tr = [np.arange(int(0.75 * len(y))) for y in ys]
    te = [np.arange(int(0.75 * len(y)), len(y)) for y in ys]
    return FederatedData.from_clients("unequal", xs, ys, tr, te, 10).to("cpu", torch.float64)


def _case(name):
    return RunConfig(executor="loop", dtype="float64", **{**VECTORS, **CASES[name]}), _unequal()


_reference = referenced(_case)


@pytest.mark.parametrize("name", sorted(CASES))
def test_message_protocol_equals_simulation(name, monkeypatch):
    from fedlib.flower.rounds import drive

    cfg, data = _case(name)
    _same(_reference(name, monkeypatch), drive(cfg, data))


@pytest.mark.parametrize("name", sorted(CASES))
def test_flower_apps_equal_simulation(name, monkeypatch):
    """Through Flower's wire form; each message rebuilds its client from ``context.state`` (``Client.state_dict``)."""
    cfg, data = _case(name)
    _same(_reference(name, monkeypatch), flower_apps(cfg, data))


def _rebuilt_drive(cfg, data):
    """``rounds.drive`` with every client rebuilt from its ``state_dict`` before each message, and the state a
    rebuilt client keeps checked to hold the method's per-client state."""
    from fedlib.flower.evaluation import Held, eval_plans
    from fedlib.flower.rounds import Client, Server, client_splits

    def build(i):
        tr, te, va = client_splits(data, i)
        return Client(cfg, i, tr, te, data.input_shape, data.n_classes, val=va)

    saved = {i: build(i).state_dict() for i in range(data.n_clients)}

    def client(i):
        c = build(i)
        c.load_state_dict(saved[i])
        return c

    c0 = build(0)
    sizes = np.array([build(i).sizes()[0] for i in range(data.n_clients)])
    server = Server(cfg, sizes, data.input_shape, data.n_classes)
    server.test_sizes = np.array([build(i).sizes()[1] for i in range(data.n_clients)])
    held = Held(server, data)
    del c0
    for t in range(1, cfg.rounds + 1):
        selected, tasks = server.begin(t)
        uploads = {}
        for task in tasks:
            c = client(task.client)
            up = c.fit(task)
            saved[task.client] = c.state_dict()
            uploads[task.client] = server.check(t, task.client, up)
        out = server.end(t, selected, uploads, sum(task.bytes_down() for task in tasks))
        params, plans = server.evaluation(), eval_plans(server, t)
        reports = []
        for i in range(data.n_clients):
            c = client(i)
            reports.append(c.evaluate(t, params, plans[i]))
            saved[i] = c.state_dict()
        server.record(out, reports, held.columns(t))
    return server, saved


@pytest.mark.parametrize("name", ["scaffold", "feddyn"])
def test_client_rebuilt_from_state_dict(name, monkeypatch):
    """A client made afresh from its ``state_dict`` before every message (what a ClientApp does with
    ``context.state``) gives the simulation's run, and its saved state holds its own c_i (SCAFFOLD) or g_k (FedDyn):
    the per-client state stays on the client, changed where it trained."""
    cfg, data = _case(name)
    ref = _reference(name, monkeypatch)
    server, saved = _rebuilt_drive(cfg, data)
    _same(ref, server)
    own = "extra.scaffold.ci." if name == "scaffold" else "extra.feddyn.g."
    trained = np.flatnonzero(ref.traces["selected"].any(0))
    for i in trained:
        rows = [v for k, v in saved[int(i)].items() if k.startswith(own)]
        assert rows and any(bool(v.abs().sum() > 0) for v in rows), (i, sorted(saved[int(i)])[:5])


def test_scaffold_bytes_by_hand(monkeypatch):
    """SCAFFOLD doubles FedAvg's traffic: an MLR on 60 features and 10 classes is 610 float64 numbers (4,880
    bytes); each of the 3 selected clients a round receives the global model and c, and uploads its model and
    delta c_i. FedNova adds one float64 (tau_i) to each upload; FedDyn sends the models alone."""
    data = _unequal()
    one = (60 * 10 + 10) * 8
    cfg = RunConfig(n_clients=5, clients_per_round=3, rounds=3, local_steps=2, batch_size=5, model="mlr", lr=0.1,
                    executor="loop", dtype="float64")  # fmt: skip
    sc = _simulated(cfg.replace(algorithm="scaffold"), data, monkeypatch).metrics
    assert list(sc.bytes_up) == [2 * 3 * one * t for t in (1, 2, 3)] == list(sc.bytes_down)
    nova = _simulated(cfg.replace(algorithm="fednova"), data, monkeypatch).metrics
    assert list(nova.bytes_up) == [3 * (one + 8) * t for t in (1, 2, 3)]
    assert list(nova.bytes_down) == [3 * one * t for t in (1, 2, 3)]
    dyn = _simulated(cfg.replace(algorithm="feddyn"), data, monkeypatch).metrics
    assert list(dyn.bytes_up) == [3 * one * t for t in (1, 2, 3)] == list(dyn.bytes_down)


@pytest.mark.parametrize("how", ["shape", "nan", "missing"])
def test_malformed_state_refused(how):
    """An upload whose method rows (SCAFFOLD's delta c_i, FedNova's tau_i) have the wrong shape, a NaN, or are
    missing is refused like a malformed model."""
    from fedlib.flower.messages import STATE
    from fedlib.flower.rounds import Client, RefusedUpdate, Server, client_splits

    for name in ("scaffold", "fednova"):
        cfg, data = _case(name)
        tr, te, _ = client_splits(data, 0)
        server = Server(cfg, np.asarray(data.train.sizes), data.input_shape, data.n_classes)
        _, tasks = server.begin(1)
        c = Client(cfg, tasks[0].client, *client_splits(data, tasks[0].client)[:2], data.input_shape, data.n_classes)
        up = c.fit(tasks[0])
        assert server.check(1, c.index, up) is up
        key = next(k for k in up if k.startswith(STATE))
        bad = dict(up)
        if how == "shape":
            bad[key] = torch.zeros(3, dtype=torch.float64)
        elif how == "nan":
            bad[key] = torch.full_like(up[key], float("nan"))
        else:
            del bad[key]
        with pytest.raises(RefusedUpdate):
            server.check(1, c.index, bad)
