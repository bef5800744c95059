"""Plots the papers share (seaborn/matplotlib), and where figures go. Each paper's own figures live in its module
(``fedlib.papers.fedmcsa``, ``.adafl``, ``.pfedla``).

Figures are saved as ``figures/<name>.<profile>.png``: a smoke run in CI never overwrites
the committed quick- or paper-profile figures. ``FEDLIB_FIGURES`` moves the folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd


def figures_dir() -> Path:
    env = os.environ.get("FEDLIB_FIGURES")
    if env:
        d = Path(env)
    else:
        root = Path(__file__).resolve().parents[1]
        d = root / "figures" if (root / "pyproject.toml").exists() else Path.cwd() / "figures"
    d.mkdir(parents=True, exist_ok=True)
    return d


def savefig(fig, name: str, profile: str) -> Path:
    path = figures_dir() / f"{name}.{profile}.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


ACCURACY_LABELS = {
    "test_acc": "sample-weighted mean test accuracy",
    "test_acc_mean": "unweighted mean test accuracy",
    "global_test_acc": "global test accuracy",
}


def late_range(frame: pd.DataFrame, metric: str, skip: float = 0.1, pad: float = 0.01) -> tuple[float, float]:
    """y-limits that zoom on where long runs differ: the range of ``metric`` after the first ``skip`` of the
    rounds, widened by ``pad`` below and ``pad / 2`` above, within [0, 1]. (Accuracies of 1000-round runs
    otherwise sit in the top few percent of a 0-1 axis, set by the first rounds.)"""
    late = frame.loc[frame["round"] > frame["round"].max() * skip, metric].dropna()
    if late.empty:
        late = frame[metric].dropna()
    return max(0.0, float(late.min()) - pad), min(1.0, float(late.max()) + pad / 2)


def accuracy_curves(
    frame: pd.DataFrame,
    hue: str = "algorithm",
    metrics=("test_acc", "test_acc_mean"),
    title: str = "",
    zoom: bool = False,
    panels: str | None = None,
):
    """Mean test accuracy per round (one panel per metric), mean over seeds with a band. ``zoom``: accuracy
    panels show only the range after the first tenth of the rounds (``late_range``, over the whole frame, so
    panels of one metric share it). ``panels``: a column of ``frame``; one panel per metric and value of it
    (in order of appearance), titled with the value."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    values = [None] if panels is None else list(pd.unique(frame[panels]))
    cells = [(m, v) for m in metrics for v in values]
    fig, axes = plt.subplots(1, len(cells), figsize=(5.5 * len(cells), 3.8), squeeze=False)
    for ax, (m, v) in zip(axes[0], cells):
        data = frame if v is None else frame[frame[panels] == v]
        sns.lineplot(
            data=data, x="round", y=m, hue=hue, errorbar=("sd", 1), ax=ax, **({"linewidth": 0.8} if zoom else {})
        )
        ax.set_ylabel(ACCURACY_LABELS.get(m, m))
        if v is not None:
            ax.set_title(str(v))
        if zoom and m in ACCURACY_LABELS:
            ax.set_ylim(*late_range(frame, m))
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
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


def paper_vs_ours_bars(cmp: pd.DataFrame, title: str = ""):
    """Grouped bars per (dataset, model): the paper's accuracy next to ours (sample-weighted BMTA, with std)."""
    import matplotlib.pyplot as plt

    cells = cmp[["dataset", "model"]].drop_duplicates().values.tolist()
    fig, axes = plt.subplots(1, len(cells), figsize=(4.2 * len(cells), 3.8), squeeze=False, sharey=True)
    for ax, (d, m) in zip(axes[0], cells):
        sub = cmp[(cmp.dataset == d) & (cmp.model == m)]
        x = range(len(sub))
        ax.bar([i - 0.2 for i in x], sub.paper.fillna(0), width=0.4, label="paper", color="#bbbbbb")
        ax.bar(
            [i + 0.2 for i in x],
            sub.ours_weighted,
            width=0.4,
            yerr=sub.ours_weighted_std.fillna(0),
            label="ours",
            color="#1f77b4",
        )
        ax.set_xticks(list(x))
        ax.set_xticklabels(sub.algorithm, rotation=45, ha="right")
        ax.set_title(f"{d} / {m}")
        ax.grid(axis="y", alpha=0.3)
    # One lower limit for all panels (they share y): 10 points under the lowest bar anywhere, so no bar is cut.
    low = pd.concat([cmp.ours_weighted, cmp.paper]).min(skipna=True)
    axes[0][0].set_ylim(max(0.0, low - 10), 100)
    axes[0][0].set_ylabel("best mean test accuracy (%)")
    axes[0][0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def label_cells(ax, values, fmt: str) -> None:
    """Write each finite value of a heat map drawn with ``imshow`` into its cell."""
    import numpy as np

    for (i, j), v in np.ndenumerate(values):
        if np.isfinite(v):
            ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=7)
