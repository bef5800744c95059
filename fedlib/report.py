"""Paper-vs-ours tables: our best mean test accuracy (mean ± std over seeds) beside the published number."""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from . import paper_data


def ours_summary(table: pd.DataFrame, keys=("dataset", "model", "algorithm")) -> pd.DataFrame:
    """Mean and std over seeds of the best (over rounds) sample-weighted and unweighted mean accuracies, in %."""
    g = table.groupby(list(keys))
    out = pd.DataFrame({
        "ours_weighted": g.best_acc.mean() * 100, "ours_weighted_std": g.best_acc.std(ddof=0) * 100,
        "ours_unweighted": g.best_acc_mean.mean() * 100, "runs": g.size()})
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


# -- AdaFL: accuracy (best, average of the last 10 rounds) and rounds / cost to a target -----------------------------
ADAFL_TARGETS = {"mnist": (90.0, 91.0), "cifar10": (73.0,)}  # Table 2's targets; Table 4 uses its own per block


def adafl_run_metrics(metrics: pd.DataFrame, targets=(), acc: str = "global_test_acc", last: int = 10,
                      window: int = 5, tail: int | None = None) -> dict:
    """AdaFL's metrics of one run, in %: best accuracy over rounds, the average of the last ``last`` rounds
    (Table 1's "Average"), and for each target the rounds T* until the mean of the last ``window`` rounds
    exceeds it (Table 2's stopping rule) with the communication cost sum_{t <= T*} gamma^(t) M (uploads so far).
    A target never reached gives NaN (the run was too short, or never got there). ``tail`` (not in the paper)
    adds how steady the run ends: the minimum and the (population) std over its last ``tail`` evaluated rounds."""
    from .metrics import last_mean, rounds_to_target

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


def adafl_frame(cfgs, label, store=None, targets=None, max_rounds: int | None = None,
                tail: int | None = None) -> pd.DataFrame:
    """One row per stored run: dataset, method (``label(cfg)``), seed, rounds and ``adafl_run_metrics`` (with
    ``tail``). ``max_rounds`` cuts runs to their first rounds (Figure 3 draws 500 rounds of T = 1000 runs)."""
    from .store import Store

    store = store or Store()
    rows = []
    for cfg, res in store.stored(cfgs):
        m = res.metrics if max_rounds is None else res.metrics[res.metrics["round"] <= max_rounds]
        tg = ADAFL_TARGETS.get(cfg.dataset, ()) if targets is None else targets
        rows.append({"dataset": cfg.dataset, "method": label(cfg), "seed": cfg.seed, "rounds": int(m["round"].max()),
                     **adafl_run_metrics(m, tg, tail=tail)})
    return pd.DataFrame(rows)


def adafl_blocks(frame: pd.DataFrame, block: int = 100, acc: str = "global_test_acc", by: str = "method") -> pd.DataFrame:
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


def adafl_pairs(frame: pd.DataFrame, pairs, targets=()) -> pd.DataFrame:
    """Paired comparisons of methods, the numbers the readings of notebooks 22-23 quote: one row per ``(A, B)`` in
    ``pairs`` (and dataset, if the frame has several), over the seeds both have (``seeds``; with one method's extra
    seeds left out, a difference is not confounded by which seeds each has). ``frame``: ``adafl_frame`` rows (with
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
        row |= {"A": a, "B": b, "seeds": ",".join(map(str, seeds)),
               "best A-B": (A.best - B.best).mean(), "last10 A-B": (A.average - B.average).mean()}
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


def adafl_paper_vs_ours(frame: pd.DataFrame, which: str) -> pd.DataFrame:
    """Long table: dataset, method, metric, target, paper, ours (mean over seeds), sd (sample std over seeds,
    NaN for one seed), diff, runs, reached -- for every cell of the paper's ``which`` table ('table1' ...
    'table4') that we ran. A target that some seed never reached has no mean (``reached`` < ``runs``)."""
    ref = paper_data.load("adafl")
    ref = ref[ref.table == which].drop(columns="table")
    rows = []
    for (dataset, method), g in frame.groupby(["dataset", "method"]):
        for _, r in ref[(ref.dataset == dataset) & (ref.method == method)].iterrows():
            col = r.metric if pd.isna(r.target) else f"{r.metric}@{r.target:g}"
            vals = g[col] if col in g else pd.Series(dtype=float)
            whole = vals.notna().all()  # a seed that never reached the target: no mean
            ours, sd = (vals.mean(), vals.std()) if whole else (np.nan, np.nan)
            rows.append({"dataset": dataset, "method": method, "metric": r.metric, "target": r.target,
                         "paper": r.value, "ours": ours, "sd": sd, "diff": ours - r.value, "runs": len(g),
                         "reached": int(vals.notna().sum())})
    return pd.DataFrame(rows).round(2)


def adafl_cost_check(n_clients: int = 100, horizon: int = 1000, dyn_horizon: int = 1500) -> pd.DataFrame:
    """Does each published communication cost equal sum_{t <= T*} gamma^(t) M for its published T*?

    The schedule of a row follows its label: AdaFL(+X) steps 0.1 -> 0.5 over T = ``horizon`` (Sec. 3.2),
    Dyn. FedAvg over ``dyn_horizon`` ("with T = 1500"), X-0.1 / X-0.5 are constant. Costs of rows whose
    T* is a mean over 3 trials need not equal the cost of the mean T* (the mean of sums is not the sum at
    the mean when the fraction changes in between), which is how the table's mismatches arise."""
    from .selection import ConstantFraction, StepFraction, schedule_counts

    ref = paper_data.load("adafl")
    ref = ref[ref.metric.isin(["rounds", "cost"])]
    wide = ref.pivot_table(index=["table", "dataset", "method", "target"], columns="metric", values="value").reset_index()
    rows = []
    for _, r in wide.iterrows():
        label = r.method
        if label.startswith("AdaFL"):
            sched = StepFraction(0.1, 0.5, 5, horizon)
        elif label.startswith("Dyn."):
            sched = StepFraction(0.1, 0.5, 5, dyn_horizon)
        else:
            sched = ConstantFraction(float(label.rsplit("-", 1)[1]))
        ours = int(schedule_counts(sched, int(r.rounds), n_clients).sum())
        rows.append({"table": r.table, "dataset": r.dataset, "method": label, "target": r.target,
                     "rounds": int(r.rounds), "paper_cost": int(r.cost), "schedule_cost": ours,
                     "consistent": ours == int(r.cost)})
    return pd.DataFrame(rows)


# -- pFedLA: per-domain accuracy, ours beside the paper's, with the arrows against each base method ------------------
def _pfedla_runs(cfgs, store=None):
    """For each stored run of ``cfgs``: (config, evaluated rounds, {domain: accuracy curve in %}), the domains in the
    config's client order and ``'avg'``, the plain mean over them (the paper's Average)."""
    from .data.domains import domain_names
    from .store import Store

    for cfg, res in (store or Store()).stored(cfgs):
        acc = res.client_acc * 100  # (evaluated rounds, N)
        per = {d: acc[:, i] for i, d in enumerate(domain_names(cfg.dataset, cfg.domains))}
        per["avg"] = acc.mean(1)
        yield cfg, res.metrics["round"].to_numpy(), per


def pfedla_frame(cfgs, store=None) -> pd.DataFrame:
    """One row per stored run and domain: algorithm, attention, attention_local, domain_percent, seed, domain,
    ``final`` (the last evaluated round's accuracy, %), ``best`` (over evaluated rounds) and ``last3`` (the mean
    of the last three evaluations: rounds 80-100 at the paper profile, a check on how much the paper's unstated
    choice of the reported round matters). Each client is one domain, in the config's domain order;
    ``domain='avg'`` is the plain mean over the domains (the paper's Average)."""
    rows = []
    for cfg, _, per in _pfedla_runs(cfgs, store):
        for d, curve in per.items():
            rows.append({"algorithm": cfg.algorithm, "attention": cfg.attention, "attention_local": cfg.attention_local,
                         "domain_percent": cfg.domain_percent, "seed": cfg.seed, "domain": d,
                         "final": float(curve[-1]), "best": float(np.nanmax(curve)), "last3": float(curve[-3:].mean())})
    return pd.DataFrame(rows)


def pfedla_curves(cfgs, store=None) -> pd.DataFrame:
    """pFedLA Figure 3's data: one row per stored run, evaluated round and domain (plus ``domain='avg'``, the
    plain mean over the domains): algorithm, attention, attention_local, seed, round, domain, ``acc`` (%).
    The rounds are the run's evaluated ones (every 10th at the paper profile)."""
    rows = []
    for cfg, rounds, per in _pfedla_runs(cfgs, store):
        for d, curve in per.items():
            rows.extend({"algorithm": cfg.algorithm, "attention": cfg.attention,
                         "attention_local": cfg.attention_local, "seed": cfg.seed, "round": int(rnd),
                         "domain": d, "acc": float(v)} for rnd, v in zip(rounds, curve))
    return pd.DataFrame(rows)


def pfedla_paper_vs_ours(frame: pd.DataFrame, dataset: str = "digits", table: str = "table1",
                         metric: str = "final") -> pd.DataFrame:
    """Wide table: one row per (algorithm, attention), per domain the paper's number, ours (mean over seeds of
    ``metric``) and an arrow against the same method without attention (paper's arrow from the paper's numbers,
    ours from ours). The paper's average is over its domains (five digit domains), ours over the domains run, so
    only the per-domain columns compare like with like when fewer domains are run."""
    ref = paper_data.load("pfedla")
    ref = ref[(ref.table == table) & (ref.dataset == dataset)].rename(columns={"method": "algorithm"})
    local = frame[frame.attention_local] if "attention_local" in frame else frame
    ours = local.groupby(["algorithm", "attention", "domain"])[metric].agg(["mean", "count"]).reset_index()
    out = ours.merge(ref[["algorithm", "attention", "domain", "value"]], on=["algorithm", "attention", "domain"],
                     how="left").rename(columns={"mean": "ours", "value": "paper", "count": "runs"})
    base = out[out.attention == "none"].set_index(["algorithm", "domain"])
    arrow = lambda v, b: "" if pd.isna(v) or pd.isna(b) else ("↑" if v > b else "↓" if v < b else "=")
    out["ours_arrow"] = [arrow(r.ours, base.ours.get((r.algorithm, r.domain))) if r.attention != "none" else ""
                         for r in out.itertuples()]
    out["paper_arrow"] = [arrow(r.paper, base.paper.get((r.algorithm, r.domain))) if r.attention != "none" else ""
                          for r in out.itertuples()]
    out["diff"] = out.ours - out.paper
    order = {a: i for i, a in enumerate(["none", "se", "eca", "ca", "hybrid"])}
    out = out.sort_values(["algorithm", "attention"], key=lambda s: s.map(order) if s.name == "attention" else s)
    return out[["algorithm", "attention", "domain", "paper", "paper_arrow", "ours", "ours_arrow", "diff", "runs"]].round(2)


# Student's t 97.5% quantiles for 1..30 degrees of freedom (two-sided 95% intervals; beyond 30: 1.96)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def pfedla_gains(frame: pd.DataFrame, metric: str = "final", dataset: str = "digits",
                 table: str = "table1") -> pd.DataFrame:
    """What attention adds to each FL method, paired by seed: one row per (algorithm, attention, domain) with
    ``gain`` = mean over seeds of (with attention - the same method without, same seed), in points of ``metric``,
    its 95% confidence interval ``low``..``high`` (Student's t over the seeds' paired differences; seeds share
    the data, the batches and the base network's initial weights, so pairing removes most of the seed noise),
    ``seeds``, ``sign``: '↑'/'↓' where the interval excludes 0, '' where it does not, and ``paper_gain``, the
    paper's number minus its base, with ``paper_in_ci``: whether our interval contains it (our runs cannot tell
    the paper's gain from ours). Seeds present for only one of the pair are left out. Rows come in the frame's
    domain order (the average last). On ``domain='avg'`` the paper's gain is over its five digit domains, ours
    over the domains run: not like with like when fewer are run."""
    if metric not in ("final", "last3", "best"):
        raise ValueError(f"metric={metric!r} is not one of: final, last3, best")
    local = frame[frame.attention_local] if "attention_local" in frame else frame
    wide = local.pivot_table(index=["algorithm", "domain", "seed"], columns="attention", values=metric)
    if "none" not in wide:
        raise ValueError("pfedla_gains needs the base runs (attention='none') beside the attention runs")
    ref = paper_data.load("pfedla")
    ref = ref[(ref.table == table) & (ref.dataset == dataset)].set_index(["method", "attention", "domain"]).value
    rows = []
    for att in [a for a in ("se", "eca", "ca", "hybrid") if a in wide]:
        diff = (wide[att] - wide["none"]).dropna()
        for (alg, dom), d in diff.groupby(level=[0, 1]):
            n, m = len(d), float(d.mean())
            half = _T975[min(n - 1, 30) - 1] * float(d.std(ddof=1)) / np.sqrt(n) if n > 1 else np.nan
            low, high = m - half, m + half
            paper = ref.get((alg, att, dom), np.nan) - ref.get((alg, "none", dom), np.nan)
            rows.append({"algorithm": alg, "attention": att, "domain": dom, "gain": m, "low": low, "high": high,
                         "seeds": n, "sign": "↑" if low > 0 else "↓" if high < 0 else "", "paper_gain": paper,
                         "paper_in_ci": bool(low <= paper <= high) if not np.isnan(paper) else None})
    out = pd.DataFrame(rows)
    order = {d: i for i, d in enumerate(dict.fromkeys(list(local.domain[local.domain != "avg"]) + ["avg"]))}
    out = out.sort_values(["domain", "algorithm"], key=lambda s: s.map(order) if s.name == "domain" else s, kind="stable")
    return out.reset_index(drop=True).round({"gain": 2, "low": 2, "high": 2, "paper_gain": 2})
