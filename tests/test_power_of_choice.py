"""Power-of-Choice selection (Cho, Wang and Joshi 2020, pow-d): the m of highest loss among d candidates drawn by
data share, composed with the methods, on both executors, batched and resumed."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import simulate_with, small_synthetic
from test_batching import _cfg, _together
from test_batching import _simulate as _simulate_batched
from test_checkpoint import Interrupt, _same, _stop_at
from test_checkpoint import _simulate as _simulate_stacked

from fedlib.algorithms import build_algorithm
from fedlib.config.run import RunConfig
from fedlib.core.selection import PowerOfChoice, build_selection, probe_rows, top_loss
from fedlib.executors import LoopExecutor, StackedExecutor
from fedlib.models.registry import build_model
from fedlib.runs.checkpoint import Checkpoint


def _never(clients):
    raise AssertionError("no loss is needed when every candidate is kept")


# -- the rule on known losses ----------------------------------------------------------------------------------------
def test_top_loss_keeps_the_highest_and_breaks_ties_by_index():
    cand = np.array([0, 2, 3, 5])
    assert top_loss(cand, np.array([0.5, 2.0, 1.0, 2.0]), 2).tolist() == [2, 5]
    assert top_loss(cand, np.array([0.5, 2.0, 1.0, 2.0]), 1).tolist() == [2]  # 2 and 5 tie: the lower index
    assert top_loss(cand, np.array([0.5, 2.0, 1.0, 2.0]), 3).tolist() == [2, 3, 5]
    assert top_loss(cand, np.array([0.5, np.nan, 1.0, 0.1]), 1).tolist() == [2]  # a NaN loss ranks highest


def test_four_clients_known_losses_give_a_known_selection():
    """d = M = 4 (every client a candidate, no draw left to chance), m = 2: losses 1.0, 3.0, 0.5, 2.0 select
    clients 1 and 3; the trace holds the four losses."""
    sel = PowerOfChoice(np.array([10, 20, 30, 40]), candidates=4, clients_per_round=2)
    known = np.array([1.0, 3.0, 0.5, 2.0])
    asked = []

    def losses(c):
        asked.append(c.tolist())
        return known[c]

    got = sel.select(1, 4, np.random.default_rng(0), losses=losses)
    assert got.tolist() == [1, 3] and asked == [[0, 1, 2, 3]]
    assert np.array_equal(sel.traces(1)["candidate_losses"], known[None])
    assert probe_rows(sel.traces(1)["candidate_losses"], [10, 20, 30, 40]).tolist() == [100]


def test_candidates_are_drawn_by_data_share_and_d_equal_m_needs_no_loss():
    """d = m = 1 on sizes 1, 2, 7: each client is the one candidate with probability n_k / n (0.1, 0.2, 0.7), and
    no loss is asked for (nothing to rank). 20,000 draws: the standard error of a share is at most 0.0035."""
    sel = PowerOfChoice(np.array([1, 2, 7]), candidates=1, clients_per_round=1)
    rng = np.random.default_rng(0)
    picks = np.array([sel.select(1, 3, rng, losses=_never)[0] for _ in range(20_000)])
    assert np.allclose(np.bincount(picks, minlength=3) / len(picks), [0.1, 0.2, 0.7], atol=0.015)
    assert probe_rows(sel.traces(5)["candidate_losses"], [1, 2, 7]).tolist() == [0] * 5  # none asked: no cost


def test_default_d_is_twice_m_at_most_n():
    sel = PowerOfChoice(np.ones(10), clients_per_round=3)
    assert sel.d(1, 10) == 6 and PowerOfChoice(np.ones(10), clients_per_round=7).d(1, 10) == 10
    sel = build_selection(RunConfig(n_clients=10, clients_per_round=None, fraction=0.3, selection="power_of_choice"),
                          np.ones(10))  # fmt: skip
    assert isinstance(sel, PowerOfChoice) and sel.d(1, 10) == 6


# -- in the round: the losses are the candidates' own -----------------------------------------------------------------
def _run(cfg, data, executor=None, **kw):
    model = build_model(cfg.model.name, data.input_shape, 10, cfg.model.hidden or (8,), seed=cfg.seed,
                        dtype=torch.float64)  # fmt: skip
    alg = build_algorithm(cfg, n_samples=data.train.sizes.numpy())
    out = simulate_with(alg, data, model, executor or StackedExecutor(), cfg.rounds, local_steps=cfg.local_steps,
                        batch_size=cfg.batch_size, seed=cfg.seed, progress=False, **kw)  # fmt: skip
    return out, model


def test_three_clients_round_one_selects_the_highest_initial_loss():
    """d = M = 3, m = 1, MLR: round 1's candidates are all clients, each reports its mean training cross-entropy on
    the initial model (computed here by hand with torch), and the one of highest loss uploads."""
    data = small_synthetic(n_clients=3, rows=40)
    cfg = RunConfig(n_clients=3, clients_per_round=1, selection="power_of_choice", poc_candidates=3, rounds=2,
                    local_steps=2, batch_size=5, model="mlr").validate()  # fmt: skip
    init = build_model("mlr", data.input_shape, 10, (8,), seed=0, dtype=torch.float64)
    by_hand = np.array([F.cross_entropy(init(x), y).item() for x, y in (data.train.client(i) for i in range(3))])
    res, _ = _run(cfg, data)
    got = res.traces["candidate_losses"]
    assert np.allclose(got[0], by_hand, rtol=1e-12, atol=0)
    assert res.traces["selected"][0].tolist() == (np.arange(3) == by_hand.argmax()).tolist()
    assert len(set(by_hand.round(6))) == 3  # distinct losses: the case decides the selection


@pytest.mark.parametrize("algorithm", ["fedavg", "fedmcsa"])
def test_a_candidate_s_loss_is_that_of_the_model_it_starts_from(algorithm):
    """FedAvg's candidates start from the global model; FedMCSA's from the personalised W_i the server sent, if one
    arrived since they trained (client 0 here), else from their own model (client 2): each loss, by hand."""
    from fedlib.core.simulation import start_losses
    from fedlib.core.state import Run, Schedule

    data = small_synthetic(n_clients=3, rows=40)
    cfg = RunConfig(algorithm=algorithm, n_clients=3, clients_per_round=1, selection="power_of_choice",
                    model="mlr").validate()  # fmt: skip
    model = build_model("mlr", data.input_shape, 10, (8,), seed=0, dtype=torch.float64)
    run = Run(build_algorithm(cfg, n_samples=data.train.sizes.numpy()), data, model, StackedExecutor(), 1, 0,
              Schedule())  # fmt: skip
    g = torch.Generator().manual_seed(5)
    for part in ("global_params", "client_params", "sent"):
        for v in getattr(run.state, part).values():
            v.copy_(torch.randn(v.shape, generator=g, dtype=v.dtype))
    run.state.fresh[:] = torch.tensor([True, False, False])

    def by_hand(i, params):
        x, y = data.train.client(i)
        return F.cross_entropy(torch.func.functional_call(model, params, (x,)), y).item()

    st = run.state
    if algorithm == "fedavg":
        want = [by_hand(i, st.global_params) for i in (0, 2)]
    else:
        want = [
            by_hand(0, {k: v[0] for k, v in st.sent.items()}),
            by_hand(2, {k: v[2] for k, v in st.client_params.items()}),
        ]
    assert np.allclose(start_losses(run, np.array([0, 2])), want, rtol=1e-12, atol=0)


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "scaffold", "fedmcsa", "pfedme", "ditto", "heurfedamp"])
def test_composes_with_methods_and_keeps_the_highest_loss_candidates(algorithm):
    """Every round: m clients upload, all of them candidates, none with a lower loss than a candidate left out;
    each candidate's loss is measured on the model it starts from (the personalised one under FedMCSA)."""
    data = small_synthetic(n_clients=6, rows=60)
    extra = {"mu": 0.1} if algorithm == "fedprox" else {}
    cfg = RunConfig(algorithm=algorithm, n_clients=6, clients_per_round=2, selection="power_of_choice",
                    poc_candidates=4, rounds=3, local_steps=2, batch_size=5, model="dnn", lr=0.05,
                    **extra).validate()  # fmt: skip
    res, _ = _run(cfg, data)
    losses, selected = res.traces["candidate_losses"], res.traces["selected"]
    assert losses.shape == selected.shape == (3, 6)
    for t in range(3):
        asked = ~np.isnan(losses[t])
        assert asked.sum() == 4 and selected[t].sum() == 2 and asked[selected[t]].all()
        assert losses[t][selected[t]].min() >= losses[t][asked & ~selected[t]].max()
    assert np.isfinite(res.metrics["test_acc"]).all()


def test_same_selection_on_both_executors():
    data = small_synthetic(n_clients=5, rows=60)
    cfg = RunConfig(n_clients=5, clients_per_round=2, selection="power_of_choice", rounds=3, local_steps=2,
                    batch_size=5, model="dnn", lr=0.05).validate()  # fmt: skip
    loop, _ = _run(cfg, data, LoopExecutor())
    stacked, _ = _run(cfg, data, StackedExecutor())
    assert np.array_equal(loop.traces["selected"], stacked.traces["selected"])
    assert np.allclose(loop.traces["candidate_losses"], stacked.traces["candidate_losses"], rtol=1e-12,
                       equal_nan=True)  # fmt: skip


def test_seeded_and_the_seed_matters():
    data = small_synthetic(n_clients=8, rows=40)
    cfg = RunConfig(n_clients=8, clients_per_round=2, selection="power_of_choice", poc_candidates=4, rounds=4,
                    local_steps=1, batch_size=5, model="mlr").validate()  # fmt: skip
    a, b = _run(cfg, data)[0], _run(cfg, data)[0]
    assert np.array_equal(a.traces["selected"], b.traces["selected"])
    assert np.array_equal(a.traces["candidate_losses"], b.traces["candidate_losses"], equal_nan=True)
    others = [_run(cfg.replace(seed=s), data)[0].traces["candidate_losses"] for s in (1, 2)]
    assert any(not np.array_equal(np.isnan(a.traces["candidate_losses"]), np.isnan(o)) for o in others)


# -- batched, resumed --------------------------------------------------------------------------------------------------
def test_batched_equals_solo():
    data = small_synthetic(n_clients=5, rows=80)
    cfgs = [_cfg("fedavg", selection="power_of_choice", poc_candidates=4, seed=s) for s in (0, 1)]
    cfgs.append(_cfg("fedavg", selection="power_of_choice", seed=0, lr=0.05))
    solo = [_simulate_batched(c, data) for c in cfgs]
    batched, _ = _together(cfgs, data)
    for a, b in zip(solo, batched):
        assert not isinstance(b, BaseException), b
        _same(a, b)


def test_resumed_run_equals_uninterrupted(tmp_path):
    data = small_synthetic(n_clients=5, rows=80)
    cfg = RunConfig(n_clients=5, clients_per_round=2, rounds=6, local_steps=3, batch_size=8, model="dnn", lr=0.1,
                    selection="power_of_choice", poc_candidates=4)  # fmt: skip
    whole = _simulate_stacked(cfg, data)
    ck = Checkpoint(tmp_path / "run.pt", every_seconds=0)
    with pytest.raises(Interrupt):
        _simulate_stacked(cfg, data, checkpoint=ck, on_round=_stop_at(4))
    resumed = _simulate_stacked(cfg, data, checkpoint=ck)
    _same(whole, resumed)
    assert "candidate_losses" in resumed.traces and [r["round"] for r in resumed.meta["resumed"]] == [3]


# -- options and refusals ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(poc_candidates=2), r"poc_candidates=2 must be >= clients_per_round=3"),
        (dict(poc_candidates=11), r"poc_candidates=11 must be between the run's largest clients per round \(m = 3\)"),
        (dict(clients_per_round=None, fraction_schedule=(0.1, 0.5, 5), poc_candidates=4, rounds=10),
         r"poc_candidates=4 must be between the run's largest clients per round \(m = 5\) and n_clients=10"),
        (dict(poc_candidates=0), r"poc_candidates"),
        (dict(poc_loss="cpow-d"), r"poc_loss='cpow-d' is not one of: pow-d"),
        (dict(selection="uniform", poc_candidates=4), r"poc_candidates=4 is set but applies only when "
         r"selection='power_of_choice'"),
        (dict(algorithm="local"), r"algorithm='local' selects no clients"),
    ],
)  # fmt: skip
def test_bad_options_are_refused_at_validate(fields, message):
    base = dict(n_clients=10, clients_per_round=3, selection="power_of_choice")
    with pytest.raises(ValueError, match=message):
        RunConfig(**{**base, **fields}).validate()


def test_a_new_rule_gets_a_key_of_its_own():
    uniform = RunConfig(n_clients=10, clients_per_round=3)
    poc = uniform.replace(selection="power_of_choice")
    assert poc.key() != uniform.key() != poc.replace(poc_candidates=6).key()
    assert poc.replace(poc_candidates=None).key() == poc.key()
