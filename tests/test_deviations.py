"""The evaluation switches that reproduce the authors' code (docs/deviations.md): which model each one scores, on 2-3
clients computed by hand, on both executors.

- pFedMe ``personal_eval``: 'theta' scores the personal theta_i (the paper's PM), 'local' the local model w_i (what
  pFedMe's code's ``evaluate_personalized_model`` tests).
- Per-FedAvg ``adapt_eval``: 'paper' adapts with one SGD step at alpha on a training batch, 'code' with two SGD steps
  (alpha, then beta) on test batches (pFedMe's code's ``train_one_step``)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import simulate_with, small_synthetic
from torch.func import functional_call

from fedlib.algorithms import build_algorithm
from fedlib.algorithms.perfedavg import AdaptBeforeEval
from fedlib.config.run import RunConfig
from fedlib.core.state import init_state
from fedlib.data.federated import FederatedData, sample_steps
from fedlib.executors import LoopExecutor, StackedExecutor
from fedlib.models.registry import build_model

EXECUTORS = [StackedExecutor, LoopExecutor]


def _loss(model, p, x, y):
    return F.cross_entropy(functional_call(model, p, (x,)), y)


def _grad(model, p, x, y):
    q = {n: t.clone().requires_grad_(True) for n, t in p.items()}
    return dict(zip(q, torch.autograd.grad(_loss(model, q, x, y), list(q.values()))))


def _test_loss(model, p, data, i):
    """Client i's mean cross-entropy on its test rows under the model ``p``: what ``client_loss`` holds."""
    x, y = data.test.client(i)
    with torch.no_grad():
        return float(_loss(model, p, x, y))


def _pfedme_client(model, w0, x, y, plan_rows, lr, personal_lr, lam, k):
    """pFedMe's client by hand: K prox-SGD steps on theta per batch, then w moves toward theta; -> (w_i, theta_i)."""
    w = {n: t.clone() for n, t in w0.items()}
    theta = {n: t.clone() for n, t in w0.items()}
    for rows in plan_rows:
        for _ in range(k):
            g = _grad(model, theta, x[rows], y[rows])
            theta = {n: theta[n] - personal_lr * (g[n] + lam * (theta[n] - w[n])) for n in theta}
        w = {n: w[n] - lr * lam * (w[n] - theta[n]) for n in w}
    return w, theta


def _pfedme_cfg(algorithm, personal_eval):
    return RunConfig(n_clients=3, clients_per_round=2, local_steps=2, batch_size=4, model="dnn", algorithm=algorithm,
                     lr=0.05, personal_lr=0.1, lam=2.0, inner_steps=2, seed=4, personal_eval=personal_eval)  # fmt: skip


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("algorithm", ["pfedme", "pfedme+mcsa"])
@pytest.mark.parametrize("personal_eval", ["theta", "local"])
def test_pfedme_personal_eval_scores_theta_or_the_local_model(executor, algorithm, personal_eval):
    """One round on 3 clients (all train): each client's scored test loss is its hand-computed theta_i's
    ('theta') or its w_i's ('local'), and the two differ."""
    data = small_synthetic(n_clients=3, rows=80)
    model = build_model("dnn", (60,), 10, (6,), seed=0, dtype=torch.float64)
    w0 = {n: t.clone() for n, t in model.state_dict().items()}
    cfg = _pfedme_cfg(algorithm, personal_eval)
    res = simulate_with(build_algorithm(cfg), data, model, executor(), 1, local_steps=2, batch_size=4, seed=4,
                        progress=False)  # fmt: skip
    plan = sample_steps(data.train, torch.arange(3), 2, 4, torch.Generator().manual_seed(5))  # the engine's draws
    for i in range(3):
        w, theta = _pfedme_client(model, w0, data.train.x, data.train.y, plan.index[:, i], 0.05, 0.1, 2.0, 2)
        scored, other = (theta, w) if personal_eval == "theta" else (w, theta)
        assert res.client_loss[0, i] == pytest.approx(_test_loss(model, scored, data, i), abs=1e-12), i
        assert abs(res.client_loss[0, i] - _test_loss(model, other, data, i)) > 1e-6, i
    # 'local' keeps no theta_i: nothing scores it
    assert ("pfedme" in res.state.extra) == (personal_eval == "theta")


def test_pfedme_personal_eval_leaves_training_and_the_global_model_alone():
    data = small_synthetic(n_clients=3, rows=80)
    runs = {}
    for personal_eval in ("theta", "local"):
        model = build_model("dnn", (60,), 10, (6,), seed=0, dtype=torch.float64)
        cfg = _pfedme_cfg("pfedme", personal_eval)
        runs[personal_eval] = simulate_with(build_algorithm(cfg), data, model, StackedExecutor(), 2, local_steps=2,
                                            batch_size=4, seed=4, progress=False)  # fmt: skip
    a, b = runs["theta"], runs["local"]
    for n, t in a.state.global_params.items():
        assert torch.equal(t, b.state.global_params[n])
    assert a.metrics.gm_test_acc.tolist() == b.metrics.gm_test_acc.tolist()


def _perfedavg_cfg(algorithm, adapt_eval):
    return RunConfig(n_clients=2, clients_per_round=2, local_steps=2, batch_size=5, model="mlr", algorithm=algorithm,
                     lr=0.3, beta=0.2, seed=1, adapt_eval=adapt_eval)  # fmt: skip


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("algorithm", ["perfedavg", "perfedavg-hf"])
@pytest.mark.parametrize("adapt_eval", ["paper", "code"])
def test_perfedavg_adapt_eval_scores_the_adapted_global_model(executor, algorithm, adapt_eval):
    """One round on 2 clients, then each client's scored test loss is that of the global model adapted by hand:
    'paper', w - alpha g(w; one training batch); 'code', u = w - alpha g(w; T1), then u - beta g(u; T2), T1 and T2
    drawn from the client's test rows, both from the run's evaluation stream (seed + 2)."""
    data = small_synthetic(n_clients=2, rows=60)
    model = build_model("mlr", (60,), 10, seed=0, dtype=torch.float64)
    cfg = _perfedavg_cfg(algorithm, adapt_eval)
    res = simulate_with(build_algorithm(cfg), data, model, executor(), 1, local_steps=2, batch_size=5, seed=1,
                        progress=False)  # fmt: skip
    w = res.state.global_params
    split = data.train if adapt_eval == "paper" else data.test
    steps = 1 if adapt_eval == "paper" else 2
    plan = sample_steps(split, torch.arange(2), steps, 5, torch.Generator().manual_seed(1 + 2))
    for i in range(2):
        rows = plan.index[:, i]
        lo, hi = int(split.offsets[i]), int(split.offsets[i] + split.sizes[i])
        assert ((rows >= lo) & (rows < hi)).all()  # the client's own rows of that split
        p = dict(w)
        for s, rate in zip(range(steps), (0.3, 0.2)):
            g = _grad(model, p, split.x[rows[s]], split.y[rows[s]])
            p = {n: p[n] - rate * g[n] for n in p}
        assert res.client_loss[0, i] == pytest.approx(_test_loss(model, p, data, i), abs=1e-12), i
        assert res.client_loss[0, i] != pytest.approx(_test_loss(model, w, data, i), abs=1e-6)  # it did adapt


def test_perfedavg_adapt_eval_code_is_two_plain_steps_on_test_rows():
    """The hook alone on 2 clients: the code's reading takes an alpha step and a beta step, the second from the
    first's result (no meta-gradient), both on the clients' test rows; the paper's, one alpha step on training rows."""
    data = small_synthetic(n_clients=2, rows=40)
    model = build_model("mlr", (60,), 10, seed=0, dtype=torch.float64)
    state = init_state(model, 2)
    AdaptBeforeEval(0.5, 4, beta=0.25, mode="code")(StackedExecutor(), model, state, data,
                                                     torch.Generator().manual_seed(0))  # fmt: skip
    plan = sample_steps(data.test, torch.arange(2), 2, 4, torch.Generator().manual_seed(0))
    for i in range(2):
        u = _grad(model, state.global_params, data.test.x[plan.index[0, i]], data.test.y[plan.index[0, i]])
        u = {n: state.global_params[n] - 0.5 * u[n] for n in u}
        g = _grad(model, u, data.test.x[plan.index[1, i]], data.test.y[plan.index[1, i]])
        for n in u:
            assert torch.allclose(state.extra["perfedavg"].adapted[n][i], u[n] - 0.25 * g[n], atol=1e-12)


def test_perfedavg_adapt_eval_code_refuses_data_without_test_rows():
    xs = [np.random.default_rng(i).normal(size=(10, 60)) for i in range(2)]
    ys = [np.arange(10) % 10 for _ in range(2)]
    data = FederatedData.from_clients("no-test", xs, ys, [np.arange(10)] * 2, [np.arange(0)] * 2, 10)
    data = data.to("cpu", torch.float64)
    model = build_model("mlr", (60,), 10, seed=0, dtype=torch.float64)
    state = init_state(model, 2)
    with pytest.raises(ValueError, match="adapt_eval='code' adapts on the clients' test rows"):
        AdaptBeforeEval(0.5, 4, 0.25, "code")(StackedExecutor(), model, state, data, torch.Generator())


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(algorithm="pfedme", personal_eval="w"), "personal_eval=.w. is not one of: theta, local"),
        (dict(algorithm="perfedavg", adapt_eval="test"), "adapt_eval=.test. is not one of: paper, code"),
        (dict(algorithm="fedavg", personal_eval="local"), "personal_eval set but algorithm='fedavg' does not use it"),
        (dict(algorithm="pfedme", adapt_eval="code"), "adapt_eval set but algorithm='pfedme' does not use it"),
    ],
)
def test_bad_switches_are_refused_before_training(change, message):
    with pytest.raises(ValueError, match=message):
        RunConfig(**change).validate()


def test_the_switches_at_their_defaults_leave_the_keys_alone():
    for alg, switch, default, other in [
        ("pfedme", "personal_eval", "theta", "local"),
        ("pfedme+mcsa", "personal_eval", "theta", "local"),
        ("perfedavg", "adapt_eval", "paper", "code"),
        ("perfedavg-hf", "adapt_eval", "paper", "code"),
    ]:
        old = RunConfig(algorithm=alg)
        assert RunConfig(algorithm=alg, **{switch: default}).key() == old.key() and switch not in old.changed()
        new = RunConfig(algorithm=alg, **{switch: other})
        assert new.key() != old.key() and new.changed()[switch] == other


def _simulate(cfg, data, executor=None, stop=None):
    model = build_model(cfg.model.name, data.input_shape, 10, (8,), seed=cfg.seed, dtype=data.train.x.dtype)
    return simulate_with(build_algorithm(cfg), data, model, executor or StackedExecutor(), cfg.rounds,
                         local_steps=cfg.local_steps, batch_size=cfg.batch_size, seed=cfg.seed, progress=False,
                         stop=stop)  # fmt: skip


def test_switched_runs_batched_with_their_defaults_equal_their_solo_runs():
    """Runs of both readings trained together (one stacked model, ``run_together``) give each its solo numbers: the
    code's Per-FedAvg adapts on the test split while its neighbour adapts on the training split."""
    from fedlib.runs.batching import run_together

    data = small_synthetic(n_clients=4, rows=60)
    base = dict(n_clients=4, clients_per_round=2, rounds=3, local_steps=2, batch_size=5, model="dnn", lr=0.1)
    cfgs = [RunConfig(algorithm="perfedavg", beta=0.3, adapt_eval=a, **base) for a in ("paper", "code")]
    cfgs += [RunConfig(algorithm="pfedme", personal_eval=p, **base) for p in ("theta", "local")]
    solo = [_simulate(c, data) for c in cfgs]
    together, _ = run_together([lambda ex, stop, c=c: _simulate(c, data, ex, stop) for c in cfgs], StackedExecutor())
    for a, b in zip(solo, together):
        assert np.array_equal(a.client_loss, b.client_loss) and np.array_equal(a.client_acc, b.client_acc)
    assert not np.array_equal(solo[0].client_loss, solo[1].client_loss)
    assert not np.array_equal(solo[2].client_loss, solo[3].client_loss)
