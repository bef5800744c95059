"""Grids as one model (``fedlib.runs.batching``): runs trained together give their solo runs' numbers bit
for bit, for every registered method, in float32 and float64; their calls really merge; a run that fails or diverges
leaves the others alone; a stop snapshots every run; ``run_configs`` batches by itself."""

import numpy as np
import pytest
import torch
from helpers import batched_and_solo, simulate_with, small_synthetic, untimed_metrics
from test_checkpoint import _same

from fedlib import RunConfig, Store
from fedlib.algorithms import ALGORITHMS, build_algorithm
from fedlib.executors import StackedExecutor, class_softmax, hardware
from fedlib.models.registry import build_model
from fedlib.runs import feasibility, grids, scheduling
from fedlib.runs.batching import run_together
from fedlib.runs.checkpoint import Checkpoint


def _cfg(algorithm, **kw):
    base = dict(n_clients=5, clients_per_round=2, rounds=4, local_steps=3, batch_size=8, model="dnn", lr=0.1)
    if "mu" in ALGORITHMS[algorithm].option_names():
        base["mu"] = 0.1
    return RunConfig(algorithm=algorithm, **{**base, **kw})


def _simulate(cfg, data, executor=None, stop=None, **kw):
    dtype = data.train.x.dtype
    model = build_model(cfg.model.name, data.input_shape, 10, (8,), seed=cfg.seed, dtype=dtype)
    alg = build_algorithm(cfg, n_samples=data.train.sizes.numpy())
    return simulate_with(
        alg, data, model, executor or StackedExecutor(), cfg.rounds, local_steps=cfg.local_steps,
        batch_size=cfg.batch_size, seed=cfg.seed, progress=False, eval_every=1, stop=stop, **kw,
    )  # fmt: skip


def _together(cfgs, data, **kw):
    outs, gang = run_together(
        [lambda ex, stop, c=c: _simulate(c, data, ex, stop, **kw) for c in cfgs], StackedExecutor()
    )
    return outs, gang


OWN_OBJECTIVE = {"fedmix", "naivemix", "fedrod"}  # per-client context: FedMix's means, FedRoD's label counts
# the number of training calls is each run's own: FedALA learns its weights W until each client's loss settles
OWN_CALLS = {"fedala"}


def _grid(algorithm):
    """Three seeds, and a run with another lr (and mu, where the method has one): all four train as one call, the
    fourth with its own numbers (``RunsSGD``)."""
    other = {"lr": 0.05, **({"mu": 0.3} if "mu" in ALGORITHMS[algorithm].option_names() else {})}
    return [_cfg(algorithm, seed=s) for s in (0, 1, 2)] + [_cfg(algorithm, seed=0, **other)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_batched_runs_equal_their_solo_runs(algorithm, dtype):
    """Every run of a batch: metrics, per-client accuracies and losses, traces and final models identical to the
    run alone (float32 too: the merged arithmetic is the solo one slice by slice)."""
    data = small_synthetic(n_clients=5, rows=80, dtype=dtype)
    cfgs = _grid(algorithm)
    solo = [_simulate(c, data) for c in cfgs]
    batched, gang = _together(cfgs, data)
    for a, b in zip(solo, batched):
        assert not isinstance(b, BaseException), b
        _same(a, b)
    calls, merged = gang.merged["train"]
    if algorithm in OWN_OBJECTIVE:  # per-run context (FedMix's means and pairs): trained one run at a time
        assert merged == calls
    elif algorithm in OWN_CALLS:  # the calls the runs share merge, the rest run alone
        assert merged < calls
    elif build_algorithm(cfgs[0]).finetune is not None:  # FedBABU: each round's training merges 4 -> 1, and the
        # evaluation's fine-tuning (epochs of unequal clients: plans with idle steps, on which the CPU merges only
        # runs of one optimiser, ``batching._train_key``) 4 -> 2, the run of another lr alone
        assert merged * 8 == calls * 3
    else:
        assert merged * len(cfgs) == calls  # the four runs' training really ran as one call, other lr included
    calls, merged = gang.merged["evaluate"]
    assert merged < calls


def test_adafl_selection_batched_equals_solo():
    """AdaFL's attention selection and dynamic fraction (per-run state outside ``State``) are unaffected."""
    data = small_synthetic(n_clients=5, rows=80)
    cfgs = [_cfg("fedavg", selection="attention", fraction_schedule=(0.2, 0.6, 3), seed=s) for s in (0, 1)]
    solo = [_simulate(c, data) for c in cfgs]
    batched, _ = _together(cfgs, data)
    for a, b in zip(solo, batched):
        _same(a, b)


def test_a_diverging_run_leaves_the_batch_and_the_others_equal_their_solo_runs():
    data = small_synthetic(n_clients=5, rows=80)
    cfgs = [_cfg("fedavg", seed=0), _cfg("fedavg", seed=1, lr=1e300), _cfg("fedavg", seed=2)]
    solo = [_simulate(c, data) for c in cfgs]
    assert solo[1].meta.get("diverged_at") is not None
    batched, _ = _together(cfgs, data)
    for i in (0, 2):
        _same(solo[i], batched[i])
    a, b = solo[1], batched[1]
    cols = [c for c in a.metrics.columns if c != "seconds"]
    assert a.meta == b.meta and a.metrics[cols].equals(b.metrics[cols])  # NaN accuracies from the diverged round on
    assert np.array_equal(a.client_acc, b.client_acc, equal_nan=True)


def test_a_failing_run_is_reported_and_the_others_finish():
    data = small_synthetic(n_clients=5, rows=80)
    cfgs = [_cfg("fedavg", seed=s) for s in (0, 1, 2)]

    def boom(t, *_):
        if t == 2:
            raise RuntimeError("run 1 failed")

    fns = [lambda ex, stop, c=c: _simulate(c, data, ex, stop) for c in cfgs]
    fns[1] = lambda ex, stop: _simulate(cfgs[1], data, ex, stop, on_round=boom)
    outs, _ = run_together(fns, StackedExecutor())
    assert isinstance(outs[1], RuntimeError) and "run 1 failed" in str(outs[1])
    for i in (0, 2):
        _same(_simulate(cfgs[i], data), outs[i])


def test_a_stop_snapshots_every_run_and_they_resume_to_their_solo_results(tmp_path):
    """Ctrl-C reaches only the main thread: the stop flag asks every run to finish its round, snapshot and stop;
    continued from the snapshots they give the uninterrupted numbers."""
    data = small_synthetic(n_clients=5, rows=80)
    cfgs = [_cfg("fedmcsa", seed=s, rounds=6) for s in (0, 1)]
    cks = [Checkpoint(tmp_path / f"run{i}.pt", every_seconds=3600) for i in range(2)]

    def fn(i):
        def go(ex, stop):
            def on_round(t, *_):
                if t == 2:
                    stop.requested = True  # what run_together does on a KeyboardInterrupt

            return _simulate(cfgs[i], data, ex, stop, checkpoint=cks[i], on_round=on_round)

        return go

    outs, _ = run_together([fn(0), fn(1)], StackedExecutor())
    assert all(isinstance(o, KeyboardInterrupt) for o in outs)
    assert [ck.info()["round"] for ck in cks] == [2, 2]
    resumed, _ = run_together(
        [lambda ex, stop, i=i: _simulate(cfgs[i], data, ex, stop, checkpoint=cks[i]) for i in range(2)],
        StackedExecutor(),
    )
    for c, r in zip(cfgs, resumed):
        _same(_simulate(c, data), r)


def test_gang_runs_unmergeable_calls_one_by_one():
    """Calls whose arithmetic differs (here: the batch size) are not merged, each still gets its own result."""
    data = small_synthetic(n_clients=5, rows=80)
    cfgs = [_cfg("fedavg", seed=0), _cfg("fedavg", seed=0, batch_size=4)]
    outs, gang = _together(cfgs, data)
    calls, merged = gang.merged["train"]
    assert calls == merged == 2 * cfgs[0].rounds
    for c, o in zip(cfgs, outs):
        _same(_simulate(c, data), o)


# -- run_configs and the CLI batch by themselves ------------------------------------------------------------------
def _synthetic(**kw):
    return RunConfig(
        dataset="synthetic", n_clients=6, clients_per_round=3, rounds=3, local_steps=2, model="mlr",
        algorithm="fedmcsa", **kw,
    )  # fmt: skip


def test_gang_threads_take_turns_between_calls():
    """One run's thread at a time runs its own Python between its calls (each hands the turn on at the barrier):
    with every thread runnable at once they took the GIL from each other, and W6 batched took 0.84x the time of
    its runs one by one (``python -m benchmarks --e2e``). Every run still makes all its calls."""
    import threading
    import time

    class Echo:  # an executor that answers each call with its own arguments
        def train(self, *args, **kwargs):
            return args[1]

    lock, active, most = threading.Lock(), [0], [0]

    def run(ex, stop, r):
        got = []
        for step in range(3):
            with lock:
                active[0] += 1
                most[0] = max(most[0], active[0])
            time.sleep(0.005)  # the run's own work, long enough for another thread to start its own
            with lock:
                active[0] -= 1
            got.append(ex.train(None, (r, step), None, None, None, objective=object()))  # unmergeable: runs alone
        return got

    outs, gang = run_together([lambda ex, stop, r=r: run(ex, stop, r) for r in range(4)], Echo())
    assert outs == [[(r, s) for s in range(3)] for r in range(4)]
    assert most[0] == 1 and gang.merged["train"] == [12, 12]


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_merged_calls_run_in_the_calling_thread_and_run_threads_start_no_openmp_team(two_threads):
    """With two threads, merged calls run in whichever run thread arrives last would make each run thread a GNU
    OpenMP team of its own: more threads in teams than cores, so every parallel region would sleep and wake its
    workers, and batching would be slower than the runs one by one (``fedlib.runs.openmp``). So the calling
    thread runs every merged call with torch's threads, and a run thread computes on one (where the runtime lets
    ``fedlib.runs.openmp`` set it); a run's metadata still records the process's threads."""
    import threading

    from fedlib.runs import openmp

    seen = []

    class Where:  # an executor that says where it ran
        def train(self, *args, **kwargs):
            seen.append((threading.current_thread() is threading.main_thread(), torch.get_num_threads()))
            return args[1]

    omp, mkl = openmp._runtime()

    def run(ex, stop):
        ex.train(None, {}, None, None, None, objective=object())
        mkl_here = mkl(1) if mkl is not None else 1  # MKL's answer: this thread's count before the call
        return torch.get_num_threads(), mkl_here, openmp.threads()

    outs, _ = run_together([run] * 3, Where())
    assert seen == [(True, 2)] * 3
    assert outs == [(1 if omp is not None else 2, 1, 2)] * 3


def test_run_together_returns_when_the_last_run_ends_not_at_the_next_poll(monkeypatch):
    """The calling thread waits for work with a timeout (to see a Ctrl-C); a run's end wakes it. Without that it
    slept out its timeout after the last run (0.2 s of a batched W6's 0.9 s)."""
    import time

    import fedlib.runs.batching as batching

    class Echo:
        def train(self, *args, **kwargs):
            return args[1]

    def run(ex, stop, r):
        got = ex.train(None, r, None, None, None, objective=object())
        time.sleep(0.05)  # the run's last round: the calling thread is waiting for work by now
        return got

    monkeypatch.setattr(batching, "_POLL", 60.0)
    t = time.perf_counter()
    outs, _ = run_together([lambda ex, stop, r=r: run(ex, stop, r) for r in range(3)], Echo())
    assert outs == [0, 1, 2] and time.perf_counter() - t < 30


def test_batches_group_by_data_model_and_method_and_respect_the_caps(monkeypatch):
    a = [_synthetic(seed=s) for s in range(5)]
    b = [_synthetic(seed=0, data_seed=1)]  # other data: another unit
    c = [RunConfig(dataset="digits", model="lenet", algorithm="fedbn", rounds=2)]  # the loop executor: alone
    units = scheduling.batches(a + b + c, most=3)
    assert [len(u) for u in units] == [3, 2, 1, 1]
    assert units[0] == a[:3] and units[1] == a[3:] and units[2] == b and units[3] == c
    assert [len(u) for u in scheduling.batches(a, most=1)] == [1] * 5
    many = [_synthetic(seed=s) for s in range(20)]
    assert [len(u) for u in scheduling.batches(many, most=16)] == [10, 10]  # as many units as 16 + 4, of equal size
    assert [len(u) for u in scheduling.batches(many, most=6)] == [5, 5, 5, 5]
    assert sum(scheduling.batches(many, most=6), []) == many  # every run once, in order
    other = [_synthetic(seed=s, data_seed=1) for s in range(2)]
    # two processes share the work: no unit above its share of the runs (16 + 2 would leave one idle most of the time),
    # and a unit is cut where that ends the grid sooner (8 + 8 + 2: 10 runs' time; 8 + 8 + 1 + 1: 9)
    assert [len(u) for u in scheduling.batches(many[:16] + other, most=16, jobs=2)] == [8, 8, 1, 1]
    trio = [_synthetic(seed=s, data_seed=d) for d in range(3) for s in range(3)]  # three kinds of three runs
    assert [len(u) for u in scheduling.batches(trio, most=16, jobs=2)] == [2, 1, 3, 3]  # 5 runs' time, not 6
    assert sum(scheduling.batches(trio, most=16, jobs=2), []) == trio  # every run once, in order
    longer = [c.replace(rounds=c.rounds * 4) for c in other]  # the span counts rounds, not runs
    assert [len(u) for u in scheduling.batches(many[:4] + longer, most=16, jobs=2)] == [2, 2, 1, 1]
    assert [len(u) for u in scheduling.batches(many[:8], most=16, jobs=3)] == [3, 3, 2]
    assert scheduling.batches(a[:3], most=16, jobs=2) == [a[:2], a[2:3]]  # two processes: a unit each
    assert [len(u) for u in scheduling.batches(a + b, most=16, jobs=4)] == [2, 2, 1, 1]  # a's 5 runs in 3 pieces
    est = feasibility.estimate(a[0])
    room = est["data"] + 2 * feasibility.run_bytes(est)  # the data once and two runs
    monkeypatch.setattr(hardware, "available_bytes", lambda device="cpu": room / scheduling.BATCH_MEMORY_SHARE)
    assert [len(u) for u in scheduling.batches(a, most=16)] == [2, 2, 1]


def test_run_configs_batches_and_stores_each_run_as_its_solo_run(tmp_path):
    cfgs = [_synthetic(seed=s, sigma=sg) for s in (0, 1) for sg in (1.0, 50.0)]
    for x, y in batched_and_solo(cfgs, tmp_path):
        assert untimed_metrics(x).equals(untimed_metrics(y))
        assert np.array_equal(x.client_acc, y.client_acc) and np.array_equal(x.client_loss, y.client_loss)
        assert x.meta["batched"] == 4 and "batched" not in y.meta


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_run_configs_refuses_a_bad_batch(bad, tmp_path):
    with pytest.raises(ValueError, match="batch="):
        grids.run_configs([_synthetic()], Store(tmp_path), progress=False, batch=bad)


def test_class_softmax_is_softmax_and_a_row_does_not_depend_on_its_neighbours():
    z = torch.randn(300, 10, dtype=torch.float64) * 5
    assert torch.equal(class_softmax(z), torch.softmax(z, -1))  # float64: torch's own kernel
    z3 = z.float().view(10, 30, 10)
    assert torch.allclose(class_softmax(z3), torch.softmax(z3, -1), rtol=0, atol=1e-6)
    assert torch.allclose(class_softmax(z3, log=True), torch.log_softmax(z3, -1), rtol=0, atol=1e-5)
    for log in (False, True):  # each row as alone: what makes batched evaluation equal solo evaluation
        whole = class_softmax(z3, log)
        assert all(torch.equal(whole[i], class_softmax(z3[i], log)) for i in range(10))
        assert all(torch.equal(whole[i, :7], class_softmax(z3[i, :7], log)) for i in range(10))
