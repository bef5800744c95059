"""The Flower path's server snapshots (``fedlib.flower.checkpoint``): a run interrupted after round 2 of 4 and resumed
from its server's state equals the uninterrupted run exactly; the sealed snapshot file round-trips and a damaged one
is refused naming the file; the ServerApp writes it after every round and resumes from it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from helpers import small_synthetic
from test_flower import VECTORS, _same

from fedlib.config.run import RunConfig

RESUMED = {
    "adafl": {"selection": "attention", "fraction_schedule": (0.6, 0.8, 2), "clients_per_round": None},
    "fedmcsa": {"algorithm": "fedmcsa"},
    "fedavgm": {"algorithm": "fedavgm"},
    "fedala": {"algorithm": "fedala", "ala_rand_percent": 50.0},  # the server's draws: who trained before, the stream
    "fedfomo": {"algorithm": "fedfomo", "fomo_m": 2},  # clients' held-out rows, the server's picks from its stream
    "fedmix": {"algorithm": "fedmix"},  # the shared set, gathered again when the drive resumes
}


def _cfg(**kw) -> RunConfig:
    return RunConfig(executor="loop", dtype="float64", **{**VECTORS, "rounds": 4, **kw})


def _equal(a, b) -> None:
    """``b`` is ``a`` exactly: every recorded number and trace (``_same``, and bit for bit)."""
    _same(a.result(), b)
    ra, rb = (pd.DataFrame(s.rows).drop(columns="seconds") for s in (a, b))
    pd.testing.assert_frame_equal(ra, rb, check_exact=True)
    assert np.array_equal(np.array(a.client_acc), np.array(b.client_acc))
    assert np.array_equal(np.array(a.client_loss), np.array(b.client_loss))
    assert np.array_equal(a.selected, b.selected) and a.uploads == b.uploads and a.bytes_down == b.bytes_down
    sa, sb = a.state_dict(), b.state_dict()  # and all the server holds: models, streams, selection scores, ...
    for k in set(sa) - {"elapsed", "rows"}:
        _deep_equal(sa[k], sb[k], k)


@pytest.mark.parametrize("name", sorted(RESUMED))
def test_interrupted_drive_equals_uninterrupted(name):
    from fedlib.flower.rounds import drive, make_clients

    cfg, data = _cfg(**RESUMED[name]), small_synthetic(n_clients=5, rows=80)
    whole = drive(cfg, data)
    clients = make_clients(cfg, data)
    first = drive(cfg, data, clients=clients, until=2)
    assert first.state.round == 2 and len(first.rows) == 2
    snap = first.state_dict()
    del first  # the server is rebuilt from its state alone; the clients keep theirs
    resumed = drive(cfg, data, clients=clients, state=snap)
    _equal(whole, resumed)
    if name == "adafl":  # the attention scores and the fraction's position came back: 3 clients, then 4
        assert list(pd.DataFrame(resumed.rows).selected) == [3, 3, 4, 4]
    if name == "fedavgm":  # its server state (the velocity) is in the snapshot
        assert snap["extra"]


def test_resume_without_server_state_differs():
    """The comparison above can fail: a server resumed without its method's state (FedAvgM's velocity) differs."""
    from fedlib.flower.client import Client, client_splits
    from fedlib.flower.rounds import drive

    cfg, data = _cfg(algorithm="fedavgm"), small_synthetic(n_clients=5, rows=80)
    whole = drive(cfg, data)
    clients = [Client(cfg, i, *client_splits(data, i)[:2], data.input_shape, data.n_classes) for i in range(5)]
    snap = drive(cfg, data, clients=clients, until=2).state_dict()
    snap["extra"] = {}
    with pytest.raises(AssertionError):
        _equal(whole, drive(cfg, data, clients=clients, state=snap))


def _snapshot(tmp_path, cfg, data):
    from fedlib.flower.checkpoint import Snapshots
    from fedlib.flower.rounds import drive

    server = drive(cfg, data, until=2)
    snaps = Snapshots(tmp_path / "server.pt", cfg)
    snaps.save(server)
    return server, snaps


def _deep_equal(a, b, where):
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), where
        for k in a:
            _deep_equal(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for j, (x, y) in enumerate(zip(a, b)):
            _deep_equal(x, y, f"{where}[{j}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b) and a.dtype == b.dtype, where
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f") and a.dtype == b.dtype, where
    elif isinstance(a, float) and np.isnan(a):
        assert np.isnan(b), where
    else:
        assert a == b, where


def test_snapshot_file_round_trips(tmp_path):
    from fedlib.flower.rounds import drive

    cfg, data = _cfg(**RESUMED["fedmcsa"]), small_synthetic(n_clients=5, rows=80)
    server, snaps = _snapshot(tmp_path, cfg, data)
    loaded = snaps.load()
    assert loaded is not None and loaded["round"] == 2
    fresh = drive(cfg, data, until=0)
    fresh.load_state_dict(loaded)
    a, b = server.state_dict(), fresh.state_dict()
    assert set(a) == set(b)
    for k in a:
        if k != "elapsed":
            _deep_equal(a[k], b[k], k)
    assert not list(tmp_path.glob("*.tmp"))  # written to a temporary file, renamed into place


@pytest.mark.parametrize("damage", ["truncated", "flipped", "other config"])
def test_damaged_snapshot_is_refused_naming_the_file(tmp_path, damage):
    from fedlib.flower.checkpoint import SnapshotError, Snapshots

    cfg, data = _cfg(), small_synthetic(n_clients=5, rows=80)
    _, snaps = _snapshot(tmp_path, cfg, data)
    raw = bytearray(snaps.path.read_bytes())
    if damage == "truncated":
        snaps.path.write_bytes(bytes(raw[: len(raw) // 2]))
    elif damage == "flipped":
        raw[len(raw) // 3] ^= 0xFF
        snaps.path.write_bytes(bytes(raw))
    else:
        snaps = Snapshots(snaps.path, _cfg(lr=0.2))
    with pytest.raises(SnapshotError, match=str(snaps.path)):
        snaps.load()


def test_server_app_snapshots_every_round_and_resumes(tmp_path):
    """``apps.simulate`` with a snapshot writes it after every round (a client checks it at the next round's start);
    stopped in round 3 and started again, it resumes from round 3 (FedAvg: clients restarted afresh resume exactly)."""
    pytest.importorskip("flwr")
    from fedlib.flower.apps import simulate
    from fedlib.flower.checkpoint import Snapshots

    cfg, data = _cfg(selection="attention"), small_synthetic(n_clients=5, rows=80)
    path = tmp_path / "server.pt"
    seen: list[int] = []
    stopped: list[int] = []

    class Stop(BaseException):
        pass

    def check(msg, context, call_next):
        if msg.metadata.message_type == "train":
            t = int(msg.content["config"]["t"])
            snap = Snapshots(path, cfg).load()
            seen.append(0 if snap is None else snap["round"])
            assert seen[-1] == t - 1
            if t == 3 and not stopped:  # the first run stops in round 3
                stopped.append(t)
                raise Stop
        return call_next(msg, context)

    whole = simulate(cfg, data)
    with pytest.raises(Stop):
        simulate(cfg, data, mods=[check], snapshot=path)
    resumed = simulate(cfg, data, mods=[check], snapshot=path)
    assert Snapshots(path, cfg).load()["round"] == 4  # type: ignore[index]
    assert seen.count(0) == 3 and max(seen) == 3  # round 1 trained once (3 clients): the second run began at 3
    _equal(whole, resumed)


def test_resume_refused_where_clients_lost_their_state(tmp_path):
    """FedMCSA keeps personalised models on its clients: a new Flower run's fresh clients cannot resume it."""
    pytest.importorskip("flwr")
    from fedlib.flower.apps import simulate
    from fedlib.flower.checkpoint import SnapshotError

    cfg, data = _cfg(**RESUMED["fedmcsa"]), small_synthetic(n_clients=5, rows=80)
    _, snaps = _snapshot(tmp_path, cfg, data)
    with pytest.raises(SnapshotError, match="keeps state on its clients"):
        simulate(cfg, data, snapshot=snaps.path)


def test_client_state_method_resumes_where_clients_kept_theirs(tmp_path):
    """In the in-process engine the clients' contexts survive a stopped ServerApp: FedMCSA (personalised models on
    the clients) resumed on the same grid equals the uninterrupted run."""
    pytest.importorskip("flwr")
    from flwr.app import Context, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from fedlib.flower.apps import LocalGrid, client_app, server_app, simulate

    cfg, data = _cfg(**RESUMED["fedmcsa"]), small_synthetic(n_clients=5, rows=80)
    whole = simulate(cfg, data)
    stopped: list[int] = []
    rounds: list[int] = []

    class Stop(BaseException):
        pass

    def stop(msg, context, call_next):
        if msg.metadata.message_type == "train":
            rounds.append(int(msg.content["config"]["t"]))
        if msg.metadata.message_type == "train" and int(msg.content["config"]["t"]) == 3 and not stopped:
            stopped.append(3)
            raise Stop
        return call_next(msg, context)

    grid = LocalGrid(client_app(cfg, data, mods=[stop]), 5)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, grid.run_id, 1
    got: list = []
    app = server_app(cfg, got.append, held=data, snapshot=tmp_path / "server.pt")
    with pytest.raises(Stop):
        app(grid, Context(1, 0, {}, RecordDict(), {}))
    app(grid, Context(1, 0, {}, RecordDict(), {}))
    assert rounds.count(1) == rounds.count(4) > 0  # round 1 ran once: the second start resumed at round 3
    _equal(whole, got[0])


def test_a_deployment_takes_its_snapshot_file(tmp_path, monkeypatch):
    """``--snapshot`` reaches the deployed ServerApp: the command line hands it to ``deploy.local`` / ``write_app``,
    the app project's run config carries it, and the deployed server builds its ServerApp with it (no file: none)."""
    pytest.importorskip("flwr")
    import tomllib

    from fedlib.flower import __main__ as cli
    from fedlib.flower import apps, deploy

    cfg = RunConfig(algorithm="fedavg", n_clients=3, clients_per_round=2, model="mlr", rounds=2)
    snap = tmp_path / "server.snapshot"
    given = {}
    monkeypatch.setattr(deploy, "local", lambda cfg, store, **kw: given.update(kw) or "stored")
    assert (
        cli.main(["local", "n_clients=3", "clients_per_round=2", "--store", str(tmp_path), "--snapshot", str(snap)])
        == 0
    )
    assert given["snapshot"] == str(snap)
    for snapshot, expect in ((snap, str(snap.resolve())), (None, None)):
        app = deploy.write_app(tmp_path / "app", cfg, tmp_path / "store", snapshot=snapshot)
        run_config = tomllib.loads((app / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
        built = {}
        monkeypatch.setattr(apps, "server_app", lambda cfg, done, **kw: built.update(kw) or (lambda grid, ctx: None))
        monkeypatch.setattr(deploy, "_held", lambda cfg: None)
        deploy._serve(None, type("Context", (), {"run_config": run_config})())
        assert built["snapshot"] == expect
