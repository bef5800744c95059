"""Figures a reader can use: the papers' names in legends, ticks and titles, percent on accuracy
axes, legends below the panels, heat maps with labelled axes and a colour bar that says what its colour means, and a
caption saying what points, bars and bands are."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from fedlib import plotting  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _texts(fig) -> str:
    return " | ".join(t.get_text() for t in fig.texts)


def _colorbar_labels(fig) -> list:
    """The labels of the figure's colour bars (axes that hold a colour bar's image and nothing else)."""
    return [ax.get_ylabel() or ax.get_xlabel() for ax in fig.axes if getattr(ax, "_colorbar", None) is not None]


def test_names_and_percent_ticks():
    assert plotting.domain_name("mnist_m") == "MNIST-M" and plotting.domain_name("avg") == "average"
    assert plotting.attention_name("eca") == "ECA" and plotting.domain_name("other") == "other"
    fig, ax = plt.subplots()
    plotting.percent_points_axis(ax)
    assert ax.yaxis.get_major_formatter()(87.5, 0) == "87.5%" and ax.yaxis.get_major_formatter()(90.0, 0) == "90%"


def _table1_frame():
    rows = []
    for seed in range(3):
        for m in ("fedavg", "ditto"):
            for att in ("none", "se", "hybrid"):
                for d, v in (("mnist", 94.0), ("mnist_m", 70.0), ("usps", 90.0), ("avg", 84.0)):
                    rows.append((m, att, True, seed, d, v + seed + (att == "se")))
    return pd.DataFrame(rows, columns=["algorithm", "attention", "attention_local", "seed", "domain", "final"])


def test_pfedla_table1_points_per_domain_with_the_papers_names():
    """One panel per domain in the paper's order (MNIST before MNIST-M, USPS between) and the average, methods
    named as in the paper, points with ± 1 std (n = 3 seeds) explained in the caption, legend below the panels."""
    from fedlib.papers import pfedla

    fig = pfedla.plot_table1(_table1_frame())
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["MNIST", "USPS", "MNIST-M", "average over the 3 domains"]
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["FedAvg", "Ditto"]
    assert axes[0].yaxis.get_major_formatter()(94.0, 0) == "94%"
    (leg,) = fig.legends
    assert [t.get_text() for t in leg.get_texts()] == [
        "base method (no attention)", "+ SE (pFedLA_s)", "+ hybrid (pFedLA_h)"
    ]  # fmt: skip
    assert "± 1 std over the seeds (n = 3)" in _texts(fig)
    # MNIST, FedAvg + SE: seeds 95, 96, 97 -> mean 96, std 1
    (line, caps, (bars,)) = axes[0].containers[1].lines
    assert line.get_ydata()[0] == pytest.approx(96.0)
    assert bars.get_segments()[0][:, 1] == pytest.approx([95.0, 97.0])


def test_pfedla_gains_heat_map_rows_in_the_papers_order_and_named():
    from fedlib.papers.pfedla import plot_gains

    rows = [
        (m, att, d, v, v)
        for m in ("ditto", "fedavg")
        for att, dv in (("none", 0.0), ("se", 1.0))
        for d, v in (("usps", 90.0 + dv), ("mnist", 80.0 + dv), ("mnist_m", 70.0 + dv))
    ]
    cmp = pd.DataFrame(rows, columns=["algorithm", "attention", "domain", "ours", "paper"]).assign(runs=5)
    fig, (ours, _) = plot_gains(cmp)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["FedAvg + SE", "Ditto + SE"]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["MNIST", "USPS", "MNIST-M"]
    assert list(ours.columns) == ["mnist", "usps", "mnist_m"] and fig.axes[0].get_xlabel() == "domain"
    assert any("percentage points" in label for label in _colorbar_labels(fig))
    assert "mean over 5 seeds" in _texts(fig)


def test_pfedla_hybrid_weights_heat_map_is_labelled():
    from fedlib.papers.pfedla import plot_hybrid_weights

    w = np.full((3, 2, 3), 1 / 3) + np.array([0.01, -0.01, 0.0])
    fig = plot_hybrid_weights(w, ["mnist", "usps", "mnist_m"], seeds=5)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["MNIST", "USPS", "MNIST-M"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["SE", "ECA", "CA"] * 2
    assert ax.get_ylabel() and any("1/3" in label for label in _colorbar_labels(fig))
    assert "mean over 5 seeds" in _texts(fig)
    assert {t.get_text() for t in ax.texts} >= {"attention layer 1", "attention layer 2", "0.343", "0.323"}


def test_pfedla_fig3_names_styles_and_caption():
    """Methods by the papers' names, SE solid and the base dashed, panels wrap two per row, no bands (the caption
    says why and gives the seeds' spread)."""
    from fedlib.papers.pfedla import plot_fig3

    rows = []
    for seed in range(2):
        for m in ("fedavg", "pfedme"):
            for att in ("none", "se"):
                for d in ("mnist", "usps", "avg"):
                    rows += [(m, att, True, seed, r, d, 80.0 + r / 10 + seed) for r in (10, 20, 30)]
    curves = pd.DataFrame(rows, columns=["algorithm", "attention", "attention_local", "seed", "round", "domain", "acc"])
    fig = plot_fig3(curves)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == ["(a) MNIST", "(b) USPS", "(c) average over the 2 domains"]
    (leg,) = fig.legends
    assert [t.get_text() for t in leg.get_texts()] == ["FedAvg", "pFedMe", "with SE (pFedLA_s)", "base method"]
    styles = {ln.get_label(): ln.get_linestyle() for ln in axes[0].get_lines()}
    assert styles == {"FedAvg": "--", "FedAvg + SE": "-", "pFedMe": "--", "pFedMe + SE": "-"}
    assert not axes[0].collections  # no bands
    assert "mean over 2 seeds" in _texts(fig) and "0.7 points" in _texts(fig)  # std of (80+3, 81+3)
    assert axes[0].yaxis.get_major_formatter()(85.0, 0) == "85%"


def test_fedmcsa_attention_panels_wrap_and_are_labelled():
    from fedlib.papers.fedmcsa import plot_attention_matrices

    att = np.random.default_rng(0).dirichlet(np.ones(4), size=(4, 4))  # (layers, N, N), rows sum to 1
    fig = plot_attention_matrices(att, ["1.weight", "1.bias", "3.weight", "3.bias"], labels=list("abcd"),
                                  axis="client (label set)")  # fmt: skip
    panels = [ax for ax in fig.axes if getattr(ax, "_colorbar", None) is None]
    assert len({round(ax.get_position().y0, 3) for ax in panels}) == 2  # two rows of two
    assert panels[0].get_title() == "1.weight (hidden layer, weights)"
    assert panels[3].get_title() == "3.bias (output layer, bias)"
    assert panels[0].get_xlabel() == "upload of client (label set)" and panels[0].get_ylabel()
    assert any("attention weight" in label for label in _colorbar_labels(fig))
    assert "grey: never sampled together" in _texts(fig)


def test_adafl_schedules_legend_below_and_coinciding_named():
    from fedlib.core.selection import ConstantFraction, StepFraction, schedule_counts
    from fedlib.papers.adafl import plot_fraction_schedules

    schedules = {
        "AdaFL": schedule_counts(StepFraction(0.1, 0.5, 5, 1000), 1000, 100),
        "FedAvg-0.1": schedule_counts(ConstantFraction(0.1), 1500, 100),
    }
    fig = plot_fraction_schedules(schedules, 100)
    assert all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1
    assert "AdaFL lies on FedAvg-0.1 until round 200" in _texts(fig)
    assert fig.axes[0].yaxis.get_major_formatter()(0.2, 0) == "20%"
    styles = [(ln.get_color(), ln.get_linestyle()) for ln in fig.axes[0].get_lines()]
    assert styles[0] != styles[1] and styles[0][1] != styles[1][1]


def test_curves_caption_says_when_panels_hold_different_seeds():
    """Notebook 23's SCAFFOLD ablation has one seed in one panel and three in the other: its caption said "mean over
    3 seeds" for both."""
    rows = [
        (panel, hue, seed, r, 0.9 + 0.01 * seed)
        for panel, seeds in (("one", [0]), ("three", [0, 1, 2]))
        for hue in ("a", "b")
        for seed in seeds
        for r in range(1, 6)
    ]
    frame = pd.DataFrame(rows, columns=["panel", "method", "seed", "round", "test_acc"])
    fig = plotting.accuracy_curves(frame, hue="method", metrics=("test_acc",), panels="panel")
    assert "lines: mean over each panel's seeds (1 to 3); shaded band: ± 1 std over seeds where there are several" in (
        _texts(fig)
    )
    fig = plotting.accuracy_curves(frame[frame.panel == "three"], hue="method", metrics=("test_acc",), panels="panel")
    assert "lines: mean over 3 seeds; shaded band: ± 1 std over seeds (n = 3)" in _texts(fig)


def test_adafl_selection_heat_map_is_labelled():
    from fedlib.papers.adafl import plot_selection_dynamics

    rng = np.random.default_rng(0)
    scores = rng.dirichlet(np.ones(6), size=5)  # (rounds, clients)
    selected = rng.random((5, 6)) < 0.5
    acc = rng.random((5, 6))
    fig = plot_selection_dynamics(scores, selected, acc, client_labels=[f"{i}/{i + 1}" for i in range(6)])
    heat = fig.axes[0]
    assert heat.get_xlabel() == "round t" and "client" in heat.get_ylabel()
    assert any("1 = uniform" in label for label in _colorbar_labels(fig))
    freq, mean_acc = selected.mean(0), acc.mean(0)
    r = np.corrcoef(mean_acc, freq)[0, 1]
    assert f"correlation {r:+.2f}" in fig.axes[3].get_title()
    assert fig.axes[3].xaxis.get_major_formatter()(85.0, 0) == "85%"


def test_a_figure_without_some_data_never_replaces_the_full_one(tmp_path, monkeypatch):
    """``make notebooks`` on a machine without MNIST drew FedMCSA's Figure 3 with its Synthetic panel alone and saved
    it over the committed figure: a figure without a data set the committed ones were drawn with is
    ``<name>.<profile>.partial.png`` (git-ignored), saying so."""
    import subprocess
    from pathlib import Path

    monkeypatch.setenv("FEDLIB_FIGURES", str(tmp_path))
    monkeypatch.delenv("FEDLIB_FIGURE_TAG", raising=False)
    full = plotting.savefig(plt.figure(), "10_fig", "paper")
    before = full.read_bytes()
    fig = plt.figure()
    partial = plotting.savefig(fig, "10_fig", "paper", absent=["cifar10", "mnist"])
    assert (full.name, partial.name) == ("10_fig.paper.png", "10_fig.paper.partial.png")
    assert full.read_bytes() == before
    assert "partial: cifar10, mnist absent" in _texts(fig)
    # without only what the committed figures lack too (FedMCSA Table 1: CIFAR-10), it is the committed figure
    fig = plt.figure()
    assert plotting.savefig(fig, "12_fig", "paper", absent=["cifar10"]).name == "12_fig.paper.png"
    assert "partial: cifar10 absent" in _texts(fig)
    monkeypatch.setenv("FEDLIB_FIGURE_TAG", "SEEDS-0")
    assert plotting.figure_name("10_fig", "quick", partial=True) == "10_fig_SEEDS-0.quick.partial.png"
    root = Path(__file__).resolve().parents[1]
    try:
        ignored = subprocess.run(["git", "check-ignore", "-q", "figures/10_fig.paper.partial.png"], cwd=root).returncode
    except OSError:
        ignored = 128
    if ignored == 128:
        pytest.skip("not a git checkout")
    assert ignored == 0
