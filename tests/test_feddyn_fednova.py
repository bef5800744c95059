"""FedDyn and FedNova: rounds on 2-3 clients against hand computations and a plain torch loop of the papers' rules,
on both executors in float64; FedNova is FedAvg exactly when the clients take equal steps and normalises by the steps
a client really took (a plan that stops it early); bad options are refused before training. Both executors agreeing
on a DNN, resumption (g_k and h kept) and batched == solo are the contract tests' (test_algorithms, test_checkpoint,
test_batching), which cover every registered method."""

from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import simulate_with, small_synthetic

from fedlib import RunConfig
from fedlib.algorithms import build_algorithm
from fedlib.algorithms.fednova import normalizer
from fedlib.core.protocols import Selector
from fedlib.core.simulation import simulate
from fedlib.core.state import Schedule
from fedlib.data.federated import BatchPlan, FederatedData
from fedlib.data.synthetic import synthetic
from fedlib.executors import LoopExecutor, StackedExecutor
from fedlib.models.registry import build_model

EXECUTORS = [StackedExecutor, LoopExecutor]
W, B = "1.weight", "1.bias"  # the MLR's one Linear layer
# each client's training rows are copies of one row (x, y), so any draw of mini-batches is the same computation
ROWS = [((1.0, 0.0), 0), ((0.0, 1.0), 1), ((1.0, 1.0), 0)]


def _data(sizes):
    """Client i holds ``sizes[i]`` training copies of ROWS[i] and one test copy."""
    xs, ys, tr, te, at = [], [], [], [], 0
    for i, n in enumerate(sizes):
        x, y = ROWS[i]
        xs += [x] * (n + 1)
        ys += [y] * (n + 1)
        tr.append(np.arange(at, at + n))
        te.append(np.array([at + n]))
        at += n + 1
    return FederatedData.from_parts("rows", np.array(xs), np.array(ys), tr, te, 2)


def _zero_mlr():
    model = build_model("mlr", (2,), 2, dtype=torch.float64)
    for p in model.parameters():
        torch.nn.init.zeros_(p)
    return model


@dataclass
class Fixed(Selector):
    """Round t selects ``rounds[t - 1]``."""

    rounds: list

    def select(self, t, n_clients, rng):
        return np.array(self.rounds[t - 1])


def _sgd(theta, i, lr, steps, momentum=0.0, wd=0.0, extra=None):
    """Client i's model after ``steps`` steps of torch.optim.SGD from ``theta`` = (W, b) on its row, the loss plus
    ``extra(W, b)``."""
    x, y = ROWS[i]
    x, y = torch.tensor([x], dtype=torch.float64), torch.tensor([y])
    w, b = (t.clone().requires_grad_(True) for t in theta)
    opt = torch.optim.SGD([w, b], lr=lr, momentum=momentum, weight_decay=wd)
    for _ in range(steps):
        loss = F.cross_entropy(x @ w.T + b, y)
        if extra is not None:
            loss = loss + extra(w, b)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return w.detach(), b.detach()


def _close(got, want):
    assert torch.allclose(got, want, rtol=0, atol=1e-12), (got, want)


# -- FedDyn ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("executor", EXECUTORS)
def test_feddyn_first_round_by_hand(executor):
    """Two clients, both selected, one step of lr 1/2 from 0. At theta^0 with g = 0 the dynamic terms have no gradient,
    so the clients step as FedAvg's (test_algorithms' golden round): client 0 to W0 = [[1/4, 0], [-1/4, 0]],
    b0 = (1/4, -1/4); client 1 to W1 = [[0, -1/4], [0, 1/4]], b1 = -b0. Then g_k = -alpha theta_k,
    h = -(alpha/2)(theta_0 + theta_1), and theta^1 = (theta_0 + theta_1)/2 - h/alpha = theta_0 + theta_1:
    W = [[1/4, -1/4], [-1/4, 1/4]], b = 0 (FedAvg's uniform mean would be half of it)."""
    alpha = 0.1
    cfg = RunConfig(algorithm="feddyn", n_clients=2, clients_per_round=2, lr=0.5, dyn_alpha=alpha)
    res = simulate_with(build_algorithm(cfg), _data([1, 1]), _zero_mlr(), executor(), 1, local_steps=1,
                        batch_size=1, progress=False)  # fmt: skip
    t = lambda v: torch.tensor(v, dtype=torch.float64)
    q = 0.25
    assert torch.equal(res.state.global_params[W], t([[q, -q], [-q, q]]))
    assert torch.equal(res.state.global_params[B], t([0.0, 0.0]))
    st = res.state.extra["feddyn"]
    assert torch.equal(st.g[W], -alpha * t([[[q, 0.0], [-q, 0.0]], [[0.0, -q], [0.0, q]]]))
    assert torch.equal(st.g[B], -alpha * t([[q, -q], [-q, q]]))
    assert torch.equal(st.h[W], -alpha / 2 * t([[q, -q], [-q, q]])) and torch.equal(st.h[B], t([0.0, 0.0]))


def _feddyn_by_loop(sizes, rounds, alpha, lr, steps, momentum=0.0, wd=0.0):
    """Algorithm 1 as written, in plain torch: (theta, g, h) after the rounds (each a list of selected clients)."""
    m = len(sizes)
    theta = (torch.zeros(2, 2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
    g = [tuple(torch.zeros_like(t) for t in theta) for _ in range(m)]
    h = tuple(torch.zeros_like(t) for t in theta)
    for sel in rounds:
        new = {}
        for k in sel:
            prev, gk = theta, g[k]

            def dyn(w, b, prev=prev, gk=gk):  # - <g_k, theta> + alpha/2 ||theta - theta^{t-1}||^2
                lin = (gk[0] * w).sum() + (gk[1] * b).sum()
                return -lin + alpha / 2 * (((w - prev[0]) ** 2).sum() + ((b - prev[1]) ** 2).sum())

            new[k] = _sgd(theta, k, lr, steps, momentum, wd, dyn)
            g[k] = tuple(gj - alpha * (nj - tj) for gj, nj, tj in zip(g[k], new[k], theta))
        h = tuple(hj - alpha / m * sum(new[k][j] - theta[j] for k in sel) for j, hj in enumerate(h))
        theta = tuple(sum(new[k][j] for k in sel) / len(sel) - h[j] / alpha for j in range(2))
    return theta, g, h


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("sgd", [{}, {"momentum": 0.5, "weight_decay": 0.01}], ids=["sgd", "momentum-wd"])
def test_feddyn_rounds_equal_the_papers_rule(executor, sgd):
    """Three clients of 1, 3 and 2 rows, two selected a round (so m = 3 != |P_t| = 2), three local steps, four
    rounds: the global model, every g_k and h equal Algorithm 1 computed by a plain torch loop (autograd through the
    dynamic terms; torch.optim.SGD with the run's momentum and weight decay)."""
    alpha, lr, steps, rounds = 0.3, 0.5, 3, [[0, 1], [1, 2], [0, 2], [0, 1]]
    cfg = RunConfig(algorithm="feddyn", n_clients=3, clients_per_round=2, lr=lr, dyn_alpha=alpha, **sgd)
    alg = build_algorithm(cfg)
    alg.select = Fixed(rounds)
    res = simulate_with(alg, _data([1, 3, 2]), _zero_mlr(), executor(), len(rounds), local_steps=steps,
                        batch_size=1, progress=False)  # fmt: skip
    theta, g, h = _feddyn_by_loop([1, 3, 2], rounds, alpha, lr, steps, sgd.get("momentum", 0.0),
                                  sgd.get("weight_decay", 0.0))  # fmt: skip
    _close(res.state.global_params[W], theta[0])
    _close(res.state.global_params[B], theta[1])
    st = res.state.extra["feddyn"]
    for k in range(3):
        _close(st.g[W][k], g[k][0])
        _close(st.g[B][k], g[k][1])
    _close(st.h[W], h[0])
    _close(st.h[B], h[1])
    assert st.h[W].abs().sum() > 0.01  # the correction is not negligible here


def test_feddyn_state_is_all_zero_for_clients_never_selected_and_alpha_matters():
    """g_k moves only for the selected clients; another alpha gives another model."""
    rounds = [[0, 1], [0, 1]]
    out = []
    for alpha in (0.1, 0.2):
        cfg = RunConfig(algorithm="feddyn", n_clients=3, clients_per_round=2, lr=0.5, dyn_alpha=alpha)
        alg = build_algorithm(cfg)
        alg.select = Fixed(rounds)
        res = simulate_with(alg, _data([1, 3, 2]), _zero_mlr(), StackedExecutor(), 2, local_steps=2, batch_size=1,
                            progress=False)  # fmt: skip
        st = res.state.extra["feddyn"]
        assert not st.g[W][2].any() and not st.g[B][2].any() and st.g[W][0].any()
        out.append(res.state.global_params[W])
    assert not torch.allclose(out[0], out[1])


def test_feddyn_linear_term_covers_the_shared_parameters_only():
    """Parameters kept on the clients (here a DNN's head, as a declared local group) are never aggregated: they take
    no g_k and no h; the shared body does."""
    data = small_synthetic(n_clients=4, rows=40)
    cfg = RunConfig(algorithm="feddyn", n_clients=4, clients_per_round=2, lr=0.1, model="dnn", dyn_alpha=0.1)
    alg = build_algorithm(cfg)
    alg.local_groups = ("head",)
    model = build_model("dnn", data.input_shape, 10, (8,), seed=0, dtype=torch.float64)
    res = simulate_with(alg, data, model, StackedExecutor(), 2, local_steps=2, batch_size=4, progress=False)
    st = res.state.extra["feddyn"]
    heads = {n for n in res.state.global_params if not alg.shared(n)}
    assert heads and not heads & set(st.g) and set(st.g) == set(st.h) == set(res.state.global_params) - heads
    assert all(st.h[n].any() for n in st.h)


def test_feddyn_bad_options_are_refused():
    for bad, match in (
        (dict(dyn_alpha=0.0), r"RunConfig.dyn_alpha=0.0 must be in \(0, 10\]"),
        (dict(dyn_alpha=-1.0), r"RunConfig.dyn_alpha=-1.0 must be in \(0, 10\]"),
        (dict(dyn_alpha=11.0), r"RunConfig.dyn_alpha=11.0 must be in \(0, 10\]"),
        (dict(dyn_alpha=5.0, lr=0.5), r"lr \* dyn_alpha must be < 2"),
    ):
        with pytest.raises(ValueError, match=match):
            RunConfig(algorithm="feddyn", **bad).validate()
    RunConfig(algorithm="feddyn", dyn_alpha=1.0, lr=1.0).validate()


# -- FedNova --------------------------------------------------------------------------------------------------------
def test_fednova_normalizer_sums_the_momentum_weights():
    """a_i = sum_{k < tau} (1 - rho^{k+1}) / (1 - rho): 1, 1 + 1.5, 1 + 1.5 + 1.75 at rho = 1/2; tau without
    momentum; the recursion of the authors' optimiser (c = rho c + 1, a += c) for long runs."""
    tau = torch.tensor([0.0, 1.0, 2.0, 3.0, 300.0], dtype=torch.float64)
    assert normalizer(tau, 0.0).tolist() == tau.tolist()
    a = normalizer(tau, 0.5)
    assert a[:4].tolist() == [0.0, 1.0, 2.5, 4.25]
    c = s = 0.0
    for _ in range(300):
        c = 0.9 * c + 1
        s += c
    assert abs(float(normalizer(tau, 0.9)[4]) - s) < 1e-10 * s


def _nova_by_hand(theta, sizes, taus, lr, momentum, tau_eff):
    """theta - tau_eff sum_i p_i (theta - theta_i) / a_i over clients 0 and 1 from ``theta``, each taking taus[i]
    steps (plain torch), p_i = n_i / sum n."""
    p = [n / sum(sizes) for n in sizes]
    a = [float(normalizer(torch.tensor([float(t)]), momentum)[0]) for t in taus]
    eff = sum(pi * (t if tau_eff == "steps" else ai) for pi, t, ai in zip(p, taus, a))
    ups = [_sgd(theta, i, lr, taus[i], momentum) for i in range(2)]
    return tuple(theta[j] - eff * sum(p[i] * (theta[j] - ups[i][j]) / a[i] for i in range(2)) for j in range(2))


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fednova_unequal_steps_by_hand(executor):
    """Clients of 1 and 3 rows, one epoch of batch 1: tau = (1, 3), p = (1/4, 3/4), tau_eff = 1/4 + 9/4 = 5/2, so
    theta^1 = theta^0 + (5/8)(theta_0 - theta^0) + (5/8)(theta_1 - theta^0); from theta^0 = 0 that is
    (5/8)(theta_0 + theta_1), where FedAvg gives theta_0 / 4 + 3 theta_1 / 4. Client 0's step is the golden one of
    test_algorithms (W0 = [[1/4, 0], [-1/4, 0]], b0 = (1/4, -1/4)); client 1's three steps by plain torch. Then a
    second round from theta^1 against the rule by plain torch."""
    cfg = RunConfig(algorithm="fednova", n_clients=2, clients_per_round=2, lr=0.5)
    data = _data([1, 3])
    res = simulate_with(build_algorithm(cfg), data, _zero_mlr(), executor(), 1, local_steps=None, local_epochs=1,
                        batch_size=1, progress=False)  # fmt: skip
    zero = (torch.zeros(2, 2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
    q = 0.25
    w0, b0 = torch.tensor([[q, 0.0], [-q, 0.0]], dtype=torch.float64), torch.tensor([q, -q], dtype=torch.float64)
    w1, b1 = _sgd(zero, 1, 0.5, 3)
    _close(res.state.global_params[W], 0.625 * (w0 + w1))
    _close(res.state.global_params[B], 0.625 * (b0 + b1))
    avg = simulate_with(build_algorithm(cfg.replace(algorithm="fedavg")), data, _zero_mlr(), executor(), 1,
                        local_steps=None, local_epochs=1, batch_size=1, progress=False)  # fmt: skip
    _close(avg.state.global_params[W], 0.25 * w0 + 0.75 * w1)
    res2 = simulate_with(build_algorithm(cfg), data, _zero_mlr(), executor(), 2, local_steps=None, local_epochs=1,
                         batch_size=1, progress=False)  # fmt: skip
    want = _nova_by_hand(_nova_by_hand(zero, [1, 3], [1, 3], 0.5, 0.0, "steps"), [1, 3], [1, 3], 0.5, 0.0, "steps")
    _close(res2.state.global_params[W], want[0])
    _close(res2.state.global_params[B], want[1])


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("tau_eff", ["steps", "normalizer"])
def test_fednova_momentum_by_hand(executor, tau_eff):
    """Momentum 1/2, tau = (2, 6) (two epochs of 1 and 3 rows): a = (2.5, 1 + 1.5 + 1.75 + 1.875 + 1.9375 +
    1.96875); two rounds against the rule by plain torch, with tau_eff sum p_i tau_i or sum p_i a_i."""
    cfg = RunConfig(algorithm="fednova", n_clients=2, clients_per_round=2, lr=0.5, momentum=0.5, nova_tau_eff=tau_eff)
    res = simulate_with(build_algorithm(cfg), _data([1, 3]), _zero_mlr(), executor(), 2, local_steps=None,
                        local_epochs=2, batch_size=1, progress=False)  # fmt: skip
    zero = (torch.zeros(2, 2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
    want = _nova_by_hand(_nova_by_hand(zero, [1, 3], [2, 6], 0.5, 0.5, tau_eff), [1, 3], [2, 6], 0.5, 0.5, tau_eff)
    _close(res.state.global_params[W], want[0])
    _close(res.state.global_params[B], want[1])


def _dnn_run(cfg, data, executor=StackedExecutor):
    model = build_model("dnn", data.input_shape, 10, (8,), seed=0, dtype=torch.float64)
    return simulate_with(build_algorithm(cfg), data, model, executor(), cfg.rounds, local_steps=cfg.local_steps,
                         local_epochs=cfg.local_epochs, batch_size=cfg.batch_size, progress=False)  # fmt: skip


def _same_models(a, b):
    return all(torch.equal(a.state.global_params[k], b.state.global_params[k]) for k in a.state.global_params)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fednova_with_equal_steps_is_fedavg_exactly(executor):
    """Equal local steps (fixed ``local_steps``) without momentum: the same metrics and models as FedAvg, bit for
    bit; with momentum too under nova_tau_eff='normalizer', not under 'steps' (it moves about 1 - rho as far)."""
    data = small_synthetic(n_clients=5, rows=60)
    base = RunConfig(n_clients=5, clients_per_round=3, rounds=3, local_steps=4, batch_size=5, model="dnn", lr=0.1)
    avg, nova = _dnn_run(base, data, executor), _dnn_run(base.replace(algorithm="fednova"), data, executor)
    assert _same_models(avg, nova) and np.array_equal(avg.metrics.test_loss, nova.metrics.test_loss)
    mom = base.replace(momentum=0.5)
    avg = _dnn_run(mom, data, executor)
    assert _same_models(avg, _dnn_run(mom.replace(algorithm="fednova"), data, executor))  # 'normalizer', the default
    assert not _same_models(avg, _dnn_run(mom.replace(algorithm="fednova", nova_tau_eff="steps"), data, executor))


def test_fednova_differs_from_fedavg_when_steps_differ():
    """Epochs over clients of unequal sizes: unequal tau_i, so FedNova's model is not FedAvg's."""
    xs, ys = synthetic(n_clients=5, seed=0)
    cut = [40, 60, 80, 100, 120]
    xs, ys = [x[:r] for x, r in zip(xs, cut)], [y[:r] for y, r in zip(ys, cut)]
    tr, te = [np.arange(r - 10) for r in cut], [np.arange(r - 10, r) for r in cut]
    data = FederatedData.from_clients("unequal", xs, ys, tr, te, 10).to("cpu", torch.float64)
    base = RunConfig(n_clients=5, clients_per_round=3, rounds=2, local_steps=None, local_epochs=1, batch_size=4,
                     model="dnn", lr=0.1)  # fmt: skip
    assert not _same_models(_dnn_run(base, data), _dnn_run(base.replace(algorithm="fednova"), data))


@dataclass(frozen=True)
class Straggling(Schedule):
    """Client 1 of every round's plan stops after ``keep`` steps: its later steps are inactive (all padding)."""

    keep: int = 1

    def plan(self, layout, clients, batches_per_step, gen):
        plan = super().plan(layout, clients, batches_per_step, gen)
        active = torch.ones(plan.index.shape[:2], dtype=torch.bool) if plan.active is None else plan.active.clone()
        weight = torch.ones(plan.index.shape) if plan.weight is None else plan.weight.clone()
        active[self.keep :, 1] = False
        weight[self.keep :, 1] = 0.0
        return BatchPlan(plan.index, weight, active)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_fednova_normalises_by_the_steps_a_client_really_took(executor):
    """A plan that stops client 1 after 2 of its 5 configured steps: FedNova divides its change by a = 2, not 5
    (the rule by plain torch with tau = (5, 2)), whatever ``local_steps`` says."""
    cfg = RunConfig(algorithm="fednova", n_clients=2, clients_per_round=2, lr=0.5, local_steps=5, batch_size=1)
    res = simulate(build_algorithm(cfg), _data([1, 3]), _zero_mlr(), executor(), Straggling(5, None, 1, keep=2),
                   rounds=1)  # fmt: skip
    zero = (torch.zeros(2, 2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64))
    want = _nova_by_hand(zero, [1, 3], [5, 2], 0.5, 0.0, "steps")
    _close(res.state.global_params[W], want[0])
    _close(res.state.global_params[B], want[1])


def test_fednova_bad_option_is_refused():
    with pytest.raises(ValueError, match=r"nova_tau_eff='uniform' is not one of: normalizer, steps"):
        RunConfig(algorithm="fednova", nova_tau_eff="uniform").validate()
