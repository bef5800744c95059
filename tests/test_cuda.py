"""The GPU path computes what the CPU path does (float64). Skipped where torch sees no CUDA device (CI); run on a
GPU machine with ``pytest tests/test_cuda.py``.

Mini-batch plans and client selections are drawn on the CPU from the run's seed whatever the device, so a run on
CUDA and the same run on the CPU see the same batches and the same clients; in float64 the only difference left is
the order of floating-point sums inside the kernels (cuBLAS vs the CPU's BLAS), far below the tolerances here.
"""

import numpy as np
import pytest
import torch
from helpers import small_synthetic

from fedlib.algorithms import ALGORITHMS
from fedlib.config.run import RunConfig
from fedlib.data.federated import FederatedData, sample_epochs
from fedlib.data.synthetic import synthetic
from fedlib.executors import LocalSGD, LoopExecutor, StackedExecutor
from fedlib.models.registry import MODELS, build_model
from fedlib.runs.train import train, train_unit

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("model_name", [n for n in sorted(MODELS) if MODELS[n].kernel == "chain"])
def test_stacked_on_cuda_equals_loop_on_cpu_float64(model_name):
    data = small_synthetic(n_clients=5, rows=90)
    model = build_model(model_name, (60,), 10, hidden=(8, 6), seed=1, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    start = {
        n: t.unsqueeze(0).repeat(5, *[1] * t.dim()) + 0.05 * torch.randn(5, *t.shape, generator=g, dtype=t.dtype)
        for n, t in model.state_dict().items()
    }
    # epoch-based plan: padded batches and clients that stop early, the masked path
    plan = sample_epochs(data.train, torch.arange(5), 2, 16, torch.Generator().manual_seed(3))
    opt = LocalSGD(lr=0.05, momentum=0.9, weight_decay=0.001, mu=1.0)
    loop = LoopExecutor().train(model, start, plan, data.train, opt, anchor=start)
    on = lambda d: {n: t.cuda() for n, t in d.items()}
    plan.index = plan.index.cuda()
    plan.weight, plan.active = plan.weight.cuda(), plan.active.cuda()
    gpu = StackedExecutor().train(model.cuda(), on(start), plan, data.train.to("cuda"), opt, anchor=on(start))
    assert max((loop[n] - start[n]).abs().max().item() for n in loop) > 1e-3  # the models moved
    assert max((gpu[n].cpu() - loop[n]).abs().max().item() for n in loop) < 1e-10


def _cfg(name, **kw):
    extra = {"mu": 0.1} if "mu" in ALGORITHMS[name].option_names() else {}
    if ALGORITHMS[name].SELECTS:  # AdaFL's selection on every method that selects clients
        extra |= {
            "selection": "attention",
            "fraction_schedule": (0.2, 0.6, 2),
            "clients_per_round": None,
            "fraction": None,
        }
    return RunConfig(
        dataset="synthetic",
        n_clients=10,
        rounds=4,
        local_epochs=1,
        local_steps=None,
        batch_size=10,
        model="dnn",
        hidden=(8,),
        lr=0.05,
        algorithm=name,
        dtype="float64",
        **extra,
        **kw,
    )


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_run_on_cuda_equals_cpu_float64(name):
    """Every registered algorithm, end to end (data, selection, local training, aggregation, evaluation)."""
    cfg = _cfg(name)
    cpu = train(cfg.replace(device="cpu"), progress=False)
    gpu = train(cfg.replace(device="cuda"), progress=False)
    assert gpu.meta["device"] == "cuda" and cpu.meta["device"] == "cpu"
    for col in ("test_loss", "test_acc", "uploads"):
        assert np.allclose(gpu.metrics[col], cpu.metrics[col], rtol=0, atol=1e-9), col


def test_a_grid_over_lr_and_mu_batched_on_cuda_equals_its_solo_runs_float64():
    """Runs of other lr and mu train as one call on the GPU, each run's numbers as per-row columns (``RunsSGD``,
    ``per_row``): each run gets its solo CPU numbers (float64)."""
    base = dict(dataset="synthetic", n_clients=10, clients_per_round=4, rounds=4, local_steps=5, batch_size=10)
    cfgs = [
        RunConfig(**base, model="dnn", hidden=(8,), algorithm="fedprox", lr=lr, mu=mu, dtype="float64", device="cuda")
        for lr, mu in ((0.05, 0.1), (0.02, 0.5), (0.05, 0.0))
    ]
    outs = train_unit(cfgs, None, lambda c: None, lambda c, r: None, progress=False)
    for c, o in zip(cfgs, outs):
        assert not isinstance(o, BaseException), o
        assert o.meta["batched"] == len(cfgs) and o.meta["device"] == "cuda"
        cpu = train(c.replace(device="cpu"), progress=False)
        for col in ("test_loss", "test_acc"):
            assert np.allclose(o.metrics[col], cpu.metrics[col], rtol=0, atol=1e-9), col


def _cpu(d):
    return {n: t.cpu() for n, t in d.items()}


# -- CUDA graphs of the client groups' loops (``fedlib.executors.graphs``) --------------------------------------------
GRAPH_CASES = [
    *(
        (n, "float32")
        for n in ("fedavg", "fedprox", "fedmcsa", "heurfedamp", "pfedme", "perfedavg-hf", "scaffold", "ditto")
    ),
    ("fedavg", "float64"),
    ("pfedme", "float64"),
]


@pytest.mark.parametrize("name, dtype", GRAPH_CASES)
def test_a_run_with_cuda_graphs_equals_it_without(name, dtype, monkeypatch):
    """Replays run the kernels the eager loop runs: a whole run's metrics equal its eager run's, and the run did
    replay (recorded on a key's second sighting, replayed after). Most runs come out identical, but cuBLAS may
    pick another algorithm under capture, so float64 can differ in its last bits (measured: docs/measurements/):
    hence the tolerances, far below a last float32 bit of these metrics."""
    from fedlib.executors import graphs

    made = []
    real = graphs.GroupGraphs.__init__

    def spy(self, *a, **kw):
        real(self, *a, **kw)
        made.append(self)

    monkeypatch.setattr(graphs.GroupGraphs, "__init__", spy)
    # AdaFL's selection (``_cfg``): 2, 4, then 6 clients a round, so a group's key repeats from round 3 on
    cfg = _cfg(name).replace(device="cuda", dtype=dtype, rounds=6, local_epochs=None, local_steps=5)
    monkeypatch.setenv("FEDLIB_CUDA_GRAPHS", "0")
    eager = train(cfg, progress=False)
    assert not made
    monkeypatch.setenv("FEDLIB_CUDA_GRAPHS", "1")
    replayed = train(cfg, progress=False)
    assert made and sum(g.hits for g in made) > 0, [(g.hits, g.recorded, g.eager) for g in made]
    # the same kernels, but cuBLAS may pick another algorithm under capture: last bits (float64 FedAvg, H100)
    tol = {"float64": 1e-12, "float32": 1e-6}[dtype]
    for col in ("test_loss", "test_acc", "uploads"):
        got, want = replayed.metrics[col].to_numpy(), eager.metrics[col].to_numpy()
        assert np.allclose(got, want, rtol=0, atol=tol), (col, np.abs(got - want).max())


def test_graphs_follow_the_shrinking_plans_of_unequal_clients():
    """Epoch-based training of unequal clients (``ShrinkingPlan``s, fewer clients at later steps): replayed groups
    equal the eager executor's round after round with other batches, and the loop's (float64). (Its first version
    moved the data to the GPU anew each round, a new address and so a new key each round: it replayed nothing. This
    version has not yet run on a GPU.)"""
    xs, ys = synthetic(n_clients=5, seed=0)
    cut = [90 - 12 * i for i in range(5)]  # unequal clients: in an epoch plan they finish at different steps
    xs, ys = [x[:n] for x, n in zip(xs, cut)], [y[:n] for y, n in zip(ys, cut)]
    parts = [np.arange(n - 10) for n in cut], [np.arange(n - 10, n) for n in cut]
    data = FederatedData.from_clients("unequal", xs, ys, *parts, 10).to("cpu", torch.float64)
    gpu = data.train.to("cuda")  # one tensor for every round: a recording reads the data at its address
    model = build_model("dnn", (60,), 10, hidden=(8,), seed=1, dtype=torch.float64).cuda()
    start = {n: t.unsqueeze(0).repeat(5, *[1] * t.dim()).cuda() for n, t in model.state_dict().items()}
    opt = LocalSGD(lr=0.05, momentum=0.9, mu=0.5)
    graphed, eager = StackedExecutor(graphs=True), StackedExecutor(graphs=False)
    for r in range(4):
        plan = sample_epochs(data.train, torch.arange(5), 2, 16, torch.Generator().manual_seed(r))
        loop = LoopExecutor().train(model.cpu(), _cpu(start), plan, data.train, opt, anchor=_cpu(start))
        plan.index, plan.weight, plan.active = plan.index.cuda(), plan.weight.cuda(), plan.active.cuda()
        a = graphed.train(model.cuda(), start, plan, gpu, opt, anchor=start)
        b = eager.train(model, start, plan, gpu, opt, anchor=start)
        assert max((a[n] - b[n]).abs().max().item() for n in a) < 1e-12, r
        assert max((a[n].cpu() - loop[n]).abs().max().item() for n in a) < 1e-10, r
        start = a
    assert graphed.graphs.hits > 0
