"""Paper-vs-ours tables shared by the papers: our best mean test accuracy (mean ± std over seeds) beside the
published number. Each paper's own reports live in its module: ``fedlib.papers.fedmcsa`` (Table 1's tuning),
``fedlib.papers.adafl`` (best / last-10 / rounds and cost to a target), ``fedlib.papers.pfedla`` (per-domain
accuracy, arrows, paired gains)."""

from __future__ import annotations

import pandas as pd

from . import paper_data


def ours_summary(table: pd.DataFrame, keys=("dataset", "model", "algorithm")) -> pd.DataFrame:
    """Mean and std over seeds of the best (over rounds) sample-weighted and unweighted mean accuracies, in %."""
    g = table.groupby(list(keys))
    out = pd.DataFrame(
        {
            "ours_weighted": g.best_acc.mean() * 100,
            "ours_weighted_std": g.best_acc.std(ddof=0) * 100,
            "ours_unweighted": g.best_acc_mean.mean() * 100,
            "runs": g.size(),
        }
    )
    return out.reset_index()


def paper_vs_ours(table: pd.DataFrame, paper: str, which: str, keys=("dataset", "model", "algorithm")) -> pd.DataFrame:
    """One row per cell we ran: the paper's number, ours (sample-weighted and unweighted BMTA) and the difference.

    ``which`` selects the paper's table (e.g. 'table2'). Cells the paper does not report (our
    Local baseline) keep an empty paper column.
    """
    ref = paper_data.load(paper)
    ref = ref[ref.table == which].rename(columns={"accuracy": "paper", "std": "paper_std"}).drop(columns="table")
    out = ours_summary(table, keys).merge(ref, on=list(keys), how="left")
    out["diff"] = out.ours_weighted - out.paper
    cols = list(keys) + ["paper", "ours_weighted", "ours_weighted_std", "diff", "ours_unweighted", "runs"]
    return out[cols].round(2)
