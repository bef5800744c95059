import math

import numpy as np
import torch
from conftest import small_synthetic

from fedlib import metrics as M
from fedlib.models import build_model


def test_means_golden():
    acc = np.array([1.0, 0.5, 0.0])
    n = np.array([2, 2, 4])
    assert M.weighted_mean(acc, n) == 3 / 8  # (2 + 1 + 0) correct of 8
    assert M.unweighted_mean(acc, n) == 0.5  # (1 + 0.5 + 0) / 3
    assert M.unweighted_mean(np.array([1.0, np.nan]), np.array([3, 0])) == 1.0  # client without data ignored


def test_best_last_rounds_cost():
    s = [0.1, 0.5, 0.3, 0.9, 0.92, 0.91, 0.95, 0.96]
    assert M.best(s) == 0.96
    assert math.isclose(M.last_mean(s, 2), 0.955)
    # windows of 5: means are .544, .706, .796, .928 -> first above 0.9 ends at round 8
    assert M.rounds_to_target(s, 0.9) == 8
    assert M.rounds_to_target(s, 0.7) == 6
    assert M.rounds_to_target(s, 0.99) is None
    assert M.rounds_to_target(s[:4], 0.0) is None  # no full window yet
    assert M.communication_cost([10, 10, 20, 20]) == 60
    assert M.communication_cost([10, 10, 20, 20], upto=3) == 40


def test_evaluate_global_equals_per_client():
    data = small_synthetic(n_clients=4, rows=60)
    model = build_model("dnn", (60,), 10, (8,), seed=0, dtype=torch.float64)
    g = model.state_dict()
    c1, l1, n1 = M.evaluate(model, g, data.test, per_client=False, chunk=7)  # chunks cross client borders
    stacked = {k: v.unsqueeze(0).repeat(4, *[1] * v.dim()) for k, v in g.items()}
    c2, l2, n2 = M.evaluate(model, stacked, data.test, per_client=True)
    assert np.array_equal(c1, c2) and np.allclose(l1, l2) and np.array_equal(n1, n2)
    assert np.array_equal(n1, [15, 15, 15, 15])
    x, y = data.test.client(2)
    assert c1[2] == (model(x).argmax(1) == y).sum().item()
