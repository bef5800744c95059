"""FedAdam (Reddi et al., ICLR 2021): hand-checkable server steps (both executors and resuming: the contract tests over
every registered algorithm in test_algorithms.py and test_checkpoint.py)."""

import pytest
import torch

from fedlib.algorithms.fedadam import ServerAdam
from fedlib.core.state import init_state


def _state():
    return init_state(torch.nn.Linear(1, 1, bias=False), 2)


def test_fedadam_golden():
    """tau = 0, eta = 0.1: x = 1, mean 0: Delta = -1, m = -0.1, v = 0.01, x = 1 - 0.1 = 0.9; then mean 0.9: Delta = 0,
    m = -0.09, v = 0.0099, x = 0.9 - 0.1 * 0.09 / sqrt(0.0099) = 0.80954660..."""
    step, st = ServerAdam(lr=0.1, beta1=0.9, beta2=0.99, tau=0.0), _state()
    x = step({"w": torch.tensor([1.0], dtype=torch.float64)}, {"w": torch.tensor([0.0], dtype=torch.float64)}, st)
    assert x["w"].item() == pytest.approx(0.9, abs=1e-15)
    x = step(x, {"w": torch.tensor([0.9], dtype=torch.float64)}, st)
    assert x["w"].item() == pytest.approx(0.9 - 0.1 * 0.09 / 0.0099**0.5, abs=1e-15)
    assert x["w"].item() == pytest.approx(0.8095466, abs=1e-7)
