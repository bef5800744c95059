"""pFedMe against a direct autograd transcription of its client loop (float64), and its server beta."""

import torch
import torch.nn.functional as F
from helpers import simulate_with, small_synthetic
from torch.func import functional_call

from fedlib.algorithms import build_algorithm
from fedlib.config.run import RunConfig
from fedlib.data.federated import sample_steps
from fedlib.executors import LoopExecutor, StackedExecutor
from fedlib.models.registry import build_model


def _reference_client(model, w0, x, y, plan_rows, lr, personal_lr, lam, K):
    """pFedMe Algorithm 1's client, step by step: K prox-SGD steps on theta per batch, then w moves toward theta."""
    w = {n: t.clone() for n, t in w0.items()}
    theta = {n: t.clone() for n, t in w0.items()}
    for rows in plan_rows:
        for _ in range(K):
            th = {n: t.clone().requires_grad_(True) for n, t in theta.items()}
            loss = F.cross_entropy(functional_call(model, th, (x[rows],)), y[rows])
            grads = torch.autograd.grad(loss, list(th.values()))
            theta = {n: (theta[n] - personal_lr * (g + lam * (theta[n] - w[n]))).detach() for n, g in zip(th, grads)}
        w = {n: w[n] - lr * lam * (w[n] - theta[n]) for n in w}
    return w, theta


def test_pfedme_one_round_matches_reference():
    data = small_synthetic(n_clients=3, rows=80)
    cfg = RunConfig(
        n_clients=3,
        clients_per_round=2,
        local_steps=3,
        batch_size=4,
        model="dnn",
        algorithm="pfedme",
        lr=0.05,
        personal_lr=0.1,
        lam=2.0,
        inner_steps=3,
        beta=0.5,
        seed=4,
    )
    model = build_model("dnn", (60,), 10, (6,), seed=0, dtype=torch.float64)
    w0 = {n: t.clone() for n, t in model.state_dict().items()}
    for executor in (StackedExecutor(), LoopExecutor()):
        res = simulate_with(
            build_algorithm(cfg), data, model, executor, 1, local_steps=3, batch_size=4, seed=4, progress=False
        )
        # same draws as the engine: the plan for all 3 clients from generator seed + 1, selection from rng(seed)
        plan = sample_steps(data.train, torch.arange(3), 3, 4, torch.Generator().manual_seed(5))
        import numpy as np

        sel = np.sort(np.random.default_rng(4).choice(3, size=2, replace=False))
        ws, thetas = zip(
            *[
                _reference_client(model, w0, data.train.x, data.train.y, plan.index[:, i], 0.05, 0.1, 2.0, 3)
                for i in range(3)
            ]
        )
        n = data.train.sizes.double()
        share = n[sel] / n[sel].sum()
        for name in w0:
            mean = sum(share[j] * ws[i][name] for j, i in enumerate(sel))
            assert torch.allclose(res.state.global_params[name], 0.5 * w0[name] + 0.5 * mean, atol=1e-12)
            for i in range(3):
                assert torch.allclose(res.state.extra["pfedme"].theta[name][i], thetas[i][name], atol=1e-12)
                assert torch.allclose(res.state.client_params[name][i], ws[i][name], atol=1e-12)
        assert not torch.allclose(thetas[0]["1.weight"], ws[0]["1.weight"])  # PM and local model differ
        assert res.metrics.gm_test_acc.notna().all() and res.metrics.test_acc.notna().all()
