"""The thread count fedlib chooses (``fedlib.runs.threads``): who decides, the free-core rule, the watch between
rounds, what a run records, and bad ``threads=`` refused before training. No test here depends on timing."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import fedlib
from fedlib.config.run import RunConfig
from fedlib.runs import threads, worker

TINY = dict(dataset="synthetic", model="mlr", n_clients=4, rounds=2, clients_per_round=2)


@pytest.fixture
def nobody_set(monkeypatch):
    """Neither OMP_NUM_THREADS (the test command sets it) nor a worker's count: fedlib chooses."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(worker, "fixed_threads", None)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def busy_clock(monkeypatch, others_cores: float, own_cores: float = 0.0):
    """/proc/stat's busy seconds and this process's CPU time as if other processes kept ``others_cores`` busy."""
    clock = {"t": 0.0}

    def perf():
        clock["t"] += 0.5  # each read half a second later: a window of 0.5 s between the two reads
        return clock["t"]

    monkeypatch.setattr(threads.time, "perf_counter", perf)
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    monkeypatch.setattr(threads, "_busy_seconds", lambda: clock["t"] * (others_cores + own_cores))
    monkeypatch.setattr(threads.time, "process_time", lambda: clock["t"] * own_cores)
    monkeypatch.setattr(threads, "cores", lambda: 4)


@pytest.mark.parametrize("others, free", [(0.0, 4), (1.0, 3), (2.6, 1), (3.4, 1), (9.0, 1)])
def test_free_cores_are_the_cores_others_leave(monkeypatch, others, free):
    busy_clock(monkeypatch, others, own_cores=1.5)  # this process's own use is not counted against it
    assert threads.free_cores() == free


def test_unknown_load_keeps_one_thread(monkeypatch):
    monkeypatch.setattr(threads, "_busy_seconds", lambda: None)
    assert threads.others_busy() is None
    assert threads.free_cores() == 1


def test_proc_stat_is_read_where_there_is_one():
    b = threads._busy_seconds()
    if b is None:
        pytest.skip("no /proc/stat here")
    assert b > 0


def test_who_decides(monkeypatch, nobody_set):
    assert threads.chosen_by(None) is None
    assert threads.chosen_by(3) == "threads="
    monkeypatch.setattr(worker, "fixed_threads", 1)
    assert threads.chosen_by(None) == "worker"
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.chosen_by(None) == "OMP_NUM_THREADS"


def test_computing_sets_then_restores_and_nests(monkeypatch, nobody_set):
    torch.set_num_threads(1)
    with threads.computing(3) as outer:
        assert torch.get_num_threads() == 3 and outer == {"threads": 3, "threads_by": "threads="}
        with threads.computing(2) as inner:  # inside a grid's block a run's own call changes nothing
            assert inner is outer and torch.get_num_threads() == 3
    assert torch.get_num_threads() == 1


def test_computing_chooses_the_free_cores(monkeypatch, nobody_set):
    monkeypatch.setattr(threads, "free_cores", lambda window=0.1, since=None: 2)
    torch.set_num_threads(1)
    with threads.computing() as rec:
        assert rec == {"threads": 2, "threads_by": "fedlib"} and torch.get_num_threads() == 2
    with threads.computing(device="cuda") as rec:  # the GPU computes: torch's count is left as it is
        assert rec["threads_by"] == "torch" and torch.get_num_threads() == 1


def test_omp_num_threads_is_respected(monkeypatch, nobody_set):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(
        threads, "free_cores", lambda window=0.1, since=None: pytest.fail("fedlib chose although the user had")
    )
    with threads.computing() as rec:
        assert rec["threads_by"] == "OMP_NUM_THREADS"


def test_load_watch_follows_the_free_cores(monkeypatch, nobody_set):
    # (all processes' busy seconds, this process's, wall seconds): others use 1, 1, then 0 of 2 cores
    samples = iter([(0, 0, 0), (30, 20, 10), (50, 30, 20), (60, 40, 30)])
    monkeypatch.setattr(threads, "sample", lambda: next(samples))
    monkeypatch.setattr(threads, "cores", lambda: 2)
    torch.set_num_threads(2)
    watch = threads.LoadWatch(every=0.0)
    watch.after_round(None, None)
    assert torch.get_num_threads() == 1  # another process started: down to one thread
    watch.after_round(None, None)
    assert torch.get_num_threads() == 1
    watch.after_round(None, None)
    assert torch.get_num_threads() == 2  # it ended: the threads come back
    assert watch.meta() == {"threads_seen": [1, 2]}


def test_load_watch_waits_its_interval(monkeypatch, nobody_set):
    monkeypatch.setattr(threads, "sample", lambda: (0.0, 0.0, threads.time.perf_counter()))
    monkeypatch.setattr(threads, "_free", lambda others: pytest.fail("checked before its interval"))
    threads.LoadWatch(every=60.0).after_round(None, None)


def test_a_run_records_its_threads(monkeypatch, nobody_set):
    monkeypatch.setattr(threads, "free_cores", lambda window=0.1, since=None: 1)
    res = fedlib.train(RunConfig(**TINY), progress=False)
    assert res.meta["threads_by"] == "fedlib" and res.meta["threads"] == 1
    assert res.meta["threads_seen"] == [1]  # the watch ran beside it
    res = fedlib.train(RunConfig(**TINY), progress=False, threads=2)
    assert res.meta["threads_by"] == "threads=" and res.meta["threads"] == 2
    assert "threads_seen" not in res.meta  # the user's count is kept: no watch


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_bad_threads_are_refused_before_training(tmp_path, bad):
    cfg = RunConfig(**TINY)
    for call in (
        lambda: fedlib.run(cfg, store=tmp_path, threads=bad),
        lambda: fedlib.run_grid(cfg, {"seed": [0, 1]}, store=tmp_path, threads=bad),
        lambda: fedlib.experiment("fedmcsa_fig3", "smoke", store=tmp_path, threads=bad),
    ):
        with pytest.raises(ValueError, match=r"threads=.* must be None .* or an int >= 1"):
            call()
    assert not any(tmp_path.rglob("*.json"))  # nothing trained, nothing stored


def test_cli_refuses_bad_threads():
    out = subprocess.run(
        [sys.executable, "-m", "fedlib.experiments", "fedmcsa_fig3", "--threads", "0"], capture_output=True, text=True
    )
    assert out.returncode == 2 and "threads=0 must be None" in out.stderr


def test_benchmark_row_runs():
    out = subprocess.run([sys.executable, "-m", "benchmarks.threads", "--tiny"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for way in ("default", "threads=1", "threads=2"):
        assert out.stdout.count(f" {way} ") == 2  # alone and beside the competing process


def test_the_set_up_is_the_window(monkeypatch, nobody_set):
    """A sample taken before loading the data measures the free cores over the loading: nothing waits."""
    slept = []
    monkeypatch.setattr(threads.time, "sleep", slept.append)
    monkeypatch.setattr(threads, "cores", lambda: 2)
    t = threads.time.perf_counter()
    monkeypatch.setattr(threads, "sample", lambda: (3.0, 2.0, t))  # others used 1 core of 2 over the last second
    assert threads.free_cores(since=(0.0, 0.0, t - 1.0)) == 1
    assert slept == [0.0]
