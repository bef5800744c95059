"""AdaFL: its experiment grids, published numbers, reports and figures.

AdaFL: adaptive client selection by attention over the clients' model divergence (Eq. 1-2) with a dynamic
participation fraction (0.1 -> 0.5 in F steps over T rounds, Sec. 2-3); experiments Sec. 3 (non-IID MNIST with an
MLP, CIFAR-10 with a CNN; Tables 1-4, Figures 2-3). Published numbers: ``fedlib/paper_data/adafl.csv``
(``published()``).

Every grid here is a pure function of ``(profile, available)`` (``fedlib.data.available.Available``); AdaFL's MNIST cells
take the data set from the base config and the CIFAR-10 cells run where that data is present.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from fedlib.config.run import RunConfig
from fedlib.papers import fedmcsa, paper_data

if TYPE_CHECKING:
    from fedlib.data.available import Available


def published() -> pd.DataFrame:
    """AdaFL Tables 1-4 as printed: ``table``, dataset, method (the paper's labels), metric, target, value."""
    return paper_data.load("adafl")


# -- grids ------------------------------------------------------------------------------------------------------------
# AdaFL (Sec. 3.1): MNIST, M = 100 clients of 2 shards of 300 (McMahan et al.'s non-IID split of the 60,000 training
# images; each client trains on all its 600, the official 10,000 test images test the global model), MLP 784-200-200-10,
# lr 0.01, momentum 0.5, E = 5, B = 10, alpha = 0.9, dynamic fraction 0.1 -> 0.5 in F = 5 steps, T = 1000 (Tables 1-2;
# Dyn. FedAvg "with T = 1500"; Figure 3: 500 rounds). Pixels are scaled to [0, 1] (the paper does not say how it
# preprocesses MNIST). 'quick' keeps the data and model but trains E = 1 for 100 rounds.
ABLATION = {  # label -> the cell's fields (Tables 1 and 2 of AdaFL)
    "AdaFL": {"selection": "attention", "fraction_schedule": (0.1, 0.5, 5)},
    "Attn.-0.1": {"selection": "attention", "fraction": 0.1},
    "Attn.-0.5": {"selection": "attention", "fraction": 0.5},
    "Dyn. FedAvg": {"fraction_schedule": (0.1, 0.5, 5), "rounds_factor": 1.5},
    "FedAvg-0.1": {"fraction": 0.1},
    "FedAvg-0.5": {"fraction": 0.5},
}
MNIST_BASE = RunConfig.of(
    dataset="mnist",
    partition="shards",
    n_clients=100,
    shard_size=300,
    train_frac=1.0,
    normalize="unit",
    model="mlp",
    hidden=(200, 200),
    lr=0.01,
    momentum=0.5,
    local_epochs=5,
    local_steps=None,
    batch_size=10,
    clients_per_round=None,
    eval_every=1,
)


def cells(labels: dict, rounds: int, seeds, **extra) -> list[dict]:
    """Grid cells of AdaFL labelled variants at ``rounds`` (``rounds_factor`` scales T for Dyn. FedAvg)."""
    out = []
    for fields in labels.values():
        f = dict(fields)
        t = int(round(rounds * f.pop("rounds_factor", 1)))
        out.append({**f, "rounds": t, "seed": list(seeds), **extra})
    return out


NAMES = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "fedmix": "FedMix",
    "naivemix": "NaiveMix",
    "scaffold": "SCAFFOLD",
    "fedmcsa": "FedMCSA",
}


def label(cfg: RunConfig) -> str:
    """The AdaFL paper's name of a config: AdaFL / Attn.-0.1 / Dyn. FedAvg / FedAvg-0.5 for FedAvg (Tables 1-2),
    AdaFL+FedProx / FedProx-0.1 ... for the others (Tables 3-4); other methods keep their registry name."""
    alg = cfg.get("algorithm")
    name = NAMES.get(alg, alg)
    attn, dyn = cfg.get("selection") == "attention", cfg.get("fraction_schedule") is not None
    frac = f"{cfg.get('fraction'):g}" if cfg.get("fraction") is not None else f"S{cfg.get('clients_per_round')}"
    if attn and dyn:
        return "AdaFL" if alg == "fedavg" else f"AdaFL+{name}"
    if attn:
        return f"Attn.-{frac}" if alg == "fedavg" else f"Attn.+{name}-{frac}"
    if dyn:
        return f"Dyn. {name}"
    return f"{name}-{frac}"


# CIFAR-10 cells (Sec. 3.1): IID over the 100 clients, the FedMix paper's CNN, lr 0.01 decaying by 0.99 per round.
# They run where CIFAR-10 is present; offline they are reported absent by the notebooks.
CIFAR = {"dataset": "cifar10", "partition": "iid", "model": "cnn", "hidden": None, "lr_decay": 0.99}


def _adafl(rounds, seeds, labels=ABLATION, smoke=False, cifar=True, **extra):
    base = MNIST_BASE
    if smoke:
        base = base.replace(n_clients=10, shard_size=30, local_epochs=1)
    elif rounds <= 100:
        base = base.replace(local_epochs=1)
    out = cells(labels, rounds, seeds, **extra)
    if cifar and not smoke:
        out += cells(labels, rounds, seeds, **{**extra, **CIFAR})
    return base, out


def table1(profile: str, available: "Available | None" = None):
    """Tables 1-2: the ablation (AdaFL, attention alone, dynamic fraction alone, FedAvg at 0.1 / 0.5), T = 1000."""
    rounds, seeds = {"smoke": (6, [0]), "quick": (100, [0]), "paper": (1000, [0, 1, 2])}[profile]
    return _adafl(rounds, seeds, smoke=profile == "smoke")


# Figure 3 draws 500 rounds. AdaFL's schedule depends on T, so it runs at T = 500; a constant-fraction run's first
# 500 rounds do not depend on T, so FedAvg-0.1/0.5 are Table 1's T = 1000 runs, drawn up to round 500.
# paper: the 3 trials of Table 1 (the paper's figure shows one curve per method; ours draws the mean and a band)
FIG3_LABELS = {k: ABLATION[k] for k in ("AdaFL", "FedAvg-0.1", "FedAvg-0.5")}


def fig3(profile: str, available: "Available | None" = None):
    """Figure 3: AdaFL vs FedAvg-0.1 / 0.5 on non-IID MNIST over 500 rounds."""
    rounds, seeds = {"smoke": (6, [0]), "quick": (50, [0]), "paper": (500, [0, 1, 2])}[profile]
    base, out = _adafl(rounds, seeds, FIG3_LABELS, smoke=profile == "smoke", cifar=False)
    return base, [c if "fraction_schedule" in c else {**c, "rounds": 2 * rounds} for c in out]


# Tables 3-4: AdaFL incorporated into FedProx, FedMix and SCAFFOLD, against each at constant fractions 0.1 and 0.5.
# The paper gives none of their own knobs; ours: FedProx mu = 0.01, FedMix lambda = 0.05 (FedMix's CIFAR-10 value; see
# fedlib/algorithms/fedmix.py) with means of M_k = 10 samples, the Taylor term at the public codes' batch scale,
# SCAFFOLD eta_g = 1 (option II). M_k = 10 is our choice, not FedMix's CIFAR-10 setting ("all": one mean of each
# client's data, 100 means in all here): each client sends 60 means, each closer to raw images than one mean of 600,
# so the privacy FedMix trades for accuracy is less than at its own setting; ``mix_mean_size`` >= 600 gives "all". Why
# the batch scale: with the per-sample term, as the equation reads, both FedMix runs on MNIST collapse after about 300
# rounds (to 26-93% from a best of 96.5%); at the batch scale both end steady (last-10 97.19 and 97.61, std over the
# last 100 rounds 0.56 and 0.11 points). The per-sample runs stay stored as an ablation (``fedmix_scale`` below, drawn
# in notebook 23).
COMBINED = {
    "fedprox": {"mu": 0.01},
    "fedmix": {"mix_lam": 0.05, "mix_mean_size": 10, "mix_taylor_scale": "batch"},
    "scaffold": {},
}
COMBINED_LABELS = {"AdaFL": ABLATION["AdaFL"], "-0.1": {"fraction": 0.1}, "-0.5": {"fraction": 0.5}}


def table3(profile: str, available: "Available | None" = None):
    """Tables 3-4: AdaFL + FedProx / FedMix / SCAFFOLD against each at fractions 0.1 and 0.5."""
    rounds, seeds = {"smoke": (6, [0]), "quick": (100, [0]), "paper": (1000, [0, 1, 2])}[profile]
    smoke = profile == "smoke"
    base, _ = _adafl(rounds, seeds, smoke=smoke, cifar=False)
    out = []
    for alg, knobs in COMBINED.items():
        out += cells(COMBINED_LABELS, rounds, seeds, algorithm=alg, **knobs)
        if not smoke:
            out += cells(COMBINED_LABELS, rounds, seeds, algorithm=alg, **knobs, **CIFAR)
    return base, out


# FedMix's Taylor-term scale (an ablation, not in the paper): AdaFL+FedMix and FedMix-0.1 with the term taken per
# sample, as FedMix's equation reads (mix_taylor_scale "sample"); Table 3's cells take it at the batch scale. Seed 0.
FEDMIX_SCALE_LABELS = {k: COMBINED_LABELS[k] for k in ("AdaFL", "-0.1")}


def fedmix_scale(profile: str, available: "Available | None" = None):
    """FedMix's Taylor term per sample (as its equation reads) instead of Table 3's batch scale, seed 0."""
    rounds = {"smoke": 6, "quick": 100, "paper": 1000}[profile]
    base, _ = _adafl(rounds, [0], smoke=profile == "smoke", cifar=False)
    knobs = {**COMBINED["fedmix"], "mix_taylor_scale": "sample"}
    return base, cells(FEDMIX_SCALE_LABELS, rounds, [0], algorithm="fedmix", **knobs)


# SCAFFOLD's control variates under momentum (an ablation, not in the paper): AdaFL+SCAFFOLD and SCAFFOLD-0.1 with
# option II's c_i+ taken as the clients' mean gradient, (1 - m) (x - y_i) / (K eta_l) (``control_estimate``
# "gradient"), where Table 3's cells take option II as written, the mean momentum-SGD update, ~1 / (1 - m) = 2x the
# gradient at AdaFL's m = 0.5 (``fedlib.algorithms.scaffold``). At the paper profile SCAFFOLD-0.1 at Table 3's three
# seeds, AdaFL+SCAFFOLD too (its growing fraction makes a run ~62 min on the 2-core CPU, two side by side; SCAFFOLD-0.1
# ~31); seed 0 below it.
SCAFFOLD_CONTROL_LABELS = FEDMIX_SCALE_LABELS
SCAFFOLD_CONTROL_SEEDS = {"AdaFL": [0, 1, 2], "-0.1": [0, 1, 2]}


def scaffold_control(profile: str, available: "Available | None" = None):
    """SCAFFOLD's control variates as the clients' mean gradient (not the mean momentum update)."""
    rounds = {"smoke": 6, "quick": 100, "paper": 1000}[profile]
    base, _ = _adafl(rounds, [0], smoke=profile == "smoke", cifar=False)
    out = []
    for name, fields in SCAFFOLD_CONTROL_LABELS.items():
        seeds = SCAFFOLD_CONTROL_SEEDS[name] if profile == "paper" else [0]
        out += cells({name: fields}, rounds, seeds, algorithm="scaffold", control_estimate="gradient")
    return base, out


# Selection dynamics (not in the paper): AdaFL vs Dyn. FedAvg on the same non-IID MNIST shards, but each client keeps
# 20% of its 600 images as a local test split, so the global model's accuracy on every client is measured each round;
# and AdaFL's selection (attention + dynamic fraction over N = 20) under FedMCSA, a personalised method, in FedMCSA's
# own MNIST setting, against FedMCSA with the same schedule but uniform selection.
def dynamics(profile: str, available: "Available | None" = None):
    """Whom AdaFL's attention selects (not in the paper), with FedAvg and with FedMCSA."""
    rounds, epochs = {"smoke": (6, 1), "quick": (100, 1), "paper": (200, 5)}[profile]
    smoke = profile == "smoke"
    base, _ = _adafl(rounds, [0], smoke=smoke, cifar=False)
    base = base.replace(train_frac=0.8, local_epochs=epochs)
    shards = [
        {"selection": "attention", "fraction_schedule": (0.1, 0.5, 5), "rounds": rounds},
        {"fraction_schedule": (0.1, 0.5, 5), "rounds": rounds},
    ]
    mcsa = dict(
        fedmcsa.DATA["mnist"],
        clients_per_round=None,
        fraction_schedule=(0.1, 0.5, 5),
        model="dnn",
        hidden=(100,),
        algorithm="fedmcsa",
        lr=0.02,
        momentum=0.0,
        batch_size=20,
        local_epochs=None,
        local_steps=20,
        train_frac=0.75,
        normalize="standardize",
        shard_size=300,
        rounds=rounds,
    )
    if smoke:
        mcsa.update(n_clients=6, local_steps=3)
    return base, shards + [{**mcsa, "selection": "attention"}, mcsa]


EXPERIMENTS = {
    "adafl_table1": table1,
    "adafl_fig3": fig3,
    "adafl_table3": table3,
    "adafl_fedmix_scale": fedmix_scale,
    "adafl_scaffold_control": scaffold_control,
    "adafl_dynamics": dynamics,
}


# -- reports: accuracy (best, average of the last 10 rounds) and rounds / cost to a target ----------------------------
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


# -- figures ---------------------------------------------------------------------------------------------------------
def plot_fraction_schedules(schedules: dict, n_clients: int, title: str = ""):
    """AdaFL Figure 2: gamma(t) of each schedule (left) and the cumulative communication cost sum gamma M (right),
    each schedule with its own colour, dash and marker, the legend below the panels and a caption naming the
    schedules that coincide (a dynamic schedule equals the constant 0.1 until its first step).
    ``schedules``: label -> K_t per round (``selection.schedule_counts``)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from fedlib import plotting

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    handles = []
    for i, (name, counts) in enumerate(schedules.items()):
        t = np.arange(1, len(counts) + 1)
        st = plotting.line_style(i)
        every = (i * 37 % 150, 150)  # markers every 150 rounds, staggered so coinciding lines show both
        (h,) = a.step(t, np.asarray(counts) / n_clients, where="post", label=name, lw=1.4, ms=5, markevery=every, **st)
        b.plot(t, np.cumsum(counts), label=name, lw=1.4, ms=5, markevery=every, **st)
        handles.append(h)
    a.set_xlabel("round t"), a.set_ylabel(f"fraction γ(t) of the M = {n_clients} clients"), a.grid(alpha=0.3)
    a.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0%}"))
    a.set_title("clients uploading per round")
    b.set_xlabel("round t"), b.set_ylabel("cumulative uploads Σ γ(t)·M"), b.grid(alpha=0.3)
    b.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    b.set_title("communication cost (models sent to the server)")
    first = {}  # each schedule's first round above its start: until then it coincides with the lowest constant
    for name, counts in schedules.items():
        c = np.asarray(counts)
        up = np.flatnonzero(c != c[0])
        first[name] = (int(c[0]), int(up[0]) + 1 if len(up) else None)
    notes = []
    for name, (k0, step) in first.items():
        same = [o for o, (k, s) in first.items() if o != name and k == k0 and s is None]
        if step is not None and same:
            notes.append(f"{name} lies on {same[0]} until round {step - 1}")
    plotting.finish(fig, handles, list(schedules), "; ".join(notes), title, legend_cols=len(schedules))
    return fig


def plot_selection_dynamics(scores, selected, client_acc, order=None, client_labels=None, title: str = ""):
    """AdaFL's attention over rounds: selection probabilities a^(t) (clients x rounds heat map, clients in ``order``,
    e.g. sorted by their label shards), beside it how often each client was selected (same rows), and below each
    client's accuracy of the global model (mean over the rounds) against that share -- do the clients with worse
    models get more attention?"""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from fedlib import plotting

    scores, selected, client_acc = np.asarray(scores, float), np.asarray(selected, bool), np.asarray(client_acc, float)
    order = np.arange(scores.shape[1]) if order is None else np.asarray(order)
    n = len(order)
    fig = plt.figure(figsize=(11, 9))
    grid = fig.add_gridspec(2, 3, width_ratios=[4, 1.2, 0.15], height_ratios=[1.5, 1], hspace=0.35, wspace=0.08)
    heat = fig.add_subplot(grid[0, 0])
    bars = fig.add_subplot(grid[0, 1], sharey=heat)
    cax = fig.add_subplot(grid[0, 2])
    scat = fig.add_subplot(grid[1, :2])
    scaled = scores[:, order].T * scores.shape[1]
    d = max(0.05, float(np.nanmax(np.abs(scaled - 1)))) if np.isfinite(scaled).any() else 1.0
    # diverging around the uniform 1/M: red clients are favoured, blue ones neglected
    im = heat.imshow(scaled, aspect="auto", cmap="RdBu_r", vmin=1 - d, vmax=1 + d, interpolation="nearest",
                     extent=(0.5, scores.shape[0] + 0.5, n - 0.5, -0.5))  # fmt: skip
    heat.set_xlabel("round t")
    heat.set_ylabel("client (its two labels), sorted by labels" if client_labels is not None else "client")
    heat.set_title("selection probability over rounds")
    cb = fig.colorbar(im, cax=cax)
    cb.set_label(f"selection probability × M\n(1 = uniform, 1/M each; M = {scores.shape[1]})")
    freq = selected[:, order].mean(0)
    acc = np.nanmean(client_acc[:, order], axis=0)
    bars.barh(np.arange(n), freq, color="tab:blue", height=0.8)
    bars.set_xlabel("share of rounds\nselected")
    bars.set_title("times selected")
    bars.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0%}" if v > 0 else ""))  # no 0% under round T
    bars.tick_params(labelleft=False)
    bars.grid(axis="x", alpha=0.3)
    if client_labels is not None:
        ticks = np.arange(0, n, max(1, n // 20))
        heat.set_yticks(ticks, [client_labels[i] for i in order[ticks]], fontsize=8)
    scat.scatter(acc * 100, freq, s=14)
    ok = np.isfinite(acc)
    r = np.corrcoef(acc[ok], freq[ok])[0, 1] if ok.sum() > 2 else np.nan
    scat.set_title(f"worse clients selected more? one point per client (correlation {r:+.2f})")
    scat.set_xlabel("client's accuracy of the global model, mean over rounds (its own test split)")
    scat.set_ylabel("share of rounds selected")
    plotting.percent_points_axis(scat, "x")
    scat.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0%}"))
    scat.grid(alpha=0.3)
    fig.suptitle(title, y=0.95)
    plotting.caption(fig, f"heat map: the attention's selection probability a_i(t) of client i in round t, times the "
                          f"M = {scores.shape[1]} clients (red: above the uniform 1/M, blue: below); the bars use the "
                          f"heat map's rows; one run.")  # fmt: skip
    return fig


def plot_accuracy_vs_cost(
    frame: pd.DataFrame, hue: str = "method", metric: str = "global_test_acc", targets=(0.95, 0.96), title: str = ""
):
    """AdaFL's cost argument as a picture: accuracy against cumulative uploads (the communication cost, log
    scale), mean over seeds, one line per ``hue``, with dotted lines at ``targets``. A curve further left at a
    target reaches it for fewer uploads. ``frame`` is ``runner.results_frame`` with a ``hue`` column."""
    import matplotlib.pyplot as plt

    from fedlib import plotting

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for i, (name, g) in enumerate(frame.groupby(hue, sort=False)):
        curve = g.groupby("round")[[metric, "uploads"]].mean()
        step = max(1, len(curve) // 10)
        ax.plot(curve.uploads, curve[metric], label=name, linewidth=1, ms=4, markevery=(i * step // 7, step),
                **plotting.line_style(i))  # fmt: skip
    for t in targets:
        ax.axhline(t, color="0.5", linestyle=":", linewidth=0.8)
    bottom = max(frame[metric].quantile(0.2), min(targets) - 0.05)
    ax.set_ylim(bottom, frame[metric].max() + 0.005)
    ax.set_xscale("log")
    shown = frame.uploads[(frame[metric] >= bottom) & (frame.uploads > 0)]
    if len(shown):
        ax.set_xlim(shown.min() / 1.5, frame.uploads.max() * 1.5)
    ax.set_xlabel("cumulative uploads (models sent to the server)")
    ax.set_ylabel(plotting.ACCURACY_LABELS.get(metric, metric))
    plotting.percent_axis(ax)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    ax.set_title(title)
    fig.tight_layout()
    return fig
