"""pFedLA's tables read from the store: per-domain accuracy of each run, Figure 3's curves, Tables 1 and 3 beside the
paper with the arrows against each base method, and the paired gains of attention with their intervals.

Every function takes stored runs (configs it loads from ``fedlib.runs.store``, or frames of them) and returns a frame;
none runs anything. Published numbers: ``fedlib/papers/paper_data/pfedla.csv``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedlib.papers import paper_data


def published() -> pd.DataFrame:
    """pFedLA Tables 1, 3 (accuracy per domain and average, method x attention) and 5/11 (the hybrid's weights)."""
    return paper_data.load("pfedla")


def _runs(cfgs, store=None):
    """For each stored run of ``cfgs``: (config, evaluated rounds, {domain: accuracy curve in %}, whether it
    diverged), the domains in the config's client order and ``'avg'``, the plain mean over them (the paper's
    Average)."""
    from fedlib.data.domains import domain_names
    from fedlib.runs.store import Store

    for cfg, res in Store.of(store).stored(cfgs):
        acc = res.client_acc * 100  # (evaluated rounds, N)
        per = {d: acc[:, i] for i, d in enumerate(domain_names(cfg.get("dataset"), cfg.get("domains")))}
        per["avg"] = acc.mean(1)
        yield cfg, res.metrics["round"].to_numpy(), per, res.meta.get("diverged_at") is not None


def frame(cfgs, store=None) -> pd.DataFrame:
    """One row per stored run and domain: algorithm, attention, attention_local, domain_percent, seed, domain,
    ``final`` (the last evaluated round's accuracy, %), ``best`` (over evaluated rounds) and ``last3`` (the mean
    of the last three evaluations: rounds 80-100 at the paper profile, a check on how much the paper's unstated
    choice of the reported round matters). Each client is one domain, in the config's domain order;
    ``domain='avg'`` is the plain mean over the domains (the paper's Average). A diverged run's numbers are all NaN
    (its best would be the best before its models became non-finite): ``paper_vs_ours`` counts it out of ``runs``."""
    rows = []
    for cfg, _, per, diverged in _runs(cfgs, store):
        for d, curve in per.items():
            rows.append(
                {
                    **{k: cfg.get(k) for k in ("algorithm", "attention", "attention_local", "domain_percent", "seed")},
                    "domain": d,
                    "final": float(curve[-1]),
                    "best": np.nan if diverged else float(np.nanmax(curve)),
                    "last3": float(curve[-3:].mean()),
                }
            )
    return pd.DataFrame(rows)


def curves(cfgs, store=None) -> pd.DataFrame:
    """pFedLA Figure 3's data: one row per stored run, evaluated round and domain (plus ``domain='avg'``, the
    plain mean over the domains): algorithm, attention, attention_local, seed, round, domain, ``acc`` (%).
    The rounds are the run's evaluated ones (every 10th at the paper profile)."""
    rows = []
    for cfg, rounds, per, _ in _runs(cfgs, store):
        fields = {k: cfg.get(k) for k in ("algorithm", "attention", "attention_local", "seed")}
        for d, curve in per.items():
            rows.extend({**fields, "round": int(rnd), "domain": d, "acc": float(v)} for rnd, v in zip(rounds, curve))
    return pd.DataFrame(rows)


def paper_vs_ours(
    frame: pd.DataFrame, dataset: str = "digits", table: str = "table1", metric: str = "final"
) -> pd.DataFrame:
    """Wide table: one row per (algorithm, attention), per domain the paper's number, ours (mean over seeds of
    ``metric``) and an arrow against the same method without attention (paper's arrow from the paper's numbers,
    ours from ours). The paper's average is over its domains (five digit domains), ours over the domains run, so
    only the per-domain columns compare like with like when fewer domains are run."""
    ref = published()
    ref = ref[(ref.table == table) & (ref.dataset == dataset)].rename(columns={"method": "algorithm"})
    local = frame[frame.attention_local] if "attention_local" in frame else frame
    ours = local.groupby(["algorithm", "attention", "domain"])[metric].agg(["mean", "count"]).reset_index()
    out = ours.merge(
        ref[["algorithm", "attention", "domain", "value"]], on=["algorithm", "attention", "domain"], how="left"
    ).rename(columns={"mean": "ours", "value": "paper", "count": "runs"})
    base = out[out.attention == "none"].set_index(["algorithm", "domain"])
    arrow = lambda v, b: "" if pd.isna(v) or pd.isna(b) else ("↑" if v > b else "↓" if v < b else "=")
    out["ours_arrow"] = [
        arrow(r.ours, base.ours.get((r.algorithm, r.domain))) if r.attention != "none" else "" for r in out.itertuples()
    ]
    out["paper_arrow"] = [
        arrow(r.paper, base.paper.get((r.algorithm, r.domain))) if r.attention != "none" else ""
        for r in out.itertuples()
    ]
    out["diff"] = out.ours - out.paper
    order = {a: i for i, a in enumerate(["none", "se", "eca", "ca", "hybrid"])}
    out = out.sort_values(["algorithm", "attention"], key=lambda s: s.map(order) if s.name == "attention" else s)
    return out[
        ["algorithm", "attention", "domain", "paper", "paper_arrow", "ours", "ours_arrow", "diff", "runs"]
    ].round(2)


# Student's t 97.5% quantiles for 1..30 degrees of freedom (two-sided 95% intervals; beyond 30: 1.96)
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def _paired(d: pd.Series) -> tuple[int, float, float, float]:
    """Seeds, mean and 95% confidence interval (Student's t) of paired differences ``d``."""
    n, m = len(d), float(d.mean())
    half = _T975[min(n - 1, 30) - 1] * float(d.std(ddof=1)) / np.sqrt(n) if n > 1 else np.nan
    return n, m, m - half, m + half


def _order_domains(out: pd.DataFrame, domains) -> pd.DataFrame:
    """Rows of ``out`` by domain in the order of ``domains`` (the average last), then by algorithm."""
    order = {d: i for i, d in enumerate(dict.fromkeys(list(domains[domains != "avg"]) + ["avg"]))}
    out = out.sort_values(
        ["domain", "algorithm"], key=lambda s: s.map(order) if s.name == "domain" else s, kind="stable"
    )
    return out.reset_index(drop=True)


def init_effect(per_client: pd.DataFrame, shared: pd.DataFrame, metric: str = "final") -> pd.DataFrame:
    """What drawing each client's attention on its own changes (``attention_init='per_client'``, the ablation
    ``pfedla_attention_init``), paired by seed: ``per_client`` and ``shared`` are ``frame`` rows of the same cells
    (Table 1's are 'shared'). One row per (algorithm, attention, domain): ``shared`` and ``per_client`` (means over
    the seeds both have, points of ``metric``), ``change`` (their paired mean difference) with its 95% interval
    ``low``..``high``, ``seeds`` and ``sign`` ('↑'/'↓' where the interval excludes 0). The pairs share the data, the
    batches and the backbone's initial weights: only the attention's initial weights differ."""
    if metric not in ("final", "last3", "best"):
        raise ValueError(f"metric={metric!r} is not one of: final, last3, best")
    key = ["algorithm", "attention", "domain", "seed"]
    both = (
        per_client.set_index(key)[metric]
        .to_frame("per_client")
        .join(shared.set_index(key)[metric].rename("shared"), how="inner")
    )
    rows = []
    for (alg, att, dom), g in both.groupby(level=[0, 1, 2], sort=False):
        n, m, low, high = _paired(g.per_client - g.shared)
        rows.append(
            {
                "algorithm": alg,
                "attention": att,
                "domain": dom,
                "shared": float(g.shared.mean()),
                "per_client": float(g.per_client.mean()),
                "change": m,
                "low": low,
                "high": high,
                "seeds": n,
                "sign": "↑" if low > 0 else "↓" if high < 0 else "",
            }
        )
    out = _order_domains(pd.DataFrame(rows), per_client.domain) if rows else pd.DataFrame(rows)
    return out.round({c: 2 for c in ("shared", "per_client", "change", "low", "high")})


def gains(frame: pd.DataFrame, metric: str = "final", dataset: str = "digits", table: str = "table1") -> pd.DataFrame:
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
        raise ValueError("pfedla.gains needs the base runs (attention='none') beside the attention runs")
    ref = published()
    ref = ref[(ref.table == table) & (ref.dataset == dataset)].set_index(["method", "attention", "domain"]).value
    rows = []
    for att in [a for a in ("se", "eca", "ca", "hybrid") if a in wide]:
        diff = (wide[att] - wide["none"]).dropna()
        for (alg, dom), d in diff.groupby(level=[0, 1]):
            n, m, low, high = _paired(d)
            paper = ref.get((alg, att, dom), np.nan) - ref.get((alg, "none", dom), np.nan)
            rows.append(
                {
                    "algorithm": alg,
                    "attention": att,
                    "domain": dom,
                    "gain": m,
                    "low": low,
                    "high": high,
                    "seeds": n,
                    "sign": "↑" if low > 0 else "↓" if high < 0 else "",
                    "paper_gain": paper,
                    "paper_in_ci": bool(low <= paper <= high) if not np.isnan(paper) else None,
                }
            )
    out = _order_domains(pd.DataFrame(rows), local.domain)
    return out.round({"gain": 2, "low": 2, "high": 2, "paper_gain": 2})
