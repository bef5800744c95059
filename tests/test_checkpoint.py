"""Interrupted runs continue from their snapshot and give the uninterrupted run's numbers, for every algorithm."""

import json

import numpy as np
import pytest
import torch
from helpers import simulate_with, small_synthetic

from fedlib import RunConfig, Store, run
from fedlib.algorithms import ALGORITHMS, build_algorithm
from fedlib.core import callbacks
from fedlib.executors import StackedExecutor
from fedlib.models.registry import build_model
from fedlib.runs import grids
from fedlib.runs import train as runner
from fedlib.runs.checkpoint import Checkpoint


class Interrupt(Exception):
    pass


def _simulate(cfg, data, **kw):
    model = build_model(cfg.model.name, data.input_shape, 10, (8,), seed=0, dtype=torch.float64)
    alg = build_algorithm(cfg, n_samples=data.train.sizes.numpy())
    return simulate_with(
        alg,
        data,
        model,
        StackedExecutor(),
        cfg.rounds,
        local_steps=cfg.local_steps,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        progress=False,
        eval_every=2,
        **kw,
    )


def _stop_at(t_stop):
    def on_round(t, *_):
        if t == t_stop:
            raise Interrupt

    return on_round


def _same(a, b):
    cols = [c for c in a.metrics.columns if c != "seconds"]
    assert a.metrics[cols].equals(b.metrics[cols])
    assert np.array_equal(a.client_acc, b.client_acc) and np.array_equal(a.client_loss, b.client_loss)
    assert a.traces.keys() == b.traces.keys()
    for k in a.traces:
        assert np.array_equal(a.traces[k], b.traces[k], equal_nan=a.traces[k].dtype.kind == "f"), k
    for part in ("global_params", "client_params", "sent"):
        pa, pb = getattr(a.state, part), getattr(b.state, part)
        assert all(torch.equal(pa[n], pb[n]) for n in pa), part
    assert a.state.extra.keys() == b.state.extra.keys()
    for k, v in a.state.extra.items():
        assert all(torch.equal(v[n], b.state.extra[k][n]) for n in v), k


CASES = [dict(algorithm=name) for name in sorted(ALGORITHMS)] + [
    # AdaFL: the attention scores and the fraction schedule live outside State
    dict(algorithm="fedavg", selection="attention", fraction_schedule=(0.2, 0.6, 3)),
    dict(algorithm="scaffold", selection="attention", fraction=0.4),
    # FedFomo downloading one model of several candidates: the affinities and the exploration draws decide which
    dict(algorithm="fedfomo", fomo_m=1, fomo_eps=0.5),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_resumed_run_equals_uninterrupted(case, tmp_path):
    """Stopped after round 4 (the snapshot of round 3 is the last), then continued in a fresh algorithm, model and
    executor: metrics, client accuracies, traces and the final models are bit-identical to a run never stopped."""
    data = small_synthetic(n_clients=5, rows=80)
    cfg = RunConfig(
        n_clients=5,
        clients_per_round=2,
        rounds=6,
        local_steps=3,
        batch_size=8,
        model="dnn",
        lr=0.1,
        **({"mu": 0.1} if "mu" in ALGORITHMS[case["algorithm"]].option_names() else {}),
        **case,
    )
    whole = _simulate(cfg, data)
    ck = Checkpoint(tmp_path / "run.pt", every_seconds=0)
    with pytest.raises(Interrupt):
        _simulate(cfg, data, checkpoint=ck, on_round=_stop_at(4))
    assert ck.info()["round"] == 3 and ck.info()["rounds"] == 6
    resumed = _simulate(cfg, data, checkpoint=ck)
    _same(whole, resumed)
    assert [r["round"] for r in resumed.meta["resumed"]] == [3] and whole.meta == {}


def test_checkpoint_of_another_length_is_ignored(tmp_path):
    data = small_synthetic(n_clients=5, rows=80)
    cfg = RunConfig(n_clients=5, clients_per_round=2, rounds=4, local_steps=2, model="dnn")
    ck = Checkpoint(tmp_path / "run.pt", every_seconds=0)
    with pytest.raises(Interrupt):
        _simulate(cfg, data, checkpoint=ck, on_round=_stop_at(3))
    assert ck.load(5) is None and ck.load(4)["round"] == 2
    longer = _simulate(cfg.replace(rounds=5), data, checkpoint=ck)
    assert "resumed" not in longer.meta and list(longer.metrics["round"]) == [2, 4, 5]
    with pytest.raises(ValueError, match="Checkpoint.every_seconds=-1 must be a number >= 0"):
        Checkpoint(tmp_path / "x.pt", every_seconds=-1)


def _killed_once_in_round(monkeypatch, t_stop: int) -> list:
    """The first evaluation of round ``t_stop`` raises KeyboardInterrupt (a kill), later ones run; returns the
    list of evaluated rounds, in order."""
    real, calls = callbacks._evaluate_round, []

    def evaluate(alg, state, data, model, t, *rest):
        calls.append(t)
        if t == t_stop and calls.count(t_stop) == 1:
            raise KeyboardInterrupt
        return real(alg, state, data, model, t, *rest)

    monkeypatch.setattr(callbacks, "_evaluate_round", evaluate)
    return calls


def test_run_continues_after_a_kill_and_cleans_up(tmp_path, monkeypatch):
    """Through the store: a run stopped in round 5 keeps a snapshot of round 4; running it again trains only
    rounds 5-6, stores what a run never stopped stores, records the resumption, and removes the snapshot."""
    cfg = RunConfig(n_clients=4, clients_per_round=2, rounds=6, local_steps=2, model="mlr")
    reference = run(cfg, Store(tmp_path / "ref"), progress=False)
    store = Store(tmp_path / "r")
    monkeypatch.setattr(Store, "checkpoint_seconds", 0.0)
    calls = _killed_once_in_round(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, store, progress=False)
    assert not store.has(cfg) and store.checkpoint(cfg).info()["round"] == 4
    res = run(cfg, store, progress=False)
    assert calls == [1, 2, 3, 4, 5, 5, 6]  # rounds 1-4 were not trained again
    assert np.array_equal(res.metrics.test_loss, reference.metrics.test_loss)
    stored = store.load(cfg)
    assert [r["round"] for r in stored.meta["resumed"]] == [4] and stored.meta["wall_seconds"] > 0
    assert not any((store.root / "_partial").iterdir())
    assert store.configs() == [cfg]


def test_forced_rerun_starts_from_scratch(tmp_path, monkeypatch):
    cfg = RunConfig(n_clients=4, clients_per_round=2, rounds=3, local_steps=2, model="mlr")
    store = Store(tmp_path)
    run(cfg, store, progress=False)
    ck = store.checkpoint(cfg)
    ck.path.parent.mkdir(parents=True)
    ck.path.write_bytes(b"stale")  # would fail to load if it were read
    ck.info_path.write_text(json.dumps({"round": 1, "rounds": 3, "elapsed": 0}))
    res = run(cfg, store, progress=False, force=True)
    assert "resumed" not in res.meta and not ck.path.exists() and not ck.info_path.exists()
    # a snapshot left beside a stored run (stopped between storing and cleaning up) goes on the next read
    ck.info_path.write_text(json.dumps({"round": 1, "rounds": 3, "elapsed": 0}))
    run(cfg, store, progress=False)
    assert not ck.info_path.exists()


@pytest.mark.parametrize("batch", [1, 16])
def test_grid_finishes_stopped_runs_first(tmp_path, monkeypatch, batch):
    """A grid whose second config was stopped part-way trains that one first (it continues from its snapshot).
    Batched (``batch`` > 1), the two share one unit, which lists the stopped run first: its runs start together in
    threads, so which of them calls ``train`` first is a race (the test must not assert that order)."""

    a = RunConfig(n_clients=4, clients_per_round=2, rounds=4, local_steps=2, model="mlr")
    b = a.replace(seed=1)
    store = Store(tmp_path)
    monkeypatch.setattr(Store, "checkpoint_seconds", 0.0)
    _killed_once_in_round(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        run(b, store, progress=False)
    order, units, real_train, real_together = [], [], runner.train, runner.train_together
    monkeypatch.setattr(runner, "train", lambda cfg, *a, **k: order.append(cfg.seed) or real_train(cfg, *a, **k))
    monkeypatch.setattr(
        grids, "train_together", lambda u, *a, **k: units.append([c.seed for c in u]) or real_together(u, *a, **k)
    )
    table = grids.run_configs([a, b], store, progress=False, batch=batch, jobs=1)
    assert list(table.seed) == [0, 1]  # the table keeps the order given
    if batch == 1:
        assert order == [1, 0] and units == []  # b first
    else:
        assert units == [[1, 0]] and sorted(order) == [0, 1]  # b first in the one unit
    assert [r["round"] for r in store.load(b).meta["resumed"]] == [2]


class _Payload:
    """Unpickling this runs a command: what a planted snapshot would do under torch.load(weights_only=False)."""

    def __reduce__(self):
        import os

        return (os.system, ("touch " + str(_Payload.marker),))


def test_planted_snapshot_runs_no_code_and_the_run_restarts(tmp_path):
    data = small_synthetic(n_clients=5, rows=80)
    cfg = RunConfig(n_clients=5, clients_per_round=2, rounds=4, local_steps=2, model="dnn")
    _Payload.marker = tmp_path / "pwned"
    ck = Checkpoint(tmp_path / "run.pt", every_seconds=0)
    torch.save({"format": 2, "rounds": 4, "round": 2, "evil": _Payload()}, ck.path)
    with pytest.warns(UserWarning, match="is not usable"):
        res = _simulate(cfg, data, checkpoint=ck)
    assert not _Payload.marker.exists() and "resumed" not in res.meta
    assert list(res.metrics["round"]) == [2, 4]
