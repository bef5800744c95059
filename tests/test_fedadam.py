"""FedAdam (Reddi et al., ICLR 2021): a hand-checkable server step, both executors."""

import numpy as np
import pytest
import torch
from conftest import small_synthetic

from fedlib import RunConfig
from fedlib.algorithms import build_algorithm
from fedlib.algorithms.fedadam import ServerAdam
from fedlib.executors import LoopExecutor, StackedExecutor
from fedlib.models import build_model
from fedlib.simulation import init_state, simulate


def _state():
    return init_state(torch.nn.Linear(1, 1, bias=False), 2)


def _run(cfg, data, executor):
    model = build_model("dnn", data.input_shape, 10, (8,), seed=0, dtype=torch.float64)
    return simulate(
        build_algorithm(cfg),
        data,
        model,
        executor,
        cfg.rounds,
        local_steps=cfg.local_steps,
        batch_size=cfg.batch_size,
        progress=False,
    )


def test_both_executors_agree():
    data = small_synthetic(n_clients=3, rows=60)
    cfg = RunConfig(
        n_clients=3,
        clients_per_round=2,
        rounds=3,
        local_steps=2,
        batch_size=4,
        lr=0.1,
        model="dnn",
        algorithm="fedadam",
    )
    a, b = _run(cfg, data, StackedExecutor()), _run(cfg, data, LoopExecutor())
    assert np.allclose(a.metrics.test_loss, b.metrics.test_loss, rtol=0, atol=1e-10)


def test_fedadam_golden():
    """tau = 0, eta = 0.1: x = 1, mean 0: Delta = -1, m = -0.1, v = 0.01, x = 1 - 0.1 = 0.9; then mean 0.9: Delta = 0,
    m = -0.09, v = 0.0099, x = 0.9 - 0.1 * 0.09 / sqrt(0.0099) = 0.80954660..."""
    step, st = ServerAdam(lr=0.1, beta1=0.9, beta2=0.99, tau=0.0), _state()
    x = step({"w": torch.tensor([1.0], dtype=torch.float64)}, {"w": torch.tensor([0.0], dtype=torch.float64)}, st)
    assert x["w"].item() == pytest.approx(0.9, abs=1e-15)
    x = step(x, {"w": torch.tensor([0.9], dtype=torch.float64)}, st)
    assert x["w"].item() == pytest.approx(0.9 - 0.1 * 0.09 / 0.0099**0.5, abs=1e-15)
    assert x["w"].item() == pytest.approx(0.8095466, abs=1e-7)
