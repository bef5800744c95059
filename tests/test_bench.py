"""The benchmark's FLOP count, which turns its timings into a rate against the machine's matmul rate."""

import collections

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.bench import ceiling, chain_flops, main
from fedlib.models.registry import build_model


def test_chain_flops_golden():
    # 2-3-4 chain, batch 5: layer 1 forward + weight grad 2 * (2*5*2*3) = 120; layer 2 adds the input
    # grad: 3 * (2*5*3*4) = 360; 480 a step, times 2 clients and 3 steps
    assert chain_flops([2, 3, 4], clients=2, batch=5, steps=3) == 2880


@pytest.mark.parametrize("name, hidden", [("mlr", None), ("dnn", (7,)), ("mlp", (7, 5))])
def test_chain_flops_matches_torch_flop_counter(name, hidden):
    """One client, one step of the loop executor's module: torch counts the same matmul FLOPs."""
    model = build_model(name, (12,), 4, hidden, seed=0)
    x, y = torch.randn(6, 12), torch.randint(0, 4, (6,))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(x), y).backward()
    dims = [12, *(hidden or ()), 4]
    assert counter.get_total_flops() == chain_flops(dims, clients=1, batch=6, steps=1)


def test_ceiling_golden():
    # a loop of 0.1 s against 2e9 FLOPs at 1e11 FLOP/s (0.02 s at best): no stacked round beats 5x
    assert ceiling(0.1, 2_000_000_000, 1e11) == pytest.approx(5.0)
    # twice the loop time or twice the rate doubles it; twice the FLOPs halves it
    assert ceiling(0.2, 2_000_000_000, 1e11) == pytest.approx(10.0)
    assert ceiling(0.1, 2_000_000_000, 2e11) == pytest.approx(10.0)
    assert ceiling(0.1, 4_000_000_000, 1e11) == pytest.approx(2.5)


def test_bench_rejects_unknown_case(capsys):
    with pytest.raises(SystemExit):
        main(["--only", "d"])
    assert "allowed: a, b, c, f" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--repeats", "0"], "--repeats=0: at least 1"),  # not a StatisticsError traceback
        (["--threads", "0"], "--threads=0: at least 1"),  # not a run on torch's default
        (["--e2e", "--repeats", "-1"], "--repeats=-1: at least 1"),
        (["--table", "nope"], "--table ['nope']: not an experiment"),
        (["--table", "fedmcsa_sigma", "--seconds", "0"], "--seconds > 0 and --jobs >= 1"),
        (["--table", "fedmcsa_sigma", "--jobs", "0"], "--seconds > 0 and --jobs >= 1"),
        pytest.param(
            ["--device", "cuda"],
            "--device cuda: no CUDA device here",  # not torch's "Found no NVIDIA driver" traceback
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here"),
        ),
    ],
)
def test_bench_refuses_bad_numbers_and_an_absent_device_in_one_line(argv, says, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and says in capsys.readouterr().err


def test_bench_refuses_a_bad_malloc_setting_in_one_line(monkeypatch, capsys):
    """``keep_freed_memory`` reads ``FEDLIB_MALLOC`` once a process, so a bad value is refused up front: a second call
    would ignore it."""
    monkeypatch.setenv("FEDLIB_MALLOC", "bogus")
    with pytest.raises(SystemExit) as stop:
        main(["--only", "a"])
    assert stop.value.code == 2 and "FEDLIB_MALLOC='bogus' is not one of: reuse, default" in capsys.readouterr().err


def test_fedmix_case_times_the_three_paths():
    from benchmarks.bench import bench_fedmix

    r = bench_fedmix(repeats=1, clients=2, steps=2)
    assert {"loop", "vmap", "chain"} <= set(r) and all(r[k] > 0 for k in ("loop", "vmap", "chain"))


# -- end to end: the printed structure, not the timings -----------------------------------------------------------
def _printed_ratio(ratio: float, num: float, den: float) -> bool:
    """Whether ``ratio``, printed with one decimal, can be ``num / den`` for the values ``num`` and ``den`` printed
    with four: an interval from the printing's rounding, not a tolerance. A relative tolerance would fail on the tiny
    workloads' millisecond rounds (a floor 0.0013 s over a limit 0.0011 s may print as ratio 1.3, which
    0.00134 / 0.00106 gives; 5e-5 s of rounding is 4% of such a number, and the ratio's own 0.05 adds to it)."""
    h = 5e-5
    low, high = (num - h) / (den + h), (num + h) / max(den - h, 1e-12)
    return low - 0.05 - 1e-9 <= ratio <= high + 0.05 + 1e-9


def test_e2e_prints_every_workload_with_its_breakdown(capsys):
    from benchmarks.bench import STAGES

    assert _printed_ratio(1.3, 0.0013, 0.0011) and not _printed_ratio(2.6, 0.0013, 0.0011)  # a tiny case; twice it
    assert _printed_ratio(2.0, 0.4066, 0.1987) and not _printed_ratio(2.2, 0.4066, 0.1987)  # a W1 row

    main(["--e2e", "--tiny", "--rounds", "2", "--only", "W3,W4,W6", "--repeats", "2"])
    out = capsys.readouterr().out.splitlines()
    assert any("GFLOP/s" in line and "limit s" in line for line in out)
    assert "median of 2 timings" in out[0]
    header = next(line for line in out if "workload" in line and "s/round" in line)
    for col in ("s/round", "GFLOP", "limit s", "ratio", *(s[:6] for s in STAGES)):
        assert col in header
    rows = {line.split()[0]: line for line in out if line.split() and line.split()[0] in ("W3", "W4", "W6")}
    assert set(rows) == {"W3", "W4", "W6"}
    for name, line in rows.items():
        # each workload timed twice: the line is the lower of the two (of an even count, the lower middle one),
        # the range of both after it
        line, spread = line.split("  median of 2: ")
        rows[name] = line
        lo, hi = (float(v) for v in spread.split("-"))
        nums = [float(v) for v in line.split()[-(4 + len(STAGES)) :]]  # s/round GFLOP limit ratio ... stages
        assert lo <= hi and nums[0] == pytest.approx(lo, abs=5e-5)
        sec, gflop, limit, ratio, shares = nums[0], nums[1], nums[2], nums[3], nums[4:]
        assert sec > 0 and gflop > 0 and limit > 0 and _printed_ratio(ratio, sec, limit)
        assert sum(shares) == pytest.approx(100, abs=0.5)  # the stages cover the round
        assert shares[STAGES.index("training")] > 0 and shares[STAGES.index("evaluation")] > 0
    # W6's grid side by side: whole runs one by one and batched as one model, each against the limit, and the ratio
    whole = {line.split()[0]: line for line in out if line.startswith(("W6w", "W6b", "W6x"))}
    assert set(whole) == {"W6w", "W6b", "W6x"} and "batched" in whole["W6b"] and "one by one" in whole["W6w"]
    for tag in ("W6w", "W6b"):
        sec, gflop, limit, ratio = (float(v) for v in whole[tag].split()[-4:])
        assert sec > 0 and gflop == pytest.approx(float(rows["W6"].split()[-(3 + len(STAGES))]), rel=0.01)
        assert _printed_ratio(ratio, sec, limit)
    assert float(whole["W6x"].split()[-1].rstrip("x")) > 0 and "medians of 2" in whole["W6x"]
    lr_grid = next(line for line in out if line.startswith("W6l"))  # the grid over lr, each run its own lr
    assert "over lr" in lr_grid and float(lr_grid.split()[-1].rstrip("x")) > 0
    # each workload's floor (its matmuls alone, replayed) against the same limit, and the round over it
    floors = {line.split()[0]: line for line in out if line.startswith(("W3f", "W4f", "W6f"))}
    assert set(floors) == {"W3f", "W4f", "W6f"}
    for tag, line in floors.items():
        head, tail = line.split("round / floor")
        floor, gflop, limit, ratio = (float(v) for v in head.split()[-4:])
        assert floor > 0 and _printed_ratio(ratio, floor, limit)
        assert gflop == pytest.approx(float(rows[tag[:2]].split()[-(3 + len(STAGES))]), rel=0.01)
        sec = float(rows[tag[:2]].split()[-(4 + len(STAGES))])
        # printed to 2 decimals, from a round and a floor printed to 4: each rounding bounds the difference (the
        # 2-decimal one alone is not enough when a loaded machine's round comes out below its floor: 0.09 printed,
        # 0.0933 recomputed)
        assert float(tail.strip().rstrip("x")) == pytest.approx(
            sec / floor, rel=0.01 + 5e-5 / floor + 5e-5 / sec, abs=0.005
        )
    ceiling_line = next(line for line in out if line.startswith("W6c"))
    assert "ceiling" in ceiling_line and float(ceiling_line.split("x")[-2].split()[-1]) > 0
    # last, the targets of the workloads that ran, each met or missed
    block = out[out.index(next(line for line in out if line.startswith("the targets (set for a 2-core CPU)"))) + 1 :]
    assert [line.split()[0] for line in block] == ["W3t", "W4t", "W6t"]
    assert all(line.rstrip().endswith(("met", "of its floor)", "out of reach)")) for line in block)


def test_e2e_rejects_unknown_workload(capsys):
    with pytest.raises(SystemExit):
        main(["--e2e", "--only", "W9"])
    assert "allowed: W1, W2, W3, W4, W5, W6, W7, W8" in capsys.readouterr().err


def test_stage_clock_books_each_stage_of_each_round():
    """Two rounds of a tiny run: every stage of run_round is booked, setup before round 1 is not."""
    from benchmarks.bench import StageClock
    from fedlib.algorithms import build_algorithm
    from fedlib.config.run import RunConfig
    from fedlib.core.callbacks import Evaluation
    from fedlib.core.simulation import simulate
    from fedlib.core.state import Schedule
    from fedlib.data import load_federated
    from fedlib.executors import make_executor

    cfg = RunConfig.of(n_clients=6, clients_per_round=3, local_steps=2, rounds=2, model="mlr").validate()
    data = load_federated(cfg).to("cpu", torch.float32)
    model = build_model("mlr", data.input_shape, 10, seed=0)
    alg = build_algorithm(cfg)
    clock = StageClock()
    simulate(alg, data, model, make_executor("auto", model), Schedule(local_steps=2), rounds=2,
             callbacks=[Evaluation(), clock])  # fmt: skip
    assert len(clock.rounds) == 2
    for r in clock.rounds:
        assert {"selection", "start", "plan", "training", "aggregation", "evaluation", "other"} <= set(r)
        assert all(v >= 0 for v in r.values())


def test_sample_flops_from_layer_shapes():
    from benchmarks.bench import sample_flops

    dnn = build_model("dnn", (784,), 10, (100,), seed=0)
    # forward 2*(784*100 + 100*10); training: chain_flops of one sample
    assert sample_flops(dnn, (784,)) == (chain_flops([784, 100, 10], 1, 1, 1), 2 * (784 * 100 + 100 * 10))
    lenet = build_model("lenet", (3, 28, 28), 10, seed=0)
    train, forward = sample_flops(lenet, (3, 28, 28))
    assert forward > 0 and 2 * forward < train < 3 * forward  # backward: weight grads + input grads but the first's


def test_e2e_skips_workloads_whose_data_is_absent(capsys, tmp_path, monkeypatch):
    """With an empty data root, W1/W2 (MNIST) and W5 (the digits) print a skip line; W5 must not raise
    ``RunConfig.domains=() must be ...`` from its config, stopping the benchmark."""
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path))
    main(["--e2e", "--tiny", "--rounds", "2", "--only", "W1,W5"])
    out = capsys.readouterr().out
    assert "W1" in out and "W5" in out
    skips = [line for line in out.splitlines() if "skipped: data absent" in line]
    assert [line.split()[0] for line in skips] == ["W1", "W5"]
    assert "(mnist)" in skips[0] and "digits" in skips[1]


# -- the floor: a round's matmuls logged at their shapes and replayed alone ---------------------------------------
def test_arithmetic_log_sees_each_steps_matmuls():
    """A stacked step of a 2-layer chain (no momentum, no proximal term) is, by hand: two forward baddbmm (bias +
    x W^T, then the logits by class, bias + W h^T), one bmm for the hidden layer's input gradient, two weight
    updates fused into baddbmm_; all of them local training's, at the group's shapes."""
    from helpers import small_synthetic

    from benchmarks.bench import ArithmeticLog, _CountingExecutor
    from fedlib.data.federated import sample_steps
    from fedlib.executors import LocalSGD, StackedExecutor

    data = small_synthetic(n_clients=3, dtype=torch.float32)
    model = build_model("dnn", (60,), 10, (8,), seed=0)
    params = {n: t.unsqueeze(0).repeat(3, *[1] * t.dim()) for n, t in model.state_dict().items()}
    plan = sample_steps(data.train, torch.arange(3), 4, 5, torch.Generator().manual_seed(0))
    log = ArithmeticLog()
    with log:
        _CountingExecutor(StackedExecutor(kernel="chain"), log).train(model, params, plan, data.train, LocalSGD(0.1))
    ops = collections.Counter()
    for (func, args, _), n in log.calls.items():
        ops[func.overloadpacket.__name__] += n
    assert ops == {"baddbmm": 2 * 4, "bmm": 4, "baddbmm_": 2 * 4}
    assert log.train == log.calls and not log.in_train
    shapes = {args[1][1] for (func, args, _) in log.calls if func.overloadpacket.__name__ == "baddbmm"}
    assert shapes == {(3, 5, 60), (3, 10, 8)}  # x (clients, batch, 60), the last layer's W (clients, classes, 8)


def test_merged_puts_equal_calls_of_the_runs_side_by_side():
    """3 runs' equal bmm calls, 7 in all: two merged calls with the client axis 3x (12 clients), one left alone;
    ops other than (b)bmm stay as they are."""
    from benchmarks.bench import merged

    t = lambda shape, stride: ("tensor", shape, stride, torch.float32, "cpu")
    bmm = (torch.ops.aten.bmm.default, (t((4, 3, 5), (15, 5, 1)), t((4, 5, 2), (10, 1, 5))), ())
    mm = (torch.ops.aten.mm.default, (t((3, 5), (5, 1)), t((5, 2), (2, 1))), ())
    out = merged(collections.Counter({bmm: 7, mm: 2}), 3)
    big = (bmm[0], (t((12, 3, 5), (15, 5, 1)), t((12, 5, 2), (10, 1, 5))), ())
    assert out == {big: 2, bmm: 1, mm: 2}


def test_replay_runs_each_call_at_its_shapes_and_strides(monkeypatch):
    """The replayed operands have the logged shapes and strides (a transposed view, an expanded batch); a call's
    time is its fastest trial's mean over min(calls, 5) repeats, times its calls. Golden numbers on a clock that
    reads 0, 1, 2, ... (every trial lasts 1 s): a call logged once, 1 s; logged 10 times, 10 x 1/5 = 2 s; and with
    trials of 1 s, 0.5 s and 1 s, the fastest counts: 0.5 s."""
    import types

    import benchmarks.bench as bench

    t = lambda shape, stride: ("tensor", shape, stride, torch.float32, "cpu")
    a, b = bench._materialise((t((4, 3, 5), (0, 5, 1)), t((4, 5, 2), (10, 1, 5))), torch.Generator().manual_seed(0))
    assert (a.shape, a.stride(), b.shape, b.stride()) == ((4, 3, 5), (0, 5, 1), (4, 5, 2), (10, 1, 5))
    key = (torch.ops.aten.bmm.default, (t((4, 3, 5), (0, 5, 1)), t((4, 5, 2), (10, 1, 5))), ())
    ticks = iter(range(1000))
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    assert bench.replay(collections.Counter({key: 1}), "cpu") == 1.0
    assert bench.replay(collections.Counter({key: 10}), "cpu") == 2.0
    readings = iter([0.0, 1.0, 5.0, 5.5, 9.0, 10.0])  # trials of 1 s, 0.5 s, 1 s
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: next(readings)))
    assert bench.replay(collections.Counter({key: 1}), "cpu") == 0.5


def test_rounds_done_counts_stored_runs_whole_and_stopped_ones_from_their_snapshot(tmp_path):
    from benchmarks.bench import rounds_done
    from fedlib import RunConfig, Store, run

    tiny = RunConfig(n_clients=4, clients_per_round=2, rounds=4, local_steps=2, model="mlr")
    stored, stopped, queued = tiny, tiny.replace(seed=1, rounds=9), tiny.replace(seed=2)
    store = Store(tmp_path)
    run(stored, store, progress=False)
    info = store.checkpoint(stopped).info_path
    info.parent.mkdir(parents=True, exist_ok=True)
    info.write_text('{"round": 7, "rounds": 9, "elapsed": 1.0}')
    assert rounds_done(store, [stored, stopped, queued]) == {stored.key(): 4, stopped.key(): 7, queued.key(): 0}


def test_table_window_of_a_whole_grid(tmp_path, capsys):
    """``--table``: the CLI trains the experiment's grid from an empty store (FEDLIB_RESULTS untouched) and the
    rounds are counted; a window longer than the grid counts every round, and the estimate is the time it took."""
    from benchmarks.bench import bench_table

    log = tmp_path / "log"
    r = bench_table("fedmcsa_sigma", 600, 2, "smoke", log=str(log))
    assert r["runs"] == 8 and r["rounds"] == sum(r["rounds_of"].values()) == 24
    assert r["rounds_done"] == 24 and r["stored"] == 8 and r["exit"] == 0
    assert r["estimate_s"] == pytest.approx(r["seconds"]) and r["slowest_run_s"] <= r["seconds"]
    assert "fedmcsa_sigma (smoke): 8 runs, 24 rounds; " in capsys.readouterr().out
    assert (tmp_path / "log.json").exists() and "runs stored" in log.read_text()


def test_e2e_targets_say_met_missed_and_whether_the_floor_allows_it():
    """The targets from hand-made results: W1 met (ratio 1.9); W2 missed with a floor within reach (ratio
    3.0, floor 0.15 s over a 0.1 s limit: 1.5, so the round must come within 2 / 1.5 = 1.33x of it); W3 missed, its
    floor of 21 ms out of reach; W4 at exactly 20 ms missed (the target is < 20 ms); W5 met at 1.311 / 3 s; W6
    missed, its ceiling 4.5x below the 5x."""
    from benchmarks.bench import W5_BEFORE_S, e2e_targets

    results = {
        "W1": {"seconds": 0.19, "limit": 0.1, "ratio": 1.9, "floor": 0.12},
        "W2": {"seconds": 0.3, "limit": 0.1, "ratio": 3.0, "floor": 0.15},
        "W3": {"seconds": 0.025, "limit": 0.002, "ratio": 12.5, "floor": 0.021},
        "W4": {"seconds": 0.020, "limit": 0.003, "ratio": 6.7, "floor": 0.01},
        "W5": {"seconds": W5_BEFORE_S / 3, "limit": 0.1, "ratio": 4.4, "floor": 0.5},
        "W6x": 1.3,
        "W6c": {"floor": 0.03, "ceiling": 4.5},
    }
    got = {name: (target, measured, said) for name, target, measured, said in e2e_targets(results)}
    assert got == {
        "W1": ("ratio <= 2", "1.9", "met"),
        "W2": ("ratio <= 2", "3.0", "missed (floor 1.5: needs the round within 1.33x of its floor)"),
        "W3": ("< 20 ms a round", "25.0 ms", "missed (floor 21.0 ms: out of reach)"),
        "W4": ("< 20 ms a round", "20.0 ms", "missed (floor 10.0 ms: needs the round within 2.00x of its floor)"),
        "W5": ("3x faster than 1.311 s: <= 0.437 s", "0.437 s", "met"),
        "W6": ("batched >= 5x one by one", "1.30x", "missed (ceiling 4.50x: out of reach)"),
    }
    del results["W6c"], results["W1"]["floor"]  # a workload without its floor (or W6 without its grid) has no row
    assert [row[0] for row in e2e_targets(results)] == ["W2", "W3", "W4", "W5"]
    # timed more than once: judged on the median, the range of the timings beside it (W3 and W4 straddling 20 ms)
    results["W2"]["range"] = (0.25, 0.42)
    results["W3"].update(seconds=0.019, range=(0.0157, 0.0243))
    results["W4"].update(seconds=0.021, range=(0.0185, 0.0302))
    results["W5"]["range"] = (0.41, 0.52)
    got = {name: (measured, said) for name, _, measured, said in e2e_targets(results)}
    assert got == {
        "W2": ("3.0 (2.5-4.2)", "missed (floor 1.5: needs the round within 1.33x of its floor)"),
        "W3": ("19.0 ms (15.7-24.3)", "met"),
        "W4": ("21.0 ms (18.5-30.2)", "missed (floor 10.0 ms: needs the round within 2.00x of its floor)"),
        "W5": ("0.437 s (0.410-0.520)", "met"),
    }


def test_e2e_judges_the_ratios_at_the_highest_matmul_rate_measured(monkeypatch, capsys):
    """The matmul rate is measured at the start and again before each workload; every workload's limit and ratio,
    and the targets, are taken at the highest: a first measurement in a slow spell (half the rate) cannot make a
    ratio look twice as good. W3's line is printed at the rate measured before it, its result at the best, measured
    later (before W4)."""
    import benchmarks.bench as bench

    rates = iter([100e9, 150e9, 200e9])  # the start, before W3, before W4
    monkeypatch.setattr(bench, "sgemm_rate", lambda device="cpu", n=2000, repeats=7: next(rates))
    results = bench.bench_e2e("cpu", bench.sgemm_rate(), only=["W3", "W4"], rounds=2, tiny=True)
    assert results["rates"] == [100e9, 150e9, 200e9]
    for name in ("W3", "W4"):
        r = results[name]
        assert r["limit"] == pytest.approx(r["flops"] / 200e9) and r["ratio"] == pytest.approx(
            r["seconds"] / r["limit"]
        )
    bench.at_rate(results, 100e9)  # at the start's rate the ratio would have been half
    assert results["W3"]["ratio"] == pytest.approx(results["W3"]["seconds"] * 100e9 / results["W3"]["flops"])
    rates = iter([100e9, 150e9, 200e9])
    main(["--e2e", "--tiny", "--rounds", "2", "--only", "W3,W4", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "measured 3 times through the run: 100-200 GFLOP/s; the targets below take the highest" in out
