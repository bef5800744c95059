"""Per-FedAvg (FO and HF) against a direct autograd transcription with the exact Hessian-vector product."""

import torch
import torch.nn.functional as F
from helpers import simulate_with, small_synthetic
from torch.func import functional_call

from fedlib.algorithms import build_algorithm
from fedlib.algorithms.perfedavg import AdaptBeforeEval
from fedlib.config.run import RunConfig
from fedlib.core.state import init_state
from fedlib.data.federated import sample_steps
from fedlib.executors import StackedExecutor
from fedlib.models.registry import build_model


def _loss(model, p, x, y):
    return F.cross_entropy(functional_call(model, p, (x,)), y)


def _reference(model, w0, x, y, batches, alpha, beta, hf):
    w = {n: t.clone() for n, t in w0.items()}
    per = 3 if hf else 2
    for r in range(len(batches) // per):
        d1, d2 = batches[r * per], batches[r * per + 1]
        wp = {n: t.clone().requires_grad_(True) for n, t in w.items()}
        g1 = torch.autograd.grad(_loss(model, wp, x[d1], y[d1]), list(wp.values()))
        wt = {n: (w[n] - alpha * g).detach().requires_grad_(True) for n, g in zip(w, g1)}
        g2 = dict(zip(w, torch.autograd.grad(_loss(model, wt, x[d2], y[d2]), list(wt.values()))))
        if hf:  # exact H(w; D'') g2 by double backward
            d3 = batches[r * per + 2]
            wp = {n: t.clone().requires_grad_(True) for n, t in w.items()}
            gw = torch.autograd.grad(_loss(model, wp, x[d3], y[d3]), list(wp.values()), create_graph=True)
            hv = dict(zip(w, torch.autograd.grad(gw, list(wp.values()), grad_outputs=[g2[n] for n in w])))
            g2 = {n: g2[n] - alpha * hv[n] for n in w}
        w = {n: (w[n] - beta * g2[n]).detach() for n in w}
    return w


def _check(algorithm, hf, atol):
    data = small_synthetic(n_clients=3, rows=80)
    cfg = RunConfig(
        n_clients=3,
        clients_per_round=3,
        local_steps=2,
        batch_size=5,
        model="dnn",
        algorithm=algorithm,
        lr=0.1,
        beta=0.3,
        seed=2,
        **({"hf_delta": 1e-5} if hf else {}),
    )
    model = build_model("dnn", (60,), 10, (6,), seed=0, dtype=torch.float64)
    w0 = {n: t.clone() for n, t in model.state_dict().items()}
    res = simulate_with(
        build_algorithm(cfg), data, model, StackedExecutor(), 1, local_steps=2, batch_size=5, seed=2, progress=False
    )
    plan = sample_steps(data.train, torch.arange(3), 2 * (3 if hf else 2), 5, torch.Generator().manual_seed(3))
    for i in range(3):
        ref = _reference(model, w0, data.train.x, data.train.y, plan.index[:, i], 0.1, 0.3, hf)
        for n in ref:
            assert torch.allclose(res.state.client_params[n][i], ref[n], atol=atol), (n, i)
    return res


def test_perfedavg_fo_matches_reference():
    res = _check("perfedavg", hf=False, atol=1e-12)
    assert res.metrics.gm_test_acc.notna().all()


def test_perfedavg_hf_matches_exact_hessian_vector_product():
    _check("perfedavg-hf", hf=True, atol=1e-8)  # finite difference with delta = 1e-5 vs exact HVP


def test_adaptation_uses_training_rows_only_and_one_step():
    data = small_synthetic(n_clients=2, rows=40)
    model = build_model("mlr", (60,), 10, seed=0, dtype=torch.float64)
    state = init_state(model, 2)
    AdaptBeforeEval(alpha=0.5, batch_size=4)(StackedExecutor(), model, state, data, torch.Generator().manual_seed(0))
    plan = sample_steps(data.train, torch.arange(2), 1, 4, torch.Generator().manual_seed(0))
    for i in range(2):
        rows = plan.index[0, i]
        assert ((rows >= data.train.offsets[i]) & (rows < data.train.offsets[i] + data.train.sizes[i])).all()
        p = {n: t.clone().requires_grad_(True) for n, t in state.global_params.items()}
        g = torch.autograd.grad(_loss(model, p, data.train.x[rows], data.train.y[rows]), list(p.values()))
        for (n, t), gn in zip(state.global_params.items(), g):
            assert torch.allclose(state.extra["perfedavg"].adapted[n][i], t - 0.5 * gn, atol=1e-12)
