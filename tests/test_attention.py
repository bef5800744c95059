"""FedMCSA / HeurFedAMP attention: hand-checkable weights on 3 clients, limits, and the Table 2 equivalences."""

import math

import numpy as np
import pytest
import torch
from helpers import simulate_with, small_synthetic

from fedlib.algorithms import build_algorithm
from fedlib.config.run import RunConfig
from fedlib.core import callbacks
from fedlib.core.attention import cosine_matrix, heurfedamp_weights, mcsa_weights
from fedlib.core.stages import Algorithm, UniformSelection, WeightedMean, mix
from fedlib.core.state import init_state, start_models
from fedlib.executors import LocalSGD, StackedExecutor
from fedlib.models.registry import build_model

# three clients' copies of one component: cos = [[1, 0, -1], [0, 1, 0], [-1, 0, 1]]
P = {"w": torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)}
LN2 = math.log(2)  # exp(sigma cos) in {2, 1, 1/2}
F = lambda *v: torch.tensor(v, dtype=torch.float64)


def test_mcsa_weights_golden():
    """Row i: exp(ln2 cos(i, k)) / sum_h exp(ln2 cos(i, h)): (2, 1, 1/2)/3.5, (1, 2, 1)/4, (1/2, 1, 2)/3.5."""
    a = mcsa_weights(P, LN2)["w"]
    assert torch.allclose(a, F([4 / 7, 2 / 7, 1 / 7], [1 / 4, 1 / 2, 1 / 4], [1 / 7, 2 / 7, 4 / 7]))
    w = mix({"w": a}, P)["w"]
    assert torch.allclose(w[0], F(3 / 7, 2 / 7))  # 4/7 (1,0) + 2/7 (0,1) + 1/7 (-1,0)
    assert torch.allclose(a.sum(1), torch.ones(3, dtype=torch.float64))  # Eq. (6): convex combinations


def test_mcsa_is_per_component():
    two = {"w": P["w"], "b": F([1.0], [1.0], [1.0])}  # identical biases: cos 1 everywhere -> uniform
    a = mcsa_weights(two, LN2)
    assert torch.allclose(a["b"], torch.full((3, 3), 1 / 3, dtype=torch.float64))
    assert not torch.allclose(a["w"], a["b"])


def test_mcsa_by_layer_golden():
    """The paper's text: a layer is one component. Weight rows P and biases (1, 1, 1) concatenated: (1, 0, 1),
    (0, 1, 1), (-1, 0, 1), cos = [[1, 1/2, 0], [1/2, 1, 1/2], [0, 1/2, 1]]; at sigma = 2 ln 2, exp(sigma cos) =
    4^cos, so rows (4, 2, 1)/7, (2, 4, 2)/8, (1, 2, 4)/7, for the weight and the bias alike. Per tensor the identical
    biases would get the mean and the weights P's golden matrix at this sigma."""
    layer = {"fc.weight": P["w"], "fc.bias": F([1.0], [1.0], [1.0]), "out.weight": P["w"]}
    a = mcsa_weights(layer, 2 * LN2, by_layer=True)
    expected = F([4 / 7, 2 / 7, 1 / 7], [1 / 4, 1 / 2, 1 / 4], [1 / 7, 2 / 7, 4 / 7])
    assert torch.allclose(a["fc.weight"], expected) and torch.allclose(a["fc.bias"], expected)
    assert torch.equal(a["out.weight"], mcsa_weights({"w": P["w"]}, 2 * LN2)["w"])  # a layer of one tensor: as before
    apart = mcsa_weights(layer, 2 * LN2)
    assert torch.allclose(apart["fc.bias"], torch.full((3, 3), 1 / 3, dtype=torch.float64))
    assert not torch.allclose(apart["fc.weight"], expected)
    sized = mcsa_weights(layer, 2 * LN2, n_samples=F(10, 10, 20), by_layer=True)  # the code's reweighting on top
    assert torch.allclose(sized["fc.bias"][1], F(1, 2, 2) / 5)  # (1/4, 1/2, 1/4) * (1, 1, 2), renormalised


@pytest.mark.parametrize("algorithm", ["fedmcsa", "fedavg+mcsa", "pfedme+mcsa"])
def test_component_layer_reaches_the_server(algorithm):
    """``component='layer'`` on each method with FedMCSA's attention gives the per-layer matrices; the default the
    per-tensor ones (every stored run's), and the default is no change of key."""
    cfg = RunConfig(algorithm=algorithm, n_clients=3, clients_per_round=3)
    up = {"fc.weight": P["w"], "fc.bias": F([1.0], [1.0], [1.0])}
    sizes, clients = F(10, 10, 20), np.arange(3)
    for component, by_layer in (("tensor", False), ("layer", True)):
        alg = build_algorithm(cfg.replace(component=component), n_samples=np.array([10, 10, 20]))
        got = alg.aggregate(up, sizes, clients).to_personal
        want = mcsa_weights(up, 50.0, by_layer=by_layer)
        assert all(torch.equal(got[n], want[n]) for n in up)
    assert cfg.replace(component="tensor").key() == cfg.key() != cfg.replace(component="layer").key()


def test_mcsa_limits():
    assert torch.allclose(mcsa_weights(P, 0.0)["w"], torch.full((3, 3), 1 / 3, dtype=torch.float64))  # sigma=0: mean
    assert torch.equal(mcsa_weights(P, 1e6)["w"], torch.eye(3, dtype=torch.float64))  # sigma->inf: own model


def test_mcsa_authors_code_reweighting_golden():
    """Rows times data shares (1, 1, 2)/4, renormalised: row 1 = (1/4, 1/2, 1/4) * (1, 1, 2) / 1.25."""
    a = mcsa_weights(P, LN2, n_samples=F(10, 10, 20))["w"]
    assert torch.allclose(a[1], F(0.2, 0.4, 0.4))
    assert torch.allclose(a[0], F(4, 2, 2) / 8)


def test_heurfedamp_weights_golden():
    """Self weight 1/2; the rest split over the others by exp(ln2 cos): row 0 others (1, 1/2) -> (1/3, 1/6)."""
    a = heurfedamp_weights(P, LN2, 0.5)
    assert torch.allclose(a, F([0.5, 1 / 3, 1 / 6], [0.25, 0.5, 0.25], [1 / 6, 1 / 3, 0.5]))
    assert torch.equal(heurfedamp_weights({"w": P["w"][:1]}, LN2, 0.5), torch.ones(1, 1, dtype=torch.float64))
    both = {"w": P["w"], "b": F([0.0], [0.0], [0.0])}  # zero biases add nothing to the whole-model cosine
    assert torch.allclose(heurfedamp_weights(both, LN2, 0.5), a)


def test_cosine_of_zero_row_is_zero():
    c = cosine_matrix(torch.tensor([[0.0, 0.0], [1.0, 0.0]]))
    assert torch.equal(c, F([0.0, 0.0], [0.0, 1.0]))


def test_start_and_anchor_follow_algorithm_1():
    """A client starts from W_i only if W_i arrived since it last trained; its anchor is the last W_i received."""
    model = build_model("mlr", (2,), 2, seed=0, dtype=torch.float64)
    state = init_state(model, 3)
    for n in state.sent:
        state.sent[n] += 1.0  # W_i differ from the clients' own models
    state.fresh[:] = torch.tensor([True, False, True])
    alg = build_algorithm(RunConfig(algorithm="fedmcsa"))
    start, anchor = start_models(alg, state, torch.arange(3))
    n = "1.bias"
    assert torch.equal(start[n][0], state.sent[n][0]) and torch.equal(start[n][1], state.client_params[n][1])
    assert all(torch.equal(anchor[k], state.sent[k]) for k in anchor)  # W_local, received or not
    fedprox = build_algorithm(RunConfig(algorithm="fedprox", mu=1.0))
    s2, a2 = start_models(fedprox, state, torch.arange(3))
    assert all(torch.equal(s2[k], a2[k]) for k in s2)  # FedProx pulls toward its start


def _simulate(cfg, data, alg=None, on_round=None, rounds=4):
    model = build_model(cfg.model.name, data.input_shape, 10, (8,), seed=0, dtype=torch.float64)
    return simulate_with(
        alg or build_algorithm(cfg),
        data,
        model,
        StackedExecutor(),
        rounds,
        local_steps=cfg.local_steps,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        progress=False,
        on_round=on_round,
    )


def test_minus_mcsa_lambda0_full_participation_is_fedavg_equal_weights():
    data = small_synthetic(n_clients=4)
    cfg = RunConfig(
        n_clients=4,
        clients_per_round=4,
        local_steps=3,
        batch_size=5,
        model="dnn",
        lr=0.1,
        algorithm="fedmcsa-mcsa",
        lam=0.0,
    )
    assert_is_fedavg(cfg, data, "uniform")


def assert_is_fedavg(cfg, data, weighting: str) -> None:
    """``cfg`` (every client sampled, no prox) trains as FedAvg with ``WeightedMean(weighting)``: the clients' trained
    models coincide round after round, and what each is sent is FedAvg's global model."""
    a = _simulate(cfg, data)
    n = cfg.get("n_clients")
    fedavg = Algorithm("fedavg", UniformSelection(n), LocalSGD(cfg.get("lr")), WeightedMean(weighting))
    b = _simulate(cfg, data, alg=fedavg)
    for k in a.state.client_params:
        assert torch.allclose(a.state.client_params[k], b.state.client_params[k], atol=1e-12)
        assert torch.allclose(a.state.sent[k], b.state.global_params[k].expand_as(a.state.sent[k]), atol=1e-12)


def test_fedmcsa_sends_attention_models_to_sampled_only():
    data = small_synthetic(n_clients=6)
    cfg = RunConfig(
        n_clients=6,
        clients_per_round=3,
        local_steps=3,
        batch_size=5,
        model="dnn",
        lr=0.1,
        algorithm="fedmcsa",
        sigma=5.0,
    )
    seen = []

    def check(t, sel, mixing, state):
        up = {n: state.client_params[n][torch.as_tensor(sel)] for n in state.client_params}
        expected = mix(mcsa_weights(up, 5.0), up)
        for n in up:
            assert torch.allclose(state.sent[n][torch.as_tensor(sel)], expected[n], atol=1e-12)
        assert state.fresh.tolist() == [i in set(sel.tolist()) for i in range(6)]
        seen.append(sel.tolist())

    res = _simulate(cfg, data, on_round=check)
    assert len(seen) == 4 and all(len(s) == 3 for s in seen)
    assert res.metrics.uploads.tolist() == [3, 6, 9, 12]


def test_fedmcsa_high_sigma_keeps_clients_apart():
    """sigma -> inf: every W_i is the client's own model, so clients never mix (the local-training limit)."""
    data = small_synthetic(n_clients=4)
    cfg = RunConfig(
        n_clients=4,
        clients_per_round=4,
        local_steps=3,
        batch_size=5,
        model="mlr",
        lr=0.1,
        algorithm="fedmcsa",
        sigma=1e6,
    )
    res = _simulate(cfg, data)
    for n in res.state.client_params:
        assert torch.equal(res.state.sent[n], res.state.client_params[n])


def test_authors_code_switch_drops_prox_and_reweights():
    alg = build_algorithm(RunConfig(algorithm="fedmcsa", mcsa_code=True))
    assert alg.local.mu == 0.0 and alg.aggregate.by_data_size
    alg = build_algorithm(RunConfig(algorithm="fedmcsa"))
    assert alg.local.mu == 5.0 and not alg.aggregate.by_data_size
    with pytest.raises(ValueError, match="mcsa_code set but algorithm='fedavg' does not use it"):
        RunConfig(mcsa_code=True).validate()


def test_local_never_communicates():
    data = small_synthetic(n_clients=3)
    cfg = RunConfig(n_clients=3, local_steps=3, batch_size=5, model="mlr", lr=0.1, algorithm="local")
    res = _simulate(cfg, data)
    assert res.metrics.uploads.tolist() == [0, 0, 0, 0] and not res.state.fresh.any()
    init = build_model("mlr", (60,), 10, seed=0, dtype=torch.float64).state_dict()
    assert all(torch.equal(res.state.sent[n][i], init[n]) for n in init for i in range(3))  # nothing was ever sent


def test_attention_trace_is_stored_compactly():
    """FedMCSA's per-layer attention is kept as window means over co-sampled pairs; with one round per window each
    sampled client's row is its attention row (sums to 1) and pairs never sampled together are NaN."""
    import fedlib
    from fedlib import RunConfig, Store

    cfg = RunConfig(
        algorithm="fedmcsa", n_clients=8, clients_per_round=4, rounds=6, local_steps=2, model="dnn", hidden=(8,)
    )
    res = fedlib.run(cfg, progress=False)
    att, names = res.traces["attention"], res.traces["attention_layers"]
    assert att.shape == (6, 4, 8, 8) and list(names) == ["1.weight", "1.bias", "3.weight", "3.bias"]
    for t in range(6):
        sel = np.nonzero(res.traces["selected"][t])[0]
        rest = np.setdiff1d(np.arange(8), sel)
        assert np.allclose(np.nansum(att[t, :, sel][:, :, sel], axis=-1), 1.0, atol=1e-6)
        assert np.isnan(att[t][:, rest][:, :, rest]).all()
    stored = Store().load(cfg)
    assert np.array_equal(stored.traces["attention"], att, equal_nan=True)
    assert list(stored.traces["attention_layers"]) == list(names)


@pytest.mark.parametrize("cap, kept", [(15_360, True), (15_359, False)])
def test_an_attention_trace_above_its_cap_is_not_kept_and_the_run_says_so(cap, kept, tmp_path, monkeypatch):
    """The trace is windows x (layers + 1) x N x N float64: FedMCSA with 5,000 clients would have held 2 GB a layer
    and stored 1 GB. Above ``ATTENTION_TRACE_BYTES`` the run keeps none, warns, and its stored meta says why. Here:
    6 windows x (4 + 1) x 8 x 8 x 8 bytes = 15,360, kept at that cap and not one byte below it."""
    import warnings

    import fedlib
    from fedlib import RunConfig, Store

    monkeypatch.setattr(callbacks, "ATTENTION_TRACE_BYTES", cap)
    cfg = RunConfig(
        algorithm="fedmcsa", n_clients=8, clients_per_round=4, rounds=6, local_steps=2, model="dnn", hidden=(8,)
    )
    store = Store(tmp_path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = fedlib.run(cfg, store, progress=False)
    said = [str(w.message) for w in seen if "attention trace" in str(w.message)]
    stored = store.load(cfg)
    if kept:
        assert not said and "attention_trace" not in res.meta and res.traces["attention"].shape == (6, 4, 8, 8)
        assert "attention" in stored.traces
        return
    why = (
        "not kept: 8 clients' pairs in 4 layer(s) would take 0.0 GB, above fedlib.core.callbacks.ATTENTION_TRACE_BYTES"
    )
    assert said == [f"attention trace {res.meta['attention_trace']}"] and res.meta["attention_trace"].startswith(why)
    assert "attention" not in res.traces and "selected" in res.traces  # the other traces are kept
    assert stored.meta["attention_trace"] == res.meta["attention_trace"] and "attention" not in stored.traces
