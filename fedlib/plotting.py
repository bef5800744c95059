"""Plots the notebooks share (seaborn/matplotlib), and where figures go.

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


def accuracy_curves(frame: pd.DataFrame, hue: str = "algorithm", metrics=("test_acc", "test_acc_mean"), title: str = ""):
    """Mean test accuracy per round (one panel per metric), mean over seeds with a band."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    labels = {"test_acc": "sample-weighted mean test accuracy", "test_acc_mean": "unweighted mean test accuracy",
              "global_test_acc": "global test accuracy"}
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 3.8), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        sns.lineplot(data=frame, x="round", y=m, hue=hue, errorbar=("sd", 1), ax=ax)
        ax.set_ylabel(labels.get(m, m))
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
        ax.bar([i + 0.2 for i in x], sub.ours_weighted, width=0.4, yerr=sub.ours_weighted_std.fillna(0),
               label="ours", color="#1f77b4")
        ax.set_xticks(list(x))
        ax.set_xticklabels(sub.algorithm, rotation=45, ha="right")
        ax.set_title(f"{d} / {m}")
        ax.set_ylim(max(0, min(sub.ours_weighted.min(), sub.paper.min(skipna=True) if sub.paper.notna().any() else 100) - 10), 100)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("best mean test accuracy (%)")
    axes[0][0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def sigma_study(frame: pd.DataFrame, local: pd.DataFrame, title: str = ""):
    """Left: accuracy per round for each sigma (one row of panels per model); right: best accuracy vs sigma
    with the Local baseline as a line (sigma -> inf is each client attending only to itself)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    models = sorted(frame.model.unique())
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 3.6 * len(models)), squeeze=False)
    for row, m in zip(axes, models):
        f = frame[frame.model == m].copy()
        f["sigma"] = f.sigma.map(lambda s: f"{s:g}")
        sns.lineplot(data=f, x="round", y="test_acc", hue="sigma", ax=row[0], palette="viridis")
        loc = local[local.model == m]
        if len(loc):
            row[0].plot(loc["round"], loc.test_acc, color="k", ls="--", label="Local")
        row[0].set_title(f"{m}: mean test accuracy per round")
        row[0].legend(fontsize=8, ncol=2)
        best = frame[frame.model == m].groupby("sigma").test_acc.max()
        row[1].plot(best.index.map(lambda s: max(s, 1.0)), best.values * 100, "o-", label="FedMCSA")
        if len(loc):
            row[1].axhline(loc.test_acc.max() * 100, color="k", ls="--", label="Local")
        row[1].set_xscale("log")
        row[1].set_xlabel("sigma (0 drawn at 1)")
        row[1].set_ylabel("best mean test accuracy (%)")
        row[1].set_title(f"{m}: best accuracy vs sigma")
        row[1].legend()
        for ax in row:
            ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def method_curves(frame: pd.DataFrame, title: str = ""):
    """Mean test accuracy per round of every method, one panel per data set (FedMCSA Figures 3 and 4)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    datasets = sorted(frame.dataset.unique())
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 4), squeeze=False)
    for ax, d in zip(axes[0], datasets):
        sns.lineplot(data=frame[frame.dataset == d], x="round", y="test_acc", hue="method", ax=ax, linewidth=1)
        ax.set_title(d)
        ax.set_ylabel("mean test accuracy (sample-weighted)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
