"""Plots the papers share (seaborn/matplotlib), and where figures go. Each paper's own figures live in its package's
``figures`` module (``fedlib.papers.fedmcsa.figures``, ``.adafl.figures``, ``.pfedla.figures``).

Figures are saved as ``figures/<name>.<profile>.png``: a smoke run in CI never overwrites the committed paper-profile
figures; a parametrised run adds its parameters to the name, and a figure drawn without a data set the committed
figures were drawn with is ``<name>.<profile>.partial.png`` (``figure_name``, ``COMMITTED_DATA``), so neither
replaces a committed figure. ``FEDLIB_FIGURES`` moves the folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

# The data sets the committed paper-profile runs and figures were made with (offline: CIFAR-10, Office-31,
# Office-Home and DomainNet never were, so a committed figure may say "partial: cifar10 absent" itself).
COMMITTED_DATA = frozenset({"synthetic", "mnist", "fmnist", "digits"})


def figures_dir() -> Path:
    env = os.environ.get("FEDLIB_FIGURES")
    if env:
        d = Path(env)
    else:
        root = Path(__file__).resolve().parents[1]
        d = root / "figures" if (root / "pyproject.toml").exists() else Path.cwd() / "figures"
    d.mkdir(parents=True, exist_ok=True)
    return d


def figure_name(name: str, profile: str, partial: bool = False) -> str:
    """``<name>.<profile>.png``, or ``<name>_<tag>.<profile>.png`` in a parametrised run (``FEDLIB_FIGURE_TAG``, set
    by ``scripts/run_notebooks.py -p NAME=V1,V2``), so a grid never overwrites the default run's figures. ``partial``
    (drawn without a data set the committed figures have): ``<name>.<profile>.partial.png``, git-ignored, so that
    running the notebooks where MNIST is absent never replaces a committed figure (FedMCSA's Figure 3, say) with a
    figure of its Synthetic panel alone."""
    tag = os.environ.get("FEDLIB_FIGURE_TAG", "")
    return f"{name}{'_' + tag if tag else ''}.{profile}{'.partial' if partial else ''}.png"


def savefig(fig, name: str, profile: str, absent=()) -> Path:
    """Save ``fig`` under ``figures_dir()`` (``figure_name``). ``absent``: data sets the figure lacks; a note at the
    top says so ("partial: mnist absent"), so a figure missing panels never passes for the full one, and if one of
    them is a data set the committed figures were drawn with (``COMMITTED_DATA``) the file is
    ``<name>.<profile>.partial.png``, so it never replaces the committed one either."""
    if absent:  # above the title, where no legend or caption lies
        fig.text(
            0.5, 1.0, f"partial: {', '.join(absent)} absent (see data/README.md)", ha="center", va="bottom",
            color="#b00020", fontsize=11,
        )  # fmt: skip
    path = figures_dir() / figure_name(name, profile, partial=bool(COMMITTED_DATA.intersection(absent)))
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


ACCURACY_LABELS = {
    "test_acc": "sample-weighted mean test accuracy",
    "test_acc_mean": "unweighted mean test accuracy",
    "global_test_acc": "global test accuracy",
    "gm_test_acc": "global model's mean test accuracy",
}

# The papers' names of the methods (legends and tables say these, not the code's ids)
METHOD_NAMES = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "perfedavg": "Per-FedAvg",
    "perfedavg-hf": "Per-FedAvg (HF)",
    "pfedme": "pFedMe",
    "pfedme (PM)": "pFedMe (PM)",
    "pfedme (GM)": "pFedMe (GM)",
    "heurfedamp": "HeurFedAMP",
    "fedmcsa": "FedMCSA",
    "fedmcsa-mcsa": "FedMCSA$^{-MCSA}$",
    "fedavg+mcsa": "FedAvg$^{+MCSA}$",
    "pfedme+mcsa": "pFedMe$^{+MCSA}$",
    "local": "Local",
    "scaffold": "SCAFFOLD",
    "fedmix": "FedMix",
    "naivemix": "NaiveMix",
    "fedbn": "FedBN",
    "ditto": "Ditto",
    "fedavgm": "FedAvgM",
    "fedadam": "FedAdam",
    "fedper": "FedPer",
    "fedrep": "FedRep",
    "lgfedavg": "LG-FedAvg",
    "fedbabu": "FedBABU",
    "fedrod": "FedRoD",
    "apfl": "APFL",
    "fedfomo": "FedFomo",
    "fedala": "FedALA",
    "fedamp": "FedAMP",
    "feddyn": "FedDyn",
    "fednova": "FedNova",
}


def method_name(value) -> str:
    """The paper's name of a method id (``'pfedme (PM)'`` -> ``'pFedMe (PM)'``); other values as they are."""
    return METHOD_NAMES.get(value, str(value)) if isinstance(value, str) else str(value)


# The papers' names of data sets' domains (pFedLA: digits, Office-31, ...) and of pFedLA's attention kinds
DOMAIN_NAMES = {
    "mnist": "MNIST",
    "svhn": "SVHN",
    "usps": "USPS",
    "synthdigits": "SynthDigits",
    "mnist_m": "MNIST-M",
    "amazon": "Amazon",
    "dslr": "DSLR",
    "webcam": "Webcam",
    "avg": "average",
}
ATTENTION_NAMES = {"none": "none", "se": "SE", "eca": "ECA", "ca": "CA", "hybrid": "hybrid"}


def domain_name(value) -> str:
    """The paper's name of a domain id (``'mnist_m'`` -> ``'MNIST-M'``, ``'avg'`` -> ``'average'``); others as
    they are."""
    return DOMAIN_NAMES.get(value, str(value)) if isinstance(value, str) else str(value)


def attention_name(value) -> str:
    """pFedLA's name of an attention kind (``'eca'`` -> ``'ECA'``); others as they are."""
    return ATTENTION_NAMES.get(value, str(value)) if isinstance(value, str) else str(value)


# Line styles so that curves stay apart when colours are close or lines lie on each other: colour, dash and marker
# all change from one curve to the next.
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"]
DASHES = ["-", "--", "-.", ":"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]


def line_style(i: int) -> dict:
    return {"color": COLORS[i % len(COLORS)], "ls": DASHES[i % len(DASHES)], "marker": MARKERS[i % len(MARKERS)]}


def draw_lines(ax, frame: pd.DataFrame, x: str, y: str, hue: str, order=None, styles=None, band: bool = True,
               names=method_name, lw: float = 1.2):  # fmt: skip
    """One curve per value of ``hue`` (in ``order``): the mean over the rows sharing ``x`` (the seeds), with a band of
    ± 1 standard deviation over them where there are several; each curve with its own colour, dash and marker (every
    tenth of the points). Returns ``(handles, labels, seeds, coinciding)``: ``seeds`` the largest number of rows per
    point, ``coinciding`` the pairs of labels whose mean curves differ by less than 0.05 points anywhere."""
    order = list(pd.unique(frame[hue])) if order is None else [v for v in order if (frame[hue] == v).any()]
    handles, labels, means, seeds = [], [], {}, 1
    for i, v in enumerate(order):
        g = frame[frame[hue] == v].groupby(x)[y]
        mean, n = g.mean(), g.count()
        seeds = max(seeds, int(n.max()) if len(n) else 1)
        st = (styles or {}).get(v, line_style(i))
        step = max(1, len(mean) // 10)  # markers every tenth of the points, staggered so coinciding curves show both
        (h,) = ax.plot(mean.index, mean.values, lw=lw, markevery=(i * step // max(1, len(order)), step), ms=4,
                       label=names(v), **st)  # fmt: skip
        if band and len(n) and n.max() > 1:
            sd = g.std(ddof=1).fillna(0)
            ax.fill_between(mean.index, (mean - sd).values, (mean + sd).values, color=st["color"], alpha=0.15, lw=0)
        handles.append(h)
        labels.append(names(v))
        means[names(v)] = mean
    coinciding = []
    keys = list(means)
    for a in range(len(keys)):
        for b in range(a + 1, len(keys)):
            d = (means[keys[a]] - means[keys[b]]).dropna()
            if len(d) and float(d.abs().max()) < 5e-4:
                coinciding.append((keys[a], keys[b]))
    return handles, labels, seeds, coinciding


# AutoLocator's steps (matplotlib's default tick locator is MaxNLocator(nbins="auto", steps=these))
AUTO_STEPS = (1, 2, 2.5, 5, 10)


def round_ticks(ax, axis: str = "x") -> None:
    """Rounds on ``axis`` of ``ax`` get integer ticks: a 20-round axis reads 0, 5, 10, 15, 20 rather than 0, 2.5, 5,
    7.5, ... (a round 2.5 does not exist). ``MaxNLocator(integer=True)`` with the default locator's ``nbins`` and
    steps: the integer steps are the default's own, so where the default already picks integers (every axis of
    25 rounds or more, every committed figure's) the ticks are the same and a figure redraws identically."""
    from matplotlib.ticker import MaxNLocator

    locator = MaxNLocator(nbins="auto", steps=list(AUTO_STEPS), integer=True)
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(locator)


def percent_axis(ax, axis: str = "y") -> None:
    """Accuracies stored as fractions, shown in percent."""
    from matplotlib.ticker import PercentFormatter

    (ax.yaxis if axis == "y" else ax.xaxis).set_major_formatter(PercentFormatter(1.0, decimals=None))


def caption_text(seeds: int, coinciding=(), fewest: int | None = None) -> str:
    """What the bands mean, and which curves lie on each other (so a legend entry without a visible line is
    explained). ``fewest``: where panels hold different numbers of seeds, the fewest (``seeds`` the most)."""
    if fewest is not None and fewest < seeds:
        parts = [f"lines: mean over each panel's seeds ({fewest} to {seeds}); shaded band: ± 1 std over seeds where "
                 "there are several"]  # fmt: skip
    else:
        parts = [f"lines: mean over {seeds} seeds; shaded band: ± 1 std over seeds (n = {seeds})" if seeds > 1 else
                 "one seed per curve (no band)"]  # fmt: skip
    pairs: dict = {}
    for a, b, *where in coinciding:
        pairs.setdefault((a, b), []).extend(where)
    for (a, b), where in pairs.items():
        parts.append(f"{a} and {b} coincide{' on ' + ' and '.join(where) if where else ''} (within 0.05 points)")
    return "; ".join(parts)


def finish(fig, handles, labels, caption: str = "", title: str = "", legend_cols: int | None = None) -> None:
    """Title, one legend for the figure below the panels (outside the data), and a caption under it."""
    fig.suptitle(title)
    fig.tight_layout()
    ncol = legend_cols or min(len(labels), 5)
    leg = fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, frameon=False)
    if caption:
        rows = -(-len(labels) // ncol)
        fig.text(0.5, -0.035 - 0.06 * rows * 3.8 / fig.get_figheight(), caption, ha="center", va="top", fontsize=9,
                 color="#444444", wrap=True)  # fmt: skip
    return leg


def caption(fig, text: str, y: float | None = None, below=None):
    """A caption under the panels (what points, bars and bands are; what a colour means), for figures without
    ``finish``'s legend; call after ``tight_layout``. ``below``: an artist (a legend) the caption goes under;
    else ``y`` in figure coordinates (default: just below the axes' tick labels)."""
    if below is not None:
        fig.canvas.draw()
        y = below.get_window_extent().transformed(fig.transFigure.inverted()).y0 - 0.08 / fig.get_figheight()
    elif y is None:
        fig.canvas.draw()
        y = min(ax.get_tightbbox().transformed(fig.transFigure.inverted()).y0 for ax in fig.axes if ax.get_visible())
        y -= 0.08 / fig.get_figheight()
    return fig.text(0.5, y, text, ha="center", va="top", fontsize=9, color="#444444", wrap=True)


def percent_points_axis(ax, axis: str = "y") -> None:
    """Accuracies stored in percent (0-100), shown with a % sign on the ticks ("85%", "87.5%")."""
    from matplotlib.ticker import FuncFormatter

    (ax.yaxis if axis == "y" else ax.xaxis).set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))


def late_range(frame: pd.DataFrame, metric: str, skip: float = 0.1, pad: float = 0.01) -> tuple[float, float]:
    """y-limits that zoom on where long runs differ: the range of ``metric`` after the first ``skip`` of the
    rounds, widened by ``pad`` below and ``pad / 2`` above, within [0, 1]. (Accuracies of 1000-round runs
    otherwise sit in the top few percent of a 0-1 axis, set by the first rounds.)"""
    late = frame.loc[frame["round"] > frame["round"].max() * skip, metric].dropna()
    if late.empty:
        late = frame[metric].dropna()
    return max(0.0, float(late.min()) - pad), min(1.0, float(late.max()) + pad / 2)


def grid_axes(n: int, ncols: int = 3, width: float = 5.0, height: float = 3.6, **kw):
    """``n`` panels in rows of at most ``ncols`` (wide figures wrap); unused axes hidden. Returns (fig, flat axes)."""
    import matplotlib.pyplot as plt

    ncols = max(1, min(ncols, n))
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, **kw)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def accuracy_curves(
    frame: pd.DataFrame,
    hue: str = "algorithm",
    metrics=("test_acc", "test_acc_mean"),
    title: str = "",
    zoom: bool = False,
    panels: str | None = None,
    ncols: int = 3,
):
    """Mean test accuracy per round (one panel per metric, in %), mean over seeds with a ± 1 std band, each method
    with its own colour, dash and marker, the legend below the panels and a caption saying what the band is and
    which curves coincide. ``zoom``: accuracy panels show only the range after the first tenth of the rounds
    (``late_range``, over the whole frame, so panels of one metric share it). ``panels``: a column of ``frame``; one
    panel per metric and value of it (in order of appearance), titled with the value; more than ``ncols`` panels
    wrap into rows."""
    values = [None] if panels is None else list(pd.unique(frame[panels]))
    cells = [(m, v) for m in metrics for v in values]
    fig, axes = grid_axes(len(cells), ncols)
    order = list(pd.unique(frame[hue]))
    # panels that show different methods (e.g. one per base method) get a legend each; otherwise one for the figure
    sets = {tuple(pd.unique(frame[frame[panels] == v][hue])) for v in values} if panels is not None else set()
    own_legends = len(sets) > 1
    coinciding, counts = [], []  # counts: each panel's most seeds per curve
    for ax, (m, v) in zip(axes, cells):
        data = frame if v is None else frame[frame[panels] == v]
        handles, labels, n, co = draw_lines(ax, data, "round", m, hue, order, lw=0.9 if zoom else 1.2)
        counts.append(n)
        where = [] if m in ACCURACY_LABELS else [f"{m}"]  # e.g. uploads: equal fractions upload alike
        where += [str(v)] if v is not None else []
        coinciding += [c for c in ((a, b, *where) for a, b in co) if c not in coinciding]
        if own_legends:
            ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=min(3, len(labels)),
                      frameon=False, fontsize=8)  # fmt: skip
        ax.set_ylabel(ACCURACY_LABELS.get(m, m))
        ax.set_xlabel("round")
        round_ticks(ax)
        if v is not None:
            ax.set_title(str(v))
        if m in ACCURACY_LABELS:
            if zoom:
                ax.set_ylim(*late_range(frame, m))
            percent_axis(ax)
        ax.grid(alpha=0.3)
    seeds = max([1, *counts])
    if own_legends:
        fig.suptitle(title)
        fig.tight_layout()
        fig.text(0.5, -0.05 * 3.6 / fig.get_figheight(), caption_text(seeds, coinciding, min(counts)), ha="center",
                 va="top", fontsize=9, color="#444444")  # fmt: skip
    else:
        finish(fig, handles, labels, caption_text(seeds, coinciding, min(counts)), title)
    return fig


def partition_plot(summary: pd.DataFrame, title: str = ""):
    """Client sizes (train/test) and the label mix of every client."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 3.6))
    sizes = summary.melt(id_vars="client", value_vars=["n_train", "n_test"], var_name="split", value_name="samples")
    sns.barplot(data=sizes, x="client", y="samples", hue="split", ax=a)
    a.set_yscale("log")
    a.set_xticks(a.get_xticks()[:: max(1, len(summary) // 10)])
    cols = [c for c in summary.columns if c.startswith("label_")]
    if cols:
        share = summary.set_index("client")[cols]
        share = share.div(share.sum(1), axis=0)
        sns.heatmap(share.T, cmap="viridis", ax=b, cbar_kws={"label": "share of client's training data"})
        b.set_yticklabels([c.removeprefix("label_") for c in cols], rotation=0)
        b.set_ylabel("label")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def paper_vs_ours_bars(cmp: pd.DataFrame, title: str = "", ncols: int = 3):
    """Per (dataset, model), one row per method: the paper's accuracy (grey cross) beside ours (sample-weighted
    BMTA, mean ± 1 std over seeds as a bar through the dot). Points, not bars, so the axis can zoom on the range the
    numbers span without cutting bars; panels wrap into rows of ``ncols``."""
    cells = cmp[["dataset", "model"]].drop_duplicates().values.tolist()
    rows = list(dict.fromkeys(cmp.algorithm))
    fig, axes = grid_axes(len(cells), ncols, width=4.2, height=0.32 * len(rows) + 1.4, sharex=True)
    runs = cmp.runs.dropna() if "runs" in cmp else pd.Series([1])
    lo, hi = (int(runs.min()), int(runs.max())) if len(runs) else (1, 1)
    ours = f"ours (mean ± 1 std, n = {hi})" if lo == hi else f"ours (mean ± 1 std over the cell's {lo}-{hi} seeds)"
    for ax, (d, m) in zip(axes, cells):
        sub = cmp[(cmp.dataset == d) & (cmp.model == m)].set_index("algorithm").reindex(rows)
        y = list(range(len(rows)))
        ax.errorbar(sub.ours_weighted, y, xerr=sub.ours_weighted_std.fillna(0), fmt="o", color="#1f77b4",
                    ms=5, capsize=2, label=ours)  # fmt: skip
        ax.plot(sub.paper, y, "x", color="#555555", ms=7, mew=2, label="paper")
        ax.set_yticks(y)
        ax.set_yticklabels([method_name(r) for r in rows])
        ax.invert_yaxis()
        ax.set_title(f"{d} / {m}")
        ax.grid(axis="x", alpha=0.3)
        ax.set_xlabel("best mean test accuracy (%)")
    handles, labels = axes[0].get_legend_handles_labels()
    finish(fig, handles, labels, title=title)
    return fig


def label_cells(ax, values, fmt: str, fontsize: float = 7, image=None) -> None:
    """Write each finite value of a heat map drawn with ``imshow`` into its cell. ``image``: the ``imshow`` result;
    given, the text is white on dark cells (so values stay readable at both ends of a colour map)."""
    import numpy as np

    for (i, j), v in np.ndenumerate(values):
        if np.isfinite(v):
            color = "black"
            if image is not None:
                r, g, b, _ = image.cmap(image.norm(v))
                color = "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.45 else "black"
            ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=fontsize, color=color)
