"""FedAvgM (Hsu et al. 2019): a hand-checkable server step and the FedAvg limit (both executors and resuming: the
contract tests over every registered algorithm in test_algorithms.py and test_checkpoint.py)."""

import numpy as np
import pytest
import torch
from helpers import simulate_with, small_synthetic

from fedlib import RunConfig
from fedlib.algorithms import build_algorithm
from fedlib.algorithms.fedavgm import ServerMomentum
from fedlib.core.state import init_state
from fedlib.executors import StackedExecutor
from fedlib.models.registry import build_model


def _state():
    return init_state(torch.nn.Linear(1, 1, bias=False), 2)


def _run(cfg, data, executor):
    model = build_model("dnn", data.input_shape, 10, (8,), seed=0, dtype=torch.float64)
    return simulate_with(
        build_algorithm(cfg),
        data,
        model,
        executor,
        cfg.rounds,
        local_steps=cfg.local_steps,
        batch_size=cfg.batch_size,
        progress=False,
    )


def test_fedavgm_golden():
    """w = 1, mean 0: Delta = 1, v = 1, w = 0; then mean -1: Delta = 1, v = 0.9 + 1 = 1.9, w = 0 - 1.9."""
    step, st = ServerMomentum(lr=1.0, momentum=0.9), _state()
    w = step({"w": torch.tensor([1.0], dtype=torch.float64)}, {"w": torch.tensor([0.0], dtype=torch.float64)}, st)
    assert w["w"].item() == 0.0
    w = step(w, {"w": torch.tensor([-1.0], dtype=torch.float64)}, st)
    assert w["w"].item() == pytest.approx(-1.9, abs=1e-15)


def test_fedavgm_without_momentum_is_fedavg():
    data = small_synthetic(n_clients=3, rows=60)
    base = RunConfig(n_clients=3, clients_per_round=2, rounds=3, local_steps=2, batch_size=4, lr=0.1, model="dnn")
    a = _run(base.replace(algorithm="fedavgm", server_momentum=0.0), data, StackedExecutor())
    b = _run(base, data, StackedExecutor())
    assert np.allclose(a.metrics.test_loss, b.metrics.test_loss, rtol=0, atol=1e-12)
    c = _run(base.replace(algorithm="fedavgm"), data, StackedExecutor())
    assert not np.allclose(c.metrics.test_loss, b.metrics.test_loss)  # momentum matters from round 2
