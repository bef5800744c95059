"""FedMix / NaiveMix (Yoon et al., ICLR 2021) and the FedMix CIFAR-10 CNN.

Golden numbers from the closed form of softmax regression; lam = 0 is FedAvg; the per-client
reference and the vectorised (vmap, second-order) implementation agree in float64; the mean set;
a tiny end-to-end run; the CNN's contract (its own, since tests/test_models.py covers flat models).
"""

import numpy as np
import pytest
import torch
from torch import nn

import fedlib
from fedlib.algorithms import ALGORITHMS, build_algorithm
from fedlib.algorithms.fedmix import MEANS_KEY, MixClient, mean_dataset, pairing
from fedlib.config.run import RunConfig
from fedlib.core.stages import ClientWork
from fedlib.core.state import init_state
from fedlib.data.federated import BatchPlan, FederatedData, Split, sample_epochs
from fedlib.data.synthetic import synthetic
from fedlib.executors import LocalSGD, LoopExecutor, StackedExecutor
from fedlib.models.registry import build_model, count_parameters

F64 = torch.float64


def _unequal_synthetic(rows=(23, 41, 60)) -> FederatedData:
    """Three Synthetic clients of unequal sizes (all rows train, two test rows each)."""
    xs, ys = synthetic(n_clients=len(rows), seed=0)
    xs, ys = [x[:r] for x, r in zip(xs, rows)], [y[:r] for y, r in zip(ys, rows)]
    tr = [np.arange(r) for r in rows]
    te = [np.arange(r - 2, r) for r in rows]
    return FederatedData.from_clients("unequal", xs, ys, tr, te, 10).to("cpu", F64)


def _stack(model: nn.Module, k: int) -> dict:
    return {n: t.unsqueeze(0).repeat(k, *[1] * t.dim()).clone() for n, t in model.state_dict().items()}


def _max_diff(a: dict, b: dict) -> float:
    return max((a[n] - b[n]).abs().max().item() for n in a)


_PATHS = {"train_loop": "loop", "train_vmap": "vmap", "train_chain": "chain"}


def _train(path: str, client: MixClient, model, params, plan, split, mx, my, pair, opt, max_group=None) -> dict:
    """``client``'s objective trained by an executor forced to one path: 'train_loop' (the loop executor, the
    reference), 'train_vmap' (the stacked executor's generic vmap path) or 'train_chain' (its chain fast path)."""
    kernel = _PATHS[path]
    ex = LoopExecutor() if kernel == "loop" else StackedExecutor(max_group=max_group, kernel=kernel)
    return ex.train(model, params, plan, split, opt, objective=client.objective(mx, my, pair))


# -- golden: softmax regression, closed form ----------------------------------------------------------
def _softmax(u):
    e = np.exp(u - u.max())
    return e / e.sum()


def _closed_form_step(W, b, xs, ys, xbar, ybar, lam, taylor, tscale=1.0):
    """One SGD step (lr = 1) on the mean over the batch of the per-sample FedMix / NaiveMix loss of
    u = W z + b, written out by hand:
      FedMix, z = (1 - lam) x, p = softmax(u), g = p - e_y the logit gradient of CE, so dl/dz = W^T g and
        L = (1 - lam) CE(u, y) + lam CE(u, ybar) + lam <W^T g, xbar> = ... + lam (W xbar)^T (p - e_y)
        dL/du (through p)   = (1 - lam) g + lam (p - ybar) + lam J v,  J = diag(p) - p p^T, v = W xbar
        dL/dW = dL/du z^T + lam g xbar^T          (the last: W's explicit appearance in W^T g)
      NaiveMix, z = (1 - lam) x + lam xbar: dL/du = p - (1 - lam) e_y - lam ybar, dL/dW = dL/du z^T.
    ``tscale`` multiplies the Taylor term (both of its gradient parts): 1, or (1 - lam) / B for the batch scale.
    """
    gW, gb = np.zeros_like(W), np.zeros_like(b)
    for x, y, xm, ym in zip(xs, ys, xbar, ybar):
        e = np.eye(len(b))[y]
        if taylor:
            z = (1 - lam) * x
            p = _softmax(W @ z + b)
            g = p - e
            J = np.diag(p) - np.outer(p, p)
            du = (1 - lam) * g + lam * (p - ym) + tscale * lam * J @ (W @ xm)
            gW += np.outer(du, z) + tscale * lam * np.outer(g, xm)
        else:
            z = (1 - lam) * x + lam * xm
            p = _softmax(W @ z + b)
            du = p - (1 - lam) * e - lam * ym
            gW += np.outer(du, z)
        gb += du
    return W - gW / len(xs), b - gb / len(xs)


@pytest.mark.parametrize("taylor, scale", [(True, "sample"), (True, "batch"), (False, "sample")])
def test_golden_softmax_regression(taylor, scale):
    W = np.array([[0.5, -1.0], [0.25, 0.75], [-0.5, 0.5]])
    b = np.array([0.1, -0.2, 0.3])
    xs = np.array([[1.0, 2.0], [-1.0, 0.5]])
    ys = np.array([0, 2])
    means_x = np.array([[0.5, 0.5], [2.0, -1.0]])
    means_y = np.array([[0.5, 0.5, 0.0], [0.0, 0.25, 0.75]])
    pair = torch.tensor([[[1, 0]]])  # sample 0 pairs with mean 1, sample 1 with mean 0
    lam = 0.2
    tscale = 1.0 if scale == "sample" else (1 - lam) / 2  # batch scale: (1 - lam) / B, B = 2
    want_W, want_b = _closed_form_step(W, b, xs, ys, means_x[[1, 0]], means_y[[1, 0]], lam, taylor, tscale)

    model = build_model("mlr", (2,), 3, dtype=F64)
    params = {"1.weight": torch.tensor(W)[None], "1.bias": torch.tensor(b)[None]}
    split = Split(torch.tensor(xs), torch.tensor(ys), torch.tensor([0]), torch.tensor([2]))
    plan = BatchPlan(torch.tensor([[[0, 1]]]))
    client = MixClient(LocalSGD(lr=1.0), lam, 1, taylor, scale)
    mx, my = torch.tensor(means_x), torch.tensor(means_y)
    for got in (
        _train("train_loop", client, model, params, plan, split, mx, my, pair, client.opt),
        _train("train_vmap", client, model, params, plan, split, mx, my, pair, client.opt),
        _train("train_chain", client, model, params, plan, split, mx, my, pair, client.opt),
    ):
        assert np.allclose(got["1.weight"][0].numpy(), want_W, atol=1e-14, rtol=0)
        assert np.allclose(got["1.bias"][0].numpy(), want_b, atol=1e-14, rtol=0)
    if taylor:  # the Taylor term changes the step: dropping it gives a different update
        no_taylor = _closed_form_step(W, b, xs, ys, means_x[[1, 0]], means_y[[1, 0]], 0.0, True)[0]
        assert not np.allclose(want_W, no_taylor)


# -- lam = 0 is FedAvg ---------------------------------------------------------------------------------
@pytest.mark.parametrize("taylor", [True, False])
def test_lam_zero_is_fedavg(taylor):
    data = _unequal_synthetic()
    model = build_model("dnn", (60,), 10, (8,), seed=0, dtype=F64)
    plan = sample_epochs(data.train.layout(), torch.arange(3), 2, 7, torch.Generator().manual_seed(3))
    assert plan.weight is not None and not bool(plan.active.all())  # a masked plan
    opt = LocalSGD(lr=0.1, momentum=0.5, weight_decay=1e-3)
    start = _stack(model, 3)
    want = LoopExecutor().train(model, start, plan, data.train, opt)
    client = MixClient(opt, 0.0, 5, taylor)
    for executor in (LoopExecutor(), StackedExecutor()):
        state = init_state(model, 3)
        state.round = 1
        got = client(ClientWork(executor, model, start, start, plan, data.train, state, torch.arange(3), opt))
        assert _max_diff(got, want) < 1e-12
    assert _max_diff(want, start) > 1e-2  # it did train


# -- the two implementations agree --------------------------------------------------------------------
class _SmallConv(nn.Sequential):
    """Conv -> ReLU -> max-pool -> Linear: the second-order path through conv and pooling, without dropout."""

    def __init__(self):
        super().__init__(
            nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(3 * 3 * 3, 4)
        )


def _image_data(sizes=(9, 14, 5)) -> Split:
    g = torch.Generator().manual_seed(0)
    n = sum(sizes)
    x = torch.randn(n, 1, 6, 6, generator=g, dtype=F64)
    y = torch.randint(4, (n,), generator=g)
    sizes = torch.tensor(sizes)
    return Split(x, y, torch.cumsum(sizes, 0) - sizes, sizes)


def _against_loop(path: str, model, split, n_classes: int, taylor: bool, scale: str = "sample"):
    """Three clients, two masked or full epochs of batch 4: the executor path ('train_vmap' or 'train_chain')
    in one group of 3 and in groups of 2 + 1 equals the per-client reference to 1e-10. Returns the plan and what
    the reference ran with (start, means, pairs, client) for further checks."""
    plan = sample_epochs(split.layout(), torch.arange(3), 2, 4, torch.Generator().manual_seed(7))
    mx, my = mean_dataset(split, n_classes, 3)
    pair = pairing(5, plan, len(my))
    client = MixClient(LocalSGD(lr=0.05, momentum=0.5, weight_decay=1e-3), 0.2, 3, taylor, scale)
    start = _stack(model, 3)
    ref = _train("train_loop", client, model, start, plan, split, mx, my, pair, client.opt)
    for group in (3, 2):
        got = _train(path, client, model, start, plan, split, mx, my, pair, client.opt, max_group=group)
        assert _max_diff(got, ref) < 1e-10
    assert _max_diff(ref, start) > 1e-3
    return plan, ref, (start, mx, my, pair, client)


@pytest.mark.parametrize("taylor", [True, False])
@pytest.mark.parametrize("which", ["dnn", "conv"])
def test_loop_matches_vmap(taylor, which):
    if which == "dnn":
        split = _unequal_synthetic().train
        model = build_model("dnn", (60,), 10, (8,), seed=0, dtype=F64)
        n_classes = 10
    else:
        split = _image_data()
        torch.manual_seed(0)
        model = _SmallConv().to(F64)
        n_classes = 4
    plan, _, _ = _against_loop("train_vmap", model, split, n_classes, taylor)
    assert plan.weight is not None and not bool(plan.active.all())


@pytest.mark.parametrize("taylor", [True, False])
@pytest.mark.parametrize("hidden", [(8,), (7, 5)])
@pytest.mark.parametrize("masked", [True, False])
def test_loop_matches_chain(taylor, hidden, masked):
    """The hand-written chain path (tangent pass beside the primal one) equals the reference on one and two
    hidden layers, with momentum and weight decay, on masked epochs (unequal clients) and on full batches."""
    split = _unequal_synthetic((23, 41, 60) if masked else (40, 40, 40)).train
    model = build_model("dnn" if len(hidden) == 1 else "mlp", (60,), 10, hidden, seed=0, dtype=F64)
    plan, ref, (start, mx, my, pair, client) = _against_loop("train_chain", model, split, 10, taylor)
    assert (plan.active is not None) == masked
    plain = _train(
        "train_chain", MixClient(client.opt, 0.0, 3, taylor), model, start, plan, split, mx, my, pair, client.opt
    )
    assert _max_diff(plain, ref) > 1e-4  # lam matters: the mixing terms are in the step


@pytest.mark.parametrize("path", ["train_vmap", "train_chain"])
def test_batch_scale_matches_loop_on_masked_epochs(path):
    """The batch scale ((1 - lam) / B on the Taylor term, B = a client's real rows that step: masked rows do not
    count) agrees across the three paths on unequal clients, and it is a different step from the per-sample one."""
    split = _unequal_synthetic((23, 41, 60)).train
    model = build_model("mlp", (60,), 10, (7, 5), seed=0, dtype=F64)
    plan, ref, (start, mx, my, pair, client) = _against_loop(path, model, split, 10, True, "batch")
    assert plan.weight is not None and not bool(plan.weight.all())  # padded rows in some steps
    per_sample = _train(
        "train_loop", MixClient(client.opt, client.lam, 3, True), model, start, plan, split, mx, my, pair, client.opt
    )
    assert _max_diff(per_sample, ref) > 1e-6


def test_engine_dispatch_and_lr_scale():
    """The hook picks the vectorised path for a StackedExecutor, the reference otherwise; both step with the lr of
    the round's optimiser they are handed (round 3 of lr_decay = 0.5**0.5: 0.1 * 0.5)."""
    data = _unequal_synthetic()
    model = build_model("mlr", (60,), 10, seed=0, dtype=F64)
    plan = sample_epochs(data.train.layout(), torch.arange(3), 1, 8, torch.Generator().manual_seed(1))
    client = MixClient(LocalSGD(lr=0.1), 0.1, 4, True)
    start = _stack(model, 3)
    outs = []
    for ex in (LoopExecutor(), StackedExecutor()):
        state = init_state(model, 3)
        state.round = 3
        work = ClientWork(ex, model, start, start, plan, data.train, state, torch.arange(3), LocalSGD(lr=0.1 * 0.5))
        outs.append(client(work))
        assert set(state.extra[MEANS_KEY].means) == {"x", "y"}
    assert _max_diff(outs[0], outs[1]) < 1e-12
    mx, my = mean_dataset(data.train, 10, 4)
    half = _train(
        "train_loop", client, model, start, plan, data.train, mx, my, pairing(3, plan, len(my)), LocalSGD(lr=0.05)
    )
    assert _max_diff(outs[0], half) < 1e-12


@pytest.mark.parametrize("taylor", [True, False])
def test_generic_terms_apply_to_the_mix_objectives(taylor):
    """The executors' generic terms (prox toward an anchor, SCAFFOLD's drift) apply to the FedMix / NaiveMix
    objectives on all three paths alike, masked epochs, groups of 2 + 1."""
    split = _unequal_synthetic().train
    model = build_model("mlp", (60,), 10, (7, 5), seed=0, dtype=F64)
    plan = sample_epochs(split.layout(), torch.arange(3), 2, 4, torch.Generator().manual_seed(7))
    mx, my = mean_dataset(split, 10, 3)
    obj = MixClient(LocalSGD(0.05), 0.2, 3, taylor).objective(mx, my, pairing(5, plan, len(my)))
    opt = LocalSGD(lr=0.05, momentum=0.5, weight_decay=1e-3, mu=0.5)
    start = _stack(model, 3)
    g = torch.Generator().manual_seed(1)
    anchor = {n: t + 0.1 * torch.randn(t.shape, generator=g, dtype=F64) for n, t in start.items()}
    drift = {n: 0.01 * torch.randn(t.shape, generator=g, dtype=F64) for n, t in start.items()}
    ref = LoopExecutor().train(model, start, plan, split, opt, anchor, drift, objective=obj)
    for kernel in ("vmap", "chain"):
        got = StackedExecutor(max_group=2, kernel=kernel).train(
            model, start, plan, split, opt, anchor, drift, objective=obj
        )
        assert _max_diff(got, ref) < 1e-10
    assert _max_diff(ref, LoopExecutor().train(model, start, plan, split, opt, anchor, objective=obj)) > 1e-4


# -- the mean set -------------------------------------------------------------------------------------
def test_mean_dataset_hand_example():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [10.0, 0.0], [20.0, 0.0]], dtype=F64)
    y = torch.tensor([0, 1, 1, 2, 2])
    split = Split(x, y, torch.tensor([0, 3]), torch.tensor([3, 2]))  # client 0: 3 rows, client 1: 2 rows
    mx, my = mean_dataset(split, 3, 2)
    assert mx.shape == (3, 2) and my.shape == (3, 3)  # ceil(3/2) + ceil(2/2) means
    assert torch.equal(mx, torch.tensor([[2.0, 3.0], [5.0, 6.0], [15.0, 0.0]], dtype=F64))
    assert torch.equal(my, torch.tensor([[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=F64))
    mx, my = mean_dataset(split, 3, 100)  # M_k >= n_k: one mean per client ("all")
    assert torch.allclose(mx, torch.tensor([[3.0, 4.0], [15.0, 0.0]], dtype=F64))
    assert torch.allclose(my, torch.tensor([[1 / 3, 2 / 3, 0.0], [0.0, 0.0, 1.0]], dtype=F64))
    assert torch.allclose(my.sum(1), torch.ones(2, dtype=F64))


def test_mean_set_computed_once_and_pairing_deterministic():
    data = _unequal_synthetic()
    model = build_model("mlr", (60,), 10, seed=0, dtype=F64)
    state = init_state(model, 3)
    client = MixClient(LocalSGD(lr=0.1), 0.1, 10, True)
    start = _stack(model, 3)
    first = client.means(model, start, data.train, state)
    assert first[0].shape == (3 + 5 + 6, 60) and first[1].shape == (14, 10)  # ceil(23/10) + ceil(41/10) + ceil(60/10)
    assert client.means(model, start, data.train, state)[0] is first[0]
    plan = sample_epochs(data.train.layout(), torch.arange(3), 1, 8, torch.Generator().manual_seed(1))
    a, b = pairing(4, plan, 14), pairing(4, plan, 14)
    assert a.shape == plan.index.shape and torch.equal(a, b) and int(a.max()) < 14
    assert not torch.equal(a, pairing(5, plan, 14))


# -- registry and a tiny end-to-end run ---------------------------------------------------------------
def test_registered_with_their_fields():
    need = {"mix_lam", "mix_mean_size"}
    for name in ("fedmix", "naivemix"):  # its own options; it selects and honours momentum and weight decay
        assert need <= set(ALGORITHMS[name].option_names()) and ALGORITHMS[name].SELECTS and ALGORITHMS[name].SGD_EXTRAS
        RunConfig(algorithm=name, mix_lam=0.1, mix_mean_size=5).validate()
        alg = build_algorithm(RunConfig(algorithm=name, mix_lam=0.1))
        assert alg.local_update.lam == 0.1 and alg.local_update.taylor == (name == "fedmix")
    with pytest.raises(ValueError, match="mix_lam"):
        RunConfig(algorithm="fedavg", mix_lam=0.1).validate()
    assert build_algorithm(RunConfig(algorithm="fedmix", mix_taylor_scale="batch")).local_update.taylor_scale == "batch"
    with pytest.raises(ValueError, match="mix_taylor_scale.*sample, batch"):
        RunConfig(algorithm="fedmix", mix_taylor_scale="mean").validate()
    with pytest.raises(ValueError, match="mix_taylor_scale"):
        RunConfig(algorithm="fedavg", mix_taylor_scale="batch").validate()


def test_end_to_end_tiny():
    base = RunConfig(
        n_clients=4,
        clients_per_round=2,
        rounds=2,
        local_steps=2,
        batch_size=5,
        model="mlr",
        algorithm="fedmix",
        mix_lam=0.1,
        mix_mean_size=5,
        dtype="float64",
    )
    runs = {ex: fedlib.train(base.replace(executor=ex), progress=False) for ex in ("loop", "stacked")}
    for res in runs.values():
        m = res.metrics
        assert len(m) == 2 and np.isfinite(m.test_acc).all() and np.isfinite(m.test_loss).all()
    assert runs["loop"].meta["executor"] == "loop" and runs["stacked"].meta["executor"] == "stacked"
    assert np.allclose(runs["loop"].metrics.test_loss, runs["stacked"].metrics.test_loss, rtol=0, atol=1e-10)
    naive = fedlib.train(base.replace(algorithm="naivemix"), progress=False)
    assert np.isfinite(naive.metrics.test_loss).all()
    assert not np.allclose(naive.metrics.test_loss, runs["stacked"].metrics.test_loss)


# -- the FedMix CIFAR-10 CNN ----------------------------------------------------------------------------
def test_cnn_contract_and_size():
    m = build_model("cnn", (3, 32, 32), 10, seed=0)
    x = torch.randn(7, 3, 32, 32)
    out = m(x)
    assert out.shape == (7, 10) and torch.isfinite(out).all()
    torch.nn.functional.cross_entropy(out, torch.arange(7) % 10).backward()
    for n, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, n
    assert not any(True for _ in m.buffers())
    conv = lambda i, o: i * o * 3 * 3 + o  # 3x3 kernels + bias
    fc = lambda i, o: i * o + o
    by_hand = (
        conv(3, 32)
        + conv(32, 64)
        + conv(64, 128)
        + conv(128, 128)
        + conv(128, 256)
        + conv(256, 256)
        + fc(256 * 4 * 4, 512)
        + fc(512, 512)
        + fc(512, 10)
    )
    assert by_hand == 3_491_530 == count_parameters(m)
    assert build_model("cnn", (1, 28, 28), 10)(torch.randn(2, 1, 28, 28)).shape == (2, 10)  # 28 -> 14 -> 7 -> 3
    with pytest.raises(ValueError, match="image inputs"):
        build_model("cnn", (60,), 10)


def test_fedmix_trains_the_cnn_vectorised():
    """The vmap path runs the CNN (dropout: independent masks per client) with the second-order term."""
    torch.manual_seed(0)
    model = build_model("cnn", (3, 16, 16), 10, (32, 32), seed=0)
    g = torch.Generator().manual_seed(0)
    split = Split(
        torch.randn(6, 3, 16, 16, generator=g),
        torch.randint(10, (6,), generator=g),
        torch.tensor([0, 3]),
        torch.tensor([3, 3]),
    )
    plan = BatchPlan(torch.tensor([[[0, 1], [3, 4]], [[1, 2], [4, 5]]]))
    client = MixClient(LocalSGD(lr=0.05, momentum=0.5), 0.05, 2, True)
    mx, my = mean_dataset(split, 10, 2)
    start = _stack(model, 2)
    got = _train("train_vmap", client, model, start, plan, split, mx, my, pairing(1, plan, len(my)), client.opt)
    assert all(torch.isfinite(t).all() for t in got.values())
    assert _max_diff(got, start) > 0


@pytest.mark.parametrize("profile", ["smoke", "quick", "paper"])
def test_adafl_fedmix_cells_take_the_batch_scale_and_the_ablation_differs_only_there(profile):
    """AdaFL Table 3's FedMix cells use the batch-scale Taylor term; the scale ablation's cells are the same
    AdaFL+FedMix and FedMix-0.1 configs with the per-sample term, nothing else changed."""
    from fedlib.experiments import profiles
    from fedlib.papers import adafl
    from fedlib.runs.grids import expand

    table3 = expand(*profiles.get("adafl_table3", profile))
    mix = {
        profiles.adafl_label(c): c for c in table3 if c.algorithm == "fedmix" and c.dataset == "mnist" and c.seed == 0
    }
    assert set(mix) == {"AdaFL+FedMix", "FedMix-0.1", "FedMix-0.5"}
    assert {c.mix_taylor_scale for c in mix.values()} == {"batch"}
    ablation = expand(*profiles.get("adafl_fedmix_scale", profile))
    assert sorted(profiles.adafl_label(c) for c in ablation) == ["AdaFL+FedMix", "FedMix-0.1"]
    for c in ablation:
        assert c.mix_taylor_scale == "sample"
        assert c.replace(mix_taylor_scale="batch") == mix[profiles.adafl_label(c)]
    both = adafl.with_counterparts(ablation, table3, "fedmix")  # what notebook 23 draws: each beside its cell
    assert both[: len(ablation)] == ablation
    assert sorted(c.key() for c in both[len(ablation) :]) == sorted(
        mix[profiles.adafl_label(c)].key() for c in ablation
    )
