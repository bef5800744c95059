"""The Ray backend (``fedlib.runs.ray_backend``): a grid on a local Ray instance stores what the local backend stores; a
worker killed mid-run is retried and nothing is lost or duplicated; a wrong address and a dataset missing on a
worker fail with messages naming them. One Ray instance (``ray.init(num_cpus=2)``) serves the whole module."""

import json
import socket
import time

import numpy as np
import pandas as pd
import pytest

from fedlib import RunConfig, Store, expand
from fedlib.runs.grids import run_configs

# Ray and Jupyter kernels started the usual way bind TCP ports picked as free a moment before; two started side by
# side on two test workers once lost a reply and hung the test command. make test runs the tests marked ``ports`` in
# a pytest of their own, one at a time, beside the others.
pytestmark = pytest.mark.ports

ray = pytest.importorskip("ray")
from fedlib.executors import hardware  # noqa: E402
from fedlib.runs import grids, ray_backend, worker  # noqa: E402
from fedlib.runs import train as runner  # noqa: E402

TINY = RunConfig(n_clients=4, clients_per_round=2, rounds=3, local_steps=2, model="mlr")
GRID = [{"algorithm": ["fedavg", "fedmcsa"], "seed": [0, 1]}, {"algorithm": "local", "model": "dnn", "hidden": (5,)}]


def test_fedlib_does_not_import_ray_unless_asked():
    """Ray is optional: importing fedlib, its CLI module and the backend module imports no Ray."""
    import subprocess
    import sys

    code = "import sys, fedlib, fedlib.experiments, fedlib.runs.ray_backend; print('ray' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local Ray instance with 2 CPUs whose workers see an empty data root (``FEDLIB_DATA``, as set where a node's
    ``ray start`` ran), started once for the module."""
    empty, cache = tmp_path_factory.mktemp("worker-data"), tmp_path_factory.mktemp("worker-cache")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in ray_backend.SLOW_START.items():
            mp.setenv(k, v)
        try:
            _init(empty, cache)
        except Exception:
            ray.shutdown()  # a node that timed out starting leaves its GCS behind, and pytest would wait on it at exit
            raise
    yield empty
    ray.shutdown()


def _init(empty, cache):
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=100 * 2**20,
        logging_level="WARNING",
        runtime_env={"env_vars": {"FEDLIB_DATA": str(empty), "FEDLIB_CACHE": str(cache)}},
    )


def _stored(store: Store, cfgs) -> dict:
    """Everything a store holds for ``cfgs``, minus what differs between two trainings of one config (wall times)."""
    out = {}
    for c in cfgs:
        res = store.load(c)
        arrays = {"acc": res.client_acc, "loss": res.client_loss, "n": res.client_n, **res.traces}
        out[c.key()] = (res.metrics.drop(columns=["seconds"]), arrays)
    return out


def _assert_same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        pd.testing.assert_frame_equal(a[k][0], b[k][0], check_exact=True)
        assert a[k][1].keys() == b[k][1].keys()
        for name in a[k][1]:
            np.testing.assert_array_equal(a[k][1][name], b[k][1][name], err_msg=f"{k} {name}")


def test_grid_on_ray_stores_what_the_local_backend_stores(cluster, tmp_path, monkeypatch, capfd):
    """A smoke grid (FedAvg, FedMCSA with its attention traces, Local) on Ray: every run stored by the driver under
    the local backend's keys, with the same files and numbers; a second call finds them all stored and submits
    nothing. The driver's bar moves by the units' estimated seconds to 100%, and counts the runs done."""

    cfgs = expand(TINY, GRID)
    local = run_configs(cfgs, Store(tmp_path / "local"), progress=False)
    store = Store(tmp_path / "ray")
    # the driver trains nothing itself: every run comes back from a Ray worker
    monkeypatch.setattr(runner, "train", lambda *a, **k: pytest.fail("trained in the driver"))
    capfd.readouterr()
    on_ray = run_configs(cfgs, store, progress=True, backend="ray")
    bar = capfd.readouterr().err
    assert "ray: 1 node(s), 2 CPUs: 100%" in bar and "done 5/5, running 0, failed 0]" in bar and "run/s" not in bar
    assert list(on_ray.key) == list(local.key) == [c.key() for c in cfgs]
    assert sorted(p.name for p in store.root.iterdir()) == sorted(c.key() for c in cfgs)  # nothing else left
    for c in cfgs:
        assert sorted(p.name for p in store.path(c).iterdir()) == [
            "clients.npz",
            "config.json",
            "manifest.json",
            "meta.json",
            "metrics.csv",
        ]
        assert json.loads((store.path(c) / "config.json").read_text()) == json.loads(json.dumps(c.to_dict()))
        assert "ray_node" in store.meta(c) and "ray_node" not in Store(tmp_path / "local").meta(c)
    _assert_same(_stored(store, cfgs), _stored(Store(tmp_path / "local"), cfgs))
    assert len(set(on_ray.best_acc)) > 1  # different runs, not one copied
    # batched on Ray as locally: each method's two seeds as one model in one task, Local's run alone
    batched = [store.meta(c).get("batched") for c in cfgs]
    assert batched == [Store(tmp_path / "local").meta(c).get("batched") for c in cfgs] == [2, 2, 2, 2, None]
    monkeypatch.setattr(ray_backend, "import_ray", lambda: pytest.fail("stored runs are not submitted"))
    again = run_configs(cfgs, store, progress=False, backend="ray")
    pd.testing.assert_frame_equal(again, on_ray)


def _crash_once(monkeypatch, key: str, marker):
    """The Ray task of the unit that trains ``key`` kills its worker once (``ray_faults.crash_once``)."""
    import ray_faults

    ray_faults.register()
    monkeypatch.setattr(ray_backend, "_train_task", ray_faults.crash_once(key, marker))


def test_a_killed_worker_is_retried_and_nothing_is_lost_or_duplicated(cluster, tmp_path, monkeypatch):
    """The worker training one config dies (``os._exit``) right after its first snapshot: Ray retries the task, the
    retry continues from the snapshot (the store is reachable from this machine's workers), and the grid ends with
    every run stored once, with the numbers of an uninterrupted run. ``batch=1``: a task per run (the batched
    units are the next test's)."""
    cfgs = expand(TINY.replace(rounds=6), {"seed": [0, 1, 2]})
    victim, marker = cfgs[1], tmp_path / "killed"
    _crash_once(monkeypatch, victim.key(), marker)
    store = Store(tmp_path / "ray")
    store.checkpoint_seconds = 0.0  # a snapshot every round
    run_configs(cfgs, store, progress=False, backend="ray", batch=1)
    assert marker.exists()  # the worker was killed
    assert [store.meta(c).get("batched") for c in cfgs] == [None] * 3
    assert sorted(p.name for p in store.root.iterdir()) == sorted(c.key() for c in cfgs)  # no _tmp, no _partial
    resumed = store.meta(victim).get("resumed")
    assert resumed and resumed[0]["round"] == 1  # the retry continued from the snapshot of round 1
    assert [store.meta(c).get("resumed") for c in cfgs if c != victim] == [None, None]
    monkeypatch.undo()
    _assert_same(_stored(store, cfgs), _local(cfgs, tmp_path))


def test_a_killed_unit_resumes_together_and_stores_its_solo_runs(cluster, tmp_path, monkeypatch):
    """Four seeds in units of two (two task slots): the worker of one unit dies right after its victim's first
    snapshot; the retried unit continues from its runs' snapshots, and every run is stored once, batched, with the
    numbers of its uninterrupted solo run."""
    cfgs = expand(TINY.replace(rounds=6), {"seed": [0, 1, 2, 3]})
    victim, marker = cfgs[1], tmp_path / "killed"
    _crash_once(monkeypatch, victim.key(), marker)
    store = Store(tmp_path / "ray")
    store.checkpoint_seconds = 0.0
    run_configs(cfgs, store, progress=False, backend="ray")
    assert marker.exists()
    assert sorted(p.name for p in store.root.iterdir()) == sorted(c.key() for c in cfgs)
    assert [store.meta(c).get("batched") for c in cfgs] == [2] * 4
    assert store.meta(victim)["resumed"][0]["round"] == 1
    assert [store.meta(c).get("resumed") for c in cfgs[2:]] == [None, None]  # the other unit went on untouched
    monkeypatch.undo()
    solo = Store(tmp_path / "solo")
    run_configs(cfgs, solo, progress=False, batch=1)
    _assert_same(_stored(store, cfgs), _stored(solo, cfgs))


def test_a_run_failing_inside_a_unit_comes_back_alone(cluster, tmp_path, monkeypatch):
    """The task body, in this process: in a unit of two, the run that raises comes back as its exception, the other
    as its result (with the node that trained it); alone, it comes back the same way."""
    from fedlib.runs import train as runner

    cfgs = expand(TINY, {"seed": [0, 1]})
    build = runner.build_algorithm

    def fail_seed_1(cfg, **kw):
        if cfg.seed == 1:
            raise ValueError("seed 1 fails")
        return build(cfg, **kw)

    monkeypatch.setattr(runner, "build_algorithm", fail_seed_1)
    monkeypatch.setattr(worker, "worker_setup", lambda *a, **k: None)  # this process's threads stay as they are
    store = Store(tmp_path / "s")
    spec = {"configs": [c.to_dict() for c in cfgs], "keys": [c.key() for c in cfgs], "data_root": None,
            "runs_per_node": {}, "threads": 1, "probe": "", "snapshots": [str(store.checkpoint(c).path) for c in cfgs],
            "every": 1.0}  # fmt: skip
    ok, failed = ray_backend._train_task(spec)
    assert isinstance(failed, ValueError) and str(failed) == "seed 1 fails"
    alone = {**spec, "configs": spec["configs"][1:], "keys": spec["keys"][1:], "snapshots": spec["snapshots"][1:]}
    [failed_alone] = ray_backend._train_task(alone)  # a task of one run returns its failure the same way
    assert isinstance(failed_alone, ValueError) and str(failed_alone) == "seed 1 fails"
    assert ok["meta"]["batched"] == 2 and ok["meta"]["ray_node"].startswith(socket.gethostname())
    solo = runner.train(cfgs[0], progress=False)
    pd.testing.assert_frame_equal(ok["metrics"].drop(columns="seconds"), solo.metrics.drop(columns="seconds"))


class _TwoArgError(Exception):
    def __init__(self, what, why):
        super().__init__(f"{what}: {why}")


def test_a_failure_that_does_not_pickle_comes_back_as_its_text():
    """A run's exception returned as a value must pickle (or its whole unit's results are lost on the way back):
    one whose ``__init__`` takes other arguments comes back as a RuntimeError naming its type and message."""
    import pickle

    e = ray_backend._portable(_TwoArgError("seed 1", "diverged"))
    assert type(e) is RuntimeError and str(e) == "_TwoArgError: seed 1: diverged"
    assert type(pickle.loads(pickle.dumps(e))) is RuntimeError
    same = ValueError("bad")
    assert ray_backend._portable(same) is same


def test_units_fit_the_memory_ray_gives_a_task_on_the_smallest_node():
    """``_units``: at most ``batch`` runs, within half the memory per task slot of the smallest node, none above its
    share of the slots; no memory reported: this machine's."""
    from fedlib.runs import feasibility

    cfgs = expand(TINY, {"seed": list(range(8))})
    est = feasibility.estimate(cfgs[0])
    three = est["data"] + 3 * feasibility.run_bytes(est)  # the data once and three runs

    def nodes(*memory):
        return [{"NodeID": f"n{i}", "Resources": {"CPU": 2.0, "memory": m}} for i, m in enumerate(memory)]

    per_node = {"n0": 1, "n1": 2}
    big, small = 1e12, 2 * three / 0.5  # small: two slots of ``three`` bytes at a 0.5 share
    assert [len(u) for u in ray_backend._units(cfgs, 16, nodes(big, big), per_node)] == [3, 3, 2]  # 3 slots
    assert [len(u) for u in ray_backend._units(cfgs, 16, nodes(big, small), per_node)] == [3, 3, 2]
    # at most 2 a unit; 2 + 2 + 2 + 2 on 3 slots would leave two idle while the fourth trains (scheduling._balance)
    assert [len(u) for u in ray_backend._units(cfgs, 2, nodes(big, big), per_node)] == [1, 1, 2, 2, 2]
    assert [len(u) for u in ray_backend._units(cfgs[:2], 16, nodes(big, big), {"n0": 1, "n1": 2})] == [1, 1]
    assert [len(u) for u in ray_backend._units(cfgs, 1, nodes(0, 0), per_node)] == [1] * 8


def test_ray_tasks_go_longest_first_and_units_balance_in_estimated_seconds(tmp_path, monkeypatch):
    """As on the local backend: ``run_configs`` hands the cluster the runs stopped part-way first, then the longest
    (``estimates.seconds`` of the stored times), with those seconds; ``_units`` cuts where that ends the grid sooner
    in seconds (two 10 s runs and two 1 s runs on 2 slots: 10 | 10 | 1 + 1, where rounds alone make 2 + 2)."""

    cfgs = expand(TINY, {"seed": [0, 1, 2, 3]})
    store = Store(tmp_path / "r")
    info = store.checkpoint(cfgs[3]).info_path  # stopped part-way: goes first whatever its estimate
    info.parent.mkdir(parents=True, exist_ok=True)
    info.write_text(json.dumps({"round": 1, "rounds": 3, "elapsed": 0.1}))
    monkeypatch.setattr(grids, "known_times", lambda store, device=None: {})  # nothing stored: each run its 3 rounds
    longer = [c.replace(rounds=30) for c in cfgs[:2]]
    seen = []
    monkeypatch.setattr(ray_backend.RayBackend, "run", lambda self, todo, *a, cost=None: seen.append((todo, cost)))
    run_configs(cfgs[2:] + longer, store, progress=False, backend="ray")
    todo, cost = seen[0]
    assert todo == [cfgs[3], *longer, cfgs[2]]
    assert cost == {c.key(): float(c.rounds) for c in todo}

    nodes = [{"NodeID": "n0", "Resources": {"CPU": 2.0, "memory": 1e12}}]
    seconds = {c.key(): s for c, s in zip(cfgs, (10.0, 10.0, 1.0, 1.0))}
    assert [len(u) for u in ray_backend._units(cfgs, 16, nodes, {"n0": 2})] == [2, 2]
    assert ray_backend._units(cfgs, 16, nodes, {"n0": 2}, seconds) == [cfgs[:1], cfgs[1:2], cfgs[2:]]


def test_a_unit_too_large_for_its_gpu_share_trains_in_parts(monkeypatch):
    """``_fit``: on a GPU (free memory as the worker sees it; Ray reports none) a unit is cut to its task's share of
    it; on the CPU (cut by the driver already) and alone it stays whole."""
    from fedlib.runs import feasibility

    cfgs = expand(TINY, {"seed": list(range(5))})
    est = feasibility.estimate(cfgs[0])
    two = est["data"] + 2 * feasibility.run_bytes(est)
    monkeypatch.setattr(hardware, "available_bytes", lambda device="cpu": 4 * two)  # a half share's half: two runs
    assert [len(p) for p in ray_backend._fit(cfgs, "cuda", 0.5)] == [2, 2, 1]
    assert [len(p) for p in ray_backend._fit(cfgs, "cuda", 0.25)] == [1] * 5  # not even the data and one run
    assert ray_backend._fit(cfgs, "cpu", 0) == [cfgs] and ray_backend._fit(cfgs[:1], "cuda", 0.5) == [cfgs[:1]]


def _local(cfgs, tmp_path):
    store = Store(tmp_path / "local")
    run_configs(cfgs, store, progress=False)
    return _stored(store, cfgs)


def test_a_worker_that_keeps_dying_is_reported_by_config_label(cluster, tmp_path, monkeypatch):
    """Without retries left (``max_retries=0``) the dead worker's config is reported by its label; the grid's other
    runs are stored."""
    cfgs = expand(TINY, {"seed": [0, 1]})
    _crash_once(monkeypatch, cfgs[0].key(), tmp_path / "killed")
    store = Store(tmp_path / "ray")
    store.checkpoint_seconds = 0.0  # killed after its first snapshot, as above
    with pytest.raises(ray_backend.RayGridError, match=r"1 run\(s\) failed on Ray \(1 stored\)") as err:
        run_configs(cfgs, store, progress=False, backend=ray_backend.RayBackend(max_retries=0))
    assert cfgs[0].label() in str(err.value) and "after 0 retries" in str(err.value)
    assert not store.has(cfgs[0]) and store.has(cfgs[1])


def test_ctrl_c_keeps_finished_runs_and_cancels_the_rest(cluster, tmp_path, monkeypatch):
    """Ctrl-C in the driver (here: right after it stored the first result) re-raises once what has finished is
    stored and the other tasks are cancelled: the cluster's CPUs are free again, nothing is half-written, and the
    next call trains only what is missing. The grid is two units on two task slots (the long run, a DNN that cannot
    batch with the others, submitted first as the longest; the two short runs as one model): the short runs' unit
    comes back first and is stored whole, though the Ctrl-C came while storing its first run."""
    # the long unit must still be running when the short one comes back: with 60 rounds, ~0.05 s apart, both came
    # back in one wait under CI's load, and all were stored, rightly; with 1,000 (3.5 s) the long one, submitted
    # first, took the worker already started and came back first in 2 of 8 runs while the short one's worker started
    cfgs = expand(TINY.replace(rounds=10), {"seed": [0, 1]}) + [TINY.replace(rounds=3000, model="dnn", hidden=(5,))]
    store = Store(tmp_path / "ray")
    save, calls = Store.save, []

    def save_then_ctrl_c(self, *a, **k):
        out = save(self, *a, **k)
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(Store, "save", save_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        run_configs(cfgs, store, progress=False, backend="ray")
    stored = [c for c in cfgs if store.has(c)]
    assert stored == cfgs[:2] and not list(store.root.glob("_tmp*"))
    t0 = time.monotonic()
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() - t0 < 30:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2  # no task of the grid holds a CPU any more
    monkeypatch.setattr(Store, "save", save)
    submitted, run = [], ray_backend.RayBackend.run
    monkeypatch.setattr(
        ray_backend.RayBackend, "run", lambda self, todo, *a, **k: submitted.extend(todo) or run(self, todo, *a, **k)
    )
    run_configs(cfgs, store, progress=False, backend="ray")
    assert all(store.has(c) for c in cfgs)
    assert submitted == [c for c in cfgs if c not in stored]  # the runs stored before Ctrl-C are not trained again
    assert sorted(p.name for p in store.root.iterdir()) == sorted(c.key() for c in cfgs)


def test_a_dataset_missing_on_a_worker_names_the_dataset_and_the_node(cluster, tmp_path):
    """The workers read their own data root (the cluster's ``FEDLIB_DATA``, here an empty folder), not the driver's:
    the run fails with the usual message, naming the dataset, that root and the node."""
    good = TINY
    bad = TINY.replace(dataset="mnist", partition="iid", n_clients=4)
    store = Store(tmp_path / "ray")
    with pytest.raises(ray_backend.RayGridError) as err:
        run_configs([good, bad], store, progress=False, backend="ray")
    msg = str(err.value)
    assert "dataset 'mnist' not found under data root " + str(cluster) in msg
    assert f"on Ray node {socket.gethostname()} (" in msg and bad.label() in msg
    assert isinstance(err.value.__cause__, FileNotFoundError)  # the DatasetNotFoundError, unwrapped
    assert store.has(good) and not store.has(bad)


@pytest.mark.parametrize("address", ["127.0.0.1:9", "ray://127.0.0.1:9"])
def test_a_bad_address_fails_fast_naming_it(cluster, tmp_path, address):
    t0 = time.perf_counter()
    with pytest.raises(ConnectionError, match=f"address={address!r}: no Ray cluster answers at 127.0.0.1:9"):
        run_configs([TINY], Store(tmp_path), progress=False, backend="ray", address=address)
    assert time.perf_counter() - t0 < 10
    with pytest.raises(ValueError, match="address='nohost': must be HOST:PORT"):
        run_configs([TINY], Store(tmp_path), progress=False, backend="ray", address="nohost")
    with pytest.raises(ConnectionError, match="RAY_ADDRESS='127.0.0.1:9': no Ray cluster answers"):
        ray_backend._probe("127.0.0.1:9", "RAY_ADDRESS")  # what connect() checks when the variable gives the address


def test_cli_and_experiment_take_the_backend(cluster, tmp_path, monkeypatch, capsys):
    """``--backend ray --address`` reaches the backend (a wrong address ends the command with its name); the local
    backend refuses Ray's options, Ray refuses ``--jobs``; ``fedlib.experiment`` takes ``backend``/``address``."""
    import fedlib
    from fedlib.experiments.cli import main

    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path / "r"))
    with pytest.raises(SystemExit, match="address='127.0.0.1:9': no Ray cluster answers"):
        main(["fedmcsa_sigma", "--profile", "smoke", "--backend", "ray", "--address", "127.0.0.1:9"])
    for argv, msg in [
        (["--address", "h:1"], "--address: only with --backend ray"),
        (["--placement"], "--placement: only with --backend ray"),
        (["--backend", "ray", "--jobs", "2"], "--jobs is for --backend local"),
        (["--backend", "ray", "--cpus-per-run", "0"], "--cpus-per-run=0 must be an integer >= 1"),
    ]:
        with pytest.raises(SystemExit):
            main(["fedmcsa_sigma", "--profile", "smoke", *argv])
        assert msg in capsys.readouterr().err
    with pytest.raises(ValueError, match="address='h:1' is for backend='ray'"):
        fedlib.experiment("fedmcsa_sigma", "smoke", address="h:1", progress=False)
    with pytest.raises(ValueError, match="backend='dask' must be 'local'"):
        fedlib.experiment("fedmcsa_sigma", "smoke", backend="dask", progress=False)
    ex = fedlib.experiment("fedmcsa_sigma", "smoke", where={"seed": 0, "model": "mlr"}, backend="ray", progress=False)
    assert len(ex.runs) == len(ex.configs) == 4 and all("ray_node" in ex.store.meta(c) for c in ex.runs)
