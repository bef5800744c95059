"""FedBABU and FedRoD, the split-model methods that add to the head rather than keep it: a round on two clients is
what a hand computation gives on both executors (training, and what is evaluated), FedBABU's fine-tuning changes
nothing it trains, and the models they cannot split or extend are refused before training. Both executors over
several rounds, resumption and batching are the contract tests' (test_algorithms, test_checkpoint, test_batching),
which cover every registered method."""

import numpy as np
import pytest
import torch
from helpers import simulate_with, small_synthetic
from torch import nn

from fedlib import RunConfig
from fedlib.algorithms import build_algorithm
from fedlib.algorithms.fedrod import FedRoDLoss, Wrapped, label_counts
from fedlib.data.federated import FederatedData
from fedlib.data.synthetic import synthetic
from fedlib.executors import LoopExecutor, StackedExecutor
from fedlib.models.groups import head
from fedlib.models.registry import build_model, register_model, unregister_model

LR = 0.1
HEAD_KEYS, BODY_KEYS = ("3.weight", "3.bias"), ("1.weight", "1.bias")
EXECUTORS = pytest.mark.parametrize("executor", [StackedExecutor, LoopExecutor], ids=["stacked", "loop"])


def _features(p, x):
    return torch.relu(x @ p["1.weight"].T + p["1.bias"])


def _logits(p, x):
    """The 60-3-10 ReLU net of ``params`` ``p``."""
    return _features(p, x) @ p["3.weight"].T + p["3.bias"]


def _step(params, loss_fn, frozen=()):
    """One full-batch SGD step on ``loss_fn(p)``, the names ``frozen`` held."""
    p = {n: t.clone().requires_grad_(n not in frozen) for n, t in params.items()}
    free = [n for n in p if n not in frozen]
    grads = torch.autograd.grad(loss_fn(p), [p[n] for n in free])
    out = {n: t.detach().clone() for n, t in p.items()}
    for n, g in zip(free, grads):
        out[n] -= LR * g
    return out


def _one_round(algorithm, executor, rounds=1, **kw):
    data = small_synthetic(n_clients=2, rows=8)  # 6 training rows each: one epoch of batch 6 is one full step
    cfg = RunConfig(n_clients=2, clients_per_round=2, rounds=rounds, local_epochs=1, batch_size=6, model="dnn",
                    hidden=(3,), lr=LR, algorithm=algorithm, **kw)  # fmt: skip
    model = build_model("dnn", data.input_shape, 10, (3,), seed=0, dtype=torch.float64)
    init = {n: t.clone() for n, t in model.state_dict().items()}
    alg = build_algorithm(cfg, n_samples=data.train.sizes.numpy())
    out = simulate_with(alg, data, model, executor, rounds, local_steps=None, local_epochs=1, batch_size=6,
                        progress=False)  # fmt: skip
    return data, init, out


def _test_loss(data, k, logits):
    x, y = _client_test(data, k)
    return nn.functional.cross_entropy(logits(x), y).item(), (logits(x).argmax(1) == y).double().mean().item()


def _client_test(data, k):
    return data.test.client(k)


# -- FedBABU --------------------------------------------------------------------------------------------------------
@EXECUTORS
@pytest.mark.parametrize("part", ["all", "head"])
def test_fedbabu_one_round_on_two_clients_by_hand(executor, part):
    """The head never moves (global and both clients' copies: the initial head); the body is the equal-size clients'
    mean of one body step each; test_acc/loss are each client's fine-tuning of that global model (one full-batch
    step: of everything, or of the head alone), gm_test_acc the global model's."""
    data, init, res = _one_round("fedbabu", executor(), babu_finetune_epochs=1, babu_finetune=part)
    state = res.state
    ce = lambda x, y: lambda p: nn.functional.cross_entropy(_logits(p, x), y)
    trained = [_step(init, ce(*data.train.client(k)), frozen=HEAD_KEYS) for k in range(2)]
    for n in HEAD_KEYS:
        assert torch.equal(state.global_params[n], init[n])
        assert all(torch.equal(state.client_params[n][k], init[n]) for k in range(2))
    glob = dict(init)
    for n in BODY_KEYS:
        glob[n] = (trained[0][n] + trained[1][n]) / 2
        torch.testing.assert_close(state.global_params[n], glob[n], rtol=0, atol=1e-12)
        assert not torch.allclose(trained[0][n], trained[1][n])
    gm_right = 0
    for k in range(2):
        tuned = _step(glob, ce(*data.train.client(k)), frozen=BODY_KEYS if part == "head" else ())
        assert not torch.allclose(tuned["3.weight"], glob["3.weight"])  # the head was fine-tuned
        loss, acc = _test_loss(data, k, lambda x: _logits(tuned, x))
        assert res.client_loss[0][k] == pytest.approx(loss, rel=0, abs=1e-12)
        assert res.client_acc[0][k] == pytest.approx(acc, rel=0, abs=1e-12)
        x, y = _client_test(data, k)
        gm_right += int((_logits(glob, x).argmax(1) == y).sum())
    n_test = int(data.test.sizes.sum())
    assert res.metrics.gm_test_acc.iloc[0] == pytest.approx(gm_right / n_test, rel=0, abs=1e-12)


@pytest.mark.parametrize("epochs", [0, 2])
def test_fedbabu_fine_tuning_changes_nothing_it_trains(epochs):
    """The fine-tuned copies are evaluated, never kept: three rounds train the same global model and clients'
    models whatever the fine-tuning; without it (tau_f = 0) what is evaluated is the global model, which is the
    gm_test_acc of a run that fine-tunes."""
    _, _, plain = _one_round("fedbabu", StackedExecutor(), rounds=3, babu_finetune_epochs=0)
    _, _, tuned = _one_round("fedbabu", StackedExecutor(), rounds=3, babu_finetune_epochs=epochs)
    for part in ("global_params", "client_params"):
        a, b = getattr(plain.state, part), getattr(tuned.state, part)
        assert all(torch.equal(a[n], b[n]) for n in a)
    if epochs:
        assert np.array_equal(plain.metrics.test_acc, tuned.metrics.gm_test_acc)
        assert not np.array_equal(plain.metrics.test_loss, tuned.metrics.test_loss)
    else:
        assert plain.metrics.gm_test_acc.isna().all()


def test_fedbabu_options_are_bounded():
    for bad, match in (
        (dict(babu_finetune_epochs=-1), "babu_finetune_epochs=-1"),
        (dict(babu_finetune_epochs=1001), "babu_finetune_epochs=1001"),
        (dict(babu_finetune="body"), "babu_finetune='body'"),
    ):
        with pytest.raises(ValueError, match=match):
            RunConfig(model="dnn", algorithm="fedbabu", **bad).validate()
    with pytest.raises(ValueError, match="weight_decay=0.01 set but algorithm='fedbabu'"):
        RunConfig(model="dnn", algorithm="fedbabu", weight_decay=0.01).validate()


# -- FedRoD ---------------------------------------------------------------------------------------------------------
def _fedrod_loss(x, y, log_counts):
    """BSM of the generic logits + CE of the detached generic logits plus the personal head on detached features."""

    def loss(p):
        z = _features(p, x)
        g = z @ p["3.weight"].T + p["3.bias"]
        h = z.detach() @ p["p.weight"].T + p["p.bias"]
        return nn.functional.cross_entropy(g + log_counts, y) + nn.functional.cross_entropy(g.detach() + h, y)

    return loss


@EXECUTORS
def test_fedrod_one_round_on_two_clients_by_hand(executor):
    """Body and generic head: the clients' mean of one step of the balanced softmax (the log of each client's label
    counts added to its logits; classes a client lacks: -inf); personal heads: one step of the cross-entropy of the
    summed logits, from the initial head, kept per client; test_* the personal prediction g(z) + h(z) of the global
    model, gm_test_acc the generic head's."""
    data, init, res = _one_round("fedrod", executor())
    state = res.state
    start = {**init, "p.weight": init["3.weight"], "p.bias": init["3.bias"]}
    trained = []
    for k in range(2):
        x, y = data.train.client(k)
        counts = torch.bincount(y, minlength=10).double()
        assert (counts == 0).any()  # the -inf of a missing class is exercised
        trained.append(_step(start, _fedrod_loss(x, y, counts.log())))
    for n in (*BODY_KEYS, *HEAD_KEYS):
        mean = (trained[0][n] + trained[1][n]) / 2
        torch.testing.assert_close(state.global_params[n], mean, rtol=0, atol=1e-12)
    heads = state.extra["fedrod"].heads
    for k in range(2):
        for n, p in (("3.weight", "p.weight"), ("3.bias", "p.bias")):
            torch.testing.assert_close(heads[n][k], trained[k][p], rtol=0, atol=1e-12)
            assert not torch.allclose(trained[k][p], init[n])
        assert all(torch.equal(state.client_params[n][k], trained[k][n]) for n in BODY_KEYS)
    glob = {n: state.global_params[n] for n in init}
    gm_right = 0
    for k in range(2):
        pk = {"weight": heads["3.weight"][k], "bias": heads["3.bias"][k]}
        personal = lambda x: _logits(glob, x) + _features(glob, x) @ pk["weight"].T + pk["bias"]
        loss, acc = _test_loss(data, k, personal)
        assert res.client_loss[0][k] == pytest.approx(loss, rel=0, abs=1e-12)
        assert res.client_acc[0][k] == pytest.approx(acc, rel=0, abs=1e-12)
        x, y = _client_test(data, k)
        gm_right += int((_logits(glob, x).argmax(1) == y).sum())
    assert res.metrics.gm_test_acc.iloc[0] == pytest.approx(gm_right / int(data.test.sizes.sum()), rel=0, abs=1e-12)


def test_fedrod_personal_heads_are_kept_by_the_clients_that_trained():
    """Only the round's selected clients move their personal heads; the others keep theirs."""
    data = small_synthetic(n_clients=4, rows=40)
    cfg = RunConfig(n_clients=4, clients_per_round=2, rounds=1, local_steps=2, batch_size=5, model="dnn",
                    hidden=(3,), lr=LR, algorithm="fedrod")  # fmt: skip
    model = build_model("dnn", data.input_shape, 10, (3,), seed=0, dtype=torch.float64)
    head0 = model.state_dict()["3.weight"].clone()
    res = simulate_with(build_algorithm(cfg), data, model, LoopExecutor(), 1, local_steps=2, batch_size=5,
                        progress=False)  # fmt: skip
    sel = set(np.flatnonzero(res.traces["selected"][0]))
    heads = res.state.extra["fedrod"].heads["3.weight"]
    assert len(sel) == 2
    for k in range(4):
        assert torch.equal(heads[k], head0) != (k in sel)


def test_label_counts_and_the_objective_context():
    data = small_synthetic(n_clients=3, rows=20)
    counts = label_counts(data.train, 10)
    for k in range(3):
        assert torch.equal(counts[k], torch.bincount(data.train.client(k)[1], minlength=10).double())
    loss = FedRoDLoss(counts.log(), batch=4)
    one, group = loss.context(0, 1, torch.float64)["log_counts"], loss.context(0, slice(0, 3), torch.float64)
    assert one.shape == (4, 10) and torch.equal(one[2], counts[1].log())
    assert group["log_counts"].shape == (3, 4, 10)


def test_fedrod_refuses_heads_it_cannot_add_to():
    """A head that is not one Linear layer is refused at validate; a model that changes its head's output is refused
    when it is wrapped (before its first step)."""
    register_model(
        "deephead",
        lambda s, c: nn.Sequential(nn.Flatten(), nn.Linear(60, 4), head(nn.Sequential(nn.ReLU(), nn.Linear(4, c)))),
        groups=("head",),
    )
    try:
        with pytest.raises(
            ValueError, match="algorithm='fedrod'.*one nn.Linear.*model='deephead' declares 2: Sequential"
        ):
            RunConfig(model="deephead", algorithm="fedrod").validate()
    finally:
        unregister_model("deephead")
    scaled = nn.Sequential(nn.Flatten(), nn.Linear(60, 4), nn.ReLU(), head(nn.Linear(4, 10)), nn.Tanh())
    with pytest.raises(ValueError, match="output is not its head's"):
        Wrapped.of(scaled, torch.zeros(1, 60))
    plain = nn.Sequential(nn.Flatten(), nn.Linear(60, 4), nn.ReLU(), head(nn.Linear(4, 10)))
    w = Wrapped.of(plain, torch.zeros(1, 60))
    assert w.names == ("3.weight", "3.bias") and plain.training  # the probe leaves the model's mode as it was
    assert set(w.module.state_dict()) == {"1.weight", "1.bias", "3.generic.weight", "3.generic.bias",
                                          "3.personal.weight", "3.personal.bias"}  # fmt: skip


@pytest.mark.parametrize("algorithm", ["fedbabu", "fedrod"])
def test_a_model_that_is_its_head_alone_is_refused(algorithm):
    with pytest.raises(ValueError, match=f"algorithm='{algorithm}'.*model='mlr' as configured is its head alone"):
        RunConfig(model="mlr", algorithm=algorithm).validate()
    RunConfig(model="dnn", algorithm=algorithm).validate()


@pytest.mark.parametrize("algorithm", ["fedbabu", "fedrod"])
def test_epochs_of_unequal_clients_agree_on_both_executors(algorithm):
    """Epoch plans of clients of unequal sizes (padded last batches, clients idle once their epochs are done: the
    stacked executor's shrinking stacks, where FedRoD's label counts are handed to a reordered group of clients, and
    FedBABU's fine-tuning plans): the two executors agree in float64."""
    xs, ys = synthetic(n_clients=4, seed=0)
    cut = [(x[:n], y[:n]) for x, y, n in zip(xs, ys, (20, 37, 54, 71))]
    tr, te = [np.arange(int(0.75 * len(y))) for _, y in cut], [np.arange(int(0.75 * len(y)), len(y)) for _, y in cut]
    data = FederatedData.from_clients("unequal", [x for x, _ in cut], [y for _, y in cut], tr, te, 10)
    data = data.to("cpu", torch.float64)
    assert len(set(data.train.sizes.tolist())) == 4
    own = {"babu_finetune_epochs": 1} if algorithm == "fedbabu" else {}
    cfg = RunConfig(n_clients=4, clients_per_round=3, rounds=3, local_epochs=2, batch_size=7, model="dnn",
                    hidden=(5,), lr=LR, algorithm=algorithm, **own)  # fmt: skip
    out = []
    for executor in (StackedExecutor(), LoopExecutor()):
        model = build_model("dnn", data.input_shape, 10, (5,), seed=0, dtype=torch.float64)
        out.append(simulate_with(build_algorithm(cfg), data, model, executor, 3, local_steps=None, local_epochs=2,
                                 batch_size=7, progress=False))  # fmt: skip
    a, b = out
    assert np.allclose(a.metrics.test_loss, b.metrics.test_loss, rtol=0, atol=1e-10)
    assert np.allclose(a.client_loss, b.client_loss, rtol=0, atol=1e-10)
    assert np.array_equal(a.metrics.gm_test_acc, b.metrics.gm_test_acc)
