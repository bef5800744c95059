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


def leaders(
    summary: pd.DataFrame, method: str, value: str = "ours_weighted", keys=("dataset", "model")
) -> pd.DataFrame:
    """Per cell (``keys``) of ``ours_summary``: ``method``'s accuracy, the best other method and its accuracy, and
    ``method``'s margin over it (negative: another method leads); how many methods the cell compares."""
    rows = []
    for cell, g in summary.groupby(list(keys), sort=False):
        own = g[g.algorithm == method][value]
        others = g[g.algorithm != method].dropna(subset=[value])
        if others.empty:
            continue
        best = others.loc[others[value].idxmax()]
        mine = float(own.iloc[0]) if len(own) else float("nan")
        rows.append(
            {
                **dict(zip(keys, cell if isinstance(cell, tuple) else (cell,))),
                method: mine,
                "best other": best.algorithm,
                "its accuracy": float(best[value]),
                "margin": mine - float(best[value]),
                "methods": int(g[value].notna().sum()),
            }
        )
    return pd.DataFrame(rows).round(2)


def methods_pivot(
    summary: pd.DataFrame, value: str = "ours_weighted", keys=("dataset", "model"), order=None
) -> pd.DataFrame:
    """``ours_summary`` as one row per method (in ``order``, else as they first appear) and one column per cell
    (``keys``); a method a cell does not run (a split-model method on MLR) is empty there."""
    out = summary.pivot_table(index="algorithm", columns=list(keys), values=value, sort=False)
    rows = [m for m in (order or dict.fromkeys(summary.algorithm)) if m in out.index]
    return out.reindex(rows).round(2)


def personal_and_global(frame: pd.DataFrame, keys=("dataset", "model", "algorithm"), diverged=()) -> pd.DataFrame:
    """For the methods that evaluate a global model beside the personal ones (the per-round ``gm_test_acc``): the
    best personal and the best global sample-weighted mean test accuracy (%, mean over seeds) and their gap. ``frame``:
    the per-round frame (``Experiment.frame``); ``diverged``: the keys of runs that diverged, left out as
    ``ours_summary`` leaves them out (a run's best before it diverged is not a result)."""
    has = frame.groupby("key").gm_test_acc.transform(lambda s: s.notna().any())
    sub = frame[has & ~frame.key.isin(set(diverged))]
    if sub.empty:
        return pd.DataFrame(columns=[*keys, "personal", "global", "gap"])
    per_run = sub.groupby(["key", *keys]).agg(personal=("test_acc", "max"), glob=("gm_test_acc", "max")).reset_index()
    out = per_run.groupby(list(keys))[["personal", "glob"]].mean() * 100
    out = out.rename(columns={"glob": "global"})
    out["gap"] = out.personal - out["global"]
    return out.reset_index().round(2)
