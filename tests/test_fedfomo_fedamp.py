"""FedAMP and FedFomo: a round on three clients against a plain torch computation on both executors, the weights'
rules, FedAMP's reduction to local proximal training, and FedFomo's held-out validation rows. Both executors at
float64, resumption and batching are the contract tests' (test_algorithms, test_checkpoint, test_batching), which
cover every registered method."""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import simulate_with, small_synthetic
from torch.func import functional_call

from fedlib import RunConfig
from fedlib.algorithms import build_algorithm
from fedlib.algorithms.fedfomo import Affinity, choose, fomo_weights
from fedlib.algorithms.local import no_aggregation
from fedlib.core.attention import fedamp_weights
from fedlib.core.simulation import method_validation
from fedlib.data.federated import FederatedData, Split
from fedlib.executors import LoopExecutor, StackedExecutor
from fedlib.models.registry import build_model

D = torch.float64
EXECUTORS = [LoopExecutor, StackedExecutor]


def _three_clients(val: bool) -> FederatedData:
    """Three clients of one training row each (x in R^2, 2 classes; clients 0 and 1 alike, client 2 not), one test row
    each and, with ``val``, two validation rows each."""
    x = np.array([[1.0, 0.2], [0.9, 0.1], [0.1, 1.0], [1.0, 0.0], [0.8, 0.3], [0.0, 1.0]])
    y = np.array([0, 0, 1, 0, 0, 1])
    data = FederatedData.from_parts("three", x, y, [np.array([0]), np.array([1]), np.array([2])],
                                    [np.array([3]), np.array([4]), np.array([5])], 2).to("cpu", D)  # fmt: skip
    if not val:
        return data
    vx = torch.tensor([[1.0, 0.1], [0.2, 0.9], [0.9, 0.0], [0.3, 0.9], [0.0, 0.8], [1.0, 0.1]], dtype=D)
    vy = torch.tensor([0, 1, 0, 1, 1, 0])
    sizes = torch.tensor([2, 2, 2])
    return dataclasses.replace(data, val=Split(vx, vy, torch.tensor([0, 2, 4]), sizes))


def _model():
    return build_model("mlr", (2,), 2, (), seed=0, dtype=D)


def _loss(model, w, x, y):
    return F.cross_entropy(functional_call(model, w, (x,)), y)


def _sgd(model, w, x, y, steps, lr, mu=0.0, anchor=None):
    """``steps`` plain gradient steps on the mean cross-entropy of (x, y) + mu/2 ||w - anchor||^2."""
    w = {k: v.clone() for k, v in w.items()}
    for _ in range(steps):
        p = {k: v.clone().requires_grad_(True) for k, v in w.items()}
        loss = _loss(model, p, x, y)
        if mu:
            loss = loss + mu / 2 * sum((p[k] - anchor[k]).square().sum() for k in p)
        g = torch.autograd.grad(loss, list(p.values()))
        w = {k: (v - lr * gk).detach() for (k, v), gk in zip(p.items(), g)}
    return w


def _flat(ws):
    return torch.stack([torch.cat([v.reshape(-1) for v in w.values()]) for w in ws])


def _cfg(algorithm, **kw):
    return RunConfig(n_clients=3, clients_per_round=3, rounds=2, local_steps=2, batch_size=1, lr=0.5, model="mlr",
                     algorithm=algorithm, **kw)  # fmt: skip


def _final(result, n=3):
    return [{k: v[i] for k, v in result.state.client_params.items()} for i in range(n)]


# -- FedAMP ------------------------------------------------------------------------------------------------------
def test_fedamp_weights_are_the_papers_message_passing():
    """xi_ij = alpha exp(-||w_i - w_j||^2 / sigma) / sigma off the diagonal, xi_ii = 1 - sum_j xi_ij."""
    g = torch.Generator().manual_seed(0)
    up = {"a": torch.randn(4, 3, 2, generator=g, dtype=D), "b": torch.randn(4, 5, generator=g, dtype=D)}
    alpha, sigma = 0.3, 7.0
    xi = fedamp_weights(up, alpha, sigma)
    flat = torch.cat([up["a"].reshape(4, -1), up["b"]], 1)
    for i in range(4):
        for j in range(4):
            if i != j:
                d = float(((flat[i] - flat[j]) ** 2).sum())
                assert abs(float(xi[i, j]) - alpha * np.exp(-d / sigma) / sigma) < 1e-15
    assert torch.allclose(xi.sum(1), torch.ones(4, dtype=D), rtol=0, atol=1e-15)
    same = fedamp_weights({"a": torch.ones(3, 2, dtype=D)}, 0.5, 2.0)  # equal models: A'(0) = 1 / sigma
    assert torch.allclose(same, torch.tensor([[0.5, 0.25, 0.25], [0.25, 0.5, 0.25], [0.25, 0.25, 0.5]], dtype=D))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fedamp_two_rounds_golden(executor):
    """Round 1: every client takes two proximal steps from the initial model (anchor: the initial model, the u_i
    every client holds before any arrived); the server sends u_i = sum_j xi_ij w_j; round 2: two steps from u_i with
    the pull lambda / alpha toward u_i. Checked against plain gradient steps and the paper's xi."""
    alpha, sigma, lam, lr = 0.5, 2.0, 0.3, 0.5
    data = _three_clients(val=False)
    cfg = _cfg("fedamp", amp_alpha=alpha, amp_sigma=sigma, amp_lambda=lam)
    res = simulate_with(build_algorithm(cfg), data, _model(), executor(), 2, local_steps=2, batch_size=1,
                        progress=False)  # fmt: skip
    model, mu = _model(), lam / alpha
    w0 = {k: v.detach().clone() for k, v in model.named_parameters()}
    xs = [data.train.client(i) for i in range(3)]
    w1 = [_sgd(model, w0, x, y, 2, lr, mu, w0) for x, y in xs]

    def cloud(ws):
        flat = _flat(ws)
        d = ((flat[:, None, :] - flat[None, :, :]) ** 2).sum(-1)
        xi = alpha * torch.exp(-d / sigma) / sigma
        xi.fill_diagonal_(0)
        xi += torch.diag(1 - xi.sum(1))
        assert xi.min() > 0.01 and (xi - torch.diag(xi.diagonal())).max() > 0.01  # the mixing really mixes
        return [{k: sum(xi[i, j] * ws[j][k] for j in range(3)) for k in w0} for i in range(3)]

    u = cloud(w1)
    w2 = [_sgd(model, u[i], *xs[i], 2, lr, mu, u[i]) for i in range(3)]
    for got, want in zip(_final(res), w2):
        for k in want:
            assert torch.allclose(got[k], want[k], rtol=0, atol=1e-12), k
    for k, sent in res.state.sent.items():  # the u_i of round 2, sent for round 3
        assert torch.allclose(sent, torch.stack([ui[k] for ui in cloud(w2)]), rtol=0, atol=1e-12), k


def test_fedamp_small_sigma_is_local_training_with_a_prox_to_the_own_model():
    """sigma -> 0 gives xi_ij = 0 exactly for distinct models: u_i = w_i, and with every client selected FedAMP is
    local training pulled (lambda / alpha) toward the model each client starts the round from, bit for bit."""
    data = small_synthetic(n_clients=4, rows=80)
    cfg = RunConfig(n_clients=4, clients_per_round=4, rounds=4, local_steps=3, batch_size=8, lr=0.1, model="dnn",
                    algorithm="fedamp", amp_sigma=1e-9, amp_alpha=0.5, amp_lambda=0.5)  # fmt: skip

    def run(alg):
        model = build_model("dnn", data.input_shape, 10, (8,), seed=0, dtype=D)
        return simulate_with(alg, data, model, StackedExecutor(), 4, local_steps=3, batch_size=8, progress=False)

    fedamp = build_algorithm(cfg)
    local_prox = dataclasses.replace(fedamp, aggregate=no_aggregation, anchor="start", traces=())
    a, b = run(fedamp), run(local_prox)
    assert fedamp.local.mu == 1.0
    assert np.array_equal(a.metrics.test_loss, b.metrics.test_loss)
    for k in a.state.client_params:
        assert torch.equal(a.state.client_params[k], b.state.client_params[k])
    other = run(build_algorithm(cfg.replace(amp_sigma=1.0)))  # a sigma at which the clients do pass messages
    assert not np.array_equal(a.metrics.test_loss, other.metrics.test_loss)


def test_fedamp_refuses_bad_options():
    for bad in (dict(amp_alpha=0.0), dict(amp_sigma=0.0), dict(amp_lambda=-1.0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            _cfg("fedamp", **bad).validate()


# -- FedFomo -----------------------------------------------------------------------------------------------------
def test_fomo_weights_rule():
    """raw w_n = (L_i(own) - L_i(n)) / ||theta_n - theta_i||; mixing: positive parts normalised; all <= 0: zeros
    (keep own); distance 0, an empty slot or a client without validation rows (NaN loss): 0."""
    own = torch.tensor([1.0, 1.0, 1.0, float("nan")], dtype=D)
    their = torch.tensor([[0.5, 2.0], [1.5, 3.0], [0.5, 0.0], [0.1, 0.2]], dtype=D)
    dist = torch.tensor([[2.0, 1.0], [1.0, 1.0], [0.0, 4.0], [1.0, 1.0]], dtype=D)
    valid = torch.tensor([[True, True], [True, True], [True, False], [True, True]])
    raw, w = fomo_weights(own, their, dist, valid)
    assert torch.equal(raw, torch.tensor([[0.25, -1.0], [-0.5, -2.0], [0.0, 0.0], [0.0, 0.0]], dtype=D))
    assert torch.equal(w, torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], dtype=D))
    _, w = fomo_weights(torch.ones(1, dtype=D), torch.tensor([[0.5, 0.0]], dtype=D), torch.ones(1, 2, dtype=D),
                        torch.ones(1, 2, dtype=torch.bool))  # fmt: skip
    assert torch.allclose(w, torch.tensor([[1 / 3, 2 / 3]], dtype=D), rtol=0, atol=1e-15)


def test_fomo_choice_is_epsilon_greedy_over_the_uploaded_others():
    uploaded = np.array([True, True, False, True, True])
    p = np.array([[0, 3, 9, 1, 2], [5, 0, 9, 4, 4], [0] * 5, [1, 2, 9, 0, 3], [0, 0, 9, 0, 0]], dtype=float)
    greedy = choose(np.array([0, 1, 3]), uploaded, p, 2, 0.0, np.random.default_rng(0))
    assert greedy[0].tolist() == [1, 4] and greedy[2].tolist() == [4, 1]  # highest P first; 2 never (not uploaded)
    assert greedy[1, 0] == 0 and greedy[1, 1] in (3, 4)  # 3 and 4 tie: either, drawn at random
    ties = {tuple(choose(np.array([4]), uploaded, p, 2, 0.0, np.random.default_rng(s))[0]) for s in range(40)}
    assert len(ties) > 1 and all(2 not in t and 4 not in t for t in ties)  # all-zero row: random among the others
    few = choose(np.array([0]), np.array([True, True, False, False, False]), p, 3, 0.0, np.random.default_rng(0))
    assert few.tolist() == [[1, -1, -1]]  # fewer candidates than M: all of them
    explore = [choose(np.array([0]), uploaded, p, 1, 1.0, np.random.default_rng(s))[0, 0] for s in range(60)]
    assert set(explore) == {1, 3, 4}  # eps = 1: uniform over the candidates, whatever the affinities
    again = choose(np.array([0, 1, 3]), uploaded, p, 2, 0.5, np.random.default_rng(7))
    assert np.array_equal(again, choose(np.array([0, 1, 3]), uploaded, p, 2, 0.5, np.random.default_rng(7)))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fedfomo_two_rounds_golden(executor):
    """Round 1: nobody has uploaded, so each client trains its own (initial) model. Round 2: each downloads the two
    others (M = 2), weighs them on its validation rows, moves to theta_i + sum_n w_n (theta_n - theta_i), trains;
    the server's P holds the raw weights. Checked against plain gradient steps and the paper's rule."""
    lr = 0.5
    data = _three_clients(val=True)
    cfg = _cfg("fedfomo", fomo_m=2, fomo_eps=0.0)
    res = simulate_with(build_algorithm(cfg), data, _model(), executor(), 2, local_steps=2, batch_size=1,
                        progress=False)  # fmt: skip
    model = _model()
    w0 = {k: v.detach().clone() for k, v in model.named_parameters()}
    xs = [data.train.client(i) for i in range(3)]
    w1 = [_sgd(model, w0, x, y, 2, lr) for x, y in xs]
    p = torch.zeros(3, 3, dtype=D)
    w2, mixed = [], 0
    for i in range(3):
        vx, vy = data.val.client(i)
        with torch.no_grad():
            own = float(_loss(model, w1[i], vx, vy))
            others = [n for n in range(3) if n != i]
            raw = []
            for n in others:
                dist = float(torch.cat([(w1[n][k] - w1[i][k]).reshape(-1) for k in w0]).norm())
                raw.append((own - float(_loss(model, w1[n], vx, vy))) / dist)
                p[i, n] = raw[-1]
        pos = np.maximum(raw, 0)
        w = pos / pos.sum() if pos.sum() > 0 else pos
        mixed += int(((w > 0) & (w < 1)).any() or (w == 1).any())
        start = {k: w1[i][k] + sum(w[m] * (w1[n][k] - w1[i][k]) for m, n in enumerate(others)) for k in w0}
        w2.append(_sgd(model, start, *xs[i], 2, lr))
    assert mixed == 2 and (p < 0).any()  # clients 0 and 1 move, client 2 keeps its own (no model helps it)
    for got, want in zip(_final(res), w2):
        for k in want:
            assert torch.allclose(got[k], want[k], rtol=0, atol=1e-12), k
    aff = Affinity.of(res.state)
    assert torch.allclose(aff.p["P"], p, rtol=0, atol=1e-12)
    assert aff.seen["uploaded"].all()


def test_fedfomo_holds_its_validation_rows_out_of_training():
    """Without a validation split the engine moves fomo_val_frac of each client's training rows out of training,
    the same rows for every run (seed) on the data, and FedFomo weighs on exactly those; with one, FedFomo reads
    the data's own split and training keeps every training row."""
    data = small_synthetic(n_clients=4, rows=80)
    cfg = RunConfig(n_clients=4, clients_per_round=2, rounds=2, local_steps=2, batch_size=4, lr=0.1, model="dnn",
                    algorithm="fedfomo", fomo_val_frac=0.25)  # fmt: skip
    alg = build_algorithm(cfg)
    kept, held = method_validation(alg, data)
    assert held is not None and kept.val is None
    assert torch.equal(kept.train.sizes + held.sizes, data.train.sizes)
    assert torch.equal(held.sizes, (data.train.sizes * 0.25).floor().long())
    for i in range(4):  # the client's rows, split in two
        both = torch.cat([kept.train.client(i)[0], held.client(i)[0]])
        assert torch.equal(both[torch.argsort(both[:, 0])], (x := data.train.client(i)[0])[torch.argsort(x[:, 0])])
    assert method_validation(alg, data)[1] is held  # once per data: batched runs share it

    seen = []
    inner = alg.local_update

    def spy(work):
        seen.append((work.split, work.val))
        return inner(work)

    alg.local_update = spy
    model = build_model("dnn", data.input_shape, 10, (8,), seed=0, dtype=D)
    simulate_with(alg, data, model, LoopExecutor(), 2, local_steps=2, batch_size=4, seed=3, progress=False)
    assert all(split is kept.train and val is held for split, val in seen)

    with_val = dataclasses.replace(data, val=held)
    assert method_validation(alg, with_val) == (with_val, None)


def test_fedfomo_refuses_bad_options():
    for bad in (dict(fomo_m=0), dict(fomo_eps=1.5), dict(fomo_val_frac=0.0), dict(fomo_val_frac=1.0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            _cfg("fedfomo", **bad).validate()
