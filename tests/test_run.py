"""Runs through the store: pure, stored atomically, grids skip stored runs and resume after interruption."""

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedlib import RunConfig, Store, expand, run, run_grid
from fedlib.executors import hardware
from fedlib.runs import estimates, feasibility, grids, scheduling, worker
from fedlib.runs import train as runner

TINY = RunConfig(n_clients=4, clients_per_round=2, rounds=3, local_steps=2, model="mlr")
ROOT = Path(__file__).resolve().parents[1]


def test_run_is_pure_and_stored(tmp_path):
    store = Store(tmp_path / "r")
    a = run(TINY, store, progress=False)
    assert store.has(TINY)
    files = sorted(p.name for p in store.path(TINY).iterdir())
    assert files == ["clients.npz", "config.json", "manifest.json", "meta.json", "metrics.csv"]
    meta = json.loads((store.path(TINY) / "meta.json").read_text())
    assert {"torch", "git_commit", "device", "wall_seconds", "executor"} <= set(meta)
    assert store.meta(TINY) == meta and store.load(TINY).meta == meta
    b = run(TINY, Store(tmp_path / "other"), progress=False)  # retrain elsewhere: same numbers
    assert np.allclose(a.metrics.test_acc, b.metrics.test_acc) and np.allclose(a.metrics.test_loss, b.metrics.test_loss)
    c = store.load(TINY)
    assert np.allclose(c.metrics.test_loss, a.metrics.test_loss, rtol=1e-5)
    assert c.client_acc.shape == (3, 4) and np.array_equal(c.client_acc, a.client_acc.astype(np.float32))
    assert np.allclose(c.client_acc.mean(1), a.metrics.test_acc_mean, rtol=0, atol=1e-6)  # exact, not float16
    assert np.allclose(c.client_loss, a.client_loss, rtol=1e-3)
    # the per-client losses, weighted by test sizes, give the round's mean test loss
    assert np.allclose((a.client_loss * a.client_n).sum(1) / a.client_n.sum(), a.metrics.test_loss)


def test_store_hit_skips_training(tmp_path, monkeypatch):
    store = Store(tmp_path)
    run(TINY, store, progress=False)
    monkeypatch.setattr(runner, "train", lambda *a, **k: pytest.fail("should have come from the store"))
    assert run(TINY, store, progress=False).metrics.shape[0] == 3


def test_grid_validates_everything_first(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "train", lambda *a, **k: pytest.fail("no training before validation"))
    with pytest.raises(ValueError, match="RunConfig.lr=-1 must be a number >= 0"):
        run_grid(TINY, {"lr": [0.1, -1]}, Store(tmp_path), progress=False)


def test_a_store_reads_other_stores_and_writes_only_its_own(tmp_path, monkeypatch):
    """``Store(root, reads)``: a run held by a read store comes from there, never trained again; a run none holds
    trains into ``root``, and so does a forced re-run; the read store is never written. Its listing and damage
    check cover both, ``root`` first."""
    committed, mine = tmp_path / "committed", tmp_path / "mine"
    run(TINY, Store(committed), progress=False)
    third = TINY.replace(seed=2)
    run(third, Store(committed), progress=False)
    before = sorted(p.relative_to(committed) for p in committed.rglob("*"))
    store = Store(mine, reads=[committed])
    assert store.has(TINY) and store.path(TINY) == committed / TINY.key()
    trained = []
    real = runner.train
    monkeypatch.setattr(runner, "train", lambda *a, **k: trained.append(a[0]) or real(*a, **k))
    assert run(TINY, store, progress=False).config == TINY and trained == []
    other = TINY.replace(seed=1)
    run(other, store, progress=False)
    assert trained == [other] and store.path(other) == mine / other.key() and (mine / other.key()).is_dir()
    run(TINY, store, progress=False, force=True)  # retrained: into mine, where it now shadows the read copy
    assert store.path(TINY) == mine / TINY.key() and store.has(TINY)
    assert sorted(p.relative_to(committed) for p in committed.rglob("*")) == before  # never written
    assert sorted(c.seed for c in store.configs()) == [0, 1, 2] and store.damaged() == []
    for folder in (mine / TINY.key(), committed / TINY.key(), committed / third.key()):
        (folder / "metrics.csv").write_text("round,test_acc\n1,1.0\n")
    damaged = store.damaged()  # each run's copy that is read: the shadowed committed copy of TINY is not
    assert len(damaged) == 2 and str(mine / TINY.key()) in damaged[0] and str(committed / third.key()) in damaged[1]
    assert Store(mine, reads=[mine]).reads == ()  # itself is not read twice


def test_a_run_without_a_profile_reads_the_committed_runs_and_writes_apart(tmp_path, monkeypatch):
    """``fedlib.run(cfg)`` with no store in a checkout (a first library example) returns a committed run from
    results/ and trains anything else into results/_explore/ (git-ignored), never into the committed results/,
    whose runs a test counts."""
    from fedlib.runs import store as store_module

    committed = tmp_path / "results"
    run(TINY, Store(committed), progress=False)
    monkeypatch.delenv("FEDLIB_RESULTS")
    monkeypatch.setattr(store_module, "committed_root", lambda: committed)
    real = runner.train
    monkeypatch.setattr(runner, "train", lambda *a, **k: pytest.fail("a committed run trained again"))
    assert run(TINY, progress=False).config == TINY
    monkeypatch.setattr(runner, "train", real)
    other = TINY.replace(seed=1)
    run(other, progress=False)
    assert sorted(p.name for p in committed.iterdir()) == sorted(["_explore", TINY.key()])
    assert (committed / "_explore" / other.key() / "metrics.csv").exists()
    df = run_grid(TINY, {"seed": [0, 1]}, progress=False)  # a grid too: both stored, nothing trains
    assert sorted(df.seed) == [0, 1]
    assert Store().root == committed / "_explore" and Store().reads == (committed,)
    monkeypatch.setattr(store_module, "committed_root", lambda: None)  # an installed package: ./results, as before
    monkeypatch.chdir(tmp_path)
    assert Store().root == tmp_path / "results" and Store().reads == ()
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path / "env"))
    assert Store().root == tmp_path / "env" and Store().reads == ()


def test_a_grid_in_dotted_names_tabulates_as_in_flat_names(tmp_path):
    """A grid in dotted names must not print ``lr`` as NaN wherever a run has the default lr (as a column from the
    changed fields only, beside ``local.lr``, would): the varied fields are the flat names' columns, whichever way
    named."""
    base = TINY.replace(algorithm="fedprox", mu=0.1)
    store = Store(tmp_path)
    dotted = run_grid(base, {"method.mu": [0.01, 0.1], "local.lr": [0.01, 0.02]}, store, progress=False)
    flat = run_grid(base, {"mu": [0.01, 0.1], "lr": [0.01, 0.02]}, store, progress=False)
    pd.testing.assert_frame_equal(dotted.drop(columns="seconds"), flat.drop(columns="seconds"))
    assert list(dotted.lr) == [0.01, 0.02, 0.01, 0.02] and "local.lr" not in dotted


def test_expand_product_and_union():
    cfgs = expand(TINY, {"lr": [0.1, 0.2], "seed": [0, 1, 2]})
    assert len(cfgs) == 6 and {c.lr for c in cfgs} == {0.1, 0.2}
    cfgs = expand(TINY, [{"algorithm": "fedavg"}, {"algorithm": "fedprox", "mu": [0.0, 0.1]}, {"algorithm": "fedavg"}])
    assert [(c.algorithm, c.mu) for c in cfgs] == [("fedavg", 0.0), ("fedprox", 0.0), ("fedprox", 0.1)]
    assert expand(TINY, {"hidden": (7,), "model": "dnn"})[0].hidden == (7,)


@pytest.mark.parametrize("batch", [1, 16], ids=["one-at-a-time", "batched"])
def test_grid_resumes_after_interruption(tmp_path, monkeypatch, batch):
    """Stopped during seed 1's run: the finished runs are kept (one at a time: seed 0; batched as one model: seeds 0
    and 2, which finish beside it), nothing is half-written, and the rerun trains only what is missing."""
    store = Store(tmp_path)
    grid = {"seed": [0, 1, 2]}
    real_train = runner.train
    calls = []

    def flaky(cfg, *a, **k):
        calls.append(cfg.seed)
        if cfg.seed == 1 and calls.count(1) == 1:
            raise KeyboardInterrupt  # the user stops the grid during the second run
        return real_train(cfg, *a, **k)

    monkeypatch.setattr(runner, "train", flaky)
    with pytest.raises(KeyboardInterrupt):
        run_grid(TINY, grid, store, progress=False, batch=batch)
    finished = [0] if batch == 1 else [0, 2]
    assert sorted(c.seed for c in store.configs()) == finished  # the finished runs are kept
    assert not list(store.root.glob("_tmp-*"))  # nothing half-written
    before = len(calls)
    df = run_grid(TINY, grid, store, progress=False, batch=batch)
    assert sorted(calls[:before]) == (sorted([0, 1]) if batch == 1 else [0, 1, 2])
    assert sorted(calls[before:]) == ([1, 2] if batch == 1 else [1])  # finished runs are not retrained
    assert sorted(df.seed) == [0, 1, 2] and len(store.configs()) == 3


def test_a_run_stored_by_another_process_meanwhile_is_kept(tmp_path, monkeypatch):
    """Two processes training one config into one store (two notebooks, a notebook beside a grid): the one that
    finishes second finds the other's result in place, even when it appears between the check and the rename (that
    rename onto a full folder raised OSError after the whole run had trained)."""
    from fedlib.runs import store as store_module

    store, other = Store(tmp_path / "s"), Store(tmp_path / "other")
    result = run(TINY, other, progress=False)
    real = store_module.os.replace

    def racing(src, dst):  # the other process renames its folder into place just before this one
        if Path(dst) == store.path(TINY) and not Path(dst).exists():
            shutil.copytree(other.path(TINY), dst)
        return real(src, dst)

    monkeypatch.setattr(store_module.os, "replace", racing)
    assert store.save(TINY, result) == store.path(TINY)
    assert store.has(TINY) and not list(store.root.glob("_tmp-*"))
    pd.testing.assert_frame_equal(store.load(TINY).metrics, result.metrics)


def test_forced_rerun_replaces_the_stored_result(tmp_path):
    """``run(force=True)`` re-trains and replaces the stored folder (e.g. to add traces a later version records)."""
    import json

    from fedlib.runs.stored import seal

    store = Store(tmp_path)
    first = run(TINY, store, progress=False)
    meta = store.path(TINY) / "meta.json"
    data = json.loads(meta.read_text())
    meta.write_text(json.dumps({**data, "marker": "old"}))
    seal(meta.parent)  # as if an older fedlib had stored it so (an unsealed edit is damage: see test_bad_input)
    again = run(TINY, store, progress=False)  # stored: comes back as is
    assert store.load(TINY).meta.get("marker") == "old"
    forced = run(TINY, store, progress=False, force=True)
    assert "marker" not in store.load(TINY).meta
    # the store keeps 6 significant digits
    assert np.allclose(again.metrics.test_acc, first.metrics.test_acc, rtol=1e-5)
    assert np.allclose(forced.metrics.test_acc, first.metrics.test_acc, rtol=1e-5)
    assert not list(tmp_path.glob("_tmp*"))


def test_parallel_jobs_store_what_one_process_stores(tmp_path, monkeypatch):
    """``jobs=2`` trains in two spawned single-threaded processes: every run is stored, with the numbers a
    single process gets, and the summary keeps the order of the configs."""
    from fedlib.runs.grids import run_configs

    cfgs = expand(TINY, {"seed": [0, 1, 2]})
    with pytest.raises(ValueError, match="jobs=0 must be an integer >= 1"):
        run_configs(cfgs, Store(tmp_path / "x"), progress=False, jobs=0)
    one = run_configs(cfgs, Store(tmp_path / "one"), progress=False)
    # the spawned workers import fedlib afresh; this process must train nothing itself
    monkeypatch.setattr(runner, "train", lambda *a, **k: pytest.fail("trained in the parent process"))
    par = run_configs(cfgs, Store(tmp_path / "par"), progress=False, jobs=2)
    assert all(Store(tmp_path / "par").has(c) for c in cfgs) and list(par.seed) == [0, 1, 2]
    assert np.allclose(par.best_acc, one.best_acc) and np.allclose(par.last10_acc, one.last10_acc)
    assert len(set(par.best_acc)) > 1  # the seeds differ: the rows are not one run copied


def test_jobs_none_is_a_process_per_core_within_the_units_and_the_memory(tmp_path, monkeypatch):
    """``jobs=None`` (the notebooks' default, ``--jobs auto``): one process per core this process may use, no more
    than the units the runs to train make, no more than fit side by side in the memory; nothing to train: one."""
    from fedlib.runs import train as runner
    from fedlib.runs.grids import run_configs
    from fedlib.runs.scheduling import BATCH_MEMORY_SHARE, default_jobs

    cfgs = expand(TINY, {"seed": list(range(8))})  # one batch key: 8 runs cut into a unit per process
    monkeypatch.setattr(hardware, "cores", lambda: 4)
    monkeypatch.setattr(hardware, "available_bytes", lambda device="cpu": 1 << 40)
    assert default_jobs(cfgs) == 4
    assert default_jobs(cfgs[:3]) == 3  # three runs: three units at most
    assert default_jobs(cfgs, batch=8) == 4  # one unit of 8 would idle three cores: cut in four
    assert default_jobs([]) == 1
    largest = sum(feasibility.estimate(TINY).values())
    monkeypatch.setattr(hardware, "available_bytes", lambda device="cpu": 2.5 * largest / BATCH_MEMORY_SHARE)
    assert default_jobs(cfgs) == 2  # memory for two runs side by side
    monkeypatch.setattr(hardware, "available_bytes", lambda device="cpu": largest / 10)
    assert default_jobs(cfgs) == 1  # not even one: one (feasibility.check refuses it before training)
    monkeypatch.setattr(hardware, "cores", lambda: 1)
    monkeypatch.setattr(hardware, "available_bytes", lambda device="cpu": 1 << 40)
    assert default_jobs(cfgs) == 1
    # on CUDA: four processes a GPU at most (the Ray backend's quarter of a GPU a run)
    monkeypatch.setattr(hardware, "cores", lambda: 16)
    monkeypatch.setattr(runner.torch.cuda, "device_count", lambda: 1)
    assert default_jobs([c.replace(device="cuda") for c in cfgs]) == 4 and default_jobs(cfgs) == 8
    # run_configs resolves None with the runs it has to train (the stored one left out)
    store = Store(tmp_path / "r")
    run(cfgs[0], store, progress=False)
    asked = []
    monkeypatch.setattr(grids, "default_jobs", lambda todo, batch: asked.append(list(todo)) or 1)
    run_configs(cfgs[:3], store, progress=False, jobs=None)
    assert asked == [cfgs[1:3]] and all(store.has(c) for c in cfgs[:3])
    for bad in (0, True, 1.5, "2"):
        with pytest.raises(ValueError, match=r"must be an integer >= 1, or None \(one process per core"):
            run_configs(cfgs, store, progress=False, jobs=bad)


def test_cores_are_the_affinity_capped_by_a_cgroup_quota(tmp_path, monkeypatch):
    """A container's CPU quota caps the processes ``jobs=None`` starts: 64 cores visible, ``--cpus 2``: 2."""

    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert hardware.cores(str(tmp_path)) == 64  # no cgroup files: the affinity
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert hardware.cores(str(tmp_path)) == 64  # v2, no quota
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert hardware.cores(str(tmp_path)) == 2  # 1.5 CPUs: two processes, rounded up
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert hardware.cores(str(tmp_path)) == 4  # v1
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert hardware.cores(str(tmp_path)) == 64  # v1, no quota
    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda pid: {3}, raising=False)
    assert hardware.cores(str(tmp_path)) == 1


def test_cache_bytes_read_from_sysfs(tmp_path):
    """``hardware.cache_bytes``: a level's data or unified cache from sysfs' index* entries (the stacked executor's
    client-group budgets: half the L3, one L2); instruction caches and unreadable entries left out; None where sysfs
    says nothing. Entries as a 2-core CPU's sysfs lists them, and a 32 MiB L3 written "32M"."""

    def entry(i, level, kind, size):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")

    assert hardware.cache_bytes(2, str(tmp_path / "absent")) is None
    entry(0, 1, "Data", "48K")
    entry(1, 1, "Instruction", "64K")
    entry(2, 2, "Unified", "2048K")
    entry(3, 3, "Unified", "491520K")
    assert hardware.cache_bytes(1, str(tmp_path)) == 48 << 10
    assert hardware.cache_bytes(2, str(tmp_path)) == 2 << 20
    assert hardware.cache_bytes(3, str(tmp_path)) == 480 << 20
    assert hardware.cache_bytes(4, str(tmp_path)) is None
    (tmp_path / "index3" / "size").write_text("32M\n")
    assert hardware.cache_bytes(3, str(tmp_path)) == 32 << 20
    (tmp_path / "index3" / "size").write_text("unknown\n")
    assert hardware.cache_bytes(3, str(tmp_path)) is None


def test_pool_workers_report_the_rounds_they_train(tmp_path, monkeypatch):
    """A jobs > 1 grid's bar moved only when a whole unit ended (hours at the paper profile): a pool worker now
    sends (unit, rounds) as it trains, a run alone or a batch of runs, at most every ``every`` seconds."""
    import queue

    from fedlib.runs.pool import _run_in_worker
    from fedlib.runs.worker import RoundReport

    q = queue.Queue()
    monkeypatch.setattr(worker, "rounds", RoundReport(q, every=0.0))  # every round sent at once
    _run_in_worker([TINY], (tmp_path / "r",), None, 7)
    assert [q.get_nowait() for _ in range(q.qsize())] == [(7, 1), (7, 1), (7, 1)]
    pair = expand(TINY, {"seed": [1, 2]})
    _run_in_worker(pair, (tmp_path / "r",), None, 8)
    sent = [q.get_nowait() for _ in range(q.qsize())]
    assert {u for u, _ in sent} == {8} and sum(n for _, n in sent) == 6 and Store(tmp_path / "r").has(pair[1])
    monkeypatch.setattr(worker, "rounds", RoundReport(q, every=3600.0))  # rounds of milliseconds: one message
    _run_in_worker(expand(TINY, {"seed": [3]}), (tmp_path / "r",), None, 9)
    assert [q.get_nowait() for _ in range(q.qsize())] == [(9, 3)]


def test_parallel_bar_counts_rounds_and_runs_stored(tmp_path, capfd):
    """The parent's bar of a jobs=2 grid: every round of every run, and the runs stored. A unit that ends is
    counted whole (a resumed run trains fewer rounds, a diverged one stops early), its late reports not again."""
    from fedlib.runs.grids import run_configs
    from fedlib.runs.pool import _RoundsBar

    run_configs(expand(TINY, {"seed": [0, 1, 2]}), Store(tmp_path / "r"), progress=True, jobs=2, batch=1)
    err = capfd.readouterr().err
    assert "training (2 processes): 100%" in err and "3/3 runs stored]" in err
    units = [expand(TINY, {"seed": [0, 1]}), [TINY.replace(seed=2, rounds=5)]]  # 6 and 5 rounds
    bar = _RoundsBar(units, "t")
    bar.add(0, 2)
    bar.add(1, 4)
    assert bar.bar.n == 6
    bar.end(1)  # a run resumed from round 2 reported 4 of its 5
    bar.add(1, 1)  # late: not counted again
    assert bar.bar.n == 7 and "1/3 runs stored" in str(bar.bar)
    bar.end(0)
    assert bar.bar.n == 11 == bar.bar.total and "3/3 runs stored" in str(bar.bar)
    bar.close()
    # by estimated seconds: unit 0's two runs 1 s each over 6 rounds, unit 1's run 10 s over 5
    cost = {units[0][0].key(): 1.0, units[0][1].key(): 1.0, units[1][0].key(): 10.0}
    bar = _RoundsBar(units, "t", cost=cost)
    bar.add(0, 3)
    assert bar.bar.n == pytest.approx(1.0)
    bar.add(1, 1)
    assert bar.bar.n == pytest.approx(3.0) and bar.bar.total == pytest.approx(12.0)
    bar.end(1)
    assert bar.bar.n == pytest.approx(11.0) and "round" not in str(bar.bar)  # the share, not the counts
    bar.end(0)
    assert bar.bar.n == pytest.approx(12.0) and "100%" in str(bar.bar)
    bar.close()


def test_stored_times_estimate_runs_of_the_kinds_stored(tmp_path):
    """A run's estimated seconds: its rounds times the median seconds a round of its kind stored, else of the same
    dataset, model, algorithm and attention at another client count (scaled), else the median of the kinds stored.
    A run trained in a batch of n counts the batch's time over n. A damaged meta.json is skipped, not read as code
    or a crash."""
    import json

    store = Store(tmp_path / "r")
    cfgs = expand(TINY, {"seed": [0, 1, 2, 3, 4]})
    # seed 1 trained in a batch of 2 that took 12 s: its share is 6 s; seeds 3 and 4 hold nonsense
    for c, extra in zip(cfgs, ({"wall_seconds": 3.0}, {"wall_seconds": 12.0, "batched": 2}, {"wall_seconds": 9.0},
                               {"wall_seconds": 9.0, "batched": 0}, {"wall_seconds": 9.0, "batched": "two"})):  # fmt: skip
        run(c, store, progress=False)
        meta = store.path(c) / "meta.json"
        meta.write_text(json.dumps({**json.loads(meta.read_text()), **extra}))
    (store.path(cfgs[2]) / "meta.json").write_text("__import__('os').system('false')")
    known = estimates.stored_times(store.root, store.root)  # a root given twice counts once
    assert known == {estimates._kind(TINY): 1.5}  # s a round: the median of 1 and 2; the damaged runs left out
    (store.path(cfgs[1]) / "meta.json").write_text("[1, 2]")  # JSON, but not a run's meta
    assert estimates.stored_times(store.root) == {estimates._kind(TINY): 1.0}
    longer, wider = TINY.replace(rounds=6), TINY.replace(n_clients=8, clients_per_round=2)
    other = TINY.replace(model="dnn", rounds=10)
    assert estimates.seconds([TINY, longer, wider, other], known) == [4.5, 9.0, 9.0, 15.0]  # 1.5 s a round
    assert estimates.seconds_for(other, known) is None
    assert estimates.seconds([other], {}) == [10.0]  # nothing stored: rounds


def _stored_at(root, cfg, wall: float, device: str = "cpu") -> Store:
    """``cfg`` trained into the store at ``root``, its meta.json then saying it took ``wall`` s on ``device``."""
    store = Store(root)
    run(cfg, store, progress=False)
    meta = store.path(cfg) / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "wall_seconds": wall, "device": device}))
    return store


def test_known_times_layer_the_committed_store_the_reference_and_the_stores_own_runs(tmp_path, monkeypatch):
    """``estimates.known_times``, per kind, the last source that holds it: the committed store (any device, then the
    runs' device), the store (any device), this version's reference timings, the store's own runs on the device.
    ``estimates.stored_times(device=...)`` counts the runs of that device alone."""
    from fedlib.runs import estimates

    own, ref, same, other = (TINY.replace(algorithm=a) for a in ("fedavg", "fedprox", "local", "ditto"))
    committed = tmp_path / "committed"
    _stored_at(committed, own, 30.0)  # 10 s a round
    _stored_at(committed, own.replace(seed=1), 3.0, "cuda")
    _stored_at(committed, ref, 3.0)  # 1 s a round
    _stored_at(committed, same, 6.0)  # 2 s a round on this device ...
    _stored_at(committed, other, 0.9, "cuda")  # ... a kind timed on a GPU alone: 0.3 s
    mine = _stored_at(tmp_path / "mine", own.replace(seed=2), 0.3)  # 0.1 s a round here
    _stored_at(mine.root, same.replace(seed=2), 0.15, "cuda")  # the store's GPU run: 0.05 s
    assert estimates.stored_times(committed, device="cuda") == {estimates._kind(own): 1.0, estimates._kind(other): 0.3}
    reference = tmp_path / "round_seconds.json"
    estimates.write_reference_times(committed, reference)  # the committed CPU runs: own 10, ref 1, same 2
    doc = json.loads(reference.read_text())
    doc["seconds_a_round"] = [r for r in doc["seconds_a_round"] if r["algorithm"] in ("fedavg", "fedprox")]
    for r in doc["seconds_a_round"]:
        r["seconds"] /= 4  # this version: own 2.5, ref 0.25
    reference.write_text(json.dumps(doc))
    monkeypatch.setattr(estimates, "REFERENCE_TIMES", reference)
    monkeypatch.setattr(estimates, "committed_root", lambda: committed)
    assert estimates.known_times(mine, "cpu") == pytest.approx({
        estimates._kind(own): 0.1,  # the store's own CPU run over the reference and the committed ones
        estimates._kind(ref): 0.25,  # the reference over the committed store
        estimates._kind(same): 2.0,  # the committed CPU runs over the store's GPU run
        estimates._kind(other): 0.3,  # timed on a GPU alone: better than nothing
    })  # fmt: skip
    assert estimates.known_times(mine, "cuda") == pytest.approx({  # no reference for a GPU
        estimates._kind(own): 1.0, estimates._kind(ref): 1.0, estimates._kind(same): 0.05,
        estimates._kind(other): 0.3,
    })  # fmt: skip


def test_reference_times_are_read_back_as_written_and_a_damaged_file_is_skipped(tmp_path, capsys):
    """``write_reference_times`` keeps each kind's median seconds a round of the store's CPU runs (and where they
    were timed); ``reference_times`` reads them back as JSON only, nothing for another device; a damaged file, or
    one with a seconds that is not a positive number, gives nothing and a warning naming the file.
    ``scripts/reference_timings.py`` is its command line."""

    store = _stored_at(tmp_path / "quick", TINY, 3.0)
    _stored_at(store.root, TINY.replace(seed=1), 9.0)
    _stored_at(store.root, TINY.replace(algorithm="local"), 1.5, "cuda")
    out = tmp_path / "ref.json"
    doc = estimates.write_reference_times(store.root, out)
    assert estimates.reference_times("cpu", out) == {estimates._kind(TINY): 2.0}  # the median of 1 and 3 s
    spec = importlib.util.spec_from_file_location("reference_timings", ROOT / "scripts" / "reference_timings.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main([str(store.root), "--out", str(tmp_path / "cli.json")])  # its command line writes the same
    assert json.loads((tmp_path / "cli.json").read_text()) == json.loads(out.read_text())
    assert "1 kinds from 2 runs" in capsys.readouterr().out
    assert estimates.reference_times("cuda", out) == {}
    assert doc["runs"] == 2 and doc["device"] == "cpu" and len(doc["commits"]) == 1
    row = json.loads(out.read_text())["seconds_a_round"][0]
    bad = {**json.loads(out.read_text()), "seconds_a_round": [{**row, "seconds": -1}]}
    for text in ("__import__('os').system('false')", json.dumps(bad), json.dumps({"device": "cpu"}), "[1]"):
        out.write_text(text)
        with pytest.warns(UserWarning, match="ref.json"):
            assert estimates.reference_times("cpu", out) == {}


def test_the_shipped_reference_times_cover_every_kind_the_quick_profile_trains(tmp_path, monkeypatch):
    """``fedlib/round_seconds.json`` holds a time for every kind of run the quick profile's experiments train on
    the data present, so that ``make notebooks``' plan from an empty store estimates every run from this version's
    times. A new kind fails here until the file is written again (``scripts/reference_timings.py``)."""
    from fedlib.experiments import named as experiments
    from fedlib.experiments import profiles

    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path / "empty"))
    reference = estimates.reference_times("cpu")
    kinds = {estimates._kind(c) for name in profiles.EXPERIMENTS for c in experiments.configs(name, "quick")[0]}
    assert kinds and all(s > 0 for s in reference.values())
    missing = sorted(map(str, kinds - reference.keys()))
    assert not missing, f"not in {estimates.REFERENCE_TIMES.name}: {missing}; see scripts/reference_timings.py"


def test_a_grid_on_several_processes_starts_with_its_longest_runs(tmp_path, monkeypatch):
    """jobs > 1: the runs stopped part-way first, then the longest by ``estimates.seconds``, so that the short runs
    fill the end; the units are balanced in those seconds."""

    short = expand(TINY, {"seed": [0, 1]})
    long = [TINY.replace(model="dnn", seed=s) for s in (0, 1)]
    times = {estimates._kind(long[0]): 100.0 / 3, estimates._kind(short[0]): 0.5}  # s a round
    monkeypatch.setattr(grids, "known_times", lambda store, device=None: times)
    seen = []

    def capture(units, store, jobs, progress, data_root, cost):
        seen.append((units, cost))
        raise KeyboardInterrupt

    monkeypatch.setattr(grids, "_run_parallel", capture)
    with pytest.raises(KeyboardInterrupt):
        grids.run_configs(short + long, Store(tmp_path / "r"), progress=False, jobs=2)
    (units, cost) = seen[0]
    assert units == [long[:1], long[1:], short]  # 100 s each, then the two 1.5 s runs as one model
    assert cost[long[0].key()] == pytest.approx(100.0) and cost[short[0].key()] == pytest.approx(1.5)
    # what the job's plan says (scripts/run_notebooks.py): 100 s on each process, then the short ones on either
    assert scheduling.span_seconds(short + long, 2, times) == pytest.approx(103.0)
    assert scheduling.span_seconds(short + long, 1, times) == pytest.approx(203.0)
    assert scheduling.span_seconds(short + long[:1], 2, times) == pytest.approx(100.0)


def test_parallel_failure_raises_and_keeps_finished_runs(tmp_path, monkeypatch):
    """A config that fails in a worker raises in the caller; the runs that did finish stay stored."""
    from fedlib.runs.grids import run_configs

    # no stored times: both runs are estimated at their 3 rounds and keep their order, so the good one starts first
    # (a unit not started when another fails is dropped; the committed store put the MNIST run first)
    monkeypatch.setattr(grids, "known_times", lambda store, device=None: {})
    good = expand(TINY, {"seed": [0]})
    bad = TINY.replace(seed=1, dataset="mnist", partition="iid")  # no MNIST under this data root
    with pytest.raises(Exception, match="mnist"):
        run_configs(good + [bad], Store(tmp_path / "r"), progress=False, jobs=2, data_root=tmp_path / "nodata")
    assert Store(tmp_path / "r").has(good[0]) and not Store(tmp_path / "r").has(bad)


def test_parallel_workers_share_the_cache_budget(monkeypatch):
    """Each of ``jobs`` worker processes runs one thread and gives the stacked executor's client groups 1/jobs of
    the one-process cache budget (the processes share the L3): AdaFL's MLP groups shrink from 7 clients to 3. The
    budget is a 32 MiB L3's (16 MiB: half of it), whatever this machine's caches are."""
    import torch

    import fedlib.executors
    from fedlib.executors import LocalSGD, StackedExecutor, make_executor, stacked
    from fedlib.models.registry import build_model

    monkeypatch.setattr(worker, "group_bytes", None)
    for module in (fedlib.executors, stacked):
        monkeypatch.setattr(module, "PROCESS_CACHE_BYTES", 16 << 20)
    threads = torch.get_num_threads()
    mlp, opt = build_model("mlp", (784,), 10, (200, 200), seed=0), LocalSGD(0.01, momentum=0.5)
    # 16 MiB / (3 copies x 0.8 MB) = 7 clients a group at most: 8 groups, of 7 (equal groups, see group_size)
    assert StackedExecutor().group_size(mlp, 50, None, opt, "cpu") == 7
    try:
        worker.worker_setup(2)
        ex = make_executor("stacked", mlp, group_bytes=worker.group_bytes)  # as train.train makes it in a worker
        assert torch.get_num_threads() == 1 and ex.group_bytes == 8 << 20
        assert ex.group_size(mlp, 50, None, opt, "cpu") == 3  # 8 MiB: 3 at most, 17 groups
        assert StackedExecutor().group_bytes == 16 << 20  # a value, not a class attribute changed at run time
        assert StackedExecutor(group_bytes=16 << 20).group_bytes == 16 << 20  # an explicit budget still wins
    finally:
        torch.set_num_threads(threads)


def test_a_grid_on_processes_runs_from_a_script_read_from_standard_input(tmp_path):
    """``python - <<EOF`` (a batch job script): each spawned worker tried to run '<stdin>' as a file, and the grid
    ended in BrokenProcessPool before any run trained."""
    import os
    import subprocess
    import sys

    script = (
        "import fedlib\nfrom fedlib.runs import grids\n"
        "ex = fedlib.experiment('quickstart', 'smoke', stored_only=True, progress=False)\n"
        "grids.run_configs(ex.configs, ex.store, progress=False, jobs=2, batch=1)\n"
        "import __main__\nprint(len(ex.runs), __main__.__file__)\n"
    )
    env = {**os.environ, "FEDLIB_RESULTS": str(tmp_path), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["2", "<stdin>"]  # both stored; __main__ as it was


def test_a_checkout_finds_its_committed_store_data_root_and_figures_from_any_folder(tmp_path, monkeypatch):
    """The committed store is results/ beside pyproject.toml, whatever the working directory (the notebooks run in
    notebooks/): found from the modules' own paths, which a move of a module one folder deeper must follow (a
    committed_root that looked one folder too shallow sent nbval's notebooks to train into notebooks/results/)."""
    from fedlib import plotting
    from fedlib.data import readers
    from fedlib.runs import store as store_module

    checkout = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    for name in ("FEDLIB_RESULTS", "FEDLIB_DATA", "FEDLIB_FIGURES"):
        monkeypatch.delenv(name, raising=False)
    assert store_module.committed_root() == checkout / "results"
    assert store_module.default_root("paper") == checkout / "results"
    assert store_module.default_root("quick") == checkout / "results" / "_explore"
    assert Path(readers.data_root()) == checkout / "data"
    assert plotting.figures_dir() == checkout / "figures"
