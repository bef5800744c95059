"""Clients that fail or lag (``fedlib.core.failures``): dropped clients do no work and upload nothing, stragglers
train on a cut plan; hand-computed rounds on both executors, the contract over every method, resuming, batching,
the store and the options' checks."""

import copy

import numpy as np
import pytest
import torch
from helpers import batched_and_solo, simulate_with, small_synthetic, untimed_metrics

from fedlib.algorithms import ALGORITHMS, build_algorithm
from fedlib.config.run import RunConfig
from fedlib.core.failures import FAILURE_STREAM, Failures, steps_taken, truncate
from fedlib.core.state import FAILURE_COLUMNS
from fedlib.data.federated import BatchPlan, FederatedData, sample_epochs, sample_steps
from fedlib.executors import LoopExecutor, StackedExecutor
from fedlib.models.registry import build_model
from fedlib.runs import stored
from fedlib.runs.checkpoint import Checkpoint

EXECUTORS = [StackedExecutor, LoopExecutor]


def _failures(cfg: RunConfig) -> Failures:
    s = cfg.selection
    return Failures(s.dropout, s.stragglers, s.straggler_work)


def _simulate(cfg, data, executor=None, model=None, **kw):
    model = model or build_model(cfg.model.name, data.input_shape, 10, (8,), seed=0, dtype=data.train.x.dtype)
    alg = build_algorithm(cfg, n_samples=data.train.sizes.numpy())
    res = simulate_with(
        alg, data, model, executor or StackedExecutor(), cfg.rounds, local_steps=cfg.local_steps,
        local_epochs=cfg.local_epochs, batch_size=cfg.batch_size, seed=cfg.seed, progress=False,
        failures=_failures(cfg), **kw,
    )  # fmt: skip
    return res, alg


def _first_seed_dropping(client: int, m: int = 3) -> int:
    return next(s for s in range(100) if Failures(1 / 3).draw(s, 1, np.arange(m)).dropped.tolist() == [client])


# -- the draw ----------------------------------------------------------------------------------------------------
def test_counts_are_the_shares_rounded_half_up_and_disjoint():
    f = Failures(dropout=0.25, stragglers=0.15)
    assert f.counts(10) == (3, 2)  # 2.5 -> 3, 1.5 -> 2 (half up)
    assert Failures(0.29).counts(50) == (15, 0)  # 0.29 * 50 is 14.499999999999998: float noise is rounded away
    assert f.counts(1) == (0, 0) and f.counts(2) == (1, 0)
    assert Failures(0.5, 0.5).counts(3) == (2, 1)  # round(1.5) + round(1.5) > 3: the stragglers get what is left
    d = Failures(0.3, 0.4).draw(7, 5, np.arange(10, 30, 2))
    assert len(d.dropped) == 3 and len(d.stragglers) == 4 and not set(d.dropped) & set(d.stragglers)
    assert set(d.dropped) | set(d.stragglers) <= set(range(10, 30, 2))
    assert list(d.dropped) == sorted(d.dropped) and list(d.stragglers) == sorted(d.stragglers)


def test_the_draw_is_a_function_of_seed_and_round_from_its_own_stream():
    f, sel = Failures(0.3, 0.3), np.arange(20)
    a, b = f.draw(3, 4, sel), f.draw(3, 4, sel)
    assert np.array_equal(a.dropped, b.dropped) and np.array_equal(a.stragglers, b.stragglers)
    rng = np.random.default_rng(np.random.SeedSequence((3, 4, FAILURE_STREAM)))
    order = rng.permutation(20)
    assert a.dropped.tolist() == sorted(order[:6]) and a.stragglers.tolist() == sorted(order[6:12])
    others = {tuple(f.draw(s, t, sel).dropped) for s in range(3) for t in range(1, 4)}
    assert len(others) > 1
    assert Failures().draw(3, 4, sel).dropped.size == 0 and not Failures().on


# -- dropout: FedAvg's mean over the clients that uploaded, by hand ----------------------------------------------------
def _three_client_data():
    """Client 0: one row x=(1,0), label 0; client 1: three rows x=(0,1), label 1; client 2: two rows x=(1,1), label
    1 (each client's rows alike, so a batch of one gives its gradient whatever row it draws); one test row each."""
    x = np.array([[1, 0], [0, 1], [0, 1], [0, 1], [1, 1], [1, 1], [1, 0], [0, 1], [1, 1]], dtype=np.float64)
    y = np.array([0, 1, 1, 1, 1, 1, 0, 1, 1])
    tr = [np.array([0]), np.array([1, 2, 3]), np.array([4, 5])]
    return FederatedData.from_parts("three", x, y, tr, [np.array([6]), np.array([7]), np.array([8])], 2)


# One SGD step (lr 0.5, batch 1) of a zero MLR: softmax(0) = (1/2, 1/2), so b_k = -(p - e_y) / 2 and
# W_k = -(p - e_y) x^T / 2: client 0 b = (1/4, -1/4), W = [[1/4, 0], [-1/4, 0]]; client 1 b = (-1/4, 1/4),
# W = [[0, -1/4], [0, 1/4]]; client 2 b = (-1/4, 1/4), W = [[-1/4, -1/4], [1/4, 1/4]]. FedAvg weighs the two that
# uploaded by their training rows (1, 3, 2):
MEANS = {
    2: ([-1 / 8, 1 / 8], [[1 / 16, -3 / 16], [-1 / 16, 3 / 16]]),  # clients 0, 1: 1/4, 3/4
    0: ([-1 / 4, 1 / 4], [[-1 / 10, -1 / 4], [1 / 10, 1 / 4]]),  # clients 1, 2: 3/5, 2/5
    1: ([-1 / 12, 1 / 12], [[-1 / 12, -1 / 6], [1 / 12, 1 / 6]]),  # clients 0, 2: 1/3, 2/3
}


@pytest.mark.parametrize("executor", EXECUTORS, ids=lambda e: e.__name__)
@pytest.mark.parametrize("dropped", [0, 1, 2])
def test_fedavg_averages_the_two_clients_that_uploaded(dropped, executor):
    seed = _first_seed_dropping(dropped)
    cfg = RunConfig(n_clients=3, clients_per_round=3, lr=0.5, local_steps=1, batch_size=1, rounds=1, dropout=1 / 3)
    model = build_model("mlr", (2,), 2, dtype=torch.float64)
    for p in model.parameters():
        torch.nn.init.zeros_(p)
    res, _ = _simulate(cfg.replace(seed=seed), _three_client_data(), executor(), model)
    b, w = MEANS[dropped]
    g = res.state.global_params
    assert torch.allclose(g["1.bias"], torch.tensor(b, dtype=torch.float64), rtol=0, atol=1e-15)
    assert torch.allclose(g["1.weight"], torch.tensor(w, dtype=torch.float64), rtol=0, atol=1e-15)
    assert all(not res.state.client_params[n][dropped].any() for n in g)  # the dropped client did not train
    m = res.metrics.iloc[0]
    assert (m.selected, m.uploads, m.dropped, m.straggled) == (3, 2, 1, 0)
    assert res.traces["selected"].tolist() == [[True] * 3]
    assert res.traces["dropped"][0].tolist() == [i == dropped for i in range(3)]
    assert res.meta["failures"]["dropped"] == 1 and res.meta["failures"]["rounds_without_uploads"] == 0


# -- stragglers: the cut plan by hand, and the straggler's model by a plain torch loop ---------------------------------
def test_truncate_keeps_the_first_ceil_work_times_r_local_steps():
    index = torch.zeros(6, 3, 2, dtype=torch.long)
    cut = truncate(BatchPlan(index), np.array([1]), 0.5)
    assert steps_taken(cut).tolist() == [6, 3, 6]  # ceil(0.5 * 6) = 3
    assert cut.active[:, 1].tolist() == [True] * 3 + [False] * 3 and cut.index is index
    assert steps_taken(truncate(BatchPlan(index), np.array([0, 2]), 0.01)).tolist() == [1, 6, 1]  # at least one
    assert steps_taken(truncate(BatchPlan(index), np.array([0]), 1.0)).tolist() == [6, 6, 6]
    assert steps_taken(truncate(BatchPlan(index), np.array([2]), 0.7)).tolist() == [6, 6, 5]  # ceil(4.2)
    # a Per-FedAvg step takes 2 mini-batches: 3 local steps, ceil(0.5 * 3) = 2 kept whole, 4 plan steps
    assert steps_taken(truncate(BatchPlan(index), np.array([0]), 0.5, batches_per_step=2)).tolist() == [4, 6, 6]
    # epochs of unequal clients: a client's own active steps are cut, in their order
    active = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 0, 0], [0, 0, 0], [0, 0, 0]], dtype=torch.bool)
    cut = truncate(BatchPlan(index, torch.ones(6, 3, 2), active), np.array([0, 1]), 0.5)
    assert steps_taken(cut).tolist() == [2, 1, 1]
    assert cut.active[:, 0].tolist() == [True, True, False, False, False, False]


def test_a_straggler_is_cut_on_the_epochs_it_would_take():
    data = small_synthetic(n_clients=3, rows=40)
    plan = sample_epochs(data.train.layout(), torch.arange(3), 2, 7, torch.Generator().manual_seed(0))
    full = steps_taken(plan)
    cut = steps_taken(truncate(plan, np.array([0, 1, 2]), 0.5))
    assert cut.tolist() == [-(-int(k) // 2) for k in full]


@pytest.mark.parametrize("executor", EXECUTORS, ids=lambda e: e.__name__)
def test_a_straggler_takes_its_first_steps_of_the_plan(executor):
    """FedAvg, all three clients selected, one a straggler doing ceil(0.5 * 5) = 3 of 5 steps: every client's model
    after round 1 is a plain torch SGD loop over its rows of the round's plan, for the steps it took."""
    data = small_synthetic(n_clients=3, rows=60)
    cfg = RunConfig(n_clients=3, clients_per_round=3, lr=0.1, local_steps=5, batch_size=4, rounds=1, model="mlr",
                    stragglers=1 / 3, straggler_work=0.5, seed=5)  # fmt: skip
    model = build_model("mlr", data.input_shape, 10, seed=0, dtype=torch.float64)
    init = copy.deepcopy(model)
    res, _ = _simulate(cfg, data, executor(), model)
    (straggler,) = Failures(0, 1 / 3).draw(5, 1, np.arange(3)).stragglers
    assert res.traces["straggled"][0].tolist() == [i == straggler for i in range(3)]
    plan = sample_steps(data.train.layout(), torch.arange(3), 5, 4, torch.Generator().manual_seed(5 + 1))
    for k in range(3):
        m = copy.deepcopy(init)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for s in range(3 if k == straggler else 5):
            rows = plan.index[s, k]
            loss = torch.nn.functional.cross_entropy(m(data.train.x[rows]), data.train.y[rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
        for n, t in m.state_dict().items():
            assert torch.allclose(res.state.client_params[n][k], t, rtol=0, atol=1e-12), (k, n)
    assert res.metrics.straggled.tolist() == [1] and res.metrics.uploads.tolist() == [3]


def test_scaffold_divides_by_the_steps_the_straggler_took():
    """Option II's c_i = (x - y_i) / (K eta): K is the straggler's 2 steps (ceil(0.4 * 5)), not the plan's 5."""
    data = small_synthetic(n_clients=3, rows=60)
    cfg = RunConfig(n_clients=3, clients_per_round=3, lr=0.1, local_steps=5, batch_size=4, rounds=1, model="mlr",
                    algorithm="scaffold", stragglers=1.0, straggler_work=0.4)  # fmt: skip
    model = build_model("mlr", data.input_shape, 10, seed=0, dtype=torch.float64)
    x = {n: t.clone() for n, t in model.state_dict().items()}
    res, _ = _simulate(cfg, data, LoopExecutor(), model)
    ci = res.state.extra["scaffold"]
    for n in x:
        want = (x[n].unsqueeze(0) - res.state.client_params[n]) / (2 * 0.1)
        assert torch.allclose(ci[f"ci.{n}"], want, rtol=0, atol=1e-12)


# -- the clients that train see the batches they would have seen; failures off are today's run ------------------------
def test_the_uploaders_train_as_without_failures_and_zero_shares_are_the_plain_run():
    data = small_synthetic(n_clients=5, rows=100)
    base = RunConfig(n_clients=5, clients_per_round=3, lr=0.1, local_steps=4, batch_size=5, rounds=1, model="dnn")
    plain, _ = _simulate(base, data, LoopExecutor())
    failing, _ = _simulate(base.replace(dropout=0.34), data, LoopExecutor())
    (dropped,) = failing.traces["dropped"][0].nonzero()[0]
    for k in np.flatnonzero(plain.traces["selected"][0]):
        for n, t in plain.state.client_params.items():
            assert torch.equal(failing.state.client_params[n][k], t[k]) == bool(k != dropped), (k, n)
    assert base.replace(dropout=0.0, stragglers=0.0).key() == base.key()
    none = simulate_with(build_algorithm(base), data, build_model("dnn", data.input_shape, 10, (8,), seed=0,
                         dtype=torch.float64), StackedExecutor(), 3, local_steps=4, batch_size=5, progress=False)  # fmt: skip
    for cfg in (base.replace(rounds=3), base.replace(rounds=3, dropout=0.1)):  # 0.1 of 3 rounds to no client
        res, _ = _simulate(cfg, data, StackedExecutor())
        assert res.metrics.drop(columns=["seconds", *FAILURE_COLUMNS], errors="ignore").equals(
            none.metrics.drop(columns=["seconds"])
        )
        assert np.array_equal(res.client_loss, none.client_loss)
        assert all(torch.equal(res.state.global_params[n], t) for n, t in none.state.global_params.items())
    assert not set(FAILURE_COLUMNS) & set(none.metrics.columns) and "dropped" not in none.traces
    assert "failures" not in none.meta


def test_a_straggler_with_all_of_its_work_is_the_plain_run():
    data = small_synthetic(n_clients=5, rows=100)
    cfg = RunConfig(n_clients=5, clients_per_round=3, lr=0.1, local_steps=4, batch_size=5, rounds=3, model="dnn")
    a, _ = _simulate(cfg, data)
    b, _ = _simulate(cfg.replace(stragglers=1.0, straggler_work=1.0), data)  # a plan with an all-True mask
    assert np.allclose(a.metrics.test_loss, b.metrics.test_loss, rtol=0, atol=1e-12)


# -- every method, both executors -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_method_with_failures_on_both_executors(name):
    """A third of the 3 selected clients drops out and a third straggles (ceil(0.5 * 5) = 3 of 5 steps) every round:
    both executors agree in float64, 2 models are uploaded a round, the counts are recorded, nothing diverges."""
    data = small_synthetic(n_clients=5, rows=200)
    opts = ALGORITHMS[name]
    cfg = RunConfig(n_clients=5, clients_per_round=3, rounds=5, local_steps=5, batch_size=8, model="dnn", lr=0.1,
                    algorithm=name, **({"mu": 0.1} if "mu" in opts.option_names() else {}),
                    **({"hf_delta": 0.1} if name == "perfedavg-hf" else {}))  # as test_algorithms' contract  # fmt: skip
    if not opts.SELECTS:
        with pytest.raises(ValueError, match="selects no clients, so dropout and stragglers"):
            cfg.replace(dropout=0.3).validate()
        return
    cfg = cfg.replace(dropout=1 / 3, stragglers=1 / 3, straggler_work=0.5)  # (FedBN on the DNN runs as FedAvg)
    a, _ = _simulate(cfg, data, StackedExecutor())
    b, _ = _simulate(cfg, data, LoopExecutor())
    assert np.allclose(a.metrics.test_loss, b.metrics.test_loss, rtol=0, atol=1e-10)
    assert np.isfinite(a.metrics.test_loss).all()
    assert list(a.metrics.uploads) == [2 * t for t in range(1, 6)] and set(a.metrics.selected) == {3}
    assert set(a.metrics.dropped) == {1} and set(a.metrics.straggled) == {1}
    assert (a.traces["dropped"].sum(1) == 1).all() and not (a.traces["dropped"] & ~a.traces["selected"]).any()
    for n, t in a.state.client_params.items():  # the two executors end on the same models
        assert torch.allclose(t, b.state.client_params[n], rtol=0, atol=1e-9), n


# -- AdaFL's scores and FedMCSA's attention among the uploaders, by hand --------------------------------------------
@pytest.mark.parametrize("executor", EXECUTORS, ids=lambda e: e.__name__)
def test_adafl_scores_move_among_the_uploaders_only(executor):
    """AdaFL Eq. 2 over S = the two that uploaded: a_i <- alpha a_i + (1 - alpha) d_i / sum_S d sum_S a, d_i the
    distance of client i's upload to the new global model; the dropped client's score stays n_k / n."""
    data = small_synthetic(n_clients=3, rows=90)
    cfg = RunConfig(n_clients=3, fraction=1.0, clients_per_round=None, selection="attention", attn_decay=0.6, lr=0.1,
                    local_steps=3, batch_size=5, rounds=1, model="dnn", dropout=1 / 3, seed=2)  # fmt: skip
    res, alg = _simulate(cfg, data, executor())
    (dropped,) = Failures(1 / 3).draw(2, 1, np.arange(3)).dropped
    up = [k for k in range(3) if k != dropped]
    n = data.train.sizes.numpy().astype(np.float64)
    a0 = n / n.sum()
    g, c = res.state.global_params, res.state.client_params
    d = np.array([sum(float(((c[k][i] - g[k]) ** 2).sum()) for k in g if g[k].is_floating_point()) for i in up]) ** 0.5
    want = a0.copy()
    want[up] = 0.6 * a0[up] + 0.4 * d / d.sum() * a0[up].sum()
    assert np.allclose(alg.select.scores, want, rtol=0, atol=1e-12)
    assert alg.select.scores[dropped] == a0[dropped] and np.isclose(alg.select.scores.sum(), 1.0)


@pytest.mark.parametrize("executor", EXECUTORS, ids=lambda e: e.__name__)
def test_fedmcsa_attends_among_the_uploaders_only(executor):
    """FedMCSA Eq. 6-7 over the two uploaders' trained models: psi = softmax(sigma cos) per tensor (2 x 2), each sent
    W_i = sum_k psi_ik Theta_k; the dropped client neither trains nor receives, the unselected one trains."""
    data = small_synthetic(n_clients=4, rows=90)
    cfg = RunConfig(n_clients=4, clients_per_round=3, algorithm="fedmcsa", sigma=3.0, lam=0.5, lr=0.1,
                    local_steps=3, batch_size=5, rounds=1, model="dnn", dropout=1 / 3, seed=1)  # fmt: skip
    model = build_model("dnn", data.input_shape, 10, (8,), seed=0, dtype=torch.float64)
    init = {n: t.clone() for n, t in model.state_dict().items()}
    seen = {}
    res, _ = _simulate(cfg, data, executor(), model, on_round=lambda t, sel, mixing, st: seen.update(sel=sel, m=mixing))
    selected = np.flatnonzero(res.traces["selected"][0])
    (dropped,) = np.flatnonzero(res.traces["dropped"][0])
    up = [k for k in selected if k != dropped]
    (idle,) = [k for k in range(4) if k not in selected]
    assert seen["sel"].tolist() == up
    c, sent = res.state.client_params, res.state.sent
    for n, psi in seen["m"].to_personal.items():
        theta = c[n][up].reshape(2, -1)
        unit = theta / theta.norm(dim=1, keepdim=True)
        want = torch.softmax(3.0 * unit @ unit.T, dim=1)
        assert psi.shape == (2, 2) and torch.allclose(psi, want, rtol=0, atol=1e-12), n
        assert torch.allclose(sent[n][up], (want @ theta).reshape(sent[n][up].shape), rtol=0, atol=1e-12)
        assert torch.equal(c[n][dropped], init[n]) and torch.equal(sent[n][dropped], init[n])
        assert not torch.equal(c[n][idle], init[n])  # FedMCSA trains the clients it did not select
    assert res.state.fresh[up].all() and not res.state.fresh[dropped]
    att = res.traces["attention"][0, 0]
    assert np.isnan(att[dropped]).all() and not np.isnan(att[np.ix_(up, up)]).any()


# -- a round without uploads ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fedavg", "fedavgm", "fedmcsa", "pfedme"])
def test_a_round_whose_every_client_dropped_leaves_the_server_as_it_was(name):
    """dropout 0.5 of 1 client drops it every round (round(0.5) = 1): the global model stays the initial one, a server
    optimiser takes no step, the rounds are evaluated and recorded, and methods that train every client still do."""
    data = small_synthetic(n_clients=3, rows=60)
    cfg = RunConfig(n_clients=3, clients_per_round=1, rounds=3, local_steps=2, batch_size=5, model="dnn", lr=0.1,
                    algorithm=name, dropout=0.5)  # fmt: skip
    model = build_model("dnn", data.input_shape, 10, (8,), seed=0, dtype=torch.float64)
    init = {n: t.clone() for n, t in model.state_dict().items()}
    res, alg = _simulate(cfg, data, StackedExecutor(), model)
    assert all(torch.equal(res.state.global_params[n], t) for n, t in init.items())
    assert "fedavgm" not in res.state.extra
    assert list(res.metrics.uploads) == [0, 0, 0] and list(res.metrics.dropped) == [1, 1, 1]
    assert res.meta["failures"]["rounds_without_uploads"] == 3 and not res.state.fresh.any()
    trained = [not all(torch.equal(res.state.client_params[n][k], init[n]) for n in init) for k in range(3)]
    assert sum(trained) == (0 if alg.trains == "selected" else 3 - int(res.traces["selected"].all(0).sum()))


# -- resuming and batching ----------------------------------------------------------------------------------------------
class Interrupt(Exception):
    pass


def _stop_at(t_stop):
    def on_round(t, *_):
        if t == t_stop:
            raise Interrupt

    return on_round


@pytest.mark.parametrize(
    "case",
    [dict(algorithm="fedavg"), dict(algorithm="scaffold", selection="attention", fraction=0.6, clients_per_round=None),
     dict(algorithm="fedmcsa"), dict(algorithm="ditto")],
    ids=lambda c: "-".join(str(v) for v in c.values()),
)  # fmt: skip
def test_a_resumed_run_with_failures_equals_the_uninterrupted_one(case, tmp_path):
    from test_checkpoint import _same

    data = small_synthetic(n_clients=5, rows=80)
    base = dict(n_clients=5, clients_per_round=3, rounds=6, local_steps=3, batch_size=8, model="dnn", lr=0.1,
                dropout=0.34, stragglers=0.34, straggler_work=0.4)  # fmt: skip
    cfg = RunConfig(**{**base, **case})
    whole, _ = _simulate(cfg, data)
    ck = Checkpoint(tmp_path / "run.pt", every_seconds=0)
    with pytest.raises(Interrupt):
        _simulate(cfg, data, checkpoint=ck, on_round=_stop_at(4))
    assert ck.info()["round"] == 3
    resumed, _ = _simulate(cfg, data, checkpoint=ck)
    _same(whole, resumed)
    assert resumed.meta["failures"] == whole.meta["failures"]


def test_batched_runs_with_failures_store_their_solo_numbers(tmp_path):
    """Through the config, training and the store: four runs (three seeds, one of another lr) with dropout and
    stragglers train batched as one model and store what each stores alone; the store reads their columns back."""
    base = RunConfig(dataset="synthetic", n_clients=6, clients_per_round=3, rounds=3, local_steps=2, model="mlr",
                     algorithm="scaffold", dropout=0.34, stragglers=0.34, straggler_work=0.5)  # fmt: skip
    cfgs = [base.replace(seed=s) for s in (0, 1, 2)] + [base.replace(lr=0.05)]
    for x, y in batched_and_solo(cfgs, tmp_path):
        assert untimed_metrics(x).equals(untimed_metrics(y))
        assert np.array_equal(x.client_acc, y.client_acc) and np.array_equal(x.client_loss, y.client_loss)
        assert all(np.array_equal(x.traces[k], y.traces[k]) for k in ("selected", "dropped", "straggled"))
        assert x.meta["batched"] == 4 and x.meta["failures"] == y.meta["failures"]
        assert list(x.metrics.dropped) == [1, 1, 1] and list(x.metrics.uploads) == [2, 4, 6]


# -- the store's checks of a stored run with failures -------------------------------------------------------------------
def test_the_store_refuses_failure_counts_its_traces_do_not_give():
    import pandas as pd

    sel = np.array([[1, 1, 1, 0], [0, 1, 1, 1]], dtype=bool)
    traces = {"selected": sel, "dropped": np.array([[1, 0, 0, 0], [0, 0, 0, 0]], dtype=bool),
              "straggled": np.array([[0, 1, 0, 0], [0, 0, 1, 0]], dtype=bool)}  # fmt: skip
    rounds = np.array([1, 2])
    good = pd.DataFrame({"dropped": [1, 0], "straggled": [1, 1]})

    def bad(msg):
        return ValueError(msg)

    stored._check_failures(bad, good, traces, rounds)
    with pytest.raises(ValueError, match="metrics.csv dropped in round 2 is 1"):
        stored._check_failures(bad, good.assign(dropped=[1, 1]), traces, rounds)
    with pytest.raises(ValueError, match="marks clients its round did not select"):
        stored._check_failures(bad, good, {**traces, "dropped": np.array([[0, 0, 0, 1], [0] * 4], dtype=bool)}, rounds)
    with pytest.raises(ValueError, match="trace_straggled is missing"):
        stored._check_failures(bad, good, {k: v for k, v in traces.items() if k != "straggled"}, rounds)


# -- the options' checks ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(dropout=1.0), r"RunConfig.dropout=1.0 must be in \[0, 1\)"),
        (dict(dropout=-0.1), r"RunConfig.dropout=-0.1 must be in \[0, 1\)"),
        (dict(dropout=float("nan")), "RunConfig.dropout=nan must be a finite number"),
        (dict(dropout="0.1"), "RunConfig.dropout='0.1' must be of type float"),
        (dict(stragglers=1.5), r"RunConfig.stragglers=1.5 must be in \[0, 1\]"),
        (dict(stragglers=0.5, straggler_work=0.0), r"RunConfig.straggler_work=0.0 must be in \(0, 1\]"),
        (dict(stragglers=0.5, straggler_work=1.2), r"RunConfig.straggler_work=1.2 must be in \(0, 1\]"),
        (dict(straggler_work=0.3), "RunConfig.straggler_work=0.3 is set but applies only when stragglers > 0"),
        (dict(dropout=0.6, stragglers=0.5), r"dropout=0.6 \+ stragglers=0.5 must be at most 1"),
        (dict(algorithm="local", dropout=0.2), "algorithm='local' selects no clients, so dropout and stragglers"),
    ],
)
def test_bad_failure_options_are_refused_by_name(kw, match):
    with pytest.raises(ValueError, match=match):
        RunConfig(**kw).validate()


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(dropout=1.0), r"dropout=1.0 must be a number in \[0, 1\)"),
        (dict(stragglers=-1), r"stragglers=-1 must be a number in \[0, 1\]"),
        (dict(work=0), r"straggler_work=0 must be a number in \(0, 1\]"),
        (dict(dropout=True), r"dropout=True must be a number"),
        (dict(dropout=0.5, stragglers=0.6), "must be at most 1"),
    ],
)
def test_the_core_refuses_bad_failures_by_name(kw, match):
    with pytest.raises(ValueError, match=match):
        Failures(**kw)


def test_adafl_s_dropout_column_is_the_beyond_grid_with_a_fifth_dropped(monkeypatch):
    """The widened AdaFL table's failure column: the same rows, labels and seeds as ``adafl_beyond``, each with
    dropout = 0.2 and so a store key of its own (a dropout run never stands in for the run without)."""
    from fedlib.experiments import profiles
    from fedlib.papers.adafl import grids

    monkeypatch.delenv("FEDLIB_PROFILE", raising=False)
    for profile in ("smoke", "paper"):
        base, plain = profiles.get("adafl_beyond", profile)
        base_d, dropped = profiles.get("adafl_beyond_dropout", profile)
        assert base_d == base and [{**c, "dropout": 0.2} for c in plain] == dropped
        a, b = (base.replace(**{k: v for k, v in c.items() if k != "seed"}, seed=0) for c in (plain[0], dropped[0]))
        assert grids.label(a) == grids.label(b) == "AdaFL" and a.key() != b.key() and b.dropout == 0.2
