"""Benchmark: local-update wall time per round, stacked executor vs per-client loop, side by side.

    python -m benchmarks [--repeats 5] [--device cpu|cuda] [--threads N] [--only a,b,c]
    python -m benchmarks --e2e [--only W1,W3] [--rounds R] [--repeats 3]
    python -m benchmarks --table adafl_table1 [--table fedmcsa_table2] [--seconds 120] [--jobs 8] [--log F]

Each case trains every client of one round (R local steps on the same ``BatchPlan``) with
both executors in this one process, alternating which goes first, and prints the median
seconds per round, the median of the per-round ratios and their range. Cases (the targets
set for the stacked executor on a 2-core CPU in brackets):
  (a) Synthetic(0.5, 0.5), N=100, DNN 60-20-10, R=20 steps of batch 20      [ratio >= 30]
  (b) MNIST-shaped, N=20, DNN 784-100-10, R=20, batch 20 (pFedMe sizes)    [ratio >= 8]
  (c) N=100, MLP 784-200-200-10, R=20, batch 10 (AdaFL's model, 600 rows) [ratio >= 4]
The loop executor is the reference the stacked one is tested against (float64, 1e-10).
  (f) FedMix's client objective (AdaFL Tables 3-4) on case (c)'s MLP, N=10, R=20, batch 10, momentum 0.5:
      the loop executor, the stacked executor's generic vmap/second-order path (any buffer-free model) and
      its hand-written chain fast path (Linear/ReLU chains), side by side, all clients in one group.

End to end (``--e2e [--only W1,..] [--rounds R] [--tiny]``): whole rounds (selection, start models, plan,
local training, aggregation, evaluation) of W1 FedAvg on MNIST Dir(0.1), W2 AdaFL's MNIST setting, W3 FedMCSA on
Synthetic with the DNN, W4 pFedMe on Synthetic MLR, W5 FedBN+SE on the digits (LeNet-BN; also "W5s": the stacked
executor with per-client BatchNorm buffers, opt-in), W6 a 12-run FedMCSA grid one by one and W7 FedPer (a
split model: heads kept on the clients) in FedMCSA's MNIST setting and W8 FedALA (adaptive local aggregation) in its
Synthetic one, each as
``fedlib.runs.train.train`` runs it with the round loop's stage clock on (``StageClock``). Per workload: seconds
per round (round 1 dropped), the round's FLOPs from the model's layer shapes (``sample_flops``) times the rows
trained and evaluated, the time those take at the large-matmul rate, the ratio (1.0 = at the limit), and the share
of each stage. Each workload is timed ``--repeats`` times (3 by default), one timing after another; its line is the
median timing's, followed by the range of them all ("median of 3: lo-hi"), since this machine's speed moves from
one run to the next by more than some targets' margins.

Each workload's line is followed by its floor (``W1f`` ...): the matmuls and convolutions of two of its rounds,
logged at their shapes and strides (``ArithmeticLog``) and replayed alone, the fastest of three trials each
(``replay``), per round; against the same limit, and the timed round over it ("round / floor"). A target below the
floor cannot be met with these kernels at these shapes, whatever the code around them does. ``W6c``: batching's
ceiling, the grid one by one (W6w) over its floor with the runs' training calls merged as ``fedlib.runs.batching`` merges
them (``merged``): the speed-up batching would give if everything but the arithmetic vanished. ``W6l``: the same
grid over the learning rate instead of sigma (3 seeds x 4 lr), batched vs one by one: its runs train as one call,
each with its own lr (``executors.sgd.RunsSGD``). Last, the CPU targets (``W1t`` ..., ``e2e_targets``): each
one's measured value, met or missed, and, when missed, how close to its floor (W6: the ceiling) the round would have to
come, or that even the floor misses it.

A whole table (``--table EXPERIMENT``, ``bench_table``): the experiment's grid at the paper profile trained by the
CLI from an empty store for ``--seconds``, then killed, and its time estimated from the rounds done
(the GPU target: AdaFL's MNIST Table 1 and FedMCSA's Table 2 each in under 10 minutes on one GPU).
On a GPU, ``FEDLIB_CUDA_GRAPHS=1`` replays the client groups' loops as CUDA graphs (``executors.graphs``) in every
mode; the header says whether it is on.

Both executors run with ``fedlib.runs.malloc.keep_freed_memory`` as training runs do (``FEDLIB_MALLOC=default``
leaves glibc's allocator as it is, to compare).

To tell how far the stacked path is from this machine's floor, each case also prints the stacked
executor's arithmetic rate (the matmul FLOPs of a round, ``chain_flops``, over its median time), the
rate of one large float32 matmul (``sgemm_rate``, measured first; ``--e2e`` again before each workload, taking
the highest), the most this CPU gives, and the
ratio's ceiling: the loop's time over the time the round's FLOPs take at that rate (``ceiling``). No
stacked executor could beat the ceiling on that run without skipping arithmetic, so a target above it
is out of this machine's reach that run, whatever the code.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import math
import statistics
import time

import numpy as np
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from fedlib.config.run import auto_device
from fedlib.core.callbacks import Callback
from fedlib.data.federated import FederatedData, sample_steps
from fedlib.data.synthetic import synthetic
from fedlib.executors import LocalSGD, LoopExecutor, StackedExecutor
from fedlib.executors.graphs import graphs_from_env
from fedlib.models.registry import build_model, linear_chain
from fedlib.runs.malloc import keep_freed_memory
from fedlib.runs.malloc import mode as malloc_mode


def _case_data(case: str) -> tuple[FederatedData, str, tuple, int]:
    rng = np.random.default_rng(0)
    if case == "a":
        xs, ys = synthetic(0.5, 0.5, 100, seed=0)
        tr = [np.arange(int(0.75 * len(y))) for y in ys]
        te = [np.arange(int(0.75 * len(y)), len(y)) for y in ys]
        return FederatedData.from_clients("synthetic", xs, ys, tr, te, 10), "dnn", (20,), 20
    n, d, hidden, batch = (20, 784, (100,), 20) if case == "b" else (100, 784, (200, 200), 10)
    sizes = rng.integers(1165, 3835, n) if case == "b" else np.full(n, 600)
    xs = [rng.standard_normal((s, d), dtype=np.float32) for s in sizes]
    ys = [rng.integers(0, 10, s) for s in sizes]
    tr = [np.arange(int(0.75 * s)) for s in sizes]
    te = [np.arange(int(0.75 * s), s) for s in sizes]
    return (
        FederatedData.from_clients(f"{case}-shaped", xs, ys, tr, te, 10),
        ("dnn" if case == "b" else "mlp"),
        hidden,
        batch,
    )


def chain_flops(dims: list[int], clients: int, batch: int, steps: int) -> int:
    """Multiply-add FLOPs of ``steps`` local SGD steps of ``clients`` Linear chains ``dims[0]-...-dims[-1]``:
    per layer the forward (2 B in out) and the weight gradient (2 B in out), and for every layer but the
    first the gradient to its input (2 B in out). Elementwise work (bias, ReLU, softmax) is left out."""
    per_step = sum(2 * batch * i * o * (2 if j == 0 else 3) for j, (i, o) in enumerate(zip(dims, dims[1:])))
    return per_step * clients * steps


def sgemm_rate(device: str = "cpu", n: int = 2000, repeats: int = 7) -> float:
    """FLOP/s of an n x n x n float32 matmul on ``device``: the fastest of ``repeats`` after a warm-up. The
    fastest, not the median: it stands for the most the machine gives, and a slow spell of a shared machine only
    ever lowers it (a median can fall well below the others in such a spell)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = []
    for r in range(repeats + 1):
        sync()
        t0 = time.perf_counter()
        a @ b
        sync()
        if r:
            times.append(time.perf_counter() - t0)
    return 2 * n**3 / min(times)


def ceiling(loop_s: float, flops: int, rate: float) -> float:
    """The largest stacked-vs-loop ratio a round of ``flops`` matmul FLOPs allows against a loop taking
    ``loop_s`` seconds, if every FLOP ran at ``rate`` FLOP/s (the large-matmul rate: an upper bound, since
    the round's thin batched matmuls run below it)."""
    return loop_s / (flops / rate)


def _alternating(ways: dict, new_round, repeats: int, device: str) -> dict:
    """Seconds of ``ways[name](*args)`` for each name over ``repeats`` rounds, ``args = new_round(r)`` made fresh
    each round (untimed) and shared by all ways. The first round warms up and is dropped; the order alternates
    between rounds, so that no way always meets a cold cache."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    order, times = list(ways), {name: [] for name in ways}
    for r in range(repeats + 1):
        args = new_round(r)
        for name in order[::-1] if r % 2 else order:
            sync()
            t0 = time.perf_counter()
            ways[name](*args)
            sync()
            if r:
                times[name].append(time.perf_counter() - t0)
    return times


def _plan(split, clients: int, steps: int, batch: int, gen, device: str):
    plan = sample_steps(split.layout(), torch.arange(clients), steps, batch, gen)
    plan.index = plan.index.to(device)
    return plan


def bench_case(
    case: str, repeats: int = 5, device: str = "cpu", steps: int = 20, lr: float = 0.02, momentum: float = 0.0
) -> dict:
    data, model_name, hidden, batch = _case_data(case)
    data = data.to(device)
    model = build_model(model_name, data.input_shape, 10, hidden, seed=0).to(device)
    n = data.n_clients
    params = {k: v.unsqueeze(0).repeat(n, *([1] * v.dim())) for k, v in model.state_dict().items()}
    opt = LocalSGD(lr=lr, momentum=momentum)
    gen = torch.Generator().manual_seed(0)
    execs = {"stacked": StackedExecutor(), "loop": LoopExecutor()}
    times = _alternating(
        {name: (lambda plan, ex=ex: ex.train(model, params, plan, data.train, opt)) for name, ex in execs.items()},
        lambda r: (_plan(data.train, n, steps, batch, gen, device),),
        repeats,
        device,
    )
    # The ratio is the median of per-repeat ratios: the two runs of a repeat are seconds apart, so
    # a slow spell of a shared machine (whose loop times vary between runs) hits both alike.
    ratios = [lo / st for lo, st in zip(times["loop"], times["stacked"])]
    dims = [data.input_shape[0], *hidden, 10]
    flops = chain_flops(dims, n, batch, steps)
    return {
        "flops": flops,
        "gflops": flops / statistics.median(times["stacked"]) / 1e9,
        "case": case,
        "model": f"{model_name} {data.input_shape[0]}-{'-'.join(map(str, hidden))}-10",
        "clients": n,
        "batch": batch,
        "steps": steps,
        "loop_s": statistics.median(times["loop"]),
        "stacked_s": statistics.median(times["stacked"]),
        "ratio": statistics.median(ratios),
        "ratio_range": (min(ratios), max(ratios)),
    }


def bench_fedmix(repeats: int = 5, device: str = "cpu", clients: int = 10, steps: int = 20) -> dict:
    """Seconds per round of the three executor paths of FedMix's objective on the same plan and pairs (case f)."""
    from fedlib.algorithms.fedmix import MixClient, mean_dataset, pairing

    data, _, hidden, batch = _case_data("c")
    split = data.to(device).train
    model = build_model("mlp", data.input_shape, 10, hidden, seed=0).to(device)
    params = {k: v.unsqueeze(0).repeat(clients, *([1] * v.dim())) for k, v in model.state_dict().items()}
    client = MixClient(LocalSGD(lr=0.01, momentum=0.5), lam=0.05, mean_size=10)
    mx, my = mean_dataset(split, 10, client.mean_size)
    gen = torch.Generator().manual_seed(0)
    ways = {
        "loop": LoopExecutor(),
        "vmap": StackedExecutor(max_group=clients, kernel="vmap"),
        "chain": StackedExecutor(max_group=clients, kernel="chain"),
    }

    def new_round(r):
        plan = _plan(split, clients, steps, batch, gen, device)
        return plan, client.objective(mx, my, pairing(r, plan, len(my)))

    times = _alternating(
        {
            name: (lambda plan, obj, ex=ex: ex.train(model, params, plan, split, client.opt, objective=obj))
            for name, ex in ways.items()
        },
        new_round,
        repeats,
        device,
    )
    return {k: statistics.median(v) for k, v in times.items()} | {"clients": clients, "steps": steps, "batch": batch}


# -- end to end: whole rounds (``--e2e``) -----------------------------------------------------------------------------
# Each workload runs through ``simulate`` as ``fedlib.runs.train.train`` runs it, with the round loop's stage clock
# on (``StageClock``). Round 1 warms up and is dropped; the rest are averaged. A round's FLOPs are counted
# from the model's layer shapes (``sample_flops``) times the rows trained (read off every plan the executor gets,
# padding not counted) and the rows evaluated; the limit is that many FLOPs at the large-matmul rate.
STAGES = ("selection", "start", "plan", "training", "aggregation", "evaluation", "other")
E2E_ROUNDS = {"W1": 5, "W2": 5, "W3": 21, "W4": 21, "W5": 3, "W6": 6, "W7": 21, "W8": 21}
# workloads whose floor is logged over all their rounds, where two are not like the rest: FedALA's long first weight
# learning falls in each client's second round of training, which the first two rounds of 20 of 100 clients rarely hold
FLOOR_EVERY_ROUND = ("W8",)
W6_LRS = (0.005, 0.01, 0.03, 0.05)  # W6l: W6's grid over lr, each seed's four runs at these
# W5's target is "3x faster than the loop": its baseline, in seconds, is the loop executor's round on the first --e2e
# run (one thread, a 2-core CPU; docs/measurements/)
W5_BEFORE_S = 1.311


def e2e_targets(results: dict) -> list[tuple[str, str, str, str]]:
    """The CPU targets against ``bench_e2e``'s results: (workload, target, measured, verdict) for each
    workload that ran. The verdict is "met", or "missed" with the bound this machine's kernels set, the workload's
    floor (its matmuls and convolutions alone, ``_floor_line``): "out of reach" when even the floor misses the
    target, else how close to its floor the round would have to come (target over floor; 1.05x leaves nothing but
    the arithmetic). W6's bound is batching's ceiling (``W6c``): the batched grid at its floor. A workload timed
    more than once (``results[name]["range"]``) is judged on its median, the range printed beside it."""
    rows = []

    def add(name, target, measured, met, bound, room):
        if met:
            said = "met"
        elif room < 1:
            said = f"missed ({bound}: out of reach)"
        else:
            said = f"missed ({bound}: needs the round within {room:.2f}x of its floor)"
        rows.append((name, target, measured, said))

    def measured(r, scale, digits, unit=""):
        """The median, and the range of the timings when there were several (``bench_e2e``'s ``repeats``)."""
        said = f"{r['seconds'] * scale:.{digits}f}{unit}"
        if "range" in r:
            lo, hi = (v * scale for v in r["range"])
            said += f" ({lo:.{digits}f}-{hi:.{digits}f})"
        return said

    for name in ("W1", "W2"):
        if "floor" in results.get(name, {}):
            r = results[name]
            floor = r["floor"] / r["limit"]
            add(name, "ratio <= 2", measured(r, 1 / r["limit"], 1), r["ratio"] <= 2, f"floor {floor:.1f}", 2 / floor)
    for name in ("W3", "W4"):
        if "floor" in results.get(name, {}):
            r = results[name]
            ms, floor = 1e3 * r["seconds"], 1e3 * r["floor"]
            add(name, "< 20 ms a round", measured(r, 1e3, 1, " ms"), ms < 20, f"floor {floor:.1f} ms", 20 / floor)
    if "floor" in results.get("W5", {}):
        r, goal = results["W5"], W5_BEFORE_S / 3
        target = f"3x faster than {W5_BEFORE_S} s: <= {goal:.3f} s"
        add("W5", target, measured(r, 1, 3, " s"), r["seconds"] <= goal, f"floor {r['floor']:.3f} s", goal / r["floor"])
    if "W6x" in results and "W6c" in results:
        speed, ceiling = results["W6x"], results["W6c"]["ceiling"]
        add("W6", "batched >= 5x one by one", f"{speed:.2f}x", speed >= 5, f"ceiling {ceiling:.2f}x", ceiling / 5)
    return rows


def _w_configs(tiny: bool = False) -> dict[str, tuple[str, list]]:
    """The workloads: name -> (what it is, its configs at their own round counts). ``tiny``: a few small clients,
    for tests (the same code paths)."""
    from fedlib.config.run import RunConfig
    from fedlib.papers import adafl, fedmcsa, pfedla

    r = E2E_ROUNDS
    w1 = RunConfig.of(
        dataset="mnist", partition="dirichlet", dirichlet_alpha=0.1, n_clients=20, clients_per_round=20, model="dnn",
        hidden=(100,), algorithm="fedavg", local_epochs=1, local_steps=None, batch_size=20, lr=0.005, rounds=r["W1"],
    )  # fmt: skip
    w2 = adafl.MNIST_BASE.replace(fraction=0.1, rounds=r["W2"])
    syn = {**fedmcsa.DATA["synthetic"], "clients_per_round": 20}
    w3 = fedmcsa.base(r["W3"]).replace(**syn, model="dnn", hidden=(20,), algorithm="fedmcsa")
    w4 = fedmcsa.base(r["W4"]).replace(**syn, model="mlr", algorithm="pfedme")
    w5 = pfedla.digits_base(pfedla.digits_domains(), r["W5"]).replace(algorithm="fedbn", attention="se")
    w6 = [
        fedmcsa.base(r["W6"]).replace(**syn, model="mlr", algorithm="fedmcsa", sigma=sigma, seed=seed)
        for seed in (0, 1, 2)
        for sigma in (1.0, 10.0, 50.0, 100.0)
    ]
    # a split-model method: FedPer's heads stay on the clients, so every round evaluates N personal models
    w7 = fedmcsa.base(r["W7"]).replace(**fedmcsa.DATA["mnist"], model="dnn", hidden=(100,), algorithm="fedper")
    # FedALA: each client's start mixes the global model in element-wise, with weights it learns on its own data
    w8 = fedmcsa.base(r["W8"]).replace(**syn, model="dnn", hidden=(20,), algorithm="fedala")
    if tiny:
        w1 = w1.replace(n_clients=4, clients_per_round=4)
        w2 = w2.replace(n_clients=10, shard_size=30, local_epochs=1)
        w3, w4 = (w.replace(n_clients=6, clients_per_round=3, local_steps=3) for w in (w3, w4))
        w5 = w5.replace(domain_percent=0.01)
        w6 = [w.replace(n_clients=6, clients_per_round=3, local_steps=3) for w in w6[:2]]
        w7, w8 = (w.replace(n_clients=4, clients_per_round=2, local_steps=3) for w in (w7, w8))
    return {
        "W1": ("FedAvg MNIST Dir(0.1) N=20 all, DNN 784-100-10, E=1 B=20", [w1]),
        "W2": ("AdaFL MNIST shards N=100 C=0.1, MLP 784-200-200-10, E=5 B=10", [w2]),
        "W3": ("FedMCSA Synthetic N=100 S=20, DNN 60-20-10, R=20 B=20, personal eval", [w3]),
        "W4": ("pFedMe Synthetic N=100 S=20, MLR, R=20 K=5 B=20", [w4]),
        "W5": ("FedBN+SE digits (LeNet-BN), E=1 B=32", [w5]),
        "W6": (f"FedMCSA Synthetic MLR grid, {len(w6)} runs one by one", w6),
        "W7": ("FedPer MNIST N=20 S=10, DNN 784-100-10 (head local), R=20 B=20", [w7]),
        "W8": ("FedALA Synthetic N=100 S=20, DNN 60-20-10, R=20 B=20", [w8]),
    }


def sample_flops(model: nn.Module, input_shape: tuple) -> tuple[int, int]:
    """(training, evaluation) matmul/convolution FLOPs of one sample through ``model``: the forward, the weight
    gradients and the gradients to every layer's input but the first (as ``chain_flops``); evaluation is the
    forward alone. Linear chains by ``chain_flops``; other models by torch's shape-based ``FlopCounterMode``
    on a batch of two (BatchNorm needs more than one row), halved."""
    import copy

    from torch.utils.flop_counter import FlopCounterMode

    layers = linear_chain(model)
    if layers is not None:
        ws = [model.get_submodule(n).weight for n in layers]
        dims = [ws[0].shape[1], *(w.shape[0] for w in ws)]
        return chain_flops(dims, 1, 1, 1), sum(2 * i * o for i, o in zip(dims, dims[1:]))
    m = copy.deepcopy(model).cpu().train()
    x = torch.randn(2, *input_shape, dtype=next(m.parameters()).dtype)
    with FlopCounterMode(display=False) as train:
        m(x).sum().backward()
    with torch.no_grad(), FlopCounterMode(display=False) as forward:
        m.eval()(x)
    return train.get_total_flops() // 2, forward.get_total_flops() // 2


# -- the floor: a round's matmuls and convolutions alone, at the shapes the round ran them -------------------------
FLOOR_OPS = ("mm", "addmm", "bmm", "baddbmm", "baddbmm_", "convolution", "convolution_backward")


class ArithmeticLog(TorchDispatchMode):
    """Every call of ``FLOOR_OPS`` made while it is on (in the thread that entered it), as (op, its arguments with
    each tensor replaced by (shape, stride, dtype, device)) -> calls: what ``replay`` times alone. Below autograd,
    so a backward's matmuls are seen; only the outermost call of an op."""

    def __init__(self):
        super().__init__()
        self.calls: collections.Counter = collections.Counter()
        self.train: collections.Counter = collections.Counter()  # those made inside ``executor.train``
        self.in_train = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket.__name__ in FLOOR_OPS:
            key = (func, _signature(args), _signature(tuple(sorted(kwargs.items()))))
            self.calls[key] += 1
            self.train[key] += self.in_train
        return func(*args, **kwargs)

    @contextlib.contextmanager
    def training(self):
        """The calls made inside it count as local training's (``train``)."""
        self.in_train = True
        try:
            yield
        finally:
            self.in_train = False


def merged(calls: collections.Counter, runs: int) -> collections.Counter:
    """The training calls of a grid of ``runs`` runs (``calls``: theirs summed) as ``fedlib.runs.batching`` merges them:
    ``runs`` equal calls (same op, shapes, strides) become one with a (b)bmm's batch dimension, the client axis,
    ``runs`` times larger (its strides stay valid: the batch dimension is the outermost or expanded); the calls
    left over, and other ops, as they are."""
    out: collections.Counter = collections.Counter()
    for (func, args, kwargs), n in calls.items():
        if func.overloadpacket.__name__ in ("bmm", "baddbmm", "baddbmm_") and n >= runs:
            grow = lambda a: (a[0], (a[1][0] * runs, *a[1][1:]), *a[2:]) if len(a) == 5 and a[0] == "tensor" else a
            out[(func, tuple(grow(a) for a in args), kwargs)] += n // runs
            n %= runs
        if n:
            out[(func, args, kwargs)] += n
    return out


def _signature(v):
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), tuple(v.stride()), v.dtype, v.device.type)
    if isinstance(v, (list, tuple)):
        return tuple(_signature(u) for u in v)
    return v


def _materialise(v, gen: torch.Generator):
    """A tensor of a signature's shape and strides (over storage of the size those need, so expanded and transposed
    operands are what the round passed), random normal values; other values as recorded."""
    if isinstance(v, tuple) and len(v) == 5 and v[0] == "tensor":
        _, shape, stride, dtype, device = v
        size = 1 + sum((n - 1) * st for n, st in zip(shape, stride)) if all(shape) else 0
        flat = torch.randn(size, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
        return flat.as_strided(shape, stride)
    if isinstance(v, tuple):
        return tuple(_materialise(u, gen) for u in v)
    return v


def replay(calls: collections.Counter, device: str, repeats: int = 5, trials: int = 3) -> float:
    """Seconds the logged calls take alone: each distinct (op, shapes, strides) run once to warm up, then
    ``trials`` times ``min(calls, repeats)`` calls; the fastest trial's mean time per call, times its calls. Its
    operands stay in the caches between calls, where in the round they arrive from the op before: a floor, below
    what the round could reach (the fastest trial: the floor under a busy machine's noise)."""
    gen = torch.Generator().manual_seed(0)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    total = 0.0
    for (func, args, kwargs), n in calls.items():
        a, kw = _materialise(args, gen), dict(_materialise(kwargs, gen))
        func(*a, **kw)
        reps, best = min(n, repeats), math.inf
        for _ in range(trials):
            sync()
            t0 = time.perf_counter()
            for _ in range(reps):
                func(*a, **kw)
            sync()
            best = min(best, (time.perf_counter() - t0) / reps)
        total += best * n
    return total


class _CountingExecutor:
    """The run's executor, counting the rows it trains (a plan's real rows: padding is not work a round needs), and
    telling ``log`` which of its calls are local training's."""

    def __init__(self, executor, log: ArithmeticLog | None = None):
        self.executor, self.rows, self.log = executor, [], log

    def train(self, model, params, plan, *args, **kwargs):
        self.rows.append(plan.index.numel() if plan.weight is None else plan.weight.sum())
        with self.log.training() if self.log is not None else contextlib.nullcontext():
            return self.executor.train(model, params, plan, *args, **kwargs)

    def evaluate(self, *args):
        return self.executor.evaluate(*args)

    def __getattr__(self, name):
        return getattr(self.executor, name)


def _eval_rows(alg, data, cfg, model) -> int:
    """Rows one evaluation passes through the model (as ``fedlib.core.callbacks._evaluate_round`` evaluates)."""
    per_client = alg.evaluate == "personal" or not all(alg.shared(n) for n in model.state_dict())
    rows = int(data.test.sizes.sum()) * (2 if alg.report_global else 1)
    if cfg.eval_train:
        rows += int(data.train.sizes.sum())
    if data.global_test is not None and alg.evaluate == "global" and not per_client:
        rows += len(data.global_test[1])
    return rows


class StageClock(Callback):
    """Seconds per stage of each round, as a callback of ``simulate``: each stage's end (``Run.lap``) adds the time
    since the previous lap to that stage of the current round; the start of a round ("round") books the time since
    the last lap (callbacks after evaluation, the loop itself) as the previous round's "other" and opens a round,
    and the run's end books the last round's tail. Time before the first round (setup) is not booked. ``sync``
    (e.g. ``torch.cuda.synchronize``) runs before each lap, so that asynchronous device work is booked to the stage
    that queued it."""

    def __init__(self, sync=None):
        self.rounds: list[dict[str, float]] = []
        self.sync = sync
        self.t: float | None = None

    def on_stage(self, stage: str) -> None:
        if stage == "round":
            self._lap("other")
            self.rounds.append({})
        else:
            self._lap(stage)

    def on_end(self, run) -> None:
        self._lap("other")

    def _lap(self, stage: str) -> None:
        if self.sync is not None:
            self.sync()
        now = time.perf_counter()
        if self.t is not None and self.rounds:
            r = self.rounds[-1]
            r[stage] = r.get(stage, 0.0) + now - self.t
        self.t = now


def time_run(cfg, device: str, executor=None, log: ArithmeticLog | None = None) -> dict:
    """One run of ``cfg`` as ``fedlib.runs.train.train`` trains it, with the stage clock on: seconds per stage per round
    (round 1 dropped), FLOPs per round, the executor's name. ``log``: the run's matmuls and convolutions logged
    (its timing is then not the run's)."""
    from fedlib.algorithms import build_algorithm
    from fedlib.core.callbacks import Evaluation
    from fedlib.core.simulation import simulate
    from fedlib.core.state import Schedule
    from fedlib.data import load_federated
    from fedlib.executors import make_executor

    cfg = cfg.replace(device=device).validate()
    dtype = getattr(torch, cfg.dtype)
    data = load_federated(cfg).to(device, dtype)
    m = cfg.model
    model = build_model(
        m.name, data.input_shape, data.n_classes, m.hidden, seed=cfg.seed, dtype=dtype, attention=m.attention
    ).to(device)
    alg = build_algorithm(cfg, n_samples=data.train.sizes.cpu().numpy())
    ex = _CountingExecutor(make_executor(cfg.executor, model) if executor is None else executor, log)
    sync = torch.cuda.synchronize if device == "cuda" else None
    clock = StageClock(sync)
    schedule = Schedule(cfg.local_steps, cfg.local_epochs, cfg.batch_size, cfg.lr_decay)
    with log or contextlib.nullcontext():
        simulate(alg, data, model, ex, schedule, rounds=cfg.rounds, seed=cfg.seed,
                 callbacks=[Evaluation(cfg.eval_every, cfg.eval_train), clock])  # fmt: skip
    rounds = clock.rounds[1:] or clock.rounds
    train_f, eval_f = sample_flops(model, data.input_shape)
    n_evals = len(range(cfg.eval_every, cfg.rounds + 1, cfg.eval_every)) + (cfg.rounds % cfg.eval_every != 0)
    rows = float(sum(float(r) for r in ex.rows))
    flops = (rows * train_f + n_evals * _eval_rows(alg, data, cfg, model) * eval_f) / cfg.rounds
    stages = {s: statistics.mean(r.get(s, 0.0) for r in rounds) for s in STAGES}
    return {"seconds": sum(stages.values()), "stages": stages, "flops": flops, "executor": ex.executor.name}


def bench_e2e(
    device: str, rate: float, only=None, rounds: int | None = None, tiny: bool = False, out=None, repeats: int = 1
) -> dict:
    """Time every workload (``only``: some of W1..W8) and print a line each: seconds per round, the round's GFLOPs,
    the seconds those take at ``rate`` FLOP/s, the ratio (1.0 = at the limit) and the stages' shares. ``repeats``:
    each workload's runs timed that many times, one after another; its line is the median timing's, with the range
    of all of them (``_e2e_line``); W6's grids alternate max(2, repeats) times each way.

    The matmul rate is measured again before each workload (``results["rates"]``, ``rate`` first), each line taking
    the highest so far, and at the end every workload's limit and ratio are those at the highest of all
    (``at_rate``), which the targets are judged on: one measurement at the start, taken in a slow spell of a
    shared machine, would lower every limit and could make a missed target read "met"."""
    from fedlib.data import readers
    from fedlib.data.domains import DOMAINS

    out = out or functools.partial(print, flush=True)
    work = _w_configs(tiny)
    out(
        f"{'':4}{'workload':70} {'executor':8} {'s/round':>8} {'GFLOP':>7} {'limit s':>8} {'ratio':>6}  "
        + " ".join(f"{s[:6]:>6}" for s in STAGES)
        + "  (stage columns: % of the round)"
    )
    results, rates = {}, [rate]
    for name, (what, cfgs) in work.items():
        if only and name not in only:
            continue
        if rounds is not None:
            cfgs = [c.replace(rounds=max(2, rounds)) for c in cfgs]
        need = {c.dataset for c in cfgs} - {"synthetic", "digits"}
        absent = readers.missing(sorted(need))
        if any(c.dataset == "digits" and not c.domains for c in cfgs):  # no digits domain under the data root
            absent.append("digits: none of " + ", ".join(DOMAINS["digits"]))
        if absent:
            out(f"{name:4}{what:70} skipped: data absent ({', '.join(absent)})")
            continue
        rates.append(sgemm_rate(device, repeats=3))
        rate = max(rates)
        # W5 also on the stacked executor (kernel='vmap': per-client BatchNorm buffers; opt-in, auto keeps the loop)
        for tag, executor in [("", None)] + ([("s", StackedExecutor(kernel="vmap"))] if name == "W5" else []):
            reps = [[time_run(c, device, executor) for c in cfgs] for _ in range(repeats)]
            _e2e_line(name + tag, what, reps, rate, out, results)
        _floor_line(name, cfgs, device, out, results)
        if name == "W6":
            _grid_lines(cfgs, device, rate, out, results, max(2, repeats))
    at_rate(results, max(rates))
    results["rates"] = rates
    return results


def at_rate(results: dict, rate: float) -> None:
    """Every workload's limit (its FLOPs at ``rate`` FLOP/s) and ratio (its round, and its floor, over that) in
    ``results``, in place."""
    for r in results.values():
        if isinstance(r, dict) and "flops" in r and "seconds" in r:
            r["limit"] = r["flops"] / rate
            r["ratio"] = r["seconds"] / r["limit"]


def time_grid(cfgs, device: str, batched: bool) -> float:
    """Wall seconds of whole runs of ``cfgs`` (every round, evaluation included; data loaded once, outside the
    timing): one after another, or all batched as one model (``fedlib.runs.batching``)."""
    from fedlib.algorithms import build_algorithm
    from fedlib.core.simulation import simulate
    from fedlib.core.state import Schedule
    from fedlib.data import load_federated
    from fedlib.executors import make_executor
    from fedlib.runs.batching import run_together
    from fedlib.runs.train import run_callbacks

    cfgs = [c.replace(device=device).validate() for c in cfgs]
    dtype = getattr(torch, cfgs[0].dtype)
    data = load_federated(cfgs[0]).to(device, dtype)

    def one(cfg, executor=None, stop=None):
        m = cfg.model
        model = build_model(m.name, data.input_shape, data.n_classes, m.hidden, seed=cfg.seed, dtype=dtype,
                            attention=m.attention).to(device)  # fmt: skip
        alg = build_algorithm(cfg, n_samples=data.train.sizes.cpu().numpy())
        schedule = Schedule(cfg.local_steps, cfg.local_epochs, cfg.batch_size, cfg.lr_decay)
        with run_callbacks(cfg.rounds, stop=stop, eval_every=cfg.eval_every, eval_train=cfg.eval_train,
                           progress=False) as callbacks:  # fmt: skip
            simulate(alg, data, model, executor or make_executor(cfg.executor, model), schedule, rounds=cfg.rounds,
                     seed=cfg.seed, callbacks=callbacks)  # fmt: skip

    t0 = time.perf_counter()
    if batched:
        probe = build_model(cfgs[0].model.name, data.input_shape, data.n_classes, cfgs[0].model.hidden, dtype=dtype)
        outcomes, _ = run_together([lambda ex, stop, c=c: one(c, ex, stop) for c in cfgs],
                                   make_executor(cfgs[0].executor, probe.to(device)))  # fmt: skip
        for o in outcomes:
            if isinstance(o, BaseException):
                raise o
    else:
        for c in cfgs:
            one(c)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _floor_line(name: str, cfgs: list, device: str, out, results: dict) -> None:
    """The workload's floor (line ``W1f`` ...): its runs' matmuls and convolutions of two rounds, logged
    (``ArithmeticLog``) and replayed alone (``replay``), per round; against the FLOP limit, and the timed round
    over it. A round cannot go below its floor without other kernels (or skipping arithmetic): a target under the
    floor is out of reach of this machine's kernels at these shapes, whatever the code around them."""
    logs, rounds = [], cfgs[0].rounds if name in FLOOR_EVERY_ROUND else 2
    for c in cfgs:
        logs.append(ArithmeticLog())
        time_run(c.replace(rounds=rounds), device, log=logs[-1])
    r = results[name]
    r["floor"] = floor = sum(replay(log.calls, device) for log in logs) / rounds
    r["logs"] = logs
    what = "  its matmuls and convolutions alone, at the round's shapes (floor)"
    out(
        f"{name + 'f':4}{what:70} {'':8} {floor:>8.4f} {r['flops'] / 1e9:>7.2f} {r['limit']:>8.4f} "
        f"{floor / r['limit']:>6.1f}  round / floor {r['seconds'] / floor:.2f}x"
    )


def _speed_up(cfgs, device: str, times_each: int = 2) -> tuple[float, dict]:
    """The grid ``cfgs`` one by one and batched, alternating, ``times_each`` times each: (the medians' ratio, the
    times)."""
    times = {"one by one": [], "batched": []}
    for _ in range(times_each):
        for how in times:
            times[how].append(time_grid(cfgs, device, how == "batched"))
    return statistics.median(times["one by one"]) / statistics.median(times["batched"]), times


def _grid_lines(cfgs, device: str, rate: float, out, results: dict, times_each: int = 2) -> None:
    """W6 side by side in this process: the grid's whole runs one by one (W6w), then batched as one model (W6b),
    alternating, ``times_each`` times each (the medians are printed), as seconds per round of the whole grid and
    against the FLOP limit;
    W6x: the speed-up; W6c: batching's ceiling; W6l: the same grid over lr (each seed's runs at ``W6_LRS`` instead of
    its sigmas), batched vs one by one."""
    rounds = cfgs[0].rounds
    speed, times = _speed_up(cfgs, device, times_each)
    flops = results["W6"]["flops"]
    for tag, (how, ts) in zip(("W6w", "W6b"), times.items()):
        sec = statistics.median(ts) / rounds
        results[tag] = {"seconds": sec, "flops": flops, "limit": flops / rate, "ratio": sec * rate / flops}
        what = f"  whole runs ({len(cfgs)} x {rounds} rounds, round 1 included), {how}"
        out(f"{tag:4}{what:70} {'':8} {sec:>8.4f} {flops / 1e9:>7.2f} {flops / rate:>8.4f} {sec * rate / flops:>6.1f}")
    results["W6x"] = speed
    what = f"  batched vs one by one (medians of {times_each}, alternating; target >= 5x)"
    out(f"{'W6x':4}{what:70} {'':8} {speed:>7.2f}x")
    # batching's ceiling: the grid's floor with its runs' training calls merged as the gang merges them
    logs = results["W6"]["logs"]
    train = sum((log.train for log in logs), collections.Counter())
    rest = sum((log.calls - log.train for log in logs), collections.Counter())
    floor = (replay(merged(train, len(logs)), device) + replay(rest, device)) / 2
    ceiling = results["W6w"]["seconds"] / floor
    results["W6c"] = {"floor": floor, "ceiling": ceiling}
    what = "  ceiling: one by one over the batched grid's floor (training merged)"
    out(f"{'W6c':4}{what:70} {'':8} {ceiling:>7.2f}x   (batched floor {floor:.4f} s/round)")
    over_lr = [c.replace(sigma=cfgs[0].sigma, lr=lr) for c, lr in zip(cfgs, W6_LRS * len(cfgs))]
    results["W6l"] = speed = _speed_up(over_lr, device, times_each)[0]
    what = "  the grid over lr (3 seeds x 4 lr, each run its own lr): batched vs one by one"
    out(f"{'W6l':4}{what:70} {'':8} {speed:>7.2f}x")


def _e2e_line(name: str, what: str, reps: list, rate: float, out, results: dict) -> None:
    """One printed line from ``reps``, the workload's timings (each a list of its runs' ``time_run`` results, whose
    rounds are summed: W6 is one round of every run of the grid): the median timing's seconds and stage shares (of
    an even count, the lower of the middle two: a timing that ran), then, of more than one, the range of all of
    them. A shared machine's speed moves between runs by more than some targets' margins (docs/performance.md), so
    one timing can meet a target that the next one misses."""
    timings = []
    for runs in reps:
        total = {s: sum(r["stages"][s] for r in runs) for s in STAGES}
        timings.append((sum(total.values()), total))
    timings.sort(key=lambda t: t[0])
    sec, total = timings[(len(timings) - 1) // 2]
    flops = sum(r["flops"] for r in reps[0])  # the rows trained and evaluated are the same every time
    limit = flops / rate
    results[name] = {"seconds": sec, "flops": flops, "limit": limit, "ratio": sec / limit, "stages": total}
    spread = ""
    if len(timings) > 1:
        results[name]["range"] = (timings[0][0], timings[-1][0])
        spread = f"  median of {len(timings)}: {timings[0][0]:.4f}-{timings[-1][0]:.4f}"
    out(
        f"{name:4}{what:70} {reps[0][0]['executor']:8} {sec:>8.4f} {flops / 1e9:>7.2f} {limit:>8.4f} "
        f"{sec / limit:>6.1f}  " + " ".join(f"{100 * total[s] / sec:>6.1f}" for s in STAGES) + spread
    )


def rounds_done(store, cfgs) -> dict:
    """Key -> rounds each config has trained in ``store``: all of them if stored, else its snapshot's, else 0."""
    return {c.key(): c.rounds if store.has(c) else (store.checkpoint(c).info() or {}).get("round", 0) for c in cfgs}


SNAPSHOT_SECONDS = 10  # bench_table: every run snapshots this often, so its rounds can be counted when stopped


def bench_table(name: str, seconds: float, jobs: int, profile: str = "paper", log=None, out=None) -> dict:
    """How long experiment ``name`` (a whole paper table) takes here, from a window of it: its configs at ``profile``
    trained from an empty store by the CLI (``python -m fedlib.experiments NAME --jobs JOBS``, batching as it does)
    for ``seconds``, the rounds done counted at the window's end (stored runs whole, the others from their
    snapshots, taken every ``SNAPSHOT_SECONDS`` here), then the CLI and its workers killed. The table's time is the
    window's at that pace (rounds done over the table's rounds), and no less than its slowest started run takes at
    its own pace. The window includes starting the processes and loading the data, and rounds after the last
    snapshot are not counted (both make the estimate long); the runs not started in the window may be slower or
    faster than those that were. ``log``: where the CLI's output goes (a path; its counts go to LOG.json)."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    from fedlib.experiments.named import configs
    from fedlib.runs.store import Store

    if seconds <= 0 or jobs < 1:
        raise ValueError(f"bench_table: seconds={seconds!r} must be > 0 and jobs={jobs!r} >= 1")

    out = out or functools.partial(print, flush=True)
    cfgs, absent = configs(name, profile)
    total = sum(c.rounds for c in cfgs)
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp, open(log or os.devnull, "w") as sink:
        cmd = [sys.executable, "-m", "fedlib.experiments", name, "--profile", profile, "--jobs", str(jobs)]
        t0 = time.perf_counter()
        env = {**os.environ, "FEDLIB_RESULTS": tmp, "FEDLIB_CHECKPOINT_SECONDS": str(SNAPSHOT_SECONDS)}
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=sink,
                                start_new_session=True)  # fmt: skip
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            pass
        elapsed = time.perf_counter() - t0
        # counted at the window's end, then killed: stopped as Ctrl-C stops it, every unit would add its last round
        done = rounds_done(Store(tmp), cfgs)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    rounds = sum(done.values())
    stored = sum(done[c.key()] == c.rounds for c in cfgs)
    estimate = elapsed * total / rounds if rounds else math.inf
    # a run cannot end sooner than its own pace allows, however many processes the others have
    slowest = max((elapsed * c.rounds / done[c.key()] for c in cfgs if done[c.key()]), default=math.inf)
    r = {"name": name, "runs": len(cfgs), "absent": absent, "rounds": total, "seconds": elapsed, "jobs": jobs,
         "rounds_done": rounds, "stored": stored, "estimate_s": estimate, "slowest_run_s": slowest,
         "exit": proc.returncode, "done": done, "rounds_of": {c.key(): c.rounds for c in cfgs}}  # fmt: skip
    if log:
        with open(f"{log}.json", "w") as f:
            json.dump(r, f, indent=1)
    out(
        f"{name} ({profile}): {len(cfgs)} runs, {total} rounds"
        + (f" ({', '.join(absent)} absent)" if absent else "")
        + f"; {elapsed:.0f} s with --jobs {jobs}: {rounds} rounds ({100 * rounds / total:.1f}%), {stored} runs whole; "
        f"at that pace the table takes {estimate / 60:.1f} min, and no less than {slowest / 60:.1f} min (its slowest "
        "started run at its own pace)"
    )
    return r


TARGETS = {"a": 30, "b": 8, "c": 4}
CASES = (*TARGETS, "f")


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--repeats", type=int, default=None,
        help="rounds per case (default 5); with --e2e, timings of each workload, the median printed (default 3)",
    )  # fmt: skip
    ap.add_argument("--device", default=auto_device(), choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    ap.add_argument(
        "--only", default=None, help="comma-separated cases among a,b,c,f (with --e2e: among W1..W8); default all"
    )
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--e2e", action="store_true", help="whole rounds of workloads W1..W8 instead of local training")
    ap.add_argument("--rounds", type=int, default=None, help="--e2e: rounds of every run (default: E2E_ROUNDS)")
    ap.add_argument("--tiny", action="store_true", help="--e2e: a few small clients per workload (tests)")
    ap.add_argument(
        "--table", action="append", default=None, metavar="EXPERIMENT",
        help="time a window of this experiment's whole grid (bench_table; repeatable) instead of the cases",
    )  # fmt: skip
    ap.add_argument("--seconds", type=float, default=120.0, help="--table: the window's length")
    ap.add_argument("--jobs", type=int, default=8, help="--table: processes (the CLI's --jobs)")
    ap.add_argument("--profile", default="paper", help="--table: the profile of the experiment's grid")
    ap.add_argument("--log", default=None, help="--table: a file for the CLI's output (and its counts, LOG.json)")
    args = ap.parse_args(argv)
    for name in ("repeats", "threads"):  # else --repeats 0: a StatisticsError traceback; --threads 0: the default
        value = getattr(args, name)
        if value is not None and value < 1:
            ap.error(f"--{name}={value}: at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():  # else torch's "Found no NVIDIA driver" traceback
        ap.error("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        malloc_mode()  # a bad FEDLIB_MALLOC (``keep_freed_memory`` reads it once a process)
        graphs = graphs_from_env()  # and a bad FEDLIB_CUDA_GRAPHS
    except ValueError as e:
        ap.error(str(e))
    reuse = keep_freed_memory()  # as in training runs; applies to both executors alike
    if args.repeats is None:
        args.repeats = 3 if args.e2e else 5
    allowed = tuple(E2E_ROUNDS) if args.e2e else CASES
    cases = [c.strip() for c in (args.only or ",".join(allowed)).split(",") if c.strip()]
    bad = [c for c in cases if c not in allowed]
    if bad:
        ap.error(f"--only: unknown case(s) {bad}; allowed: {', '.join(allowed)}")
    if args.rounds is not None and args.rounds < 2:
        ap.error(f"--rounds={args.rounds}: at least 2 (round 1 warms up and is not timed)")
    if args.table:
        from fedlib.experiments.profiles import EXPERIMENTS

        bad = [t for t in args.table if t not in EXPERIMENTS]
        if bad or args.seconds <= 0 or args.jobs < 1:
            ap.error(f"--table {bad}: not an experiment" if bad else "--seconds > 0 and --jobs >= 1")
        for t in args.table:
            bench_table(t, args.seconds, args.jobs, args.profile, args.log and f"{args.log}.{t}")
        return
    print(
        f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}, "
        + (
            f"whole rounds (round 1 dropped, the rest averaged; median of {args.repeats} timings), evaluation every "
            "round, "
            if args.e2e
            else f"momentum {args.momentum}, median of {args.repeats} rounds (ratio: median of paired rounds), "
        )
        + f"glibc malloc: {'freed memory reused' if reuse else 'default'} (fedlib.runs.malloc)"
        + (f", CUDA graphs: {'on' if graphs else 'off'} (FEDLIB_CUDA_GRAPHS)" if args.device == "cuda" else "")
    )
    rate = sgemm_rate(args.device)
    if args.e2e:
        print(
            f"one 2000x2000x2000 float32 matmul on this {args.device}: {rate / 1e9:.0f} GFLOP/s at the start (measured "
            "again as the run goes); limit s: the round's FLOPs at the highest rate so far; ratio: s/round over "
            "limit s (1.0 = at the limit)"
        )
        results = bench_e2e(args.device, rate, cases, args.rounds, args.tiny, repeats=args.repeats)
        targets = e2e_targets(results)
        rates = results["rates"]
        print(
            f"the matmul rate, measured {len(rates)} times through the run: {min(rates) / 1e9:.0f}-"
            f"{max(rates) / 1e9:.0f} GFLOP/s; the targets below take the highest (a slow spell only ever lowers it)"
        )
        if targets:
            print(f"the targets (set for a 2-core CPU){' (not this device)' if args.device != 'cpu' else ''}:")
            for name, target, measured, said in targets:
                print(f"{name + 't':4}{target:44} {measured:>22}  {said}")
        return
    print(
        f"one 2000x2000x2000 float32 matmul on this {args.device}: {rate / 1e9:.0f} GFLOP/s (the most the stacked "
        "rates below could reach; ceiling: the loop's time over the round's FLOPs at this rate)"
    )
    if any(c in TARGETS for c in cases):
        print(
            f"{'case':4} {'model':22} {'N':>4} {'B':>3} {'R':>3} {'loop s/round':>13} {'stacked s/round':>16} "
            f"{'ratio':>7} {'range':>11} {'target':>13} {'stacked GFLOP/s':>16} {'ceiling':>8}"
        )
    for c in [c for c in cases if c in TARGETS]:
        r = bench_case(c, args.repeats, args.device, momentum=args.momentum)
        lo, hi = r["ratio_range"]
        target = f">={TARGETS[c]} " + ("ok" if r["ratio"] >= TARGETS[c] else "MISSED")
        print(
            f"({c})  {r['model']:22} {r['clients']:>4} {r['batch']:>3} {r['steps']:>3} {r['loop_s']:>13.4f} "
            f"{r['stacked_s']:>16.4f} {r['ratio']:>7.1f} {lo:>5.1f}-{hi:<5.1f} {target:>13} {r['gflops']:>16.0f} "
            f"{ceiling(r['loop_s'], r['flops'], rate):>8.1f}",
            flush=True,
        )
    if "f" in cases:
        r = bench_fedmix(args.repeats, args.device)
        print(
            f"(f)  fedmix, mlp 784-200-200-10, N={r['clients']}, B={r['batch']}, R={r['steps']}, momentum 0.5: "
            f"loop {r['loop']:.4f}, vmap {r['vmap']:.4f}, chain {r['chain']:.4f} s/round; chain is "
            f"{r['vmap'] / r['chain']:.1f}x the vmap path, {r['loop'] / r['chain']:.1f}x the loop",
            flush=True,
        )


if __name__ == "__main__":
    main()
