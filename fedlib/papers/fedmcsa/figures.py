"""FedMCSA's figures (matplotlib): Figures 3-5, Table 1's grid, the learned attention, and our readings drawn.

Each function draws from frames the tables already hold and returns the figure; the notebooks save it
(``fedlib.plotting.savefig``). Nothing here reads the store or runs anything, and the drawing is deterministic, so
the committed figures redraw byte for byte from the committed store. matplotlib is imported inside the functions:
importing the package for its grids or tables needs no plotting stack.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedlib.papers.fedmcsa.paper import FEDMCSA_PARTITION, partition_label
from fedlib.papers.fedmcsa.tables import MINUS_COLUMNS, _two_by_two, method_frame

FIGURES = {
    "mlr": ("fedmcsa_fig3", "Figure 3 (MLR)", "10_fedmcsa_fig3_mlr"),
    "dnn": ("fedmcsa_fig4", "Figure 4 (DNN)", "11_fedmcsa_fig4_dnn"),
}


def figure_experiment(model: str, partition: bool = False) -> str:
    """The experiment Figure 3 (``model='mlr'``) or 4 (``'dnn'``) draws; ``partition``: its MNIST panel on FedMCSA's
    own partition instead (``fig3_partition``, ``fig4_partition``)."""
    name = FIGURES[model][0]
    return f"{name}_partition" if partition else name


def figure_3_4(model: str, ex, partition: bool = False):
    """Figure 3 (``model='mlr'``) or 4 (``'dnn'``) from its experiment ``ex`` (``fedlib.experiment`` of
    ``figure_experiment(model, partition)``), the call notebooks 10 and 11 share: its curves and best accuracies
    (``method_frame``), the figure and the name to save it under. Returns a
    ``types.SimpleNamespace(experiment, frame, best, fig, name)``."""
    from types import SimpleNamespace

    _, what, fig_name = FIGURES[model]
    if partition:  # the MNIST panel on FedMCSA's own partition
        fig_name = f"{fig_name}_fedmcsa_partition"
        what += f" on FedMCSA's partition, {partition_label(FEDMCSA_PARTITION['label_stride'])}"
    frame, best_ = method_frame(ex.frame) if ex.runs else (pd.DataFrame(), pd.DataFrame())
    fig = plot_method_curves(frame, title=f"FedMCSA {what}, {ex.profile} profile") if len(frame) else None
    return SimpleNamespace(experiment=ex, frame=frame, best=best_, fig=fig, name=fig_name)


def plot_method_curves(frame: pd.DataFrame, title: str = ""):
    """Mean test accuracy per round of every method, one panel per data set (FedMCSA Figures 3 and 4), in the
    papers' names, each with its own colour, dash and marker; the caption names curves that lie on each other."""
    from fedlib import plotting

    datasets = sorted(frame.dataset.unique())
    fig, axes = plotting.grid_axes(len(datasets), 2, width=6, height=4)
    order = list(dict.fromkeys(frame.method))
    seeds, coinciding = 1, []
    for ax, d in zip(axes, datasets):
        handles, labels, n, co = plotting.draw_lines(ax, frame[frame.dataset == d], "round", "test_acc", "method",
                                                     order, lw=1.0)  # fmt: skip
        seeds = max(seeds, n)
        coinciding += [(a, b, d) for a, b in co]
        ax.set_title(d)
        ax.set_xlabel("round")
        plotting.round_ticks(ax)
        ax.set_ylabel("mean test accuracy (sample-weighted)")
        plotting.percent_axis(ax)
        ax.grid(alpha=0.3)
    plotting.finish(fig, handles, labels, plotting.caption_text(seeds, coinciding), title, legend_cols=4)
    return fig


def plot_tuning_gain(frame: pd.DataFrame, paper: pd.DataFrame | None = None, title: str = ""):
    """FedMCSA Table 1's grid at a glance, one panel per (dataset, model): for each method the span of BMTA over
    its grid (bar), the setting Figures 3-4 use (open circle), the winner (filled dot) and the paper's Table 1
    number (red cross; ``paper`` rows: dataset, model, algorithm, accuracy)."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    frame = frame[frame.stored]
    cells_ = frame[["dataset", "model"]].drop_duplicates().values.tolist()
    if not cells_:
        fig, ax = plt.subplots(figsize=(4, 1))
        ax.axis("off")
        ax.text(0.5, 0.5, "no grid runs stored", ha="center")
        return fig
    rows = list(dict.fromkeys(frame.row))
    fig, axes = plt.subplots(
        1, len(cells_), figsize=(3.4 * len(cells_), 0.45 * len(rows) + 1.6), squeeze=False, sharey=True
    )
    for ax, (d, m) in zip(axes[0], cells_):
        sub = frame[(frame.dataset == d) & (frame.model == m)]
        for y, row in enumerate(rows):
            g = sub[sub.row == row]
            if g.empty:
                continue
            ax.plot([g.bmta.min(), g.bmta.max()], [y, y], color="#9ecae1", lw=6, solid_capstyle="butt")
            ax.plot(g[g.figure_setting].bmta, [y] * int(g.figure_setting.sum()), "o", mfc="white", mec="k")
            if g.winner.any():
                ax.plot(g[g.winner].bmta, [y], "o", color="#08519c")
            if paper is not None:
                p = paper[(paper.dataset == d) & (paper.model == m) & (paper.algorithm == row)]
                ax.plot(p.accuracy, [y] * len(p), "x", color="#d62728", ms=8, mew=2)
        ax.set_title(f"{d} / {m}")
        ax.set_xlabel("BMTA (%)")
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(range(len(rows)))
    axes[0][0].set_yticklabels(rows)
    axes[0][0].invert_yaxis()
    handles = [
        Line2D([], [], color="#9ecae1", lw=6, label="grid span"),
        Line2D([], [], marker="o", ls="", mfc="white", mec="k", label="Figs 3-4 setting"),
        Line2D([], [], marker="o", ls="", color="#08519c", label="winner (seed 0)"),
        Line2D([], [], marker="x", ls="", color="#d62728", mew=2, label="paper Table 1"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=4 if len(cells_) > 2 else 2, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.08 if len(cells_) > 2 else 0.14, 1, 1))
    return fig


def plot_sigma_study(frame: pd.DataFrame, local: pd.DataFrame, title: str = ""):
    """Figure 5. Left: accuracy per round for each sigma (one row of panels per model), each sigma its own colour
    (distinct steps of a qualitative map), dash and marker, Local in black; right: best accuracy vs sigma with the
    Local baseline as a line (sigma -> inf is each client attending only to itself). Accuracy in % throughout."""
    import matplotlib.pyplot as plt

    from fedlib import plotting

    models = sorted(frame.model.unique())
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 3.8 * len(models)), squeeze=False)
    sigmas = sorted(frame.sigma.unique())
    styles = {s: plotting.line_style(i) for i, s in enumerate(sigmas)}
    seeds = 1
    for row, m in zip(axes, models):
        f = frame[frame.model == m]
        handles, labels, seeds, _ = plotting.draw_lines(
            row[0], f, "round", "test_acc", "sigma", sigmas, styles, names=lambda s: f"σ = {s:g}", lw=0.9
        )
        loc = local[local.model == m]
        if len(loc):
            lh, ll, _, _ = plotting.draw_lines(
                row[0], loc.assign(method="Local"), "round", "test_acc", "method",
                styles={"Local": {"color": "k", "ls": "--", "marker": None}}, names=str, lw=1.4,
            )  # fmt: skip
            handles, labels = handles + lh, labels + ll
        row[0].set_title(f"{m}: mean test accuracy per round")
        row[0].set_xlabel("round")
        plotting.round_ticks(row[0])
        row[0].set_ylabel("sample-weighted mean test accuracy")
        plotting.percent_axis(row[0])
        best_ = f.groupby("sigma").test_acc.max()
        row[1].plot(best_.index.map(lambda s: max(s, 1.0)), best_.values * 100, "o-", label="FedMCSA")
        if len(loc):
            row[1].axhline(loc.test_acc.max() * 100, color="k", ls="--", label="Local")
        row[1].set_xscale("log")
        row[1].set_xlabel("σ (σ = 0 drawn at 1)")
        row[1].set_ylabel("best mean test accuracy (%)")
        row[1].set_title(f"{m}: best accuracy vs σ")
        row[1].legend(loc="lower right")
        for ax in row:
            ax.grid(alpha=0.3)
        row[0].legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.subplots_adjust(wspace=0.45)
    return fig


def plot_attention_matrices(att, layers, order=None, labels=None, title: str = "", axis: str = "client"):
    """FedMCSA's learned attention, one panel per layer (model component; two panels per row): clients x clients,
    row i = the weights of client i's personalised model over the uploads (window mean over the rounds both were
    sampled; grey: never together). ``att``: (layers, N, N); ``order``: client order (e.g. grouped by label set);
    ``labels``: tick labels (each client's label set); ``axis``: what the clients' order is, for the axis labels."""
    import matplotlib.pyplot as plt

    from fedlib.plotting import caption, grid_axes

    att = np.asarray(att, dtype=float)
    order = np.arange(att.shape[-1]) if order is None else np.asarray(order)
    k = att.shape[0]
    names = [_layer_name(str(n), [str(x) for x in layers]) for n in layers]
    fig, axes = grid_axes(k, ncols=2, width=4.6, height=4.4, layout="constrained")
    vmax = np.nanpercentile(att, 99) if np.isfinite(att).any() else 1
    cmap = plt.get_cmap("viridis").with_extremes(bad="0.85")
    for i, (ax, a, name) in enumerate(zip(axes, att, names)):
        im = ax.imshow(a[np.ix_(order, order)], cmap=cmap, vmin=0, vmax=vmax, interpolation="nearest")
        ax.set_title(name, fontsize=10)
        if labels is not None and len(order) <= 30:
            ax.set_xticks(range(len(order)), [labels[i] for i in order], rotation=90, fontsize=8)
            ax.set_yticks(range(len(order)), [labels[i] for i in order], fontsize=8)
        else:
            ax.set_xticks([]), ax.set_yticks([])
        ax.set_xlabel(f"upload of {axis}")
        if i % 2 == 0:  # the right column shares the left's rows
            ax.set_ylabel(f"personalised model of {axis}")
    fig.suptitle(title)
    fig.colorbar(im, ax=axes, shrink=0.8, extend="max" if np.nanmax(att) > vmax else "neither",
                 label="attention weight (a row sums to 1 over\nthe clients sampled that round)")  # fmt: skip
    caption(fig, "row i: the weights client i's personalised model gives each upload, mean over the window's rounds "
                 f"in which both clients were sampled; grey: never sampled together; colour scale capped at {vmax:.2f} "
                 "(the 99th percentile).")  # fmt: skip
    return fig


def _layer_name(name: str, layers: list) -> str:
    """'1.weight' -> '1.weight (hidden layer, weights)': the DNN's Linear modules are named by their index in the
    Sequential, the last one is the output layer."""
    mod, _, kind = name.rpartition(".")
    mods = list(dict.fromkeys(n.rpartition(".")[0] for n in layers))
    if kind not in ("weight", "bias") or mod not in mods:
        return name
    what = "weights" if kind == "weight" else "bias"
    if len(mods) == 1:  # one layer drawn alone: its place in the network is not known here
        return f"{name} ({what})"
    where = "output layer" if mod == mods[-1] else "hidden layer" if len(mods) == 2 else f"layer {mods.index(mod) + 1}"
    return f"{name} ({where}, {what})"


def spectral_order(att) -> np.ndarray:
    """A client order that puts clients attending to each other next to each other: sort by the Fiedler vector
    of the symmetrised attention (mean over layers; pairs never sampled together count as 0)."""
    import warnings

    with warnings.catch_warnings():  # pairs never sampled together are NaN in every layer
        warnings.simplefilter("ignore", RuntimeWarning)
        a = np.nan_to_num(np.nanmean(np.asarray(att, dtype=float), axis=0) if np.ndim(att) == 3 else np.asarray(att))
    w = (a + a.T) / 2
    np.fill_diagonal(w, 0)
    lap = np.diag(w.sum(1)) - w
    _, vec = np.linalg.eigh(lap)
    return np.argsort(vec[:, 1]) if vec.shape[1] > 1 else np.arange(len(w))


def plot_paper_by_partition(both: pd.DataFrame, title: str = ""):
    """``paper_by_partition`` as points, one panel per (dataset, model), a row per method: ours minus the paper
    (points, mean over the seeds) on pFedMe's partition (open circle) and on FedMCSA's own (filled dot), joined by a
    line, with 0 (the paper) marked. Differences, not accuracies, because on the image data most cells sit within
    2 points of 99%, where accuracies would overlap."""
    from fedlib.plotting import COLORS, finish, grid_axes, method_name

    both = both.dropna(subset=["paper"])
    cells = both[["dataset", "model"]].drop_duplicates().values.tolist()
    rows = list(dict.fromkeys(both.algorithm))
    fig, axes = grid_axes(len(cells), 2, width=4.6, height=0.34 * len(rows) + 1.4, sharex=True)
    for ax, (d, m) in zip(axes, cells):
        sub = both[(both.dataset == d) & (both.model == m)].set_index("algorithm").reindex(rows)
        y = np.arange(len(rows))
        a, b = sub["diff, pFedMe's"], sub["diff, FedMCSA's"]
        ax.hlines(y, np.fmin(a, b), np.fmax(a, b), color="#bbbbbb", lw=1.5, zorder=1)
        ax.plot(
            a, y, "o", mfc="white", mec=COLORS[0], mew=1.5, ms=6, label="ours on pFedMe's partition, (u + j) mod 10"
        )
        ax.plot(b, y, "o", color=COLORS[1], ms=6, label="ours on FedMCSA's partition, (2u + j) mod 10")
        ax.axvline(0, color="#555555", lw=1, label="the paper")
        ax.set_yticks(y)
        ax.set_yticklabels([method_name(r) for r in rows])
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_title(f"{d} / {m}", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        ax.set_xlabel("ours − paper (points)")
        ax.tick_params(axis="x", labelbottom=True)  # every panel keeps its scale (the axis is shared)
    handles, labels = axes[0].get_legend_handles_labels()
    finish(fig, handles, labels, title=title, legend_cols=3)
    return fig


def plot_minus_mcsa(table: pd.DataFrame, title: str = ""):
    """``minus_mcsa_table`` as points, one panel per (reading, data set), a row per (model, partition): the paper's
    FedMCSA^-MCSA (grey cross) and FedAvg (grey plus) beside ours, the clients' trained models and the mean the
    server sends (mean ± 1 std over the seeds)."""
    from fedlib.plotting import COLORS, finish, grid_axes, method_name

    datasets, readings = list(dict.fromkeys(table.dataset)), list(dict.fromkeys(table.reading))
    fig, axes = grid_axes(len(datasets) * len(readings), len(datasets), width=4.4, height=2.7, sharex=True)
    for ax, (r, d) in zip(axes, [(r, d) for r in readings for d in datasets]):
        sub = table[(table.dataset == d) & (table.reading == r)].reset_index(drop=True)
        y = np.arange(len(sub))
        for i, (col, (_, label)) in enumerate(MINUS_COLUMNS.items()):
            ax.errorbar(sub[col], y + 0.12 * (2 * i - 1), xerr=sub[f"{col} std"].fillna(0), fmt="os"[i],
                        color=COLORS[i], ms=5, capsize=2, label=label)  # fmt: skip
        ax.plot(sub.paper, y, "x", color="#555555", ms=8, mew=2, label=f"paper: {method_name('fedmcsa-mcsa')}")
        ax.plot(sub["paper FedAvg"], y, "+", color="#555555", ms=9, mew=1.5, label="paper: FedAvg")
        ax.set_yticks(y)
        ax.set_yticklabels([f"{m.upper()}, {p.removeprefix('labels ')}" for m, p in zip(sub.model, sub.partition)])
        ax.set_ylim(len(sub) - 0.5, -0.5)
        ax.set_title(f"{d}: {r}", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        ax.set_xlabel("best mean test accuracy (%)")
    handles, labels = axes[0].get_legend_handles_labels()
    finish(fig, handles, labels, title=title, legend_cols=2)
    return fig


_SWITCHES_BOTTOM = 75  # the 2x2's accuracy axis starts here (%): every cell is above 80; the caption says so


def plot_switches(
    readings: "pd.DataFrame | dict[str, pd.DataFrame]", title: str = "", bottom: float | None = _SWITCHES_BOTTOM
):
    """The 2x2 as bars: per data set and model, the proximal anchor on / off, each with data-size reweighting off / on
    (mean over the seeds, ± std as error bars), Local and the paper's FedMCSA numbers for that data set as lines.
    ``readings``: Synthetic's ``readings_table``, or {data set: its ``readings_table``}. ``bottom``: where the accuracy
    axis starts (%; None: below the lowest bar by half its gap to 100%, whole points); the bars' labels get two
    decimals where the axis spans 10 points or less."""
    from fedlib import plotting

    by = readings if isinstance(readings, dict) else {"synthetic": readings}
    two = {d: _two_by_two(r) for d, r in by.items()}
    if bottom is None:
        low = min(r.weighted.min() for r in two.values())
        bottom = float(np.floor(low - (100 - low) / 2))
    panels = [(d, m, r) for d, r in by.items() for m in dict.fromkeys(two[d].model)]
    fig, axes = plotting.grid_axes(len(panels), 2, width=4.6, height=3.6)
    width, fmt = 0.36, "%.1f" if 100 - bottom > 10 else "%.2f"
    for ax, (d, m, rd) in zip(axes, panels):
        rm = two[d][two[d].model == m]
        for j, rw in enumerate(("off", "on")):
            ys, es = [], []
            for anchor in ("on", "off"):
                x = rm[(rm.anchor == anchor) & (rm.reweighting == rw)]
                ys.append(x.weighted.iloc[0] if len(x) else np.nan)
                es.append(x.weighted_std.iloc[0] if len(x) else 0.0)
            pos = np.arange(2) + (j - 0.5) * width
            bars = ax.bar(pos, ys, width, yerr=es, capsize=3, color=plotting.COLORS[j], hatch=("", "//")[j],
                          edgecolor="white", label=f"data-size reweighting {rw}")  # fmt: skip
            # inside the bar's top: above it the Local and paper lines would cross the numbers
            for text in ax.bar_label(bars, fmt=fmt, padding=-20, fontsize=8, color="white", fontweight="bold"):
                text.set_bbox(dict(facecolor=plotting.COLORS[j], edgecolor="none", pad=1.0))  # legible on the hatch
        loc = rd[(rd.reading == "Local") & (rd.model == m)]
        if len(loc):
            ax.axhline(loc.weighted.iloc[0], color="k", ls="-", lw=1.2, label="Local (each client alone)")
        first = rm.iloc[0]
        ax.axhline(first["paper Table 2"], color="#555555", ls="--", lw=1.2, label="paper, Table 2 (σ = 50, λ = 5)")
        ax.axhline(first["paper Table 1"], color="#555555", ls=":", lw=1.5, label="paper, Table 1 (tuned)")
        ax.set_xticks(np.arange(2), ["proximal anchor on\n(λ = 5, the paper)", "proximal anchor off"])
        ax.set_ylim(bottom, 100)
        ax.set_ylabel("best mean test accuracy (%)")
        ax.set_title(f"{d} / {m}")
        ax.grid(alpha=0.3, axis="y")
    handles, labels = axes[0].get_legend_handles_labels()
    order = [labels.index(x) for x in labels if x.startswith("data-size")]  # the bars first, then the lines
    order += [i for i in range(len(labels)) if i not in order]
    handles, labels = [handles[i] for i in order], [labels[i] for i in order]
    n = max((int(r.seeds.max()) for r in by.values() if len(r)), default=0)
    caption = f"bars: mean over seeds, error bars ± std over seeds (n = {n}); the y-axis starts at {bottom:g}%"
    plotting.finish(fig, handles, labels, caption, title, legend_cols=3)
    return fig


def plot_readings_sigma(paper: pd.DataFrame, code: pd.DataFrame, local: pd.DataFrame, title: str = ""):
    """Figure 5 under both readings: best sample-weighted mean test accuracy (%) against σ, the paper's equations
    (λ = 5) and the authors' code (``mcsa_code``) side by side, per model, with Local as a line. Frames: per-round
    results (``Experiment.frame``) of one seed."""
    from fedlib import plotting

    models = sorted(paper.model.unique())
    fig, axes = plotting.grid_axes(len(models), 2, width=5.5, height=3.8)
    for ax, m in zip(axes, models):
        for i, (label, f) in enumerate([("paper's equations (λ = 5)", paper), ("authors' code", code)]):
            best_ = f[f.model == m].groupby("sigma").test_acc.max()
            st = plotting.line_style(i)
            ax.plot(best_.index.map(lambda s: max(s, 1.0)), best_.values * 100, label=label, **st)
        loc = local[local.model == m]
        if len(loc):
            ax.axhline(loc.test_acc.max() * 100, color="k", ls="--", label="Local")
        ax.set_xscale("log")
        ax.set_xlabel("σ (σ = 0 drawn at 1)")
        ax.set_ylabel("best mean test accuracy (%)")
        ax.set_title(f"synthetic / {m}")
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    plotting.finish(fig, handles, labels, "one seed (0) per point", title)
    return fig
