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
