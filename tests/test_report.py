import numpy as np
import pandas as pd
import pytest

from fedlib.experiments.profiles import available_cells, get
from fedlib.papers import paper_data
from fedlib.papers.report import paper_vs_ours
from fedlib.runs.store import Store


def test_paper_numbers_are_complete():
    ref = paper_data.load("fedmcsa")
    assert len(ref[ref.table == "table1"]) == 7 * 8 and len(ref[ref.table == "table2"]) == 6 * 8
    row = ref[
        (ref.table == "table1") & (ref.dataset == "synthetic") & (ref.model == "mlr") & (ref.algorithm == "fedmcsa")
    ]
    assert row.accuracy.item() == 95.27 and row["std"].item() == 0.01  # FedMCSA Table 1, first cell
    with pytest.raises(ValueError, match="paper='nope' has no stored numbers"):
        paper_data.load("nope")


def test_paper_vs_ours_golden():
    table = pd.DataFrame(
        {
            "dataset": ["synthetic"] * 3,
            "model": ["mlr"] * 3,
            "algorithm": ["fedavg", "fedavg", "local"],
            "seed": [0, 1, 0],
            "best_acc": [0.70, 0.80, 0.9],
            "best_acc_mean": [0.4, 0.6, 0.9],
        }
    )
    out = paper_vs_ours(table, "fedmcsa", "table2").set_index("algorithm")
    assert out.loc["fedavg", "paper"] == 77.26 and out.loc["fedavg", "ours_weighted"] == 75.0
    assert out.loc["fedavg", "ours_weighted_std"] == 5.0 and out.loc["fedavg", "diff"] == -2.26
    assert out.loc["fedavg", "ours_unweighted"] == 50.0 and out.loc["fedavg", "runs"] == 2
    assert pd.isna(out.loc["local", "paper"])  # not in the paper


def test_a_diverged_run_is_left_out_of_paper_vs_ours():
    """A diverged seed's best (before its models became non-finite) was averaged in as a good number: it is left
    out, counted in ``diverged``, and a cell whose every run diverged has no number."""
    table = pd.DataFrame(
        {
            "dataset": ["synthetic"] * 4,
            "model": ["mlr"] * 4,
            "algorithm": ["fedavg", "fedavg", "fedprox", "local"],
            "seed": [0, 1, 0, 0],
            "best_acc": [0.70, 0.99, 0.95, 0.9],
            "best_acc_mean": [0.4, 0.99, 0.95, 0.9],
            "diverged_at": [None, 7, 3, None],
        }
    )
    out = paper_vs_ours(table, "fedmcsa", "table2").set_index("algorithm")
    assert out.loc["fedavg", "ours_weighted"] == 70.0 and out.loc["fedavg", "runs"] == 1
    assert out.loc["fedavg", "diverged"] == 1 and out.loc["local", "diverged"] == 0
    assert np.isnan(out.loc["fedprox", "ours_weighted"]) and out.loc["fedprox", "runs"] == 0
    # no run diverged: the table as before, without the column
    assert "diverged" not in paper_vs_ours(table[table.diverged_at.isna()], "fedmcsa", "table2")


def test_available_cells_drops_absent_datasets(monkeypatch, tmp_path):
    monkeypatch.delenv("FEDLIB_PROFILE", raising=False)  # `make test` forces smoke, which would pick the smoke grid
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path))
    base, grid = get("fedmcsa_table2", "quick")
    keep, missing = available_cells(grid, base)
    assert missing == ["mnist"] and {c["dataset"] for c in keep} == {"synthetic"}
    # AdaFL's MNIST cells take the data set from the base config: without MNIST and CIFAR-10 nothing is left to run
    base, grid = get("adafl_table1", "quick")
    assert base.dataset == "mnist" and any("dataset" not in c for c in grid)
    keep, missing = available_cells(grid, base)
    assert keep == [] and missing == ["cifar10", "mnist"]


def test_available_cells_takes_domains_from_base(monkeypatch):
    """pFedLA's digits cells name no domains: they run on the base config's, the domains present (offline three of
    the five). A regression once dropped them all because it compared against the five domains of the paper."""
    from fedlib.data import domains
    from fedlib.experiments import profiles

    present = {d: () for d in domains.DOMAINS} | {"digits": ("mnist", "usps", "mnist_m")}
    monkeypatch.setattr(domains, "available", lambda: present)
    monkeypatch.setattr(domains, "digits_available", lambda: present["digits"])
    base, grid = profiles.get("pfedla_table1", "paper")
    assert base.domains == ("mnist", "usps", "mnist_m") and grid and all("domains" not in c for c in grid)
    keep, missing = available_cells(grid, base)
    assert keep == grid and missing == []
    # a cell that asks for a domain that is absent is still dropped
    keep, missing = available_cells([{"domains": ("mnist", "svhn")}], base)
    assert keep == [] and missing == ["digits"]


def test_experiments_cli_dry_run_and_filter(monkeypatch, tmp_path, capsys):
    from fedlib.experiments import cli
    from fedlib.experiments import named as experiments

    monkeypatch.delenv("FEDLIB_PROFILE", raising=False)
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path / "no-data"))
    cfgs, missing = experiments.configs("fedmcsa_table2", "paper", {"seed": 0})
    assert missing == ["cifar10", "fmnist", "mnist"] and len(cfgs) == 2 * 7 and {c.seed for c in cfgs} == {0}
    assert cli.main(["fedmcsa_sigma", "--profile", "smoke", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "8 configs, 0 stored" in out and out.count("to run  ") == 8
    # status: one line per experiment; without data only the Synthetic grids have configs, none stored here
    table = experiments.status("paper").set_index("experiment")
    assert set(table.index) == set(__import__("fedlib.experiments.profiles", fromlist=["EXPERIMENTS"]).EXPERIMENTS)
    assert tuple(table.loc["fedmcsa_sigma", ["configs", "stored", "to run"]]) == (18, 0, 18)
    assert table.loc["fedmcsa_table2", "absent data"] == "cifar10, fmnist, mnist"
    assert table.loc["pfedla_table1", "absent data"] == "all (no cells)"
    # a run stopped part-way shows how far it got (it continues from there)
    sigma_cfgs, _ = experiments.configs("fedmcsa_sigma", "paper")
    info = experiments.Store().checkpoint(sigma_cfgs[0]).info_path
    info.parent.mkdir(parents=True)
    info.write_text('{"round": 412, "rounds": %d, "elapsed": 3.0}' % sigma_cfgs[0].rounds)
    table = experiments.status("paper").set_index("experiment")
    assert table.loc["fedmcsa_sigma", "resumable (round/T)"] == f"412/{sigma_cfgs[0].rounds}"
    assert table.loc["fedmcsa_table1", "resumable (round/T)"] == ""
    assert cli.main(["status", "--profile", "smoke"]) == 0 and "fedmcsa_sigma" in capsys.readouterr().out
    # several experiments are one queue, a config they share counted once
    assert cli.main(["fedmcsa_sigma", "fedmcsa_sigma", "--profile", "smoke", "--dry-run"]) == 0
    assert "8 configs, 0 stored" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["status", "fedmcsa_sigma", "--profile", "smoke"])
    assert "'status' takes no experiment names" in capsys.readouterr().err
    # a filter on a field that does not exist is refused by name, not silently empty or an AttributeError
    for bad in ("sigmaa=1", "seed"):
        with pytest.raises(SystemExit):
            cli.main(["fedmcsa_sigma", "--profile", "smoke", "--dry-run", "--where", bad])
        err = capsys.readouterr().err
        assert f"--where={bad!r} must be FIELD=VALUE" in err and "sigma, " in err
    # a tuple-valued field matches its Python literal
    assert cli.main(["fedmcsa_sigma", "--profile", "smoke", "--dry-run", "--where", "hidden=(20,)"]) == 0
    assert "4 configs, 0 stored" in capsys.readouterr().out


ADAFL_MD = __import__("pathlib").Path(__file__).resolve().parents[2] / "shared" / "papers" / "adafl.md"


@pytest.mark.skipif(not ADAFL_MD.exists(), reason="the papers folder (../shared/papers) is not beside the project")
def test_adafl_numbers_match_the_paper_text():
    """Every number of AdaFL's Tables 1-4 in fedlib/paper_data/adafl.csv, re-read from the paper's text."""
    import re

    ref = paper_data.load("adafl")
    lines = ADAFL_MD.read_text().splitlines()
    tables = {
        "table1": range(176, 184),
        "table2": range(195, 203),
        "table3": range(210, 221),
        "table4": range(226, 239),
    }
    seen = 0
    for table, span in tables.items():
        for line in (lines[i - 1] for i in span):
            cells = line.replace("<i>", "").replace("</i>", "").split("\t")
            method = cells[0].strip()
            nums = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", re.sub(r"<[^>]+>", "", "\t".join(cells[1:])))]
            rows = ref[(ref.table == table) & (ref.method == method)]
            if rows.empty or not nums:
                continue
            if table in ("table1", "table3"):  # MNIST average, best, CIFAR-10 average, best
                want = [
                    rows[(rows.dataset == d) & (rows.metric == m)].value.item()
                    for d in ("mnist", "cifar10")
                    for m in ("average", "best")
                ]
            else:  # rounds (cost) per target column
                want = []
                for d in ("mnist", "cifar10"):
                    sub = rows[rows.dataset == d].sort_values("target")
                    for tg in sub.target.unique():
                        want += [
                            sub[(sub.target == tg) & (sub.metric == "rounds")].value.item(),
                            sub[(sub.target == tg) & (sub.metric == "cost")].value.item(),
                        ]
            assert nums == want, (table, method, nums, want)
            seen += 1
    assert seen == 6 + 6 + 9 + 9


def test_adafl_run_metrics_golden():
    """best, last-10 average, and rounds/cost to a target by AdaFL's rule (mean of the last 5 rounds > target)."""
    from fedlib.papers.adafl import run_metrics as adafl_run_metrics

    acc = np.array([0.5, 0.8, 0.9, 0.92, 0.93, 0.95, 0.96, 0.90, 0.97, 0.98, 0.99, 0.97])
    uploads = np.cumsum([10] * 6 + [20] * 6)
    m = pd.DataFrame({"round": np.arange(1, 13), "global_test_acc": acc, "uploads": uploads})
    out = adafl_run_metrics(m, targets=(90.0, 99.5))
    assert out["best"] == 99.0 and np.isclose(out["average"], acc[-10:].mean() * 100)
    # 5-round means: r5 81.0, r6 90.0 (not > 90), r7 93.2 -> T* = 7, cost = 60 + 20 = 80
    assert out["rounds@90"] == 7 and out["cost@90"] == 80
    assert np.isnan(out["rounds@99.5"]) and np.isnan(out["cost@99.5"])
    assert "min_last4" not in out
    # tail: the last 4 rounds 97, 98, 99, 97 -> min 97, std sqrt(((-.75)^2 + .25^2 + 1.25^2 + (-.75)^2) / 4)
    end = adafl_run_metrics(m, tail=4)
    assert np.isclose(end["min_last4"], 97.0) and np.isclose(end["std_last4"], np.sqrt(2.75 / 4))


def test_adafl_paper_vs_ours_golden():
    """Mean and sample sd over seeds beside the paper's value; a target one seed missed has no mean."""
    from fedlib.papers.adafl import paper_vs_ours as adafl_paper_vs_ours

    frame = pd.DataFrame(
        {
            "dataset": ["mnist", "mnist"],
            "method": ["FedAvg-0.1", "FedAvg-0.1"],
            "seed": [0, 1],
            "best": [97.0, 96.0],
            "average": [96.5, 96.5],
            "rounds@90": [100.0, 140.0],
            "cost@90": [1000.0, 1400.0],
            "rounds@91": [200.0, np.nan],
            "cost@91": [2000.0, np.nan],
        }
    )
    t1 = adafl_paper_vs_ours(frame, "table1").set_index("metric")
    # paper: best 91.05, average 88.68; ours: mean 96.5 (sd sqrt(0.5)) and 96.5 (sd 0)
    assert t1.loc["best", "ours"] == 96.5 and t1.loc["best", "sd"] == pytest.approx(0.71, abs=0.005)
    assert t1.loc["best", "diff"] == pytest.approx(96.5 - 91.05)
    assert t1.loc["average", "sd"] == 0 and t1.loc["average", "diff"] == pytest.approx(96.5 - 88.68)
    assert (t1.runs == 2).all() and (t1.reached == 2).all()
    t2 = adafl_paper_vs_ours(frame, "table2").set_index(["metric", "target"])
    # 90%: both seeds, rounds 120 +- sqrt(800) against the paper's 1008; 91%: one seed missed it
    assert t2.loc[("rounds", 90.0), "ours"] == 120 and t2.loc[("rounds", 90.0), "sd"] == pytest.approx(28.28, abs=0.005)
    assert t2.loc[("cost", 90.0), "diff"] == 1200 - 10080
    assert np.isnan(t2.loc[("rounds", 91.0), "ours"]) and np.isnan(t2.loc[("rounds", 91.0), "sd"])
    assert t2.loc[("rounds", 91.0), "reached"] == 1 and t2.loc[("rounds", 91.0), "runs"] == 2
    # a single seed has no sd
    assert np.isnan(adafl_paper_vs_ours(frame[frame.seed == 0], "table1").sd).all()


def test_adafl_blocks_golden():
    """Per block: mean accuracy and mean |round-to-round change| per seed, then averaged over seeds."""
    from fedlib.papers.adafl import blocks as adafl_blocks

    # seed 0: 50 70 | 60 80 -> block means 60, 70; changes (-, 20) | (10, 20) -> 20, 15
    # seed 1: 40 40 | 90 90 -> block means 40, 90; changes (-, 0) | (50, 0) -> 0, 25
    frame = pd.DataFrame(
        {
            "method": "A",
            "seed": [0] * 4 + [1] * 4,
            "round": [1, 2, 3, 4] * 2,
            "global_test_acc": [0.5, 0.7, 0.6, 0.8, 0.4, 0.4, 0.9, 0.9],
        }
    )
    out = adafl_blocks(frame.sample(frac=1, random_state=0), block=2)  # row order must not matter
    assert out.rounds.tolist() == ["1-2", "3-4"] and out.seeds.tolist() == [2, 2]
    assert np.allclose(out.acc, [50, 80]) and np.allclose(out.change, [10, 20])


def test_adafl_pairs_golden():
    """Paired over the common seeds only; % fewer from the means; a target missed at a common seed gives no mean."""
    from fedlib.papers.adafl import pairs as adafl_pairs

    nan = np.nan
    frame = pd.DataFrame(
        {
            "method": ["A", "A", "B", "B", "B", "C"],
            "seed": [0, 1, 0, 1, 2, 5],
            "best": [97.0, 97.2, 96.5, 96.9, 99.0, 90.0],
            "average": [96.0, 96.4, 96.2, 96.0, 99.0, 90.0],
            "std_last100": [0.1, 0.3, 0.5, 0.7, 9.0, 1.0],
            "rounds@95": [100, 200, 300, 100, 1, 1],
            "cost@95": [1000, 3000, 15000, 5000, 1, 1],
            "rounds@97": [500, nan, 600, 700, 1, 1],
            "cost@97": [9000, nan, 20000, 30000, 1, 1],
        }
    )
    out = adafl_pairs(frame, [("A", "B"), ("A", "C")], targets=(95.0, 97.0))
    assert len(out) == 1  # A and C share no seed: no row
    r = out.iloc[0]
    assert r["seeds"] == "0,1"  # B's seed 2 (best 99) is left out
    # best: (97.0-96.5 + 97.2-96.9)/2 = 0.4; last10: (-0.2 + 0.4)/2 = 0.1; std: (0.1+0.3)/2, (0.5+0.7)/2
    assert np.allclose([r["best A-B"], r["last10 A-B"], r["std A"], r["std B"]], [0.4, 0.1, 0.2, 0.6])
    # to 95%: rounds 150 vs 200 -> 25% fewer; uploads 2000 vs 10000 -> 80% fewer
    assert np.allclose(
        [r["rounds A@95"], r["rounds B@95"], r["fewer rounds %@95"], r["fewer uploads %@95"]], [150, 200, 25, 80]
    )
    assert r["reached@95"] == "2/2 of 2" and r["reached@97"] == "1/2 of 2"
    assert np.isnan([r["rounds A@97"], r["fewer rounds %@97"], r["fewer uploads %@97"]]).all()
    # per dataset: the same runs under a second dataset pair only among themselves
    two = pd.concat([frame.assign(dataset="mnist"), frame[frame.method == "B"].assign(dataset="cifar10")])
    assert adafl_pairs(two, [("A", "B")]).dataset.tolist() == ["mnist"]


def test_pfedla_arrows_against_the_base_method():
    from fedlib.papers.pfedla import paper_vs_ours as pfedla_paper_vs_ours

    rows = []
    for att, acc in (("none", 90.0), ("se", 91.0), ("eca", 89.0)):
        for seed, shift in ((0, 0.5), (1, -0.5)):
            rows.append(
                {
                    "algorithm": "fedbn",
                    "attention": att,
                    "attention_local": True,
                    "domain_percent": None,
                    "seed": seed,
                    "domain": "usps",
                    "final": acc + shift,
                    "best": acc + 1,
                }
            )
    out = pfedla_paper_vs_ours(pd.DataFrame(rows)).set_index("attention")
    assert (
        out.loc["se", "ours_arrow"] == "↑"
        and out.loc["eca", "ours_arrow"] == "↓"
        and out.loc["none", "ours_arrow"] == ""
    )
    assert out.loc["none", "ours"] == 90.0 and out.loc["none", "runs"] == 2
    # the paper's FedBN USPS: 93.82 (base), 94.52 (+SE) -> up; diff = ours - paper
    assert out.loc["none", "paper"] == 93.82 and out.loc["se", "paper_arrow"] == "↑"
    assert np.isclose(out.loc["none", "diff"], 90.0 - 93.82)


def test_paper_vs_ours_bars_cut_no_bar():
    """Paper vs ours as points on a shared accuracy axis: every value of every panel (and its error bar) is inside
    the axis of every panel, not only of its own."""
    import matplotlib

    matplotlib.use("Agg")
    from fedlib.plotting import paper_vs_ours_bars

    cmp = pd.DataFrame(
        {
            "dataset": ["synthetic", "mnist"],
            "model": ["mlr", "mlr"],
            "algorithm": ["fedavg"] * 2,
            "paper": [77.26, 92.4],
            "ours_weighted": [60.0, 95.0],
            "ours_weighted_std": [0.5, np.nan],
        }
    )
    fig = paper_vs_ours_bars(cmp)
    for ax in fig.axes:
        lo, hi = ax.get_xlim()
        assert lo < 60.0 - 0.5 and hi > 95.0 and lo < 77.26 < hi and lo < 92.4 < hi


def test_paper_vs_ours_bars_name_the_seeds_each_cell_has():
    """The legend's seed count: n where every cell has n runs; the range where they differ (a cell of one seed is
    not a mean of three)."""
    import matplotlib

    matplotlib.use("Agg")
    from fedlib.plotting import paper_vs_ours_bars

    cmp = pd.DataFrame({"dataset": ["synthetic", "mnist"], "model": ["mlr"] * 2, "algorithm": ["fedavg"] * 2,
                        "paper": [77.26, 92.4], "ours_weighted": [77.0, 92.0], "ours_weighted_std": [0.5, np.nan]})  # fmt: skip

    def legend(runs):
        fig = paper_vs_ours_bars(cmp.assign(runs=runs))
        return (
            [t.get_text() for t in fig.legends[0].get_texts()]
            if fig.legends
            else fig.axes[0].get_legend_handles_labels()[1]
        )

    assert "ours (mean ± 1 std, n = 3)" in legend([3, 3])
    assert "ours (mean ± 1 std over the cell's 1-3 seeds)" in legend([3, 1])


def test_pfedla_fig4_bars_show_their_differences():
    """Panels (a) and (b): accuracies near 85% differ by a point; the y range spans every run (not 0-100), and each
    bar carries its mean."""
    import matplotlib

    matplotlib.use("Agg")
    from fedlib.papers.pfedla import plot_fig4 as pfedla_fig4

    a = [
        ("fedbn", att, True, None, s, v)
        for att, vs in {
            "none": (86.0, 88.0),
            "se": (85.0, 86.0),
            "eca": (87.0, 87.0),
            "ca": (87.5, 87.5),
            "hybrid": (86.7, 86.7),
        }.items()
        for s, v in enumerate(vs)
    ]
    b = [
        ("fedprox", "none", True, None, 0, 83.4),
        ("fedprox", "se", True, None, 0, 84.1),
        ("fedprox", "se", False, None, 0, 83.5),
    ]
    c = [("fedbn", att, True, p, 0, 90.0 + p) for att in ("none", "se") for p in (0.2, 1.0)]
    avg = pd.DataFrame(
        a + b + c, columns=["algorithm", "attention", "attention_local", "domain_percent", "seed", "final"]
    )
    fig, (pa, pb, pc) = pfedla_fig4(avg, 0.1)
    assert len(pa) == 10 and len(pb) == 3 and len(pc) == 8  # (c) includes (a)'s none and SE runs at 10%
    lo, hi = fig.axes[0].get_ylim()
    assert lo == 83.0 and hi == 89.0  # min 85 - max(2, 1.5), max 88 + max(1, 0.75)
    assert 81.4 <= fig.axes[1].get_ylim()[0] < 83.4 and fig.axes[1].get_ylim()[1] > 84.1
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert labels == ["87.00", "85.50", "87.00", "87.50", "86.70"]  # the bars' means, in the panel's order


class _FakeStore(Store):
    """Yields the given (config, result) pairs, as ``Store.stored`` does for stored configs (a ``Store``, as the
    readers take one: ``Store.of``)."""

    def __init__(self, runs):
        super().__init__("/nonexistent-fake-store")
        self.runs = runs

    def stored(self, cfgs):
        yield from ((c, r) for c, r in self.runs if c in cfgs)


def _digits_run(attention, seed, acc):
    from fedlib.config.run import RunConfig
    from fedlib.core.state import RunResult

    cfg = RunConfig(
        dataset="digits",
        domains=("mnist", "usps"),
        model="lenet",
        algorithm="fedbn",
        attention=attention,
        seed=seed,
        clients_per_round=None,
        n_clients=2,
        rounds=20,
        eval_every=10,
    )
    acc = np.asarray(acc, dtype=float)  # (evaluated rounds, clients), fractions
    m = pd.DataFrame({"round": [10, 20]})
    return cfg, RunResult(m, acc, np.zeros_like(acc), np.ones(2, int), {}, cfg)


def test_pfedla_curves_and_fig3_golden():
    """Per evaluated round and domain, plus the plain mean over domains; Figure 3 has one panel per domain and the
    average, each with the two settings (dashed base, solid + SE) of every method."""
    import matplotlib

    matplotlib.use("Agg")
    from fedlib.papers.pfedla import curves as pfedla_curves
    from fedlib.papers.pfedla import plot_fig3 as pfedla_fig3

    runs = [
        _digits_run("none", 0, [[0.5, 0.7], [0.6, 0.8]]),
        _digits_run("se", 0, [[0.55, 0.75], [0.7, 0.9]]),
        _digits_run("se", 1, [[0.65, 0.65], [0.8, 0.7]]),
    ]
    other = _digits_run("none", 1, [[0.1, 0.1], [0.1, 0.1]])  # not asked for: must not appear
    curves = pfedla_curves([c for c, _ in runs], store=_FakeStore(runs + [other]))
    assert len(curves) == 3 * 2 * 3  # runs x rounds x (2 domains + avg)
    at = curves.set_index(["attention", "seed", "round", "domain"]).acc
    assert at["none", 0, 20, "usps"] == pytest.approx(80.0) and at["none", 0, 10, "avg"] == pytest.approx(60.0)
    assert at["se", 1, 20, "avg"] == pytest.approx(75.0)
    fig = pfedla_fig3(curves)
    assert [ax.get_title() for ax in fig.axes if ax.get_visible()] == [
        "(a) MNIST",
        "(b) USPS",
        "(c) average over the 2 domains",
    ]
    # each panel: the SE line (mean of seeds 0-1) and the base line; SE's average at round 20 is (80 + 75) / 2
    lines = [ln for ln in fig.axes[2].get_lines() if len(ln.get_xdata()) == 2]
    assert sorted(round(float(ln.get_ydata()[-1]), 6) for ln in lines) == [70.0, 77.5]


def test_pfedla_frame_golden():
    """Per domain and for the plain mean over domains: the last evaluation, the best and the mean of the last three."""
    from fedlib.papers.pfedla import frame as pfedla_frame

    cfg, res = _digits_run("se", 0, [[0.5, 0.7], [0.6, 0.8]])
    res.client_acc = np.array([[0.5, 0.7], [0.9, 0.8], [0.6, 0.8], [0.7, 0.6]])
    res.metrics = pd.DataFrame({"round": [5, 10, 15, 20]})
    f = pfedla_frame([cfg], store=_FakeStore([(cfg, res)])).set_index("domain")
    assert f.loc["mnist", ["final", "best", "last3"]].tolist() == pytest.approx([70.0, 90.0, 220 / 3])
    assert f.loc["usps", ["final", "best", "last3"]].tolist() == pytest.approx([60.0, 80.0, 220 / 3])
    # the average's best is the best of the averaged curve (85 at the second evaluation), not a mean of bests
    assert f.loc["avg", ["final", "best", "last3"]].tolist() == pytest.approx([65.0, 85.0, 220 / 3])


def test_diverged_runs_give_no_number_to_the_adafl_and_pfedla_tables():
    """AdaFL's and pFedLA's frames: a diverged run's every metric is NaN (its best was the best before its models
    became non-finite), so AdaFL's cell has no mean and pFedLA's counts one run fewer."""
    from fedlib.config.run import RunConfig
    from fedlib.core.state import RunResult
    from fedlib.papers import adafl
    from fedlib.papers.pfedla import frame as pfedla_frame

    cfg, res = _digits_run("se", 0, [[0.5, 0.7], [np.nan, np.nan]])
    res.meta = {"diverged_at": 20}
    f = pfedla_frame([cfg], store=_FakeStore([(cfg, res)]))
    assert f[["final", "best", "last3"]].isna().all().all()
    mnist = RunConfig(dataset="mnist", n_clients=4, clients_per_round=2, rounds=3, model="mlr")
    m = pd.DataFrame({"round": [1, 2, 3], "global_test_acc": [0.5, 0.9, np.nan], "uploads": [2, 4, 6]})
    runs = [(mnist, RunResult(m, np.zeros((3, 4)), np.zeros((3, 4)), np.ones(4, int), {"diverged_at": 3}, mnist))]
    row = adafl.frame([mnist], store=_FakeStore(runs)).iloc[0]
    assert np.isnan(row.best) and np.isnan(row.average) and row.rounds == 3
    runs[0][1].meta = {}
    assert adafl.frame([mnist], store=_FakeStore(runs)).iloc[0].best == pytest.approx(90.0)  # not diverged: its best


def test_pfedla_gains_golden():
    """Gains are attention minus the same method's base, per domain; the panel titles count the cells above base."""
    import matplotlib

    matplotlib.use("Agg")
    from fedlib.papers.pfedla import plot_gains as pfedla_gains

    rows = [
        ("fedbn", "none", "mnist", 90.0, 80.0),
        ("fedbn", "se", "mnist", 91.5, 79.0),
        ("fedbn", "none", "usps", 70.0, 60.0),
        ("fedbn", "se", "usps", 69.0, 61.0),
        ("ditto", "none", "mnist", 50.0, 50.0),
        ("ditto", "se", "mnist", 52.0, 51.0),
        ("ditto", "none", "usps", 40.0, 40.0),
        ("ditto", "se", "usps", 43.0, 41.0),
        ("fedbn", "se", "avg", 1.0, 1.0),
    ]  # the average column is left out
    cmp = pd.DataFrame(rows, columns=["algorithm", "attention", "domain", "ours", "paper"])
    fig, (ours, paper) = pfedla_gains(cmp)
    assert ours.loc[("fedbn", "se")].tolist() == [1.5, -1.0] and ours.loc[("ditto", "se")].tolist() == [2.0, 3.0]
    assert paper.loc[("fedbn", "se")].tolist() == [-1.0, 1.0] and list(ours.columns) == ["mnist", "usps"]
    assert [ax.get_title() for ax in fig.axes[:2]] == [
        "ours:\n3 of 4 cells above base",
        "paper (Table 1):\n3 of 4 cells above base",
    ]


def test_pfedla_init_effect_golden():
    """Per-client attention minus the shared draw, paired by seed: usps diffs (1, -1, 3) -> mean 1, sd 2, 95%
    half-width t(0.975, 2) 2 / sqrt(3), the interval contains 0; mnist diffs (-2, -3, -2) -> mean -7/3, sd
    sqrt(1/3), half-width 4.303 / 3, below 0. A seed with only the shared run (seed 3) is left out."""
    from fedlib.papers.pfedla import init_effect

    cols = ["algorithm", "attention", "domain", "seed", "final"]
    shared = pd.DataFrame(
        [("fedbn", "se", d, s, v) for s, (u, m) in enumerate([(90, 80), (80, 70), (85, 75), (50, 50)])
         for d, v in (("mnist", m), ("usps", u))], columns=cols)  # fmt: skip
    per_client = pd.DataFrame(
        [("fedbn", "se", d, s, v) for s, (u, m) in enumerate([(91, 78), (79, 67), (88, 73)])
         for d, v in (("mnist", m), ("usps", u))], columns=cols)  # fmt: skip
    e = init_effect(per_client, shared).set_index("domain")
    assert list(e.index) == ["mnist", "usps"] and set(e.seeds) == {3}
    half = 4.303 * 2 / np.sqrt(3)
    assert e.loc["usps", ["shared", "per_client", "change", "low", "high"]].tolist() == pytest.approx(
        [85.0, 86.0, 1.0, round(1 - half, 2), round(1 + half, 2)]
    )
    assert e.loc["mnist", ["change", "low", "high"]].tolist() == pytest.approx(
        [-2.33, round(-7 / 3 - 4.303 / 3, 2), round(-7 / 3 + 4.303 / 3, 2)]
    )
    assert e.loc["usps", "sign"] == "" and e.loc["mnist", "sign"] == "↓"
    with pytest.raises(ValueError, match="metric='avg' is not one of"):
        init_effect(per_client, shared, metric="avg")
    import matplotlib

    matplotlib.use("Agg")
    from fedlib.papers.pfedla import plot_init_effect

    fig = plot_init_effect(init_effect(per_client, shared))
    assert [ax.get_title() for ax in fig.axes] == ["MNIST", "USPS"]
    from matplotlib.collections import PathCollection

    def points(ax):
        """The points a panel draws, as (x, filled): a filled (black) circle where the interval excludes 0, an
        open one where it does not, and no paper marker (no paper numbers here)."""
        drawn = [c for c in ax.collections if isinstance(c, PathCollection) and len(c.get_offsets())]
        return [(round(float(c.get_offsets()[0][0]), 2), tuple(c.get_facecolors()[0]) == (0, 0, 0, 1)) for c in drawn]

    assert points(fig.axes[0]) == [(-2.33, True)] and points(fig.axes[1]) == [(1.0, False)]
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_pfedla_paired_gains_golden():
    """Paired by seed: usps diffs (1, 2, 1) -> mean 4/3, sd sqrt(1/3), 95% half-width t(0.975, 2) sqrt(1/3)/sqrt(3)
    = 4.303 / 3, so the interval contains 0; mnist diffs (2, 2, 3) -> mean 7/3, same half-width, interval above 0.
    A seed run without attention only (seed 3) is left out; the paper's gain is its se minus its none."""
    import matplotlib

    matplotlib.use("Agg")
    from fedlib.papers.pfedla import gains as pfedla_gains
    from fedlib.papers.pfedla import plot_gain_intervals as pfedla_gain_intervals

    rows = []
    for seed, (bu, su, bm, sm) in enumerate(
        [(90, 91, 80, 82), (80, 82, 70, 72), (85, 86, 75, 78), (50, None, 50, None)]
    ):
        rows += [("fedbn", "none", "usps", seed, bu), ("fedbn", "none", "mnist", seed, bm)]
        if su is not None:
            rows += [("fedbn", "se", "usps", seed, su), ("fedbn", "se", "mnist", seed, sm)]
    frame = pd.DataFrame(rows, columns=["algorithm", "attention", "domain", "seed", "final"]).assign(
        attention_local=True
    )
    g = pfedla_gains(frame).set_index("domain")
    half = 4.303 / 3
    assert g.loc["usps", ["gain", "low", "high"]].tolist() == pytest.approx(
        [1.33, round(4 / 3 - half, 2), round(4 / 3 + half, 2)]
    )
    assert g.loc["mnist", ["gain", "low", "high"]].tolist() == pytest.approx(
        [2.33, round(7 / 3 - half, 2), round(7 / 3 + half, 2)]
    )
    assert g.loc["usps", "sign"] == "" and g.loc["mnist", "sign"] == "↑" and set(g.seeds) == {3}
    ref = paper_data.load("pfedla").query("table == 'table1' and dataset == 'digits' and method == 'fedbn'")
    val = lambda att, dom: ref[(ref.attention == att) & (ref.domain == dom)].value.item()
    assert g.loc["usps", "paper_gain"] == pytest.approx(round(val("se", "usps") - val("none", "usps"), 2))
    assert g.loc["usps", "paper_in_ci"] == (
        g.loc["usps", "low"] <= g.loc["usps", "paper_gain"] <= g.loc["usps", "high"]
    )
    with pytest.raises(ValueError, match="metric='avg' is not one of: final, last3, best"):
        pfedla_gains(frame, metric="avg")
    fig = pfedla_gain_intervals(pfedla_gains(frame))
    assert [ax.get_title() for ax in fig.axes] == ["USPS", "MNIST"]


def test_accuracy_vs_cost_draws_mean_curves_over_uploads():
    """One line per method: the seeds' mean accuracy at each round against the mean uploads of that round."""
    import matplotlib

    matplotlib.use("Agg")
    from fedlib.papers.adafl import plot_accuracy_vs_cost as accuracy_vs_cost

    rows = [
        ("A", 0, 1, 10, 0.90),
        ("A", 0, 2, 20, 0.96),
        ("A", 1, 1, 10, 0.92),
        ("A", 1, 2, 20, 0.98),
        ("B", 0, 1, 50, 0.94),
        ("B", 0, 2, 100, 0.97),
    ]
    frame = pd.DataFrame(rows, columns=["method", "seed", "round", "uploads", "global_test_acc"])
    fig = accuracy_vs_cost(frame)
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines() if not ln.get_label().startswith("_")}
    assert list(lines["A"].get_xdata()) == [10, 20] and list(lines["A"].get_ydata()) == pytest.approx([0.91, 0.97])
    assert list(lines["B"].get_xdata()) == [50, 100] and fig.axes[0].get_xscale() == "log"


def test_late_range_zooms_past_the_first_rounds():
    from fedlib.plotting import late_range

    # 20 rounds: the first two (0.1, 0.5) are the first tenth and are left out; later ones span 0.90-0.97
    acc = [0.1, 0.5] + [0.90 + 0.07 * i / 17 for i in range(18)]
    frame = pd.DataFrame({"round": np.arange(1, 21), "global_test_acc": acc})
    lo, hi = late_range(frame, "global_test_acc")
    assert np.isclose(lo, 0.89) and np.isclose(hi, 0.975)
    # clipped to [0, 1]
    lo, hi = late_range(frame.assign(global_test_acc=[0.0] * 2 + [0.005] + [0.999] * 17), "global_test_acc")
    assert lo == 0.0 and hi == 1.0


def test_accuracy_curves_panels_split_by_a_column_and_share_the_zoom():
    from fedlib.plotting import accuracy_curves, late_range

    rounds = np.arange(1, 21)
    frame = pd.concat(
        [
            pd.DataFrame({"round": rounds, "global_test_acc": np.linspace(lo, hi, 20), "method": m, "family": fam})
            for m, fam, lo, hi in (("A", "X", 0.2, 0.9), ("B", "X", 0.3, 0.95), ("C", "Y", 0.1, 0.8))
        ]
    )
    fig = accuracy_curves(frame, hue="method", metrics=("global_test_acc",), panels="family", zoom=True)
    assert [ax.get_title() for ax in fig.axes[:2]] == ["X", "Y"]
    assert {ln.get_label() for ln in fig.axes[1].get_lines() if not ln.get_label().startswith("_")} == {"C"}
    want = late_range(frame, "global_test_acc")
    assert fig.axes[0].get_ylim() == pytest.approx(want) and fig.axes[1].get_ylim() == pytest.approx(want)
    assert len(accuracy_curves(frame, hue="method", metrics=("global_test_acc",)).axes) == 1


def test_personal_and_global_by_hand_and_without_diverged_runs():
    """Two seeds of one cell: the best personal and global accuracies (%) averaged over the seeds, their gap; a
    diverged run is left out as in ``ours_summary``, and a method with no global model is not listed."""
    from fedlib.papers.report import personal_and_global

    def run(key, acc, gm):
        return pd.DataFrame({"key": key, "dataset": "d", "model": "m", "algorithm": "a", "round": [1, 2],
                             "test_acc": acc, "gm_test_acc": gm})  # fmt: skip

    no_gm = run("c", [0.5, 0.6], [np.nan, np.nan]).assign(algorithm="b")
    frame = pd.concat([run("k0", [0.8, 0.9], [0.7, 0.6]), run("k1", [0.7, 0.5], [0.5, 0.6]), no_gm])
    out = personal_and_global(frame)
    assert list(out.algorithm) == ["a"]
    assert out.personal.iloc[0] == pytest.approx(80.0) and out["global"].iloc[0] == pytest.approx(65.0)
    assert out.gap.iloc[0] == pytest.approx(15.0)
    alone = personal_and_global(frame, diverged=["k1"])
    assert alone.personal.iloc[0] == pytest.approx(90.0) and alone["global"].iloc[0] == pytest.approx(70.0)
