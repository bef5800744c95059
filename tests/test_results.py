"""``Results``: what ``run``, ``run_grid`` and ``experiment`` return; its summary worked by hand from the per-round
frame of a tiny grid, ``results_frame`` of a grid's table, plots on integer round ticks, and the old return values'
uses (a RunResult's fields and dict summary, the summary table's columns, pandas' own ``table.plot``) intact."""

import math

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import AutoLocator  # noqa: E402

import fedlib  # noqa: E402
from fedlib import RunConfig, Store, results_frame, run, run_grid  # noqa: E402
from fedlib.core import metrics as M  # noqa: E402
from fedlib.core.state import RunResult  # noqa: E402
from fedlib.plotting import round_ticks  # noqa: E402
from fedlib.runs.results import Results, ResultsTable, RunResults  # noqa: E402

# 20 rounds: the last 10 are not all of them (best, final and last-10 are three numbers), and the default tick locator
# puts a 20-round axis on 0, 2.5, 5, 7.5, ...
TINY = RunConfig(n_clients=4, clients_per_round=2, rounds=20, local_steps=2, model="mlr")
GRID = {"lr": [0.02, 0.2], "seed": [0, 1]}


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("results"))
    return run_grid(TINY, GRID, store, progress=False), store


def test_the_summary_is_best_last_and_last10_of_the_frame_by_hand(grid):
    table, _ = grid
    frame = table.frame
    assert len(table) == 4 and len(frame) == 4 * 20 and frame["round"].tolist()[:20] == list(range(1, 21))
    summary = table.summary()
    for row in summary.itertuples():
        acc = frame[frame.key == row.key].sort_values("round").test_acc.to_numpy()
        assert len(acc) == 20
        assert row.best_acc == max(acc)
        assert row.final_acc == acc[19]
        assert row.last10_acc == pytest.approx(sum(acc[10:]) / 10, rel=1e-12)  # rounds 11..20
        assert row.last10_acc != pytest.approx(acc.mean(), rel=1e-9)  # a mean over all 20 would be wrong
    # each row is its run's own summary, and the per-config rows keep the grid's fields
    assert summary[["lr", "seed"]].values.tolist() == [[0.02, 0], [0.02, 1], [0.2, 0], [0.2, 1]]
    assert "test_acc_at_best_val" not in summary  # no protocol here holds out a validation split


def test_the_summary_of_a_run_is_its_row_of_the_grid_summary(grid):
    table, store = grid
    one = run(TINY.replace(lr=0.2, seed=1), store, progress=False)
    assert isinstance(one, RunResults) and isinstance(one, RunResult) and isinstance(one, Results)
    row = table.summary().set_index("key").loc[one.config.key()]
    s = one.summary()
    assert isinstance(s, dict) and s["best_acc"] == row.best_acc and s["last10_acc"] == row.last10_acc
    assert one.configs == [one.config] and len(one.frame) == 20
    assert one.frame.test_acc.tolist() == one.metrics.test_acc.tolist() and (one.frame.key == one.config.key()).all()


def test_best_on_validation_is_the_test_accuracy_in_the_round_best_on_validation():
    m = pd.DataFrame({"round": [1, 2, 3, 4], "test_acc": [0.5, 0.9, 0.6, 0.7], "val_acc": [0.1, np.nan, 0.8, 0.8]})
    assert M.at_best(m.val_acc, m.test_acc) == 0.6  # round 3: the first of the two best; NaN never wins
    assert math.isnan(M.at_best([np.nan, np.nan], [0.1, 0.2]))
    m = m.assign(test_acc_mean=m.test_acc, global_test_acc=np.nan, uploads=[2, 4, 6, 8], seconds=1.0)
    s = RunResult(m, np.zeros((4, 1)), np.zeros((4, 1)), np.ones(1)).summary()
    assert s["test_acc_at_best_val"] == 0.6 and s["best_acc"] == 0.9


def test_results_frame_takes_what_run_grid_returns(grid):
    table, store = grid
    by_table = results_frame(table)
    by_configs = results_frame(table.configs, store)
    pd.testing.assert_frame_equal(by_table, by_configs)
    assert len(by_table) == 80 and set(by_table.key) == set(table.key)
    # a row selection keeps its runs; so does a concatenation of two selections
    sub = table[table.lr == 0.2]
    assert isinstance(sub, ResultsTable) and [c.get("lr") for c in sub.configs] == [0.2, 0.2]
    assert set(results_frame(sub).key) == set(sub.key) and len(results_frame(sub)) == 40
    both = pd.concat([table.iloc[:1], table.iloc[3:]])
    assert set(results_frame(both).key) == {table.key.iloc[0], table.key.iloc[3]}
    one = run(TINY, store, progress=False)  # a Results of one run too
    pd.testing.assert_frame_equal(results_frame(one), by_table[by_table.key == TINY.key()].reset_index(drop=True))
    with pytest.raises(TypeError, match="does not know its runs"):
        results_frame(pd.DataFrame(table))
    with pytest.raises(ValueError, match="no 'key' column"):
        table[["lr", "best_acc"]].frame


def test_the_table_is_the_summary_dataframe_it_was(grid):
    table, _ = grid
    assert isinstance(table, pd.DataFrame)
    cols = ["key", "best_acc", "best_acc_mean", "final_acc", "last10_acc", "best_global_acc", "uploads", "diverged_at"]
    assert set(cols) <= set(table.columns) and table.best_acc.dtype == float
    assert table.groupby("lr").best_acc.mean().index.tolist() == [0.02, 0.2]
    # pandas' own plot: an accessor and a call with pandas' arguments
    assert table.plot.bar(x="seed", y="best_acc") is not None and table.plot(x="seed", y="best_acc") is not None
    plt.close("all")


def _round_ticks(fig):
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    return [t for t in ax.get_xticks() if lo <= t <= hi]


def test_plot_draws_curves_on_integer_round_ticks(grid):
    table, _ = grid
    fig = table.plot(metric="test_acc", by="lr")
    ticks = _round_ticks(fig)
    assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks), ticks
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["0.02", "0.2"]  # one curve per lr
    # the default: one curve per field the runs differ in (seeds apart: they are the band)
    assert [line.get_label() for line in table.plot().axes[0].get_lines()] == ["0.02", "0.2"]
    assert len(run(TINY, table.store, progress=False).plot("test_loss").axes[0].get_lines()) == 1
    # the default locator puts a 20-round axis on 0, 2.5, 5, ...: what integer ticks fix
    plain = plt.figure().add_subplot()
    plain.plot(range(1, 21), range(20))
    plain.figure.canvas.draw()
    assert any(not float(t).is_integer() for t in plain.get_xticks())
    plt.close("all")


def test_plot_refuses_a_metric_or_field_it_does_not_have(grid):
    table, _ = grid
    with pytest.raises(ValueError, match=r"metric='acc' is not a metrics column; one of: test_acc, "):
        table.plot(metric="acc")
    with pytest.raises(ValueError, match=r"by='nosuch' must be a config field"):
        table.plot(by="nosuch")
    with pytest.raises(ValueError, match="nothing to plot"):
        ResultsTable().plot()


@pytest.mark.parametrize("length", [3, 5, 8])
def test_integer_round_ticks_leave_integer_ticks_as_they_were(length):
    """Where the default locator already gives integers (every committed figure's round axis), ``round_ticks`` gives
    the same ticks, so those figures redraw identically; where it gave fractions, integers."""
    fractional = 0
    for hi in [*range(2, 60), 80, 100, 150, 200, 500, 800, 1000, 1500]:
        for lo in (0, 1, 10):
            if hi <= lo:
                continue
            fig = plt.figure(figsize=(length, 3))
            ax = fig.add_subplot()
            ax.plot([lo, hi], [0, 1])
            ax.xaxis.set_major_locator(AutoLocator())
            before = ax.get_xticks()
            round_ticks(ax)
            after = ax.get_xticks()
            plt.close(fig)
            assert all(float(t).is_integer() for t in after), (lo, hi, after)
            if all(float(t).is_integer() for t in before):
                assert np.array_equal(before, after), (lo, hi, before, after)
            else:
                fractional += 1
    assert fractional > 0  # the short axes the change is for


def test_experiment_returns_results(tmp_path):
    ex = fedlib.experiment("quickstart", "smoke", store=tmp_path, progress=False)
    assert isinstance(ex, Results) and isinstance(ex.table, ResultsTable)
    assert len(ex.summary()) == len(ex.runs) == len(ex.configs) and set(ex.summary().key) == set(ex.table.key)
    pd.testing.assert_frame_equal(results_frame(ex.table), ex.frame)
    pd.testing.assert_frame_equal(results_frame(ex), ex.frame)
    assert str(ex) == ex.describe() and ex.describe().startswith("quickstart, profile smoke")
    assert all(float(t).is_integer() for t in _round_ticks(ex.plot(by="algorithm")))
    plt.close("all")
