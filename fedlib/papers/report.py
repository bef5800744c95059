"""Paper-vs-ours tables shared by the papers: our best mean test accuracy (mean ± std over seeds) beside the
published number. Each paper's own tables live in its package: ``fedlib.papers.fedmcsa.tables`` and
``.tuning`` (both readings, both partitions, Table 1's tuning), ``fedlib.papers.adafl.tables`` (best / last-10 /
rounds and cost to a target), ``fedlib.papers.pfedla.tables`` (per-domain accuracy, arrows, paired gains). Like
them, these functions read runs already stored and run nothing."""

from __future__ import annotations

import pandas as pd

from fedlib.papers import paper_data


def ours_summary(table: pd.DataFrame, keys=("dataset", "model", "algorithm")) -> pd.DataFrame:
    """Mean and std over seeds of the best (over rounds) sample-weighted and unweighted mean accuracies, in %.
    A diverged run (``diverged_at`` set: its best is the best before its models became non-finite) is left out of
    both and counted in a ``diverged`` column, which appears only when some run diverged; ``runs`` counts the rest."""
    diverged = table.diverged_at.notna() if "diverged_at" in table else pd.Series(False, index=table.index)
    g = table[~diverged].groupby(list(keys))
    out = pd.DataFrame(
        {
            "ours_weighted": g.best_acc.mean() * 100,
            "ours_weighted_std": g.best_acc.std(ddof=0) * 100,
            "ours_unweighted": g.best_acc_mean.mean() * 100,
            "runs": g.size(),
        }
    )
    if diverged.any():
        every = table.groupby(list(keys)).size().rename("all")
        out = out.reindex(every.index)  # a cell whose every run diverged: no number
        out["runs"] = out.runs.fillna(0).astype(int)
        out["diverged"] = table[diverged].groupby(list(keys)).size().reindex(every.index, fill_value=0)
    return out.reset_index()


def paper_vs_ours(table: pd.DataFrame, paper: str, which: str, keys=("dataset", "model", "algorithm")) -> pd.DataFrame:
    """One row per cell we ran: the paper's number, ours (sample-weighted and unweighted BMTA) and the difference.

    ``which`` selects the paper's table (e.g. 'table2'; one the paper's numbers do not hold is a ValueError naming
    those they do). Cells the paper does not report (our Local baseline) keep an empty paper column.
    """
    ref = paper_data.load(paper)
    tables = sorted(ref.table.unique())
    if which not in tables:
        raise ValueError(
            f"which={which!r}: the stored numbers of paper={paper!r} have no such table; they have: {', '.join(tables)}"
        )
    ref = ref[ref.table == which].rename(columns={"accuracy": "paper", "std": "paper_std"}).drop(columns="table")
    out = ours_summary(table, keys).merge(ref, on=list(keys), how="left")
    out["diff"] = out.ours_weighted - out.paper
    cols = list(keys) + ["paper", "ours_weighted", "ours_weighted_std", "diff", "ours_unweighted", "runs"]
    return out[cols + ["diverged"] * ("diverged" in out)].round(2)
