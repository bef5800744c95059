"""AdaFL's selection stage: the fraction schedule (Figure 2, Table 2 costs), the attention scores (Eq. 1-2), sampling."""

import itertools

import numpy as np
import pytest
import torch
from helpers import simulate_with, small_synthetic
from hypothesis import given, settings
from hypothesis import strategies as st

from fedlib.algorithms import build_algorithm
from fedlib.config.run import RunConfig
from fedlib.core.metrics import communication_cost
from fedlib.core.selection import (
    AttentionSelection,
    ConstantFraction,
    StepFraction,
    attention_update,
    build_selection,
    clients_for,
    schedule_counts,
)
from fedlib.executors import LoopExecutor, StackedExecutor
from fedlib.models.registry import build_model


# -- the dynamic fraction ------------------------------------------------------------------------------
def test_step_fraction_paper_instance():
    """Figure 2: 0.1 -> 0.5 in F = 5 steps of Delta_T = T / 5 rounds."""
    s = StepFraction(0.1, 0.5, 5, 1000)
    got = {t: s.count(t, 100) for t in (1, 200, 201, 400, 401, 600, 601, 800, 801, 1000, 1200)}
    assert got == {1: 10, 200: 10, 201: 20, 400: 20, 401: 30, 600: 30, 601: 40, 800: 40, 801: 50, 1000: 50, 1200: 50}
    counts = schedule_counts(s, 1000, 100)
    assert counts.sum() == 200 * (10 + 20 + 30 + 40 + 50) and (np.diff(counts) >= 0).all()


@pytest.mark.parametrize(
    "horizon, rounds, cost",
    [
        (1000, 423, 6690),
        (1000, 761, 18440),
        (1000, 683, 15320),  # AdaFL rows of Table 2 (MNIST 90%, 91%; CIFAR 73%)
        (1500, 951, 20040),
        (1500, 1485, 44250),
        (1500, 1103, 26120),  # Dyn. FedAvg rows: "with T = 1500"
    ],
)
def test_paper_table2_costs_follow_from_the_schedule(horizon, rounds, cost):
    """AdaFL's Table 2 cost column is sum_{t <= T*} gamma^(t) M; our schedule reproduces every dynamic entry."""
    counts = schedule_counts(StepFraction(0.1, 0.5, 5, horizon), rounds, 100)
    assert communication_cost(counts) == cost


def test_constant_fraction_costs():
    assert communication_cost(schedule_counts(ConstantFraction(0.1), 939, 100)) == 9390  # Attn.-0.1, Table 2
    assert communication_cost(schedule_counts(ConstantFraction(0.5), 420, 100)) == 21000  # Attn.-0.5


def test_rounding_and_bad_schedules():
    assert clients_for(0.1 + 0.2, 100) == 30 and clients_for(0.001, 100) == 1 and clients_for(0.015, 100) == 2
    assert StepFraction(0.2, 0.2, 1, 10).fraction(7) == 0.2
    with pytest.raises(ValueError, match="must not decrease"):
        StepFraction(0.5, 0.1, 5, 100)
    with pytest.raises(ValueError, match="horizon"):
        StepFraction(0.1, 0.5, 5, 3)
    with pytest.raises(ValueError, match="set both to None"):
        RunConfig(fraction_schedule=(0.1, 0.5, 5)).validate()
    with pytest.raises(ValueError, match=r"fraction_schedule=\(0.1, 0.5\) must be"):
        RunConfig(clients_per_round=None, fraction_schedule=(0.1, 0.5)).validate()
    with pytest.raises(ValueError, match="selects no clients"):
        RunConfig(algorithm="local", selection="attention").validate()
    with pytest.raises(ValueError, match="attn_decay"):
        RunConfig(attn_decay=0.5).validate()


def test_schedule_horizon_defaults_to_rounds():
    cfg = RunConfig(clients_per_round=None, fraction_schedule=(0.1, 0.5, 5), rounds=10, n_clients=20).validate()
    sel = build_selection(cfg)
    assert [sel.count(20, t) for t in range(1, 11)] == [2, 2, 4, 4, 6, 6, 8, 8, 10, 10]
    sel = build_selection(cfg.replace(fraction_schedule=(0.1, 0.5, 5, 20)))
    assert [sel.count(20, t) for t in range(1, 11)] == [2, 2, 2, 2, 4, 4, 4, 4, 6, 6]


# -- the attention scores ------------------------------------------------------------------------------
def test_attention_update_golden_three_clients():
    """a = (0.2, 0.3, 0.5), S = {0, 2}, d = (1, 3), alpha = 0.9; the selected mass is 0.7:
    a_0 = 0.9 * 0.2 + 0.1 * 1/4 * 0.7 = 0.1975, a_2 = 0.9 * 0.5 + 0.1 * 3/4 * 0.7 = 0.5025, a_1 unchanged."""
    a = attention_update(np.array([0.2, 0.3, 0.5]), np.array([0, 2]), np.array([1.0, 3.0]), 0.9)
    assert np.allclose(a, [0.1975, 0.3, 0.5025], rtol=0, atol=1e-15) and np.isclose(a.sum(), 1.0)


def test_observe_measures_euclidean_distance_over_all_parameters():
    sel = AttentionSelection(np.array([1.0, 1.0, 2.0]), decay=0.5)
    assert np.allclose(sel.scores, [0.25, 0.25, 0.5])
    new_global = {"w": torch.zeros(2), "b": torch.zeros(1)}
    uploads = {"w": torch.tensor([[3.0, 0.0], [0.0, 0.0]]), "b": torch.tensor([[4.0], [1.0]])}  # d = (5, 1)
    d = sel.observe(np.array([1, 2]), uploads, new_global)
    assert np.allclose(d, [5.0, 1.0])
    # mass 0.75: a_1 = 0.125 + 0.5 * 5/6 * 0.75, a_2 = 0.25 + 0.5 * 1/6 * 0.75, a_0 unchanged
    assert np.allclose(sel.scores, [0.25, 0.125 + 0.3125, 0.25 + 0.0625])


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.integers(0, 10**6), st.floats(0.0, 0.99))
def test_scores_stay_a_probability_vector(m, seed, decay):
    rng = np.random.default_rng(seed)
    a = rng.dirichlet(np.ones(m))
    for _ in range(20):
        k = int(rng.integers(1, m + 1))
        s = np.sort(rng.choice(m, k, replace=False))
        before = a.copy()
        a = attention_update(a, s, rng.exponential(size=k), decay)
        assert np.isclose(a.sum(), 1.0, atol=1e-12) and (a > 0).all()
        rest = np.setdiff1d(np.arange(m), s)
        assert np.array_equal(a[rest], before[rest])  # unselected clients keep their scores


def _inclusion_probabilities(p, k):
    """P(i in S) under successive sampling without replacement (each draw from p renormalised), by enumeration."""
    incl = np.zeros(len(p))
    for order in itertools.permutations(range(len(p)), k):
        prob, left = 1.0, 1.0
        for i in order:
            prob *= p[i] / left
            left -= p[i]
        incl[list(order)] += prob
    return incl


@pytest.mark.parametrize("k", [1, 2])
def test_sampling_frequencies_match_the_scores(k):
    """K = 1: clients are drawn with frequency a_i. K = 2: with the inclusion probabilities of successive sampling."""
    p = np.array([0.1, 0.2, 0.3, 0.4])
    sel = AttentionSelection(p * 10, clients_per_round=k)
    rng = np.random.default_rng(0)
    draws = 40_000
    freq = np.zeros(4)
    for t in range(draws):
        freq[sel.select(t, 4, rng)] += 1
    freq /= draws
    want = p if k == 1 else _inclusion_probabilities(p, k)
    assert np.isclose(want.sum(), k)
    sd = np.sqrt(want * (1 - want) / draws)
    assert (np.abs(freq - want) < 5 * sd).all(), (freq, want)
    # the test has teeth: uniform selection would be far off
    assert (np.abs(np.full(4, k / 4) - want) > 10 * sd).any()


# -- end to end in the round loop ---------------------------------------------------------------------
def _adafl_run(executor, rounds=6, **kw):
    data = small_synthetic(n_clients=8, rows=160)
    cfg = RunConfig(
        n_clients=8,
        clients_per_round=None,
        fraction_schedule=(0.25, 0.5, 2),
        selection="attention",
        rounds=rounds,
        local_steps=3,
        batch_size=5,
        model="dnn",
        lr=0.1,
        momentum=0.5,
        **kw,
    ).validate()
    alg = build_algorithm(cfg, n_samples=data.train.sizes.numpy())
    model = build_model("dnn", data.input_shape, 10, (8,), seed=0, dtype=torch.float64)
    log = []
    res = simulate_with(
        alg,
        data,
        model,
        executor,
        rounds,
        local_steps=3,
        batch_size=5,
        progress=False,
        on_round=lambda t, sel, mixing, state: log.append((sel.copy(), alg.select.scores.copy())),
    )
    return data, alg, res, log


def test_adafl_in_the_round_loop():
    data, alg, res, log = _adafl_run(StackedExecutor())
    n = data.train.sizes.numpy()
    assert np.allclose(alg.select.history[0], n / n.sum())  # a^(1) = n
    assert [len(s) for s, _ in log] == [2, 2, 2, 4, 4, 4]
    assert list(res.metrics.uploads) == list(np.cumsum([2, 2, 2, 4, 4, 4]))
    prev = alg.select.history[0]
    for sel, scores in log:
        rest = np.setdiff1d(np.arange(8), sel)
        assert np.array_equal(scores[rest], prev[rest]) and np.isclose(scores.sum(), 1.0)
        if len(sel) == 2:
            # two equally weighted uploads: the new global is their midpoint, so d_1 = d_2 and Eq. 2 keeps the scores
            assert np.allclose(scores[sel], prev[sel], rtol=0, atol=1e-15)
        else:
            assert not np.allclose(scores[sel], prev[sel])
        prev = scores


def test_adafl_selection_same_on_both_executors():
    _, _, a, log_a = _adafl_run(StackedExecutor())
    _, _, b, log_b = _adafl_run(LoopExecutor())
    assert all(np.array_equal(x[0], y[0]) for x, y in zip(log_a, log_b))
    assert np.allclose(a.metrics.test_loss, b.metrics.test_loss, rtol=0, atol=1e-10)


@pytest.mark.parametrize("algorithm", ["fedprox", "scaffold", "fedmcsa", "pfedme"])
def test_attention_selection_composes_with_other_methods(algorithm):
    """AdaFL 'can be incorporated into any FL method': selection is a stage, the method's rest is untouched."""
    data = small_synthetic(n_clients=6, rows=120)
    cfg = RunConfig(
        n_clients=6,
        clients_per_round=3,
        selection="attention",
        rounds=3,
        local_steps=2,
        batch_size=4,
        model="dnn",
        lr=0.05,
        algorithm=algorithm,
    ).validate()
    alg = build_algorithm(cfg, n_samples=data.train.sizes.numpy())
    assert isinstance(alg.select, AttentionSelection)
    model = build_model("dnn", data.input_shape, 10, (8,), seed=0, dtype=torch.float64)
    res = simulate_with(alg, data, model, StackedExecutor(), 3, local_steps=2, batch_size=4, progress=False)
    assert list(res.metrics.uploads) == [3, 6, 9] and np.isfinite(res.metrics.test_loss).all()
    assert not np.allclose(alg.select.scores, alg.select.history[0])  # the scores moved


def test_adafl_cifar_setting_on_cifar_shaped_tensors():
    """AdaFL's CIFAR-10 cell (FedMix CNN, IID, lr 0.01 x 0.99^t, E epochs with momentum 0.5) end to end on generated
    3x32x32 images: CIFAR-10 itself is not available offline."""
    from fedlib.data.federated import FederatedData

    g = np.random.default_rng(0)
    xs = [g.normal(size=(12, 3, 32, 32)).astype(np.float32) for _ in range(4)]
    ys = [g.integers(0, 10, 12) for _ in range(4)]
    data = FederatedData.from_clients("cifar-shaped", xs, ys, [np.arange(12)] * 4, [np.arange(8, 12)] * 4, 10)
    cfg = RunConfig(
        n_clients=4,
        clients_per_round=None,
        fraction_schedule=(0.25, 0.5, 2),
        selection="attention",
        model="cnn",
        lr=0.01,
        lr_decay=0.99,
        momentum=0.5,
        local_epochs=1,
        local_steps=None,
        batch_size=5,
        rounds=2,
    ).validate()
    alg = build_algorithm(cfg, n_samples=data.train.sizes.numpy())
    model = build_model("cnn", (3, 32, 32), 10, seed=0)
    res = simulate_with(
        alg,
        data,
        model,
        StackedExecutor(),
        2,
        local_epochs=1,
        local_steps=None,
        batch_size=5,
        progress=False,
        lr_decay=0.99,
    )
    assert list(res.metrics.uploads) == [1, 3] and np.isfinite(res.metrics.test_loss).all()
    assert len(alg.select.history) == 2 and np.isclose(alg.select.scores.sum(), 1.0)


def test_progress_bar_shows_the_global_accuracy_without_client_test_splits(capsys):
    """AdaFL's setting keeps no client test split (train_frac = 1): the bar must show the global model's accuracy
    on the global test set, not the clients' (NaN) accuracy."""
    from fedlib.data.federated import FederatedData

    g = np.random.default_rng(0)
    x, y = g.normal(size=(160, 6)).astype(np.float32), g.integers(0, 3, 160)
    parts = [np.arange(40 * i, 40 * (i + 1)) for i in range(4)]
    data = FederatedData.from_parts(
        "no-client-test", x, y, parts, [np.arange(0)] * 4, 3, global_test=(x[:50], y[:50])
    ).to("cpu", torch.float64)
    cfg = RunConfig(n_clients=4, clients_per_round=2, rounds=2, local_steps=2, batch_size=5, lr=0.1).validate()
    alg = build_algorithm(cfg, n_samples=data.train.sizes.numpy())
    model = build_model("mlr", data.input_shape, 3, seed=0, dtype=torch.float64)
    res = simulate_with(alg, data, model, StackedExecutor(), 2, local_steps=2, batch_size=5, progress=True)
    assert res.metrics.test_acc.isna().all() and res.metrics.global_test_acc.notna().all()
    err = capsys.readouterr().err
    assert "acc=nan" not in err and f"acc={res.metrics.global_test_acc.iloc[-1]:.4f}" in err
    # and the run's summary (the experiments CLI's table) reports the global accuracy beside the clients' NaN
    summary = res.summary()
    assert np.isnan(summary["best_acc"]) and summary["best_global_acc"] == res.metrics.global_test_acc.max()
    assert summary["last10_global_acc"] == res.metrics.global_test_acc.mean()  # 2 rounds: the last 10 are all
