"""FedMCSA's tables read from the store: which reading of FedMCSA a run is, both readings beside the paper, the two
partitions beside the paper, which model Table 2's FedMCSA^-MCSA row evaluates, a method scored as the paper defines it
beside the authors' code's switch, and Figures 3-4's margins.

Every function here takes runs already stored (``Experiment.table`` / ``frame`` rows or configs it loads from
``fedlib.runs.store``) and returns a frame; none runs anything, so a notebook redraws its tables from the committed
store alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fedlib.config.run import RunConfig
from fedlib.core.metrics import best
from fedlib.papers.fedmcsa.paper import PARTITIONS, _table2_published, partition_label, published

if TYPE_CHECKING:
    from fedlib.runs.store import Store


# Table 2's rows with FedMCSA's attention behind another method's clients; their clients have no prox of FedMCSA's
# kind, so their authors'-code reading is the data-size reweighting alone (``by_data_size``)
PLUS_MCSA = {"fedavg+mcsa": "FedAvg^+MCSA", "pfedme+mcsa": "pFedMe^+MCSA"}


def reading(cfg: RunConfig) -> tuple[str, str, str]:
    """(row, proximal anchor, data-size reweighting) of a ``fedmcsa_readings`` config: which reading of FedMCSA it is
    and where it sits on the two switches the authors' code flips (``fedlib.algorithms.fedmcsa``: ``mcsa_code`` drops
    the anchor, and on FedMCSA also reweights; ``by_data_size`` reweights alone). FedAvg^+MCSA and pFedMe^+MCSA keep
    their own clients (``prox`` says which), so their code reading is the reweighting alone (``PLUS_MCSA``). On a
    partition other than pFedMe's the row says so: ', labels (2u + j) mod 10' (``label_stride=2``)."""
    row, prox, reweighting = _reading(cfg)
    stride = cfg.get("label_stride")  # its default, 1, on the partitions it does not apply to
    return (row if stride == 1 else f"{row}, {partition_label(stride)}"), prox, reweighting


def _reading(cfg: RunConfig) -> tuple[str, str, str]:
    alg = cfg.get("algorithm")
    if alg == "local":
        return "Local", "-", "-"
    if alg in PLUS_MCSA:  # Table 2's +MCSA rows: their clients keep their own procedure, only the server can differ
        name = PLUS_MCSA[alg]
        prox = f"pFedMe's own (λ = {cfg.get('lam'):g})" if alg == "pfedme+mcsa" else "none (FedAvg's SGD)"
        if cfg.get("by_data_size"):
            return f"{name}, authors' code (reweighting)", prox, "on"
        return f"{name}, paper's equations", prox, "off"
    name = "FedMCSA" if alg == "fedmcsa" else "FedMCSA^-MCSA"
    if cfg.get("component") == "layer":  # None on a stored config without the option: a tensor
        name += " per layer"
    code, lam = cfg.get("mcsa_code"), cfg.get("lam")
    by_size = bool(cfg.get("by_data_size"))  # None on a stored config without the option: off
    sigma = f", σ = {cfg.get('sigma'):g}" if alg == "fedmcsa" and cfg.get("sigma") != 50 else ""
    reweighting = "on" if by_size or (code and alg == "fedmcsa") else "off"
    weighted = ", data-weighted mean" if alg != "fedmcsa" and by_size else ""
    if code:
        return f"{name}, authors' code{weighted}{sigma}", "off (code)", reweighting
    if lam == 0:
        return f"{name}, paper with λ = 0{sigma}", "off (λ = 0)", reweighting
    if by_size:
        return f"{name}, paper + data-size reweighting{sigma}", f"on (λ = {lam:g})", reweighting
    return f"{name}, paper's equations{sigma}", f"on (λ = {lam:g})", reweighting


def readings_table(table: pd.DataFrame, cfgs: list[RunConfig], dataset: str = "synthetic") -> pd.DataFrame:
    """Both readings side by side on ``dataset``: per model and reading, the best sample-weighted and unweighted mean
    test accuracy (%, mean ± std over seeds) beside the paper's numbers for that data set (Table 1: FedMCSA tuned;
    Table 2: FedMCSA, FedMCSA^-MCSA, FedAvg^+MCSA and pFedMe^+MCSA at σ = 50, λ = 5). ``table``: ``Experiment.table``
    of ``cfgs`` (same order); the runs on other data sets are left out."""
    ref = published()
    ref = ref[ref.dataset == dataset].set_index(["table", "model", "algorithm"]).accuracy
    rows = pd.DataFrame([(c.get("model"), c.get("algorithm"), *reading(c)) for c in cfgs],
                        columns=["model", "algorithm", "reading", "prox", "reweighting"])  # fmt: skip
    t = pd.concat([table.reset_index(drop=True)[["seed", "best_acc", "best_acc_mean"]], rows], axis=1)
    # Figure 5's sweep points are drawn, not tabulated; the other data sets' runs are left out
    sweep_only = lambda c: c.get("algorithm") == "fedmcsa" and c.get("sigma") not in (50.0, 1000.0)
    t = t[pd.Series([c.get("dataset") == dataset and not sweep_only(c) for c in cfgs], dtype=bool)]
    g = t.groupby(["model", "reading", "algorithm", "prox", "reweighting"], sort=False)
    out = pd.DataFrame(
        {
            "weighted": g.best_acc.mean() * 100,
            "weighted_std": g.best_acc.std(ddof=0) * 100,
            "unweighted": g.best_acc_mean.mean() * 100,
            "seeds": g.size(),
        }
    ).reset_index()
    out["paper Table 2"] = [
        ref.get(("table2", m, a)) if a != "local" else None for m, a in zip(out.model, out.algorithm)
    ]
    out["paper Table 1"] = [
        ref.get(("table1", m, a)) if a == "fedmcsa" else None for m, a in zip(out.model, out.algorithm)
    ]
    return out.drop(columns="algorithm").round(2)


def _two_by_two(readings: pd.DataFrame) -> pd.DataFrame:
    """FedMCSA's rows at σ = 50 of ``readings_table``, with ``anchor`` ('on' / 'off') from the prox column."""
    # "FedMCSA per layer, ..." does not start so: the 2x2's cells are all per tensor, on pFedMe's partition
    r = readings[readings.reading.str.startswith("FedMCSA,") & ~readings.reading.str.contains("σ = |labels \\(")]
    return r.assign(anchor=r.prox.str.split().str[0])


def _mean_std(row) -> str:
    """A ``readings_table`` row's cell: '(mean) ± (std)' of the best sample-weighted accuracy (%)."""
    return f"{row.weighted:.2f} ± {row.weighted_std:.2f}"


def switches(readings: pd.DataFrame) -> pd.DataFrame:
    """The 2x2 of the authors' code's two switches on FedMCSA at σ = 50, from ``readings_table``: per model, rows the
    proximal anchor (on: λ = 5, the paper; off: λ = 0 or the code), columns data-size reweighting off / on, cells the
    best sample-weighted mean test accuracy '(mean) ± (std)' (%, over the seeds, ddof 0); beside them Local and the
    paper's Synthetic FedMCSA numbers (Table 2 at σ = 50, λ = 5; Table 1 tuned)."""
    r = _two_by_two(readings)
    local = readings[readings.reading == "Local"].set_index("model")
    out = []
    for m in dict.fromkeys(r.model):
        for anchor, label in (("on", "on (λ = 5)"), ("off", "off")):
            row = {"model": m, "proximal anchor": label}
            for rw in ("off", "on"):
                x = r[(r.model == m) & (r.anchor == anchor) & (r.reweighting == rw)]
                if len(x) > 1:
                    raise ValueError(f"switches: {len(x)} readings for {m}, anchor {anchor}, reweighting {rw}")
                row[f"reweighting {rw}"] = _mean_std(x.iloc[0]) if len(x) else ""
            row["Local"] = _mean_std(local.loc[m]) if m in local.index else ""
            first = r[r.model == m].iloc[0]
            row["paper Table 2"], row["paper Table 1"] = first["paper Table 2"], first["paper Table 1"]
            out.append(row)
    return pd.DataFrame(out).set_index(["model", "proximal anchor"])


PLUS_MCSA_READINGS = ("paper's equations", "authors' code (reweighting)")
PLUS_MCSA_COLUMNS = ["model", "method", *PLUS_MCSA_READINGS, "reweighting's change", "Local", "paper Table 2"]


def plus_mcsa(readings: pd.DataFrame) -> pd.DataFrame:
    """Table 2's FedAvg^+MCSA and pFedMe^+MCSA rows under both readings, from ``readings_table``: per model and method,
    the paper's equations and the authors' code (the data-size reweighting alone: these clients have no anchor of
    FedMCSA's kind to drop), best sample-weighted mean test accuracy '(mean) ± (std)' (%, over the seeds, ddof 0), the
    reweighting's change in points (of the two means shown), Local and the paper's Table 2 number."""
    local = readings[readings.reading == "Local"].set_index("model")
    out = []
    for m in dict.fromkeys(readings.model):
        for name in PLUS_MCSA.values():
            r = readings[(readings.model == m) & readings.reading.str.startswith(f"{name},")].set_index("reading")
            if not len(r):
                continue
            # a reading not stored yet (a grid still running, drawn with STORED_ONLY) leaves its cells empty
            paper, code = (r.loc[k] if (k := f"{name}, {x}") in r.index else None for x in PLUS_MCSA_READINGS)
            out.append(
                {
                    "model": m,
                    "method": name,
                    "paper's equations": "" if paper is None else _mean_std(paper),
                    "authors' code (reweighting)": "" if code is None else _mean_std(code),
                    "reweighting's change": None if paper is None or code is None
                    else round(code.weighted - paper.weighted, 2),
                    "Local": _mean_std(local.loc[m]) if m in local.index else "",
                    "paper Table 2": (code if paper is None else paper)["paper Table 2"],
                }
            )  # fmt: skip
    return pd.DataFrame(out, columns=PLUS_MCSA_COLUMNS).set_index(["model", "method"])


PARTITION_COLUMNS = ["model", "reading", *PARTITIONS, "change", "paper Table 2"]


def by_partition(readings: pd.DataFrame) -> pd.DataFrame:
    """The readings run on both partitions, from ``readings_table`` of one image data set: pFedMe's (client u holds
    the labels (u + j) mod 10; every other run) and FedMCSA's own copy of that script ((2u + j) mod 10,
    ``FEDMCSA_PARTITION``). Per model and reading: the best sample-weighted mean test accuracy '(mean) ± (std)' (%,
    over the seeds) on each, the change in points (of the two means shown) and the paper's Table 2 number."""
    suffix = f", {PARTITIONS[1]}"
    out = []
    for m in dict.fromkeys(readings.model):
        r = readings[readings.model == m].set_index("reading")
        for name in (x.removesuffix(suffix) for x in r.index if x.endswith(suffix)):
            ours, theirs = (r.loc[name] if name in r.index else None), r.loc[name + suffix]
            out.append(
                {
                    "model": m,
                    "reading": name,
                    PARTITIONS[0]: "" if ours is None else _mean_std(ours),
                    PARTITIONS[1]: _mean_std(theirs),
                    "change": None if ours is None else round(theirs.weighted - ours.weighted, 2),
                    "paper Table 2": theirs["paper Table 2"],
                }
            )
    return pd.DataFrame(out, columns=PARTITION_COLUMNS).set_index(["model", "reading"])


def paper_by_partition(ours: pd.DataFrame, theirs: pd.DataFrame) -> pd.DataFrame:
    """A table's cells on both partitions beside the paper, from ``fedlib.papers.report.paper_vs_ours`` (Table 2) or
    ``table1_vs_paper`` (Table 1) of the runs on pFedMe's partition (``ours``: client u holds the labels (u + j) mod
    10; ``fedmcsa_table2``, ``fedmcsa_table1``) and on FedMCSA's own ((2u + j) mod 10; ``theirs``:
    ``fedmcsa_table2_partition``, ``fedmcsa_table1_partition``). One row per (dataset, model,
    algorithm) both hold: the paper's number, our best sample-weighted mean test accuracy on each partition (%, mean
    over the seeds), each one's difference from the paper, and ``closer``: the partition whose number is nearer the
    paper's (by more than 0.05 points; '' within that or where the paper has no number)."""
    key = ["dataset", "model", "algorithm"]
    a, b = (f.set_index(key) for f in (ours, theirs))
    out = pd.DataFrame({"paper": a.paper, "pFedMe's partition": a.ours_weighted}).join(
        b.ours_weighted.rename("FedMCSA's partition"), how="inner"
    )
    out["diff, pFedMe's"] = out["pFedMe's partition"] - out.paper
    out["diff, FedMCSA's"] = out["FedMCSA's partition"] - out.paper
    gain = out["diff, pFedMe's"].abs() - out["diff, FedMCSA's"].abs()
    out["closer"] = np.select([gain > 0.05, gain < -0.05], ["FedMCSA's", "pFedMe's"], "")
    return out.round(2).reset_index()


# -- which model FedMCSA^-MCSA evaluates (notebook 13) ----------------------------------------------------------------


MINUS_COLUMNS = {  # column -> (metrics column of a ``table2_mean`` run, its label in the figure)
    "trained Θ_i": ("test_acc", "ours: the clients' trained models Θ_i (Algorithm 1)"),
    "sent mean": ("gm_test_acc", "ours: the mean the server sends"),
}


def minus_mcsa_table(cfgs: list[RunConfig], table2: dict, store: "Store | None" = None) -> pd.DataFrame:
    """Which model Table 2's FedMCSA^-MCSA numbers are, from the runs of ``table2_mean`` (``cfgs``, stored in
    ``store``). One row per (data set, model, partition, reading): the paper's FedMCSA^-MCSA number, our best
    sample-weighted mean test accuracy (%, mean and std over the seeds) of the clients' trained models Θ_i (Table 2's
    cell, as Algorithm 1 evaluates) and of the mean the server sends, each one's difference from the paper, and
    FedAvg's number in the paper and ours (``table2``: label_stride -> ``report.paper_vs_ours`` of Table 2 on that
    partition, or None; a partition without one gets none). A diverged run is left out, as
    ``report.ours_summary`` leaves it out."""
    from fedlib.runs.store import Store

    store = Store.of(store)
    ref = _table2_published()
    runs = []
    for cfg in cfgs:
        res = store.load(cfg)
        if res is None or res.meta.get("diverged_at") is not None:
            continue
        cell = {f: cfg.get(f) for f in ("dataset", "model", "label_stride")}
        cell["reading"] = _reading(cfg)[0].removeprefix("FedMCSA^-MCSA, ")
        runs.append({**cell, **{c: 100 * best(res.metrics[m]) for c, (m, _) in MINUS_COLUMNS.items()}})
    g = pd.DataFrame(runs).groupby(["dataset", "model", "label_stride", "reading"], sort=False)
    out = g.mean().join(g.std(ddof=0).add_suffix(" std")).assign(seeds=g.size()).reset_index()
    ours_fedavg = _ours(table2, "fedavg")
    out["paper"] = [ref.get((d, m, "fedmcsa-mcsa")) for d, m in zip(out.dataset, out.model)]
    out["Θ_i − paper"] = out["trained Θ_i"] - out.paper
    out["mean − paper"] = out["sent mean"] - out.paper
    out["paper FedAvg"] = [ref.get((d, m, "fedavg")) for d, m in zip(out.dataset, out.model)]
    out["our FedAvg"] = [ours_fedavg.get(k) for k in zip(out.label_stride, out.dataset, out.model)]
    out.insert(2, "partition", [partition_label(s) for s in out.pop("label_stride")])
    cols = ["paper", "trained Θ_i", "trained Θ_i std", "Θ_i − paper", "sent mean", "sent mean std", "mean − paper"]
    return out[["dataset", "model", "partition", "reading", *cols, "paper FedAvg", "our FedAvg", "seeds"]].round(2)


def _ours(table2: dict, algorithm: str) -> dict:
    """{(label_stride, dataset, model): our number} of ``algorithm`` in ``table2`` (label_stride ->
    ``report.paper_vs_ours`` of Table 2 on that partition, or None)."""
    return {
        (s, d, m): v
        for s, cmp in table2.items()
        if cmp is not None
        for d, m, a, v in cmp[["dataset", "model", "algorithm", "ours_weighted"]].itertuples(index=False)
        if a == algorithm
    }


def mcsa_gain(minus: pd.DataFrame, table2: dict) -> pd.DataFrame:
    """What Table 2's ablation measures: FedMCSA minus FedMCSA^-MCSA, the paper's and ours, per (data set, model,
    partition), on the paper's equations (``minus``: ``minus_mcsa_table``, whose rows of that reading are used;
    ``table2`` as there, for our FedMCSA). The paper sets FedMCSA's personalised models against a number that
    tracks a global model's; ours against the variant's trained models Θ_i (evaluated alike) and against the mean
    the server sends (evaluated as the paper's row seems to be)."""
    ours, ref = _ours(table2, "fedmcsa"), _table2_published()
    rows = minus[minus.reading == "paper's equations"]
    out = rows[["dataset", "model", "partition"]].copy()
    strides = {partition_label(s): s for s in table2}
    out["paper FedMCSA"] = [ref.get((d, m, "fedmcsa")) for d, m in zip(rows.dataset, rows.model)]
    out["paper gap"] = out["paper FedMCSA"] - rows.paper
    out["our FedMCSA"] = [ours.get((strides.get(p), d, m)) for d, m, p in zip(rows.dataset, rows.model, rows.partition)]
    out["gap over Θ_i"] = out["our FedMCSA"] - rows["trained Θ_i"]
    out["gap over the mean"] = out["our FedMCSA"] - rows["sent mean"]
    return out.round(2).reset_index(drop=True)


# -- Figures 3-4's numbers (notebooks 10 and 11) ---------------------------------------------------------------------


def method_frame(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Figures 3-4's curves from per-round results (``Experiment.frame``): a ``method`` column with pFedMe's
    personalised models as 'pfedme (PM)' and its global model as a row of its own, 'pfedme (GM)'; and each method's
    best accuracy (%, sample-weighted) per data set."""
    frame = frame.assign(method=frame.algorithm)
    gm = frame[frame.algorithm == "pfedme"].assign(method="pfedme (GM)", test_acc=lambda f: f.gm_test_acc)
    frame = pd.concat([frame.assign(method=frame.method.replace({"pfedme": "pfedme (PM)"})), gm])
    best_ = frame.groupby(["dataset", "method"]).test_acc.max().unstack(0).mul(100).round(2)
    return frame, best_


# Sec. 5.2.1's text (the figures' "same hyperparameters"): FedMCSA "is about x% more accurate than" each method, in
# points, on Synthetic and MNIST; the methods in the text's order
MARGIN_METHODS = ["fedavg", "fedprox", "perfedavg", "pfedme (GM)", "pfedme (PM)", "heurfedamp"]
PAPER_MARGINS = {
    ("mlr", "synthetic"): [16.86, 16.66, 9.55, 17.57, 10.53, 9.64],
    ("mlr", "mnist"): [6.47, 6.42, 5.60, 6.53, 2.75, 0.50],
    ("dnn", "synthetic"): [11.39, 11.69, 7.52, 13.42, 9.07, 11.61],
    ("dnn", "mnist"): [2.94, 2.96, 1.81, 3.06, 1.50, 1.07],
}


def figure_margins(model: str, dataset: str, best_by: dict) -> pd.DataFrame:
    """FedMCSA's margin over each method Sec. 5.2.1 names (points: FedMCSA's best sample-weighted mean test accuracy
    minus the method's), per column of ``best_by`` ({label: a data set's column of ``figure_3_4(...).best``}; a None
    column is left out), beside the paper's stated margin for ``model`` and ``dataset``."""
    out = pd.DataFrame(index=pd.Index(MARGIN_METHODS, name="FedMCSA over"))
    for label, best_ in best_by.items():
        if best_ is not None and "fedmcsa" in best_.index:
            out[label] = (best_["fedmcsa"] - best_.reindex(MARGIN_METHODS)).round(2)
    out["paper (Sec. 5.2.1)"] = PAPER_MARGINS[(model, dataset)]
    return out


def switched_eval(default: pd.DataFrame, switched: pd.DataFrame) -> pd.DataFrame:
    """A method scored as the paper defines it beside its authors' code's evaluation switch (``grids.CODE_EVAL``),
    from two ``Experiment.table`` frames: one row per algorithm, data set and model with the mean over the seeds
    stored in both (``runs``) of the best sample-weighted (``paper``, ``code``) and unweighted (``paper_unweighted``,
    ``code_unweighted``) accuracies, in %, and ``diff`` = code - paper. Runs are paired by seed: a switch changes only
    what is scored, so the two runs of a seed trained the same models and their difference is the switch's alone."""
    keys = ["algorithm", "dataset", "model", "seed"]

    def scored(table: pd.DataFrame, name: str) -> pd.DataFrame:
        kept = table[table.diverged_at.isna()]
        return kept[[*keys, "best_acc", "best_acc_mean"]].rename(
            columns={"best_acc": name, "best_acc_mean": f"{name}_unweighted"}
        )

    accs = ["paper", "code", "paper_unweighted", "code_unweighted"]
    both = scored(default, "paper").merge(scored(switched, "code"), on=keys)
    out = both.groupby(keys[:-1], sort=False).agg(runs=("seed", "size"), **{c: (c, "mean") for c in accs})
    out[accs] = out[accs] * 100
    out["diff"] = out.code - out.paper
    return out[["runs", "paper", "code", "diff", "paper_unweighted", "code_unweighted"]].round(2).reset_index()
