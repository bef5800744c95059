"""fedlib.papers.traffic: a stored run's byte columns derived from its config and uploads equal the ones the
simulation records, exactly, for every method the notebooks draw against bytes; a 3-client case counted by hand."""

import numpy as np
import pandas as pd
import pytest
from helpers import shared_data_root
from test_quoted_numbers import RESULTS, _paper, reading

import fedlib
from fedlib.config.run import RunConfig
from fedlib.papers import adafl, fedmcsa, traffic
from fedlib.runs.train import train

BYTES = ["bytes_up", "bytes_down"]


def _check(cfg, res):
    """Derived from the uploads column, from the selected trace, and through ``with_bytes`` == recorded."""
    old = res.metrics.drop(columns=BYTES)  # what a run stored before the columns existed reads as
    for d in (traffic.derived_bytes(cfg, old), traffic.derived_bytes(cfg, old, res.traces["selected"])):
        for c in BYTES:
            assert d[c].tolist() == res.metrics[c].tolist(), (cfg.label(), c)
    frame = old.assign(key=cfg.key())
    got = traffic.with_bytes(frame, [cfg])
    assert (got.bytes_from == "derived").all()
    assert got[BYTES].values.tolist() == res.metrics[BYTES].values.tolist()
    assert (traffic.with_bytes(res.metrics.assign(key=cfg.key()), [cfg]).bytes_from == "recorded").all()


def test_derived_equals_recorded_fedmcsa_figure_4():
    """Notebook 11's methods (FedAvg, FedProx, Per-FedAvg, pFedMe, HeurFedAMP, FedMCSA, Local), its smoke configs."""
    ex = fedlib.experiment(fedmcsa.figure_experiment("dnn"), "smoke", stored_only=True)
    names = set()
    for cfg in ex.configs:
        _check(cfg, train(cfg, progress=False))
        names.add(cfg.method.NAME)
    assert names == set(traffic.DERIVED)  # every derived method is checked against the simulation


@pytest.mark.skipif(shared_data_root() is None, reason="needs MNIST")
def test_derived_equals_recorded_adafl_figure_3():
    """Notebook 21's runs: AdaFL (attention selection, a growing fraction) and FedAvg-0.1/0.5, their smoke configs."""
    for cfg in fedlib.experiment("adafl_fig3", "smoke", stored_only=True).configs:
        _check(cfg, train(cfg, progress=False, data_root=shared_data_root()))


def test_evaluated_every_other_round_needs_the_trace():
    cfg = RunConfig(algorithm="fedmcsa", n_clients=4, clients_per_round=2, rounds=4, eval_every=2, local_steps=1,
                    model="mlr")  # fmt: skip
    res = train(cfg, progress=False)
    old = res.metrics.drop(columns=BYTES)
    assert (
        traffic.derived_bytes(cfg, old, res.traces["selected"])[BYTES].values.tolist()
        == res.metrics[BYTES].values.tolist()
    )
    with pytest.raises(ValueError, match="no row for every round"):
        traffic.derived_bytes(cfg, old)


def test_three_clients_by_hand():
    """MLR on Synthetic (60 features, 10 classes): M = (60 x 10 + 10) x 4 bytes = 2440; 3 clients, 2 a round."""
    m = (60 * 10 + 10) * 4
    base = dict(n_clients=3, clients_per_round=2, rounds=3, local_steps=1, model="mlr")
    want = {
        "fedavg": ([2 * m, 4 * m, 6 * m], [2 * m, 4 * m, 6 * m]),  # the 2 selected get the global model
        "pfedme": ([2 * m, 4 * m, 6 * m], [3 * m, 6 * m, 9 * m]),  # all 3 train from the global model
        "fedmcsa": ([2 * m, 4 * m, 6 * m], [0, 2 * m, 4 * m]),  # last round's 2 W_i, delivered the round after
        "local": ([0, 0, 0], [0, 0, 0]),
    }
    for name, (up, down) in want.items():
        cfg = RunConfig(algorithm=name, **base)
        res = train(cfg, progress=False)
        assert res.metrics.bytes_up.tolist() == up and res.metrics.bytes_down.tolist() == down, name
        d = traffic.derived_bytes(cfg, res.metrics.drop(columns=BYTES))
        assert d.bytes_up.tolist() == up and d.bytes_down.tolist() == down, name


def test_refused():
    with pytest.raises(ValueError, match="method 'scaffold'.*fedavg, fedmcsa"):
        cfg = RunConfig(algorithm="scaffold", n_clients=3, clients_per_round=2, rounds=1, model="mlr")
        traffic.derived_bytes(cfg, train(cfg, progress=False).metrics)
    cfg = RunConfig(n_clients=4, clients_per_round=2, rounds=1, model="mlr", dropout=0.5)
    with pytest.raises(ValueError, match="dropout=0.5"):
        traffic.derived_bytes(cfg, pd.DataFrame())
    cfg = RunConfig(n_clients=4, clients_per_round=2, rounds=2, model="mlr", selection="power_of_choice",
                    poc_candidates=3)  # fmt: skip
    with pytest.raises(ValueError, match="probes candidates"):  # its probe downloads are in no stored column
        traffic.derived_bytes(cfg, train(cfg, progress=False).metrics.drop(columns=BYTES))


def _quoted(text: str, numbers) -> None:
    for x in numbers:
        assert f"{x:.1f} " in text or f"{x:.1f}%" in text, f"{x:.1f} not quoted"


@pytest.mark.skipif(not any(RESULTS.glob("*/metrics.csv")), reason="the committed store is not here")
def test_adafl_bytes_as_quoted():
    """Notebook 21's Reading quotes its bytes table (paper profile, committed store)."""
    ex = _paper("adafl_fig3")
    cfgs = ex.stored_runs()
    frame = adafl.labelled(ex.frame, cfgs)
    frame = frame[frame["round"] <= min(c.get("rounds") for c in cfgs)]
    t = traffic.bytes_table(traffic.with_bytes(frame, cfgs), "global_test_acc", targets=(0.95, 0.96), unit="GB")
    text = reading("21").replace("\n  ", " ")
    _quoted(text, [t.loc["AdaFL", "up GB"], t.loc["FedAvg-0.5", "up GB"], t.loc["AdaFL", "GB to 96%"],
                   t.loc["FedAvg-0.5", "GB to 96%"], t.loc["FedAvg-0.1", "GB to 95%"], t.loc["AdaFL", "GB to 95%"]])  # fmt: skip
    assert np.isnan(t.loc["FedAvg-0.1", "GB to 96%"]) and (t["up GB"] == t["down GB"]).all()


@pytest.mark.skipif(not any(RESULTS.glob("*/metrics.csv")), reason="the committed store is not here")
def test_fedmcsa_bytes_as_quoted():
    """Notebook 11's Reading quotes its bytes table (paper profile, committed store)."""
    ex = _paper(fedmcsa.figure_experiment("dnn"))
    frame, _ = fedmcsa.method_frame(traffic.with_bytes(ex.frame, ex.stored_runs()))
    t = traffic.bytes_table(frame, "test_acc", panel="dataset", targets=(0.96,))
    mn, sy = t.loc["mnist"], t.loc["synthetic"]
    text = reading("11").replace("\n", " ")
    _quoted(text, [mn.loc["fedavg", "up MB"], sy.loc["fedavg", "up MB"], mn.loc["fedmcsa", "down MB"],
                   mn.loc["fedavg", "down MB"], mn.loc["pfedme (PM)", "down MB"], sy.loc["pfedme (PM)", "down MB"],
                   *mn.loc[["pfedme (PM)", "heurfedamp", "fedmcsa", "fedavg"], "MB to 96%"]])  # fmt: skip
    assert (mn.drop(index="local")["up MB"] == mn.loc["fedavg", "up MB"]).all()  # every method but Local, MNIST


def test_bytes_figure_log_axis_caption_and_table():
    import matplotlib

    matplotlib.use("Agg")
    frame = pd.DataFrame(
        {
            "method": ["fedavg"] * 3 + ["local"] * 3,
            "round": [1, 2, 3] * 2,
            "test_acc": [0.5, 0.6, 0.7, 0.8, 0.8, 0.8],
            "bytes_up": [1_000_000, 2_000_000, 3_000_000, 0, 0, 0],
            "bytes_down": [1_000_000, 2_000_000, 3_000_000, 0, 0, 0],
        }
    )
    fig = traffic.plot_accuracy_vs_bytes(frame, targets=(0.65,))
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "cumulative bytes sent, up + down (MB)"
    assert [line.get_label() for line in ax.get_lines()][0] == "FedAvg"  # Local sends nothing: left out, and said
    assert "left out, sending nothing: Local" in " | ".join(t.get_text() for t in fig.texts)
    t = traffic.bytes_table(frame, targets=(0.65, 0.9))
    assert t.loc["fedavg"].tolist()[:3] == [3.0, 3.0, 6.0] and np.isnan(t.loc["fedavg", "MB to 90%"])
