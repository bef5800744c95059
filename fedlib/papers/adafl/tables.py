"""AdaFL's tables read from the store: the paper's metrics of a run (best, average of the last 10 rounds, rounds and
communication cost to a target), paired comparisons, paper-vs-ours frames and the check of the published costs.

Every function takes stored runs (configs it loads from ``fedlib.runs.store``, or frames of them) and returns a frame;
none runs anything, so the notebooks' tables come from the committed store alone. Published numbers:
``fedlib/papers/paper_data/adafl.csv``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from fedlib.papers import paper_data
from fedlib.papers.adafl.grids import label


def published() -> pd.DataFrame:
    """AdaFL Tables 1-4 as printed: ``table``, dataset, method (the paper's labels), metric, target, value."""
    return paper_data.load("adafl")


TARGETS = {"mnist": (90.0, 91.0), "cifar10": (73.0,)}  # Table 2's targets; Table 4 uses its own per block


def run_metrics(
    metrics: pd.DataFrame,
    targets=(),
    acc: str = "global_test_acc",
    last: int = 10,
    window: int = 5,
    tail: int | None = None,
) -> dict:
    """AdaFL's metrics of one run, in %: best accuracy over rounds, the average of the last ``last`` rounds
    (Table 1's "Average"), and for each target the rounds T* until the mean of the last ``window`` rounds
    exceeds it (Table 2's stopping rule) with the communication cost sum_{t <= T*} gamma^(t) M (uploads so far).
    A target never reached gives NaN (the run was too short, or never got there). ``tail`` (not in the paper)
    adds how steady the run ends: the minimum and the (population) std over its last ``tail`` evaluated rounds."""
    from fedlib.core.metrics import last_mean, rounds_to_target

    s = metrics[acc].to_numpy(dtype=float) * 100
    out = {"best": float(np.nanmax(s)), "average": last_mean(s, last)}
    if tail is not None:
        end = s[~np.isnan(s)][-tail:]
        out[f"min_last{tail}"], out[f"std_last{tail}"] = float(end.min()), float(end.std())
    for tg in targets:
        r = rounds_to_target(s, tg, window)
        out[f"rounds@{tg:g}"] = float(r) if r is not None else np.nan
        out[f"cost@{tg:g}"] = float(metrics.uploads.iloc[r - 1]) if r is not None else np.nan
    return out


def with_counterparts(ablation: list, grid: list, algorithm: str) -> list:
    """An ablation's configs followed by the cells of ``grid`` (a table's configs) it changes one option of: those of
    ``algorithm`` with the label (``label``), seed and data set of an ablation config. Notebook 23 draws its two
    ablations (FedMix's Taylor-term scale, SCAFFOLD's control variates) beside Table 3's cells this way."""
    key = lambda c: (label(c), c.get("seed"), c.get("dataset"))
    keys = {key(c) for c in ablation}
    return list(ablation) + [c for c in grid if c.get("algorithm") == algorithm and key(c) in keys]


def frame(
    cfgs, label=label, store=None, targets=None, max_rounds: int | None = None, tail: int | None = None
) -> pd.DataFrame:
    """One row per stored run: dataset, method (``label(cfg)``), seed, rounds and ``run_metrics`` (with
    ``tail``). ``max_rounds`` cuts runs to their first rounds (Figure 3 draws 500 rounds of T = 1000 runs). A
    diverged run (``diverged_at`` in its meta) has every metric NaN: its best is the best before its models became
    non-finite, and ``paper_vs_ours`` then gives its cell no mean (``reached`` < ``runs``), as for a target a seed
    never reached."""
    from fedlib.runs.store import Store

    store = Store.of(store)
    rows = []
    for cfg, res in store.stored(cfgs):
        m = res.metrics if max_rounds is None else res.metrics[res.metrics["round"] <= max_rounds]
        tg = TARGETS.get(cfg.get("dataset"), ()) if targets is None else targets
        rows.append(
            {
                "dataset": cfg.get("dataset"),
                "method": label(cfg),
                "seed": cfg.get("seed"),
                "rounds": int(m["round"].max()),
                **run_metrics(m, tg, tail=tail),
            }
        )
        if res.meta.get("diverged_at") is not None:
            rows[-1].update({k: np.nan for k in rows[-1] if k not in ("dataset", "method", "seed", "rounds")})
    return pd.DataFrame(rows)


def blocks(frame: pd.DataFrame, block: int = 100, acc: str = "global_test_acc", by: str = "method") -> pd.DataFrame:
    """Accuracy per block of ``block`` rounds, the way AdaFL's Figure 3 is read: for each ``by`` value and block, the
    mean accuracy (%) and the mean absolute round-to-round change (%, how much the curve swings; the change into a
    block's first round counts in that block), each taken per seed and then averaged over the seeds (``seeds``).
    ``frame``: per-round metrics with ``by``, ``seed`` and ``round`` columns (``fedlib.results_frame``)."""
    f = frame.sort_values([by, "seed", "round"]).copy()
    f["change"] = f.groupby([by, "seed"])[acc].diff().abs()
    f["block"] = (f["round"] - 1) // block
    per_seed = f.groupby([by, "seed", "block"]).agg(acc=(acc, "mean"), change=("change", "mean"))
    out = per_seed.groupby([by, "block"]).agg(acc=("acc", "mean"), change=("change", "mean"), seeds=("acc", "size"))
    out[["acc", "change"]] *= 100
    out = out.reset_index()
    out.insert(1, "rounds", [f"{b * block + 1}-{(b + 1) * block}" for b in out.block])
    return out.drop(columns="block")


def pairs(frame: pd.DataFrame, pairs, targets=()) -> pd.DataFrame:
    """Paired comparisons of methods, the numbers the readings of notebooks 22-23 quote: one row per ``(A, B)`` in
    ``pairs`` (and dataset, if the frame has several), over the seeds both have (``seeds``; with one method's extra
    seeds left out, a difference is not confounded by which seeds each has). ``frame``: ``frame`` rows (with
    ``tail`` for the std columns).

    Columns: ``best A-B``, ``last10 A-B`` (mean over the common seeds of A's minus B's, points); ``std A``,
    ``std B`` (how steady each ends: mean std over the last rounds, if the frame has it); for each target t,
    ``rounds A@t`` and ``rounds B@t`` (mean over the common seeds) and ``fewer rounds %@t`` and ``fewer uploads %@t``
    (100 (1 - mean_A / mean_B): how much less A needs; negative: more). A target that A or B missed at some common
    seed has no means (NaN) and ``reached@t`` says how often each got there, as "a/b of n"."""
    rows = []
    by_dataset = frame.groupby("dataset") if "dataset" in frame else [(None, frame)]
    for (dataset, fr), (a, b) in itertools.product(by_dataset, pairs):
        A = fr[fr.method == a].set_index("seed")
        B = fr[fr.method == b].set_index("seed")
        seeds = sorted(set(A.index) & set(B.index))
        if not seeds:
            continue
        A, B = A.loc[seeds], B.loc[seeds]
        row = {"dataset": dataset} if dataset is not None else {}
        row |= {
            "A": a,
            "B": b,
            "seeds": ",".join(map(str, seeds)),
            "best A-B": (A.best - B.best).mean(),
            "last10 A-B": (A.average - B.average).mean(),
        }
        std = [c for c in frame.columns if c.startswith("std_last")]
        if std:
            row["std A"], row["std B"] = A[std[0]].mean(), B[std[0]].mean()
        for t in targets:
            ra, rb, ca, cb = A[f"rounds@{t:g}"], B[f"rounds@{t:g}"], A[f"cost@{t:g}"], B[f"cost@{t:g}"]
            whole = ra.notna().all() and rb.notna().all()
            row[f"rounds A@{t:g}"] = ra.mean() if whole else np.nan
            row[f"rounds B@{t:g}"] = rb.mean() if whole else np.nan
            row[f"fewer rounds %@{t:g}"] = 100 * (1 - ra.mean() / rb.mean()) if whole else np.nan
            row[f"fewer uploads %@{t:g}"] = 100 * (1 - ca.mean() / cb.mean()) if whole else np.nan
            row[f"reached@{t:g}"] = f"{int(ra.notna().sum())}/{int(rb.notna().sum())} of {len(seeds)}"
        rows.append(row)
    return pd.DataFrame(rows)


def paper_vs_ours(frame: pd.DataFrame, which: str) -> pd.DataFrame:
    """Long table: dataset, method, metric, target, paper, ours (mean over seeds), sd (sample std over seeds,
    NaN for one seed), diff, runs, reached -- for every cell of the paper's ``which`` table ('table1' ...
    'table4') that we ran. A target that some seed never reached has no mean (``reached`` < ``runs``)."""
    ref = published()
    ref = ref[ref.table == which].drop(columns="table")
    rows = []
    for (dataset, method), g in frame.groupby(["dataset", "method"]):
        for _, r in ref[(ref.dataset == dataset) & (ref.method == method)].iterrows():
            col = r.metric if pd.isna(r.target) else f"{r.metric}@{r.target:g}"
            vals = g[col] if col in g else pd.Series(dtype=float)
            whole = vals.notna().all()  # a seed that never reached the target: no mean
            ours, sd = (vals.mean(), vals.std()) if whole else (np.nan, np.nan)
            rows.append(
                {
                    "dataset": dataset,
                    "method": method,
                    "metric": r.metric,
                    "target": r.target,
                    "paper": r.value,
                    "ours": ours,
                    "sd": sd,
                    "diff": ours - r.value,
                    "runs": len(g),
                    "reached": int(vals.notna().sum()),
                }
            )
    return pd.DataFrame(rows).round(2)


def cost_check(n_clients: int = 100, horizon: int = 1000, dyn_horizon: int = 1500) -> pd.DataFrame:
    """Does each published communication cost equal sum_{t <= T*} gamma^(t) M for its published T*?

    The schedule of a row follows its label: AdaFL(+X) steps 0.1 -> 0.5 over T = ``horizon`` (Sec. 3.2),
    Dyn. FedAvg over ``dyn_horizon`` ("with T = 1500"), X-0.1 / X-0.5 are constant. Costs of rows whose
    T* is a mean over 3 trials need not equal the cost of the mean T* (the mean of sums is not the sum at
    the mean when the fraction changes in between), which is how the table's mismatches arise."""
    from fedlib.core.selection import ConstantFraction, StepFraction, schedule_counts

    ref = published()
    ref = ref[ref.metric.isin(["rounds", "cost"])]
    wide = ref.pivot_table(
        index=["table", "dataset", "method", "target"], columns="metric", values="value"
    ).reset_index()
    rows = []
    for _, r in wide.iterrows():
        name = r.method
        if name.startswith("AdaFL"):
            sched = StepFraction(0.1, 0.5, 5, horizon)
        elif name.startswith("Dyn."):
            sched = StepFraction(0.1, 0.5, 5, dyn_horizon)
        else:
            sched = ConstantFraction(float(name.rsplit("-", 1)[1]))
        ours = int(schedule_counts(sched, int(r.rounds), n_clients).sum())
        rows.append(
            {
                "table": r.table,
                "dataset": r.dataset,
                "method": name,
                "target": r.target,
                "rounds": int(r.rounds),
                "paper_cost": int(r.cost),
                "schedule_cost": ours,
                "consistent": ours == int(r.cost),
            }
        )
    return pd.DataFrame(rows)


def labelled(results: pd.DataFrame, cfgs, name=label, column: str = "method") -> pd.DataFrame:
    """Per-round results (``Experiment.frame``) with each run's AdaFL label (``name(cfg)``) in ``column``."""
    return results.assign(**{column: results.key.map({c.key(): name(c) for c in cfgs})})
