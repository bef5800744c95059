"""FedMCSA Table 1 selection (``fedlib.papers.fedmcsa``): the winner of each row is the grid config with the highest
stored seed-0 BMTA, picked by an explicit step between the two stages."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedlib import expand
from fedlib.config.run import RunConfig
from fedlib.core.state import COLUMNS, RunResult
from fedlib.experiments import profiles
from fedlib.papers import fedmcsa
from fedlib.papers.fedmcsa import grid_frame, select, setting, status, table1_runs, table1_winners
from fedlib.runs.store import Store
from fedlib.runs.stored import expected_rounds


def _fake(store: Store, cfg: RunConfig, test_acc, gm=None):
    """Store a run whose per-round sample-weighted accuracy is ``test_acc`` (unweighted: 1 point lower), its last
    value repeated up to the config's rounds (a stored run has every evaluated round: ``fedlib.runs.stored.read_run``)."""
    rounds = expected_rounds(cfg)
    acc = _repeat_last(test_acc, rounds)
    m = pd.DataFrame({c: np.nan for c in COLUMNS}, index=range(len(rounds)))
    m["round"], m["test_acc"], m["test_acc_mean"] = rounds, acc, acc - 0.01
    if gm is not None:
        m["gm_test_acc"] = _repeat_last(gm, rounds)
        m["gm_test_acc_mean"] = m["gm_test_acc"] - 0.01
    m["selected"], m["uploads"], m["seconds"] = 3, 3 * np.arange(1, len(rounds) + 1), 1.0
    m["test_loss"] = 0.0  # the weighted mean of the per-client losses (zeros below), which a read recomputes
    store.save(cfg, RunResult(m, _clients(acc), np.zeros((len(rounds), 2)), N, {}, cfg))


N = np.array([1, 3])  # two clients' test sizes


def _clients(test_acc):
    """Per-client accuracies whose weighted mean (by ``N``) is ``test_acc`` and plain mean ``test_acc`` - 0.01, as a
    stored run's must be (``fedlib.runs.stored.read_run`` checks it)."""
    a = np.asarray(test_acc, float)[:, None]
    return np.hstack([a - 0.03, a + 0.01])


def _repeat_last(v, rounds):
    v = list(np.asarray(v, float))
    return np.asarray(v + v[-1:] * (len(rounds) - len(v)))


@pytest.fixture
def grid():
    base = RunConfig(n_clients=6, clients_per_round=3, rounds=3)
    return expand(
        base,
        [{"algorithm": "fedprox", "lr": [0.01, 0.05], "mu": [0.01, 0.1]}, {"algorithm": "pfedme", "lr": [0.01, 0.05]}],
    )


def test_select_picks_the_best_bmta_per_row(tmp_path, grid):
    store = Store(tmp_path)
    # fedprox: BMTA (best over rounds) 0.70, 0.80, 0.90, 0.85 -> (lr 0.05, mu 0.01) wins although its last round is low
    for cfg, acc in zip(grid[:4], [[0.6, 0.7], [0.8, 0.5], [0.9, 0.5], [0.85, 0.85]]):
        _fake(store, cfg, acc)
    # pfedme: PM prefers lr 0.01, GM prefers lr 0.05 -- two rows, two winners
    _fake(store, grid[4], [0.95, 0.9], gm=[0.7, 0.6])
    _fake(store, grid[5], [0.9, 0.9], gm=[0.6, 0.8])
    winners, frame = select(grid, store)
    assert winners[("synthetic", "mlr", "fedprox")] == grid[2]
    assert (grid[2].lr, grid[2].mu) == (0.05, 0.01)
    assert winners[("synthetic", "mlr", "pfedme")] == grid[4]
    assert winners[("synthetic", "mlr", "pfedme (GM)")] == grid[5]
    assert frame.winner.sum() == 3
    fp = frame[frame.row == "fedprox"]
    assert fp.bmta.round(6).tolist() == [70.0, 80.0, 90.0, 85.0]
    assert fp.bmta_unweighted.round(6).tolist() == [69.0, 79.0, 89.0, 84.0]
    assert setting(grid[2]) == "lr=0.05 mu=0.01"
    assert not frame.lr_at_edge.any()  # two learning rates: no interior to speak of


def test_lr_at_edge_flags_a_winner_at_the_end_of_three_rates(tmp_path):
    base = RunConfig(n_clients=6, clients_per_round=3, rounds=3)
    grid = expand(base, {"algorithm": ["fedavg", "local"], "lr": [0.01, 0.02, 0.05]})
    store = Store(tmp_path)
    for cfg, acc in zip(grid, [0.5, 0.6, 0.7, 0.5, 0.8, 0.7]):  # fedavg peaks at 0.05 (edge), local at 0.02
        _fake(store, cfg, [acc])
    _, frame = select(grid, store)
    w = frame[frame.winner].set_index("row")
    assert w.loc["fedavg", "lr"] == 0.05 and w.loc["fedavg", "lr_at_edge"]
    assert w.loc["local", "lr"] == 0.02 and not w.loc["local", "lr_at_edge"]


def test_incomplete_grid_has_no_winner(tmp_path, grid):
    store = Store(tmp_path)
    for cfg in grid[:3]:  # one fedprox config missing
        _fake(store, cfg, [0.5])
    winners, frame = select(grid, store)
    assert not winners
    st = status(frame)
    row = st[st.row == "fedprox"].iloc[0]
    assert (row.stored, row.grid, row.selected) == (3, 4, False)


def test_ties_go_to_the_first_config_in_grid_order(tmp_path, grid):
    store = Store(tmp_path)
    for cfg in grid[:4]:
        _fake(store, cfg, [0.5, 0.75])
    winners, _ = select(grid, store)
    assert winners[("synthetic", "mlr", "fedprox")] == grid[0]


def test_table1_runs_reads_each_rows_column_over_seeds(tmp_path, grid):
    store = Store(tmp_path)
    w = grid[4]
    _fake(store, w, [0.9, 0.8], gm=[0.6, 0.7])
    _fake(store, w.replace(seed=1), [0.7, 0.85], gm=[0.75, 0.5])
    runs = table1_runs({("synthetic", "mlr", "pfedme"): w, ("synthetic", "mlr", "pfedme (GM)"): w}, [0, 1, 2], store)
    pm = runs[runs.algorithm == "pfedme"].sort_values("seed")
    gm = runs[runs.algorithm == "pfedme (GM)"].sort_values("seed")
    assert pm.best_acc.tolist() == [0.9, 0.85] and gm.best_acc.tolist() == [0.7, 0.75]  # seed 2 not stored: left out
    assert np.allclose(gm.best_acc_mean, [0.69, 0.74])


def test_table1_profiles_hold_the_stated_grid(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDLIB_PROFILE", raising=False)  # `make test` forces smoke, which would pick the smoke grid
    base, grid = profiles.get("fedmcsa_table1_grid", "paper")
    cfgs = expand(base, [c for c in grid if c["dataset"] == "mnist" and c["model"] == "mlr"])
    n_knobbed = sum(1 for k in fedmcsa.TABLE1_KNOBS.values() if k)
    assert len(cfgs) == len(fedmcsa.TABLE1_LRS) * (len(fedmcsa.TABLE1_KNOBS) - n_knobbed + 2 * n_knobbed)
    assert {c.rounds for c in cfgs} == {800} and {(c.batch_size, c.local_steps) for c in cfgs} == {(20, 20)}
    # the Figures 3-4 runs are grid points: every method of the figures at lr 0.02 is in the grid (same key)
    fb, fgrid = profiles.get("fedmcsa_fig3", "paper")
    fig = {c.key() for c in expand(fb, fgrid) if c.dataset == "mnist"}
    assert fig <= {c.key() for c in cfgs}
    # ... and grid_frame flags exactly those (Local is in Figures 3-4 too); pFedMe flags one config in both its rows
    fr = grid_frame(cfgs, Store(tmp_path))
    assert set(fr[fr.figure_setting].key) == fig
    assert fr[fr.figure_setting].groupby("row").size().eq(1).all()


def test_a_diverged_run_never_wins(tmp_path, grid):
    """FedProx's (lr 0.05, mu 0.01) reached the best BMTA, 0.95, before its models became non-finite at round 2: the
    next best wins, the frame says where the diverged run stopped, and a row whose every run diverged has no winner.
    (It won, at 95%, and Table 1 re-ran a setting that ends in NaN.) A folder given as the store works too."""
    store = Store(tmp_path)
    for cfg, acc in zip(grid[:4], [[0.6, 0.7], [0.8, 0.5], [0.95], [0.85, 0.85]]):
        _fake(store, cfg, acc)
    diverged = grid[2]
    rounds = expected_rounds(diverged, 2)
    m = pd.DataFrame({c: np.nan for c in COLUMNS}, index=range(len(rounds)))
    m["round"], m["test_acc"], m["test_acc_mean"] = rounds, [0.95, np.nan], [0.94, np.nan]  # round 2: NaN
    m["selected"], m["uploads"], m["seconds"] = 3, [3, 6], 1.0
    z = np.zeros((len(rounds), 2))
    z[1], m["test_loss"] = np.nan, [0.0, np.nan]  # the losses a read recomputes test_loss from: NaN where it diverged
    store.save(diverged, RunResult(m, _clients(m.test_acc), z, N, {"diverged_at": 2}, diverged), replace=True)
    for cfg in grid[4:]:
        _fake(store, cfg, [0.9], gm=[0.8])
    winners, frame = select(grid, str(tmp_path))
    assert winners[("synthetic", "mlr", "fedprox")] == grid[3]  # 0.85, not the diverged 0.95
    row = frame.set_index("key").loc[diverged.key()]
    assert row.bmta == pytest.approx(95.0) and row.diverged_at == 2 and not row.winner
    assert np.isnan(frame.set_index("key").loc[grid[3].key()].diverged_at)
    # every run of a row diverged: no winner for it
    for cfg in grid[4:]:
        store.save(cfg, RunResult(m, _clients(m.test_acc), z, N, {"diverged_at": 2}, cfg), replace=True)
    winners, _ = select(grid, store)
    assert ("synthetic", "mlr", "pfedme") not in winners and ("synthetic", "mlr", "fedprox") in winners


def test_stage2_runs_the_winners_with_three_seeds(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path))
    monkeypatch.delenv("FEDLIB_PROFILE", raising=False)
    base, grid = profiles.get("fedmcsa_table1_grid", "smoke")
    store = Store(tmp_path)
    cfgs = expand(base, grid)
    for i, cfg in enumerate(cfgs):
        _fake(store, cfg, [0.5 + 0.01 * i], gm=[0.4])
    winners = table1_winners(cfgs, store)
    assert winners == select(cfgs, store)[0]
    assert len(winners) == 8  # 7 methods of the grid, pFedMe giving two rows
    # the grid of stage 2 is a function of the profile and the winners, given explicitly; without them it is refused
    with pytest.raises(ValueError, match="takes winners="):
        profiles.get("fedmcsa_table1", "smoke")
    b2, g2 = profiles.get("fedmcsa_table1", "smoke", winners=winners)
    stage2 = expand(b2, g2)
    # accuracy rises along the grid, so each row's last config wins -- except pFedMe (GM), whose accuracy is the same
    # everywhere, so the first (ties go to grid order)
    assert {c.replace(seed=0).key() for c in stage2} == {w.key() for w in winners.values()}
    assert sorted({c.seed for c in stage2}) == fedmcsa.TABLE1_SEEDS["smoke"]
    # fedlib.experiment runs the step itself: the grid (stored only here), then the winners, then stage 2
    import fedlib

    ex = fedlib.experiment("fedmcsa_table1", "smoke", stored_only=True, progress=False, store=store)
    assert ex.after.name == "fedmcsa_table1_grid" and ex.inputs["winners"] == winners
    assert [c.key() for c in ex.configs] == [c.key() for c in stage2]
    assert {c.get("seed") for c in ex.missing_runs} == {1}  # seed 0 of each winner is its stored grid run
    # ... or takes them given
    given = fedlib.experiment(
        "fedmcsa_table1", "smoke", stored_only=True, progress=False, store=store, inputs={"winners": winners}
    )
    assert given.after is None and [c.key() for c in given.configs] == [c.key() for c in stage2]


def test_table1_on_fedmcsas_partition_runs_the_image_winners_with_label_stride_2(tmp_path):
    """``fedmcsa_table1_partition``: each image row's winner (picked on pFedMe's partition) with the profile's seeds,
    the only change its partition (``label_stride=2``); Synthetic's rows, which have no label partition, left out."""
    av = profiles.Available(frozenset({"synthetic", "mnist"}))
    base, grid = profiles.get("fedmcsa_table1_grid", "paper", av)
    grid, _ = profiles.available_cells(grid, base, av)
    cfgs = expand(base, grid)
    store = Store(tmp_path)
    for i, cfg in enumerate(c for c in cfgs if c.get("model") == "mlr"):  # accuracy rises along the grid
        _fake(store, cfg, [0.5 + 0.001 * i], gm=[0.4])
    winners = table1_winners(cfgs, store)
    assert {k[:2] for k in winners} == {("synthetic", "mlr"), ("mnist", "mlr")}  # the DNN grids are not stored
    with pytest.raises(ValueError, match="takes winners="):
        profiles.get("fedmcsa_table1_partition", "paper", av)
    b2, g2 = profiles.get("fedmcsa_table1_partition", "paper", av, winners=winners)
    stage2 = expand(b2, g2)
    mnist = {k: w for k, w in winners.items() if k[0] == "mnist"}
    assert len(stage2) == len({w.key() for w in mnist.values()}) * 3 and len(mnist) == 8
    assert {c.replace(seed=0, label_stride=1).key() for c in stage2} == {w.key() for w in mnist.values()}
    assert {c.get("label_stride") for c in stage2} == {2} and sorted({c.seed for c in stage2}) == [0, 1, 2]
    assert fedmcsa.partition_winners(winners) == {k: w.replace(label_stride=2) for k, w in mnist.items()}
    # fedlib.experiment runs the step on the grid's stored runs, as for Table 1 itself
    import fedlib

    ex = fedlib.experiment(
        "fedmcsa_table1_partition", "paper", stored_only=True, progress=False, store=store, available=av
    )
    assert ex.after.name == "fedmcsa_table1_grid" and ex.inputs["winners"] == winners
    assert [c.key() for c in ex.configs] == [c.key() for c in stage2] and not ex.runs


def test_table1_code_eval_switches_only_pfedme_pm_and_perfedavg_winners(tmp_path):
    """``fedmcsa_table1_code_eval``: the pFedMe (PM) winner with ``personal_eval='local'`` and the Per-FedAvg winner
    with ``adapt_eval='code'``, each otherwise its winner's config, the profile's seeds; no other row, not pFedMe's
    GM row (its score is the global model, which the switch does not touch)."""
    av = profiles.Available(frozenset({"synthetic"}))
    base, grid = profiles.get("fedmcsa_table1_grid", "paper", av)
    grid, _ = profiles.available_cells(grid, base, av)
    cfgs = expand(base, grid)
    store = Store(tmp_path)
    for i, cfg in enumerate(c for c in cfgs if c.get("model") == "mlr"):
        _fake(store, cfg, [0.5 + 0.001 * i], gm=[0.4])
    winners = table1_winners(cfgs, store)
    switched = fedmcsa.code_eval_winners(winners)
    assert sorted(switched) == [("synthetic", "mlr", "perfedavg"), ("synthetic", "mlr", "pfedme")]
    assert switched["synthetic", "mlr", "pfedme"] == winners["synthetic", "mlr", "pfedme"].replace(
        personal_eval="local"
    )
    assert switched["synthetic", "mlr", "perfedavg"] == winners["synthetic", "mlr", "perfedavg"].replace(
        adapt_eval="code"
    )
    b2, g2 = profiles.get("fedmcsa_table1_code_eval", "paper", av, winners=winners)
    stage2 = expand(b2, g2)
    assert sorted((c.get("algorithm"), c.seed) for c in stage2) == [
        (a, s) for a in ("perfedavg", "pfedme") for s in (0, 1, 2)
    ]
    assert all(c.key() != w.replace(seed=c.seed).key() for c in stage2 for w in winners.values())  # own keys
    import fedlib

    ex = fedlib.experiment(
        "fedmcsa_table1_code_eval", "paper", stored_only=True, progress=False, store=store, available=av
    )
    assert ex.after.name == "fedmcsa_table1_grid" and [c.key() for c in ex.configs] == [c.key() for c in stage2]


@pytest.mark.parametrize("name", ["fedmcsa_table1", "fedmcsa_table1_code_eval"])
def test_cli_where_picks_winner_seeds_the_grid_does_not_have(name, tmp_path, monkeypatch, capsys):
    """``--where seed=1`` on a stage-2 experiment: the grid the step reads is queued first with the same filter, and
    its runs are all seed 0, so it stopped as a usage error ("matches none of the configs of 'fedmcsa_table1_grid'")
    before the winners' seed 1 was listed. A filter that matches none of the grid queues none of it."""
    from fedlib.experiments import cli

    av = profiles.Available.scan()
    base, grid = profiles.get("fedmcsa_table1_grid", "smoke", av)
    cfgs = expand(base, profiles.available_cells(grid, base, av)[0])
    store = Store(tmp_path)
    for i, cfg in enumerate(cfgs):
        _fake(store, cfg, [0.5 + 0.001 * i], gm=[0.4])
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path))
    assert cli.main([name, "--profile", "smoke", "--where", "seed=1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    stage2 = expand(*profiles.get(name, "smoke", av, winners=table1_winners(cfgs, store)))
    listed = [line for line in out.splitlines() if line.startswith(("to run", "stored"))]
    assert sorted(listed) == sorted("to run  " + c.label() for c in stage2 if c.seed == 1) and listed
    with pytest.raises(SystemExit) as bad:  # a filter that matches none of the named experiment is still an error
        cli.main([name, "--profile", "smoke", "--where", "seed=7", "--dry-run"])
    assert bad.value.code == 2 and f"matches none of the {len(stage2)} configs of {name!r}" in capsys.readouterr().err


# Stage 2's configs at the paper profile, from the winners among the committed stage-1 runs in results/, before the
# winners became an explicit step (FedMCSA Table 1 complete, 3 seeds; CIFAR-10 absent): 132 configs (44 winners x 3
# seeds; pFedMe's PM and GM rows share 4 winners) whose sorted keys hash to this.
PAPER_STAGE2 = (132, "787da7253fbf1f28d3acca139021570c451e0cd4")
RESULTS = Path(__file__).resolve().parents[1] / "results"


@pytest.mark.skipif(not any(RESULTS.glob("*/metrics.csv")), reason="the committed results store is not here")
def test_the_stored_winners_give_the_same_stage2_keys_as_before(monkeypatch):
    import hashlib

    monkeypatch.delenv("FEDLIB_PROFILE", raising=False)  # `make test` forces smoke
    store = Store(RESULTS)  # read only
    # the data the paper profile's Table 1 ran on (offline: no CIFAR-10), given, so the test needs no data root
    av = profiles.Available(frozenset({"synthetic", "mnist", "fmnist"}))
    base, grid = profiles.get("fedmcsa_table1_grid", "paper", av)
    grid, absent = profiles.available_cells(grid, base, av)
    assert absent == ["cifar10"]
    winners = table1_winners(expand(base, grid), store)
    assert len(winners) == 3 * 2 * 8  # every row of every (data set, model): the grids are complete
    assert len({w.key() for w in winners.values()}) == 44  # pFedMe's PM and GM rows share a winner in 4 cells
    b2, g2 = profiles.get("fedmcsa_table1", "paper", av, winners=winners)
    stage2 = expand(b2, g2)
    keys = sorted(c.key() for c in stage2)
    assert (len(keys), hashlib.sha1(" ".join(keys).encode()).hexdigest()) == PAPER_STAGE2
    assert all(store.has(c) for c in stage2)  # Table 1 is complete at 3 seeds
