"""fedlib's methods as Flower apps (``fedlib.flower``) compute what the simulation computes.

On the same data, config and seed, a run of the Flower ``ServerApp`` and ``ClientApp`` (every message through Flower's
wire form, ``fedlib.flower.apps.LocalGrid``) and ``fedlib.train`` select the same clients, give the same per-round
accuracies and losses (float64, loop executor: within 1e-10; they agree exactly here) and count the same bytes up
and down. A client's local groups (FedBN's BN, pFedLA's attention) are never in a message; malformed or missing
uploads are refused and logged, and the round goes on with the others. ``import fedlib`` imports no flwr.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import small_synthetic

from fedlib.config.run import RunConfig
from fedlib.data.federated import FederatedData


def test_import_fedlib_imports_no_flwr():
    code = "import sys, fedlib, fedlib.flower.rounds; print(any(m == 'flwr' or m.startswith('flwr.') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _images(n_clients=4, rows=24) -> FederatedData:
    g = np.random.default_rng(0)
    xs = [g.normal(size=(rows, 1, 28, 28)).astype(np.float32) + 0.2 * i for i in range(n_clients)]
    ys = [g.integers(0, 10, rows) for _ in range(n_clients)]
    tr, te = [np.arange(rows * 3 // 4)] * n_clients, [np.arange(rows * 3 // 4, rows)] * n_clients
    return FederatedData.from_clients("images", xs, ys, tr, te, 10).to("cpu", torch.float64)


VECTORS = dict(n_clients=5, clients_per_round=3, rounds=3, local_steps=3, batch_size=5, model="dnn", lr=0.1)
IMAGES = dict(n_clients=4, clients_per_round=2, rounds=3, local_steps=2, batch_size=4, model="lenet", dataset="mnist",
              partition="iid", lr=0.05)  # fmt: skip
CASES = {
    "fedavg": (VECTORS, {}),
    "fedprox": (VECTORS, {"algorithm": "fedprox", "mu": 0.5}),
    "fedmcsa": (VECTORS, {"algorithm": "fedmcsa"}),
    "adafl": (VECTORS, {"selection": "attention"}),
    "ditto": (VECTORS, {"algorithm": "ditto"}),
    "fedbn": (IMAGES, {"algorithm": "fedbn"}),
    "pfedla-se": (IMAGES, {"attention": "se", "attention_init": "per_client"}),
    "fedper": (VECTORS, {"algorithm": "fedper"}),
    "fedamp": (VECTORS, {"algorithm": "fedamp"}),
    "pfedme": (VECTORS, {"algorithm": "pfedme"}),
}


def _case(name):
    base, kw = CASES[name]
    cfg = RunConfig(executor="loop", dtype="float64", **base, **kw)
    data = small_synthetic(n_clients=5, rows=80) if base is VECTORS else _images()
    return cfg, data


def _simulated(cfg, data, monkeypatch):
    """``fedlib.train(cfg)`` on ``data`` (its loader handed the data), with the round's selections recorded."""
    import fedlib.runs.train as T

    monkeypatch.setattr(T, "load_federated", lambda cfg, root=None: data)
    return T.train(cfg, progress=False)


def referenced(case):
    """``reference(name, monkeypatch)`` for a test file's ``case(name) -> (cfg, data)``: ``fedlib.train``'s result
    of each case, computed once and shared by the tests that compare with it."""
    cache: dict = {}

    def reference(name, monkeypatch):
        if name not in cache:
            cache[name] = _simulated(*case(name), monkeypatch)
        return cache[name]

    return reference


_reference = referenced(_case)


def flower_apps(cfg, data):
    """``cfg``'s run through Flower's ServerApp and ClientApp (``apps.simulate``: every message in Flower's wire
    form), checked to have refused no upload."""
    pytest.importorskip("flwr")
    from fedlib.flower.apps import simulate

    server = simulate(cfg, data)
    assert server.refused == []
    return server


@pytest.mark.parametrize("name", sorted(CASES))
def test_message_protocol_equals_simulation(name, monkeypatch):
    """The server and client halves (``fedlib.flower.rounds``, no Flower) exchanging their messages in process."""
    from fedlib.flower.rounds import drive

    cfg, data = _case(name)
    ref = _reference(name, monkeypatch)
    server = drive(cfg, data)
    _same(ref, server)


@pytest.mark.parametrize("name", sorted(CASES))
def test_flower_apps_equal_simulation(name, monkeypatch):
    cfg, data = _case(name)
    _same(_reference(name, monkeypatch), flower_apps(cfg, data))


def _same(ref, server, moves=True):
    """``server``'s run is ``ref``'s (``fedlib.train``'s); ``moves``: whether models travel (Local's do not)."""
    got = pd.DataFrame(server.rows)
    m = ref.metrics
    assert list(got["round"]) == list(m["round"])
    assert np.array_equal(got.selected, m.selected) and np.array_equal(got.uploads, m.uploads)
    sel = ref.traces["selected"]  # the same clients each round: AdaFL's scores evolve the same on both sides
    for col in ("test_acc", "test_acc_mean", "test_loss", "gm_test_acc"):
        np.testing.assert_allclose(got[col], m[col], rtol=0, atol=1e-10, equal_nan=True, err_msg=col)
    np.testing.assert_allclose(np.array(server.client_acc), ref.client_acc, rtol=0, atol=1e-10)
    assert list(got.bytes_up) == list(m.bytes_up) and list(got.bytes_down) == list(m.bytes_down)
    assert ((m.bytes_up > 0).all() if moves else (m.bytes_up == 0).all()) and m.bytes_up.is_monotonic_increasing
    assert sel.shape == (len(m), ref.client_acc.shape[1])


def test_selected_clients_match(monkeypatch):
    """AdaFL's selection: the clients each round picks, on both sides (its scores depend on the uploads)."""
    from fedlib.flower.rounds import Client, Server, client_splits

    cfg, data = _case("adafl")
    ref = _reference("adafl", monkeypatch)
    clients = [Client(cfg, i, *client_splits(data, i)[:2], data.input_shape, data.n_classes) for i in range(5)]
    server = Server(cfg, np.array([c.sizes()[0] for c in clients]), data.input_shape, data.n_classes)
    for t in range(1, cfg.rounds + 1):
        selected, tasks = server.begin(t)
        assert np.flatnonzero(ref.traces["selected"][t - 1]).tolist() == sorted(selected.tolist())
        ups = {task.client: clients[task.client].fit(task) for task in tasks}
        server.end(t, selected, {i: u for i, u in ups.items() if u}, sum(task.bytes_down() for task in tasks))


@pytest.mark.parametrize("name, group", [("fedbn", "bn"), ("pfedla-se", "attn")])
def test_local_groups_never_travel(name, group):
    """No message holds a parameter of a group the method keeps on the clients."""
    from fedlib.flower.rounds import Client, Server, client_splits
    from fedlib.models.groups import param_groups

    cfg, data = _case(name)
    clients = [Client(cfg, i, *client_splits(data, i)[:2], data.input_shape, data.n_classes) for i in range(4)]
    groups = param_groups(clients[0].model)
    local = {k for k, g in groups.items() if g == group}
    assert local
    server = Server(cfg, np.array([c.sizes()[0] for c in clients]), data.input_shape, data.n_classes)
    initial = {k: v.clone() for k, v in clients[0].model.state_dict().items() if k in local}
    for t in (1, 2):
        selected, tasks = server.begin(t)
        ups = {}
        for task in tasks:
            assert not local & (set(task.params) | set(task.personal))
            ups[task.client] = clients[task.client].fit(task)
            assert not local & set(ups[task.client])
        server.end(t, selected, ups, 0)
    assert not local & set(server.evaluation())
    trained = next(c for c in clients if c.state.round > 0)  # its local groups moved, on the client only
    assert any(not torch.equal(initial[k], trained.state.client_params[k][0]) for k in local if k.endswith("weight"))


def test_malformed_uploads_are_refused(caplog):
    """A NaN upload and a wrongly shaped one are refused (logged, recorded), and the round aggregates the others."""
    pytest.importorskip("flwr")
    from flwr.app import Array, ArrayRecord

    from fedlib.flower.apps import simulate

    cfg, data = _case("fedavg")
    cfg = cfg.replace(clients_per_round=5)

    def corrupt(msg, context, call_next):
        reply = call_next(msg, context)
        if msg.metadata.message_type != "train":
            return reply
        t, i = int(msg.content["config"]["t"]), int(context.node_config["partition-id"])
        if t == 2 and i in (1, 3):
            rec = reply.content["upload"]
            k = next(iter(rec))
            a = rec[k].numpy().copy()
            if i == 1:
                a.flat[0] = np.nan
            else:
                a = a[:-1]
            new = ArrayRecord({**{n: v for n, v in rec.items()}, k: Array(a)})
            reply.content["upload"] = new
        return reply

    with caplog.at_level("WARNING", logger="fedlib.flower"):
        server = simulate(cfg, data, mods=[corrupt])
    assert sorted((t, c) for t, c, _ in server.refused) == [(2, 1), (2, 3)]
    why = dict(((t, c), w) for t, c, w in server.refused)
    assert "non-finite" in why[(2, 1)] and "expected" in why[(2, 3)]
    assert "refused" in caplog.text
    rows = pd.DataFrame(server.rows)
    assert list(rows.uploads) == [5, 8, 13]  # round 2 aggregated the three well-formed uploads
    assert np.isfinite(rows.test_loss).all()


def test_failed_client_is_left_out():
    """A client whose ClientApp fails in a round (a killed process answers nothing, a crash answers an error) is
    left out of that round; the run goes on and the client rejoins the next round."""
    pytest.importorskip("flwr")
    from fedlib.flower.apps import simulate

    cfg, data = _case("fedavg")
    cfg = cfg.replace(clients_per_round=5)

    def crash(msg, context, call_next):
        if msg.metadata.message_type == "train" and int(msg.content["config"]["t"]) == 2:
            if int(context.node_config["partition-id"]) == 4:
                raise RuntimeError("killed")
        return call_next(msg, context)

    server = simulate(cfg, data, mods=[crash])
    assert [(t, c) for t, c, _ in server.refused] == [(2, 4)]
    assert list(pd.DataFrame(server.rows).uploads) == [5, 9, 14]


def test_simulated_failures_are_refused():
    from fedlib.flower.rounds import setup

    with pytest.raises(ValueError, match="dropout and stragglers simulate failing clients"):
        setup(RunConfig(n_clients=3, clients_per_round=2, dropout=0.5), (60,), 10, None)


def test_bytes_by_hand(monkeypatch):
    """The simulation's byte columns: an MLR on 60 features and 10 classes is 610 float64 numbers (4,880 bytes) a
    model. FedAvg sends the global model to its 3 selected clients and receives 3 uploads a round; FedMCSA (every
    client trains, starting from its W_i where one waits) sends nothing in round 1 and, from round 2, the W_i of
    the clients that uploaded the round before, the clients its selection drew."""
    data = small_synthetic(n_clients=5, rows=60)
    one = (60 * 10 + 10) * 8
    cfg = RunConfig(n_clients=5, clients_per_round=3, rounds=3, local_steps=2, batch_size=5, model="mlr", lr=0.1,
                    executor="loop", dtype="float64")  # fmt: skip
    fedavg = _simulated(cfg, data, monkeypatch).metrics
    assert list(fedavg.bytes_up) == [3 * one * t for t in (1, 2, 3)] == list(fedavg.bytes_down)
    mcsa = _simulated(cfg.replace(algorithm="fedmcsa"), data, monkeypatch).metrics
    assert list(mcsa.bytes_up) == [3 * one * t for t in (1, 2, 3)]
    assert list(mcsa.bytes_down) == [0, 3 * one, 6 * one]
    # float32 halves them
    f32 = _simulated(cfg.replace(dtype="float32"), data.to("cpu", torch.float32), monkeypatch).metrics
    assert list(f32.bytes_up) == [3 * one // 2 * t for t in (1, 2, 3)]


def test_stored_runs_without_byte_columns_read(tmp_path, monkeypatch):
    """A run stored before the byte columns (its metrics.csv lacks them) reads as stored, without them."""
    from fedlib import Store, run

    monkeypatch.delenv("FEDLIB_READ_UNSEALED", raising=False)
    cfg = RunConfig(n_clients=4, clients_per_round=2, rounds=2, local_steps=2, model="mlr")
    store = Store(tmp_path)
    first = run(cfg, store, progress=False)
    assert {"bytes_up", "bytes_down"} <= set(first.metrics.columns)
    folder = store.path(cfg)
    m = pd.read_csv(folder / "metrics.csv").drop(columns=["bytes_up", "bytes_down"])
    m.to_csv(folder / "metrics.csv", index=False, float_format="%.6g")
    (folder / "manifest.json").unlink()
    store.reseal(cfg)  # as the run was sealed when it was stored, before the columns
    again = store.load(cfg)
    assert again is not None and "bytes_up" not in again.metrics.columns
    assert np.allclose(again.metrics.test_loss, first.metrics.test_loss, rtol=1e-5, atol=0)


@pytest.mark.slow
@pytest.mark.ports
def test_flower_simulation_engine_equals_simulation(monkeypatch):
    """Flower's own simulation engine (``run_simulation``: the ClientApps in Ray actors, their state kept by the
    engine) gives the simulation's numbers too."""
    pytest.importorskip("flwr")
    pytest.importorskip("ray")
    from fedlib.flower.apps import simulate

    cfg, data = _case("fedmcsa")
    ref = _reference("fedmcsa", monkeypatch)
    _same(ref, simulate(cfg, data, engine="ray", cpus=2))


def _free_port() -> int:
    """A port p with p, p + 100 + i (the SuperNodes') free, for the deployment test."""
    import random
    import socket

    for _ in range(50):
        p = random.randint(20000, 40000)
        try:
            for q in (p, p + 100, p + 101, p + 102):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
    raise RuntimeError("no free ports")


@pytest.mark.slow
@pytest.mark.ports
def test_deployment_on_localhost(tmp_path):
    """A SuperLink, 3 SuperNodes (one killed mid-way through round 2) and ``flwr run`` of the generated app, on
    localhost: 3 rounds, the run stored in the store's layout with ``deployment: flower``; the killed client is left
    out of rounds 2 and 3 (the SuperLink answers for it once its heartbeats stop) and the run completes; round 1 is
    the simulation's."""
    pytest.importorskip("flwr")
    from fedlib import Store, train
    from fedlib.flower.deploy import local

    cfg = RunConfig(algorithm="fedmcsa", n_clients=3, clients_per_round=3, rounds=3, model="mlr", local_steps=2)
    store = tmp_path / "store"
    folder = local(cfg, store, port=_free_port(), log_dir=tmp_path / "logs", kill=(2, 2))
    run = Store(store).load(cfg)
    assert run is not None and folder == Store(store).path(cfg)
    assert run.meta["deployment"] == "flower"
    assert list(run.metrics["round"]) == [1, 2, 3]
    assert list(run.metrics.uploads) == [3, 5, 7]  # client 2 answered round 1 only
    assert {(t, c) for t, c, _ in run.meta["refused"]} == {(2, 2), (3, 2)}
    assert run.traces["selected"][:, 2].tolist() == [True, False, False]
    assert {tuple(x) for x in run.meta["stale"]} == {(2, 2), (3, 2)}  # its round-1 accuracy kept
    assert run.client_acc[1, 2] == run.client_acc[2, 2] == run.client_acc[0, 2]
    sim = train(cfg, progress=False).metrics
    np.testing.assert_allclose(run.metrics.test_acc[0], sim.test_acc[0], rtol=0, atol=1e-6)  # metrics.csv's digits
    assert run.metrics.bytes_up[0] == sim.bytes_up[0]


@pytest.mark.parametrize("name", sorted(__import__("fedlib.algorithms", fromlist=["METHODS"]).METHODS))
def test_every_registered_method_drives_as_it_simulates(name, monkeypatch):
    """The contract over every registered method: its rounds through the message protocol (``rounds.drive``) equal
    ``fedlib.train`` in float64, with its defaults, so a method added to the registry without a working Flower path
    fails here. (The cases above and the ``test_flower_*`` files add each method's own options and Flower's wire.)"""
    from fedlib.algorithms import METHODS
    from fedlib.flower.rounds import drive

    images = any(g == "bn" for g in getattr(METHODS[name], "LOCAL_GROUPS", ()))  # BN lives in the CNNs only
    base = IMAGES if images else VECTORS
    cfg = RunConfig(executor="loop", dtype="float64", **{**base, "algorithm": name})
    data = _images() if images else small_synthetic(n_clients=5, rows=80)
    _same(_simulated(cfg, data, monkeypatch), drive(cfg, data), moves=name != "local")
