"""The stacked executor computes exactly what the per-client loop does (float64, same mini-batches)."""

import pytest
import torch
from helpers import small_synthetic
from torch import nn

from fedlib.data.federated import FederatedData, sample_epochs, sample_steps
from fedlib.executors import (
    PROCESS_CACHE_BYTES,
    CrossEntropy,
    LocalSGD,
    LoopExecutor,
    Objective,
    StackedExecutor,
    chain_forward,
    fast_path,
    make_executor,
)
from fedlib.executors.sgd import RunsSGD, _segments, restrict
from fedlib.models.registry import MODELS, build_model, linear_chain

OPTS = {
    "sgd": LocalSGD(lr=0.1),
    "momentum+wd": LocalSGD(lr=0.1, momentum=0.5, weight_decay=0.01),
    "prox": LocalSGD(lr=0.1, mu=0.3),
    "all": LocalSGD(lr=0.05, momentum=0.9, weight_decay=0.001, mu=1.0),
}


def _params(model, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        n: t.unsqueeze(0).repeat(k, *[1] * t.dim()) + 0.05 * torch.randn(k, *t.shape, generator=g, dtype=t.dtype)
        for n, t in model.state_dict().items()
    }


def _maxdiff(a, b):
    return max((a[n] - b[n]).abs().max().item() for n in a)


def _plan(split, k: int, sampler: str, steps: tuple, epochs: tuple, seed: int = 3):
    """Clients 0..k-1's plan: ``steps`` = (steps, B) of ``sample_steps``, or ``epochs`` = (epochs, B) of
    ``sample_epochs``."""
    gen, clients = torch.Generator().manual_seed(seed), torch.arange(k)
    if sampler == "steps":
        return sample_steps(split, clients, *steps, gen)
    return sample_epochs(split, clients, *epochs, gen)


@pytest.mark.parametrize("model_name", [n for n in sorted(MODELS) if MODELS[n].kernel == "chain"])  # the Linear chains
@pytest.mark.parametrize("opt_name", sorted(OPTS))
@pytest.mark.parametrize("sampler", ["steps", "epochs"])
@pytest.mark.parametrize("group", [None, 2])
def test_stacked_equals_loop_float64(model_name, opt_name, sampler, group):
    data = small_synthetic(n_clients=5, rows=90)
    model = build_model(model_name, (60,), 10, hidden=(8, 6), seed=1, dtype=torch.float64)
    k = data.n_clients
    start = _params(model, k)
    anchor = _params(model, k, seed=7)  # a different anchor than the start, to test the prox direction
    plan = _plan(data.train, k, sampler, (6, 7), (2, 16))
    opt = OPTS[opt_name]
    loop = LoopExecutor().train(model, start, plan, data.train, opt, anchor=anchor)
    stacked = StackedExecutor(max_group=group).train(model, start, plan, data.train, opt, anchor=anchor)
    assert _maxdiff(loop, start) > 1e-3  # training moved the models, so equality below means something
    assert _maxdiff(stacked, loop) < 1e-10


def test_vmap_path_equals_loop():
    """A buffer-free model that is not a Linear chain goes through vmap(grad(functional_call))."""
    data = small_synthetic(n_clients=4, rows=80)
    model = nn.Sequential(nn.Linear(60, 9), nn.Tanh(), nn.Linear(9, 10)).to(torch.float64)
    assert linear_chain(model) is None and StackedExecutor.supports(model)
    start = _params(model, 4)
    plan = sample_epochs(data.train, torch.arange(4), 1, 16, torch.Generator().manual_seed(0))
    opt = OPTS["all"]
    a = LoopExecutor().train(model, start, plan, data.train, opt, anchor=start)
    b = StackedExecutor().train(model, start, plan, data.train, opt, anchor=start)
    assert _maxdiff(a, start) > 1e-3
    assert _maxdiff(a, b) < 1e-10


def test_inactive_client_does_not_move():
    """Epoch plans pad small clients with inactive steps: no momentum, weight decay or prox step then."""
    data = small_synthetic(n_clients=3, rows=120)
    model = build_model("dnn", (60,), 10, (5,), seed=0, dtype=torch.float64)
    start = _params(model, 3)
    plan = sample_steps(data.train, torch.arange(3), 4, 5, torch.Generator().manual_seed(0))
    plan.active = torch.ones(4, 3, dtype=torch.bool)
    plan.active[:, 1] = False
    plan.weight = torch.ones(plan.index.shape)
    out = StackedExecutor().train(model, start, plan, data.train, OPTS["all"], anchor=_params(model, 3, 5))
    for n in out:
        assert torch.equal(out[n][1], start[n][1])
        assert not torch.equal(out[n][0], start[n][0])


def test_hand_checked_mlr_step():
    """One SGD step of softmax regression on 2 clients, checked against the formula by hand.

    Zero weights give uniform softmax p = 1/C, so dL/db = p - onehot and
    dL/dW = (p - onehot) x^T for a batch of one sample.
    """
    from fedlib.data.federated import BatchPlan, Split

    x = torch.tensor([[1.0, 2.0], [-1.0, 0.5]], dtype=torch.float64)
    y = torch.tensor([0, 2])
    split = Split(x, y, torch.tensor([0, 1]), torch.tensor([1, 1]))
    model = build_model("mlr", (2,), 3, dtype=torch.float64)
    params = {n: torch.zeros(2, *t.shape, dtype=torch.float64) for n, t in model.state_dict().items()}
    plan = BatchPlan(torch.tensor([[[0], [1]]]))
    out = StackedExecutor().train(model, params, plan, split, LocalSGD(lr=0.3))
    third = 1 / 3
    # client 0: label 0, x=(1,2): grad_b = (1/3-1, 1/3, 1/3); W row c = -0.3 * grad_b[c] * x
    assert torch.allclose(out["1.bias"][0], torch.tensor([0.2, -0.1, -0.1], dtype=torch.float64))
    assert torch.allclose(
        out["1.weight"][0], torch.tensor([[0.2, 0.4], [-0.1, -0.2], [-0.1, -0.2]], dtype=torch.float64)
    )
    # client 1: label 2, x=(-1,0.5)
    assert torch.allclose(out["1.bias"][1], -0.3 * torch.tensor([third, third, third - 1], dtype=torch.float64))
    assert torch.allclose(out["1.weight"][1][2], torch.tensor([-0.2, 0.1], dtype=torch.float64))


def test_make_executor_choices():
    model = build_model("mlp", (4,), 3)
    assert make_executor("auto", model).name == "stacked"
    bn = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    assert make_executor("auto", bn).name == "loop"
    with pytest.raises(ValueError, match="executor='stacked' does not cover"):
        make_executor("stacked", bn)
    with pytest.raises(ValueError, match="executor='nope' is not one of: auto, stacked, loop"):
        make_executor("nope", model)


def test_prox_without_anchor_is_an_error():
    data = small_synthetic(n_clients=2, rows=40)
    model = build_model("mlr", (60,), 10, dtype=torch.float64)
    plan = sample_steps(data.train, torch.arange(2), 1, 2, torch.Generator())
    with pytest.raises(ValueError, match="mu=0.5 needs an anchor"):
        StackedExecutor().train(model, _params(model, 2), plan, data.train, LocalSGD(0.1, mu=0.5))


class _WithUnused(nn.Module):
    """An MLR with a parameter the data loss never reaches (only the proximal term moves it)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(60, 10)
        self.spare = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return self.fc(x)


@pytest.mark.parametrize("model_name", ["lenet-se", "dnn", "unused"])
@pytest.mark.parametrize("opt", [LocalSGD(0.1, mu=0.3), LocalSGD(0.05, 0.9, 1e-3, mu=5.0), LocalSGD(0.1, 0.5)])
def test_loop_generic_terms_are_autograds_bit_for_bit(model_name, opt):
    """The loop executor adds mu (w - anchor_i) and drift_i to the data loss's gradient after backward: the same
    float32 parameters, bit for bit, as autograd through mu/2 ||w - anchor_i||^2 + <drift_i, w> added to the loss
    (the autograd formulation), a parameter the data loss does not reach included."""
    shape = (3, 28, 28) if model_name == "lenet-se" else (60,)
    g = torch.Generator().manual_seed(0)
    rows = (30, 21)
    data = FederatedData.from_clients(
        "t", [torch.randn(n, *shape, generator=g).numpy() for n in rows],
        [torch.randint(0, 10, (n,), generator=g).numpy() for n in rows],
        [torch.arange(n).numpy() for n in rows], [torch.arange(n).numpy() for n in rows], 10,
    )  # fmt: skip
    if model_name == "unused":
        torch.manual_seed(0)
        model = _WithUnused()
    elif model_name == "lenet-se":
        model = build_model("lenet", shape, 10, seed=0, attention="se")
    else:
        model = build_model("dnn", shape, 10, (20,), seed=0)
    params = {n: t.unsqueeze(0).repeat(2, *[1] * t.dim()) for n, t in model.state_dict().items()}
    names = [n for n, _ in model.named_parameters()]
    shift = {n: 0.05 * torch.randn(t.shape, generator=g) for n, t in params.items() if n in names}
    anchor = {n: t + shift[n] if n in shift else t for n, t in params.items()}
    drift = None if opt.mu else {n: 0.3 * v for n, v in shift.items()}
    plan = sample_steps(data.train, torch.arange(2), 4, 8, g)
    got = LoopExecutor().train(model, params, plan, data.train, opt, anchor=anchor, drift=drift)
    for i in range(2):  # the reference: the terms in the loss, through autograd
        model.load_state_dict({n: t[i] for n, t in params.items()})
        model.train()
        ps = dict(model.named_parameters())
        sgd = torch.optim.SGD(ps.values(), lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay)
        for s in range(plan.steps):
            rows_i = plan.index[s, i]
            loss = nn.functional.cross_entropy(model(data.train.x[rows_i]), data.train.y[rows_i])
            if opt.mu:
                loss = loss + opt.mu / 2 * sum(((p - anchor[n][i]) ** 2).sum() for n, p in ps.items())
            if drift is not None:
                loss = loss + sum((p * drift[n][i]).sum() for n, p in ps.items())
            sgd.zero_grad(set_to_none=True)
            loss.backward()
            sgd.step()
        for n, t in model.state_dict().items():
            assert torch.equal(got[n][i], t), (n, i)
    if model_name == "unused" and opt.mu:  # the spare parameter moved toward its anchor by the pull alone
        assert not torch.equal(got["spare"], params["spare"])


# -- client objectives: any objective on any executor -------------------------------
class _SmoothedCE(Objective):
    """A method's own objective with no fast path: label-smoothed cross-entropy."""

    def loss(self, forward, params, x, y, w, ctx):
        out = forward(params, x)
        per = torch.nn.functional.cross_entropy(out, y, reduction="none", label_smoothing=0.2)
        return self.reduce(per, w)


class _SubclassedCE(CrossEntropy):
    """A subclass may change the loss: it does not inherit CrossEntropy's hand-written chain path."""


@pytest.mark.parametrize("sampler", ["steps", "epochs"])
def test_any_objective_on_every_executor_with_the_generic_terms(sampler):
    """An objective without a fast path runs on the loop and (vmap fallback, even for a chain) on the stacked
    executor, with momentum, weight decay, the proximal term and the drift applied to it alike."""
    data = small_synthetic(n_clients=4, rows=80)
    model = build_model("mlp", (60,), 10, hidden=(8, 6), seed=1, dtype=torch.float64)
    start, anchor = _params(model, 4), _params(model, 4, seed=7)
    drift = {
        n: 0.01 * torch.randn(t.shape, generator=torch.Generator().manual_seed(2), dtype=t.dtype)
        for n, t in start.items()
    }
    plan = _plan(data.train, 4, sampler, (5, 7), (2, 16))
    opt, obj = OPTS["all"], _SmoothedCE()
    assert fast_path("chain", obj) is None and fast_path("chain", _SubclassedCE()) is None
    assert fast_path("chain", CrossEntropy()) is not None
    loop = LoopExecutor().train(model, start, plan, data.train, opt, anchor, drift, objective=obj)
    for ex in (StackedExecutor(), StackedExecutor(max_group=3), StackedExecutor(kernel="vmap")):
        assert _maxdiff(ex.train(model, start, plan, data.train, opt, anchor, drift, objective=obj), loop) < 1e-10
    plain = LoopExecutor().train(model, start, plan, data.train, opt, anchor, drift)
    assert _maxdiff(plain, loop) > 1e-4  # the objective mattered
    # the default objective, the explicit one, a subclass (generic path) and the forced paths agree
    for ex in (StackedExecutor(), StackedExecutor(kernel="chain"), StackedExecutor(kernel="vmap")):
        for o in (None, CrossEntropy(), _SubclassedCE()):
            assert _maxdiff(ex.train(model, start, plan, data.train, opt, anchor, drift, objective=o), plain) < 1e-10


def test_forced_kernels_and_group_bytes():
    tanh = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)).to(torch.float64)
    data = small_synthetic(n_clients=2, rows=40)
    plan = sample_steps(data.train, torch.arange(2), 1, 2, torch.Generator())
    with pytest.raises(ValueError, match="not a Flatten/Linear/ReLU chain"):
        StackedExecutor(kernel="chain").train(tanh, _params(tanh, 2), plan, data.train, LocalSGD(0.1))
    with pytest.raises(ValueError, match="kernel='loop'"):
        StackedExecutor(kernel="loop")
    mlp = build_model("mlp", (784,), 10, (200, 200), seed=0)
    assert make_executor("stacked", mlp, group_bytes=8 << 20).group_bytes == 8 << 20
    assert make_executor("auto", mlp).group_bytes == PROCESS_CACHE_BYTES
    opt = LocalSGD(0.01, momentum=0.5)
    assert make_executor("auto", mlp, group_bytes=8 << 20).group_size(mlp, 50, None, opt, "cpu") == 3


@pytest.mark.parametrize(
    "l2, l3, mlr_group, mlp_group",
    [(1 << 20, 32 << 20, 200, 5), (2 << 20, 480 << 20, 400, 10)],
    ids=["amd-1MiB-L2-32MiB-L3", "intel-2MiB-L2-480MiB-L3"],
)
def test_a_chains_group_keeps_one_steps_inputs_within_l2(monkeypatch, l2, l3, mlr_group, mlp_group):
    """Twelve batched Synthetic runs' 1,200 MLR clients go in groups whose one step's inputs fit in a core's L2, not
    in one (the byte budget alone): 1 MiB over 20 rows of 60 float32 inputs is 218 clients (2 MiB: 436), cut into
    equal groups. AdaFL's MLP stays bounded by its parameters, half the L3 (16 MiB: groups of 5 of 10 clients; 240
    MiB: all 10 at once), and a GPU takes every client at once. The budgets as two common CPUs'
    caches give them (``PROCESS_CACHE_BYTES``, ``CORE_CACHE_BYTES``)."""
    from fedlib.data.federated import BatchPlan
    from fedlib.executors import stacked

    monkeypatch.setattr(stacked, "CORE_CACHE_BYTES", l2)
    mlr = build_model("mlr", (60,), 10, seed=0)
    plan = BatchPlan(torch.zeros(20, 1200, 20, dtype=torch.long))
    opt = LocalSGD(0.01, mu=0.001)
    ex = StackedExecutor(group_bytes=l3 // 2)
    assert ex.group_bytes // (610 * 4 * 3) > 1200  # the byte budget alone would take all of them
    assert ex.group_size(mlr, 1200, plan, opt, "cpu") == mlr_group
    assert ex.group_size(mlr, 1200, plan, opt, "cuda") == 1200
    mlp = build_model("mlp", (784,), 10, (200, 200), seed=0)
    plan = BatchPlan(torch.zeros(60, 10, 10, dtype=torch.long))  # B = 10: 33 clients' inputs fit in 1 MiB
    assert ex.group_size(mlp, 10, plan, LocalSGD(0.01, momentum=0.5, mu=0.001), "cpu") == mlp_group


def test_chain_forward_is_the_models_forward():
    """One forward for the chain kernels and evaluation: one model (addmm) and a group (batched), with the
    tangent rows beside the primal ones equal to the Jacobian-vector product."""
    model = build_model("mlp", (3, 4), 5, hidden=(6, 7), seed=0, dtype=torch.float64)
    layers = linear_chain(model)
    x = torch.randn(8, 3, 4, dtype=torch.float64)
    one = {n: t for n, t in model.state_dict().items()}
    assert torch.allclose(chain_forward(layers, one, x)[-1], model(x), rtol=0, atol=1e-14)
    group = _params(model, 2)
    xs = torch.randn(2, 8, 3, 4, dtype=torch.float64)
    v = torch.randn(2, 8, 3, 4, dtype=torch.float64)
    hs = chain_forward(layers, group, xs)
    ht = chain_forward(layers, group, xs, tangent=v)
    for i in range(2):
        pi = {n: t[i] for n, t in group.items()}
        f = lambda z: torch.func.functional_call(model, pi, (z,))
        out, jvp = torch.autograd.functional.jvp(f, xs[i], v[i])
        assert torch.allclose(hs[-1][i], out, rtol=0, atol=1e-13)
        assert torch.allclose(ht[-1][i, :8], out, rtol=0, atol=1e-13)
        assert torch.allclose(ht[-1][i, 8:], jvp, rtol=0, atol=1e-13)


@pytest.mark.parametrize("model_name", ["mlr", "dnn", "mlp"])
@pytest.mark.parametrize("sampler", ["steps", "epochs"])
@pytest.mark.parametrize("opt_name", ["sgd", "all"])
def test_by_class_training_equals_loop_float64(monkeypatch, model_name, sampler, opt_name):
    """The cross-entropy path's float32 layout (the last layer's logits by class, ``chain.trains_by_class``),
    forced on in float64: the loop's numbers, on lock-step plans and on the shrinking stacks of unequal clients.
    By default it is on in float32 on the CPU only."""
    import fedlib.executors.chain as chain

    assert chain.trains_by_class(torch.zeros(1)) and not chain.trains_by_class(torch.zeros(1, dtype=torch.float64))
    data = _unequal()
    model = build_model(model_name, (12,), 5, hidden=(8, 6), seed=1, dtype=torch.float64)
    k, gen = data.n_clients, torch.Generator().manual_seed(3)
    start, anchor = _params(model, k), _params(model, k, seed=7)
    if sampler == "steps":
        plan = sample_steps(data.train, torch.arange(k), 6, 4, gen)
    else:
        plan = sample_epochs(data.train, torch.arange(k), 2, 8, gen)
    loop = LoopExecutor().train(model, start, plan, data.train, OPTS[opt_name], anchor)
    asked = []
    monkeypatch.setattr(chain, "trains_by_class", lambda W: asked.append(W.dtype) or True)
    stacked = StackedExecutor(kernel="chain").train(model, start, plan, data.train, OPTS[opt_name], anchor)
    assert asked and _maxdiff(loop, start) > 1e-3
    assert _maxdiff(stacked, loop) < 1e-10


def test_repeated_steps_gather_their_rows_once(monkeypatch):
    """pFedMe's inner steps repeat a local step's mini-batch (``BatchPlan.at_steps``): the chain path gathers each
    run of equal steps' rows once, and trains as the loop does (float64, rows first and by class)."""
    import fedlib.executors.chain as chain

    data = small_synthetic(n_clients=4, rows=80)
    model = build_model("dnn", (60,), 10, hidden=(8,), seed=1, dtype=torch.float64)
    k = data.n_clients
    plan = sample_steps(data.train, torch.arange(k), 3, 5, torch.Generator().manual_seed(0))
    plan = plan.at_steps(torch.tensor([0, 0, 0, 1, 2, 2]))  # 6 steps, 3 distinct batches
    start, anchor = _params(model, k), _params(model, k, seed=7)
    loop = LoopExecutor().train(model, start, plan, data.train, OPTS["all"], anchor)
    gathers, gather = [], chain.gather_rows
    monkeypatch.setattr(chain, "gather_rows", lambda t, rows: gathers.append(rows.shape) or gather(t, rows))
    for by_class in (False, True):
        monkeypatch.setattr(chain, "trains_by_class", lambda W: by_class)
        gathers.clear()
        stacked = StackedExecutor(kernel="chain").train(model, start, plan, data.train, OPTS["all"], anchor)
        assert len(gathers) == 2 * 3  # x and y of the 3 distinct batches
        assert _maxdiff(loop, start) > 1e-3
        assert _maxdiff(stacked, loop) < 1e-10


# -- no padding waste: epoch plans of unequal clients ------------------------------------------
def _unequal(sizes=(3, 41, 17, 90, 1, 60, 8), dtype=torch.float64):
    """Clients of very unequal sizes (the smallest finish their epoch in one step, the largest in twelve)."""
    import numpy as np

    from fedlib.data.federated import FederatedData

    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((s, 12)) for s in sizes]
    ys = [rng.integers(0, 5, s) for s in sizes]
    parts = [np.arange(s) for s in sizes]
    return FederatedData.from_clients("unequal", xs, ys, parts, [p[:0] for p in parts], 5).to("cpu", dtype)


@pytest.mark.parametrize("model_name", ["mlr", "dnn", "mlp"])
@pytest.mark.parametrize("opt_name", sorted(OPTS))
@pytest.mark.parametrize("ex", ["chain", "chain-groups-of-2", "vmap"])
def test_shrinking_stack_equals_loop_float64(model_name, opt_name, ex):
    """Epoch plans of unequal clients (2 epochs, partial last batches, clients idle between their epochs' ends):
    the stacked executor, which runs each step on the clients that still have one, computes what the loop does."""
    data = _unequal()
    model = build_model(model_name, (12,), 5, hidden=(8, 6), seed=1, dtype=torch.float64)
    k = data.n_clients
    start, anchor = _params(model, k), _params(model, k, seed=7)
    drift = {n: 0.01 * torch.randn(t.shape, generator=torch.Generator().manual_seed(2), dtype=t.dtype)
             for n, t in start.items()}  # fmt: skip
    plan = sample_epochs(data.train, torch.arange(k), 2, 8, torch.Generator().manual_seed(3))
    assert plan.active is not None and not bool(plan.active.all())
    opt = OPTS[opt_name]
    kw = {"chain": {"kernel": "chain"}, "chain-groups-of-2": {"max_group": 2}, "vmap": {"kernel": "vmap"}}[ex]
    for d in (None, drift):
        loop = LoopExecutor().train(model, start, plan, data.train, opt, anchor, d)
        stacked = StackedExecutor(**kw).train(model, start, plan, data.train, opt, anchor, d)
        assert _maxdiff(loop, start) > 1e-3
        assert _maxdiff(stacked, loop) < 1e-10


def test_shrinking_stack_does_each_clients_steps_only(monkeypatch):
    """The work handed to the group paths is every client's own active steps, not the largest client's count for
    everyone: sum over groups and steps of the clients stepping == the plan's active (client, step) pairs."""
    import fedlib.executors.stacked as stacked

    data = _unequal()
    k = data.n_clients
    model = build_model("dnn", (12,), 5, hidden=(8,), seed=1, dtype=torch.float64)
    plan = sample_epochs(data.train, torch.arange(k), 2, 8, torch.Generator().manual_seed(3))
    seen = []

    def record(g):
        plan = g.plan
        live = getattr(plan, "live_at", lambda s: plan.index.shape[1])  # (a lock-step plan: every client, always)
        seen.append(sum(live(s) for s in range(plan.steps)))

    monkeypatch.setattr(stacked, "fast_path", lambda kernel, objective: record)
    for g in (None, 2, 3):
        seen.clear()
        StackedExecutor(max_group=g).train(model, _params(model, k), plan, data.train, LocalSGD(0.1))
        assert sum(seen) == int(plan.active.sum()) < plan.active.numel()


def test_shrinking_stack_fuses_the_weight_update(monkeypatch):
    """Every client of a shrunk stack's step steps, so the chain path writes the update into the weight-gradient
    matmul (``_fused_weight_step``) at every step and layer, as on a lock-step plan without padding; the masked
    update (a separate gradient and ``torch.where``) was ~10% of W1's round (``python -m benchmarks --e2e``)."""
    import fedlib.executors.chain as chain

    data = _unequal()
    k = data.n_clients
    model = build_model("dnn", (12,), 5, hidden=(8,), seed=1, dtype=torch.float64)
    plan = sample_epochs(data.train, torch.arange(k), 2, 8, torch.Generator().manual_seed(3))
    assert plan.active is not None and not bool(plan.active.all())
    calls, fused = [], chain._fused_weight_step
    monkeypatch.setattr(chain, "_fused_weight_step", lambda *a, **kw: calls.append(1) or fused(*a, **kw))
    StackedExecutor(kernel="chain").train(model, _params(model, k), plan, data.train, LocalSGD(0.1))
    steps = int(plan.active.any(1).sum())  # the shrunk stack's steps: while any client still has one
    assert len(calls) == 2 * steps  # two Linear layers a step


@pytest.mark.parametrize("kernel", ["chain", "vmap"])
@pytest.mark.parametrize("taylor", [True, False])
def test_shrinking_stack_keeps_per_step_context(kernel, taylor):
    """FedMix's means are paired with (plan step, client, row): a client's k-th step in the shrunk stack still gets
    the means of its own plan step (stacked == loop in float64 on an epoch plan of unequal clients)."""
    from fedlib.algorithms.fedmix import mean_dataset
    from fedlib.executors import FedMixObjective, NaiveMixObjective

    data = _unequal()
    k = data.n_clients
    model = build_model("mlp", (12,), 5, hidden=(8, 6), seed=1, dtype=torch.float64)
    start = _params(model, k)
    plan = sample_epochs(data.train, torch.arange(k), 2, 8, torch.Generator().manual_seed(3))
    mx, my = mean_dataset(data.train, 5, 4)
    pair = torch.randint(0, len(my), tuple(plan.index.shape), generator=torch.Generator().manual_seed(4))
    obj = (FedMixObjective if taylor else NaiveMixObjective)(0.3, mx, my, pair)
    opt = LocalSGD(0.1, momentum=0.5)
    loop = LoopExecutor().train(model, start, plan, data.train, opt, objective=obj)
    stacked = StackedExecutor(kernel=kernel, max_group=3).train(model, start, plan, data.train, opt, objective=obj)
    assert _maxdiff(loop, start) > 1e-3
    assert _maxdiff(stacked, loop) < 1e-10


# -- every model stacked: BatchNorm nets with per-client buffers -------------------------------------
def _bn_case(attention: str, sampler: str):
    """Four clients of LeNet-BN (float64) of 13, 40, 7 and 27 images: with B = 8, epoch plans have short last batches
    of 5, 7 and 3 rows (BatchNorm needs 2 or more)."""
    import numpy as np

    from fedlib.data.federated import FederatedData

    rng = np.random.default_rng(0)
    sizes = (13, 40, 7, 27)
    xs = [0.5 * rng.standard_normal((s, 3, 28, 28)) for s in sizes]
    ys = [rng.integers(0, 10, s) for s in sizes]
    parts = [np.arange(s) for s in sizes]
    data = FederatedData.from_clients("bn", xs, ys, parts, [p[:0] for p in parts], 10).to("cpu", torch.float64)
    model = build_model("lenet", (3, 28, 28), 10, attention=attention, seed=0, dtype=torch.float64)
    k = len(sizes)
    g = torch.Generator().manual_seed(1)
    start = {
        n: t.unsqueeze(0).repeat(k, *[1] * t.dim())
        + (0.01 * torch.randn(k, *t.shape, generator=g, dtype=t.dtype) if t.is_floating_point() else 0)
        for n, t in model.state_dict().items()
    }
    anchor = {n: t + 0.01 if t.is_floating_point() else t for n, t in start.items()}
    plan = _plan(data.train, k, sampler, (3, 6), (2, 8), seed=2)
    return data, model, start, anchor, plan


@pytest.mark.parametrize("attention", ["none", "se", "eca", "ca", "hybrid"])
@pytest.mark.parametrize("sampler", ["steps", "epochs"])
@pytest.mark.parametrize("opt_name", ["sgd", "all"])
def test_batchnorm_net_stacked_equals_loop_float64(attention, sampler, opt_name):
    """pFedLA's LeNet-BN (with each attention kind; CA holds a BatchNorm of its own) on the stacked executor's vmap
    path with explicit per-client buffers: parameters and running statistics (mean, var, num_batches_tracked) as
    the loop's, on full batches and on an epoch plan of unequal clients with short last batches."""
    data, model, start, anchor, plan = _bn_case(attention, sampler)
    opt = {"sgd": LocalSGD(0.01), "all": LocalSGD(0.01, momentum=0.5, weight_decay=1e-3, mu=0.1)}[opt_name]
    loop = LoopExecutor().train(model, start, plan, data.train, opt, anchor)
    stacked = StackedExecutor(kernel="vmap", max_group=3).train(model, start, plan, data.train, opt, anchor)
    floats = [n for n in loop if loop[n].is_floating_point()]
    stats = [n for n in floats if "running" in n]
    assert stats and max((loop[n] - start[n]).abs().max().item() for n in stats) > 1e-3  # the statistics moved
    assert max((loop[n] - start[n]).abs().max().item() for n in floats) > 1e-3
    assert max((stacked[n] - loop[n]).abs().max().item() for n in floats) < 1e-10
    for n in loop:
        if not loop[n].is_floating_point():  # num_batches_tracked: every client's own count of steps
            assert torch.equal(stacked[n], loop[n]) and not torch.equal(loop[n], start[n])


def test_batchnorm_net_stays_on_the_loop_unless_asked():
    """``auto`` keeps BatchNorm nets on the loop (the float32 numbers stored runs hold); the stacked executor takes
    them with kernel='vmap' only."""
    lenet = build_model("lenet", (3, 28, 28), 10, seed=0)
    assert make_executor("auto", lenet).name == "loop"
    assert StackedExecutor(kernel="vmap").kernel_for(lenet) == "vmap-buffers"
    with pytest.raises(NotImplementedError, match="kernel='vmap'"):
        StackedExecutor().kernel_for(lenet)


# -- per-run optimisers: several runs' clients side by side, each run its own LocalSGD --------------
RUNS = [(2, OPTS["sgd"]), (1, OPTS["all"]), (3, LocalSGD(lr=0.03, momentum=0.5, mu=0.1)), (1, OPTS["all"])]


def _per_run(ex, model, start, plan, data, anchor, drift):
    """Each run alone: its clients' slice of the call, trained with its own ``LocalSGD``; concatenated back."""
    outs, a = [], 0
    for n, opt in RUNS:
        sl = slice(a, a + n)
        cut = lambda d: None if d is None else {k: t[sl] for k, t in d.items()}
        outs.append(ex.train(model, cut(start), plan.clients(sl), data, opt, cut(anchor), cut(drift)))
        a += n
    return {k: torch.cat([o[k] for o in outs]) for k in outs[0]}


def _runs_case(dtype, sampler):
    data = _unequal(dtype=dtype)  # 7 clients of 1 to 90 rows: epoch plans shrink and sort them across the runs
    model = build_model("dnn", (12,), 5, hidden=(8,), seed=1, dtype=dtype)
    k = data.n_clients
    start, anchor = _params(model, k), _params(model, k, seed=7)
    drift = {n: 0.01 * torch.randn(t.shape, generator=torch.Generator().manual_seed(2), dtype=t.dtype)
             for n, t in start.items()}  # fmt: skip
    plan = _plan(data.train, k, sampler, (5, 6), (2, 8))
    return data, model, start, anchor, drift, plan


def test_runs_sgd_parts_and_restriction():
    opt = RunsSGD.of([n for n, _ in RUNS], [o for _, o in RUNS])
    assert [(a, b) for a, b, _ in opt.parts] == [(0, 2), (2, 3), (3, 6), (6, 7)]
    assert (opt.momentum, opt.mu, opt.weight_decay) == (0.9, 1.0, 0.001)  # "does any run need it"
    assert not hasattr(opt, "lr")  # no single value: a path that reads it would be wrong
    assert [s for s, _ in opt.slices(4)] == [slice(0, 2), slice(2, 3), slice(3, 4)]  # a shrinking step's first 4
    assert restrict(opt, slice(3, 6)) == RUNS[2][1]  # a group inside one run: the scalar path
    picked = restrict(opt, torch.tensor([6, 2, 0, 1, 4]))  # clients sorted by step count, across the runs
    assert picked.parts == ((0, 2, OPTS["all"]), (2, 4, OPTS["sgd"]), (4, 5, RUNS[2][1]))  # equal ones: one stretch
    assert RunsSGD.of([2, 3], [OPTS["sgd"], OPTS["sgd"]]) == OPTS["sgd"]  # one optimiser: unchanged
    assert restrict(opt, slice(0, 0)) is opt  # no clients: nothing to cut (nothing trains)
    with pytest.raises(ValueError, match="no clients"):
        _segments([], False)


@pytest.mark.parametrize("sampler", ["steps", "epochs"])
@pytest.mark.parametrize("ex", ["chain", "chain-groups-of-2", "vmap", "loop"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_per_run_optimisers_give_each_run_its_solo_training_bit_for_bit(sampler, ex, dtype):
    """``RunsSGD`` per run (the CPU's way): every run's clients get what the run alone gets, float32 included, with
    momentum, weight decay, the proximal term and the drift differing between runs, on lock-step plans and on
    shrinking stacks (which sort the clients across the runs)."""
    data, model, start, anchor, drift, plan = _runs_case(dtype, sampler)
    kw = {"chain": {"kernel": "chain"}, "chain-groups-of-2": {"max_group": 2}, "vmap": {"kernel": "vmap"}}
    executor = LoopExecutor() if ex == "loop" else StackedExecutor(**kw[ex])
    opt = RunsSGD.of([n for n, _ in RUNS], [o for _, o in RUNS])
    for d in (None, drift):
        alone = _per_run(executor, model, start, plan, data.train, anchor, d)
        together = executor.train(model, start, plan, data.train, opt, anchor, d)
        assert _maxdiff(alone, start) > 1e-3
        for n in alone:
            assert torch.equal(together[n], alone[n]), n


@pytest.mark.parametrize("sampler", ["steps", "epochs"])
@pytest.mark.parametrize("ex", ["chain", "vmap"])
def test_per_row_optimisers_equal_each_runs_solo_training_float64(sampler, ex):
    """``RunsSGD`` per row (other devices' way: one operation for all runs): each run's numbers as columns, the
    same training in float64 (float32 differs in the last bits: products rounded apart, -lr applied to dz first)."""
    data, model, start, anchor, drift, plan = _runs_case(torch.float64, sampler)
    executor = StackedExecutor(kernel=ex)
    opt = RunsSGD.of([n for n, _ in RUNS], [o for _, o in RUNS], per_row=True)
    for d in (None, drift):
        alone = _per_run(executor, model, start, plan, data.train, anchor, d)
        assert _maxdiff(executor.train(model, start, plan, data.train, opt, anchor, d), alone) < 1e-10


@pytest.mark.parametrize("sampler", ["steps", "epochs"])
def test_per_run_optimisers_on_a_batchnorm_net(sampler):
    """``RunsSGD`` on LeNet-BN with per-client buffers (kernel='vmap'), where the clients of a short last batch step
    apart (an index of clients, not a slice): each run gets what it gets alone, statistics included (float64: a
    vmapped convolution's sums depend on its group, so not bit for bit; these nets train on the loop by default)."""
    data, model, start, anchor, plan = _bn_case("se", sampler)
    runs = [(1, LocalSGD(0.01)), (2, LocalSGD(0.01, momentum=0.5, weight_decay=1e-3, mu=0.1)), (1, LocalSGD(0.03))]
    ex = StackedExecutor(kernel="vmap", max_group=3)
    alone, a = [], 0
    for n, opt in runs:
        sl = slice(a, a + n)
        cut = lambda d: {k: t[sl] for k, t in d.items()}
        alone.append(ex.train(model, cut(start), plan.clients(sl), data.train, opt, cut(anchor)))
        a += n
    together = ex.train(model, start, plan, data.train, RunsSGD.of([n for n, _ in runs], [o for _, o in runs]), anchor)
    assert max((together[n] - start[n]).abs().max().item() for n in start if start[n].is_floating_point()) > 1e-3
    for name in start:
        assert torch.allclose(together[name], torch.cat([r[name] for r in alone]), rtol=0, atol=1e-12), name
