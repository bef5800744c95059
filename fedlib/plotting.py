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


ACCURACY_LABELS = {"test_acc": "sample-weighted mean test accuracy", "test_acc_mean": "unweighted mean test accuracy",
                   "global_test_acc": "global test accuracy"}


def late_range(frame: pd.DataFrame, metric: str, skip: float = 0.1, pad: float = 0.01) -> tuple[float, float]:
    """y-limits that zoom on where long runs differ: the range of ``metric`` after the first ``skip`` of the
    rounds, widened by ``pad`` below and ``pad / 2`` above, within [0, 1]. (Accuracies of 1000-round runs
    otherwise sit in the top few percent of a 0-1 axis, set by the first rounds.)"""
    late = frame.loc[frame["round"] > frame["round"].max() * skip, metric].dropna()
    if late.empty:
        late = frame[metric].dropna()
    return max(0.0, float(late.min()) - pad), min(1.0, float(late.max()) + pad / 2)


def accuracy_curves(frame: pd.DataFrame, hue: str = "algorithm", metrics=("test_acc", "test_acc_mean"), title: str = "",
                    zoom: bool = False, panels: str | None = None):
    """Mean test accuracy per round (one panel per metric), mean over seeds with a band. ``zoom``: accuracy
    panels show only the range after the first tenth of the rounds (``late_range``, over the whole frame, so
    panels of one metric share it). ``panels``: a column of ``frame``; one panel per metric and value of it
    (in order of appearance), titled with the value."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    values = [None] if panels is None else list(pd.unique(frame[panels]))
    cells = [(m, v) for m in metrics for v in values]
    fig, axes = plt.subplots(1, len(cells), figsize=(5.5 * len(cells), 3.8), squeeze=False)
    for ax, (m, v) in zip(axes[0], cells):
        data = frame if v is None else frame[frame[panels] == v]
        sns.lineplot(data=data, x="round", y=m, hue=hue, errorbar=("sd", 1), ax=ax, **({"linewidth": 0.8} if zoom else {}))
        ax.set_ylabel(ACCURACY_LABELS.get(m, m))
        if v is not None:
            ax.set_title(str(v))
        if zoom and m in ACCURACY_LABELS:
            ax.set_ylim(*late_range(frame, m))
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
        ax.grid(axis="y", alpha=0.3)
    # One lower limit for all panels (they share y): 10 points under the lowest bar anywhere, so no bar is cut.
    low = pd.concat([cmp.ours_weighted, cmp.paper]).min(skipna=True)
    axes[0][0].set_ylim(max(0.0, low - 10), 100)
    axes[0][0].set_ylabel("best mean test accuracy (%)")
    axes[0][0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def tuning_gain(frame: pd.DataFrame, paper: pd.DataFrame | None = None, title: str = ""):
    """FedMCSA Table 1's grid at a glance, one panel per (dataset, model): for each method the span of BMTA over
    its grid (bar), the setting Figures 3-4 use (open circle), the winner (filled dot) and the paper's Table 1
    number (red cross; ``paper`` rows: dataset, model, algorithm, accuracy)."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    frame = frame[frame.stored]
    cells = frame[["dataset", "model"]].drop_duplicates().values.tolist()
    if not cells:
        fig, ax = plt.subplots(figsize=(4, 1))
        ax.axis("off")
        ax.text(0.5, 0.5, "no grid runs stored", ha="center")
        return fig
    rows = list(dict.fromkeys(frame.row))
    fig, axes = plt.subplots(1, len(cells), figsize=(3.4 * len(cells), 0.45 * len(rows) + 1.6), squeeze=False,
                             sharey=True)
    for ax, (d, m) in zip(axes[0], cells):
        sub = frame[(frame.dataset == d) & (frame.model == m)]
        for y, row in enumerate(rows):
            g = sub[sub.row == row]
            if g.empty:
                continue
            ax.plot([g.bmta.min(), g.bmta.max()], [y, y], color="#9ecae1", lw=6, solid_capstyle="butt")
            ax.plot(g[g.figure_setting].bmta, [y] * int(g.figure_setting.sum()), "o", mfc="white", mec="k")
            if g.winner.any():
                ax.plot(g[g.winner].bmta, [y], "o", color="#08519c")
            if paper is not None:
                p = paper[(paper.dataset == d) & (paper.model == m) & (paper.algorithm == row)]
                ax.plot(p.accuracy, [y] * len(p), "x", color="#d62728", ms=8, mew=2)
        ax.set_title(f"{d} / {m}")
        ax.set_xlabel("BMTA (%)")
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(range(len(rows)))
    axes[0][0].set_yticklabels(rows)
    axes[0][0].invert_yaxis()
    handles = [Line2D([], [], color="#9ecae1", lw=6, label="grid span"),
               Line2D([], [], marker="o", ls="", mfc="white", mec="k", label="Figs 3-4 setting"),
               Line2D([], [], marker="o", ls="", color="#08519c", label="winner (seed 0)"),
               Line2D([], [], marker="x", ls="", color="#d62728", mew=2, label="paper Table 1")]
    fig.legend(handles=handles, loc="lower center", ncol=4 if len(cells) > 2 else 2, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.08 if len(cells) > 2 else 0.14, 1, 1))
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


def fraction_schedules(schedules: dict, n_clients: int, title: str = ""):
    """AdaFL Figure 2: gamma(t) of each schedule (left) and the cumulative communication cost sum gamma M (right).
    ``schedules``: label -> K_t per round (``selection.schedule_counts``)."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    for label, counts in schedules.items():
        t = np.arange(1, len(counts) + 1)
        a.step(t, np.asarray(counts) / n_clients, where="post", label=label)
        b.plot(t, np.cumsum(counts), label=label)
    a.set_xlabel("round t"), a.set_ylabel("fraction γ(t)"), a.grid(alpha=0.3), a.legend()
    b.set_xlabel("round t"), b.set_ylabel("communication cost Σ γ(t) M (model uploads)"), b.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def selection_dynamics(scores, selected, client_acc, order=None, client_labels=None, title: str = ""):
    """AdaFL's attention over rounds: selection probabilities a^(t) (clients x rounds heat map, clients in ``order``,
    e.g. sorted by their label shards), how often each client was selected, and each client's accuracy of the
    global model (mean over the rounds) -- do the clients with worse models get more attention?"""
    import matplotlib.pyplot as plt
    import numpy as np

    scores, selected, client_acc = np.asarray(scores, float), np.asarray(selected, bool), np.asarray(client_acc, float)
    order = np.arange(scores.shape[1]) if order is None else np.asarray(order)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), gridspec_kw={"width_ratios": [3, 1, 1]})
    im = axes[0].imshow(scores[:, order].T * scores.shape[1], aspect="auto", cmap="magma", interpolation="nearest")
    axes[0].set_xlabel("round t"), axes[0].set_ylabel("client (sorted)")
    fig.colorbar(im, ax=axes[0], label="M · a_i(t)  (1 = uniform)")
    freq = selected[:, order].mean(0)
    acc = np.nanmean(client_acc[:, order], axis=0)
    axes[1].barh(np.arange(len(order)), freq, color="tab:blue")
    axes[1].invert_yaxis(), axes[1].set_xlabel("share of rounds selected"), axes[1].set_yticks([])
    axes[2].scatter(acc * 100, freq, s=12)
    axes[2].set_xlabel("client's accuracy of the global model (%)"), axes[2].set_ylabel("share of rounds selected")
    axes[2].grid(alpha=0.3)
    if client_labels is not None:
        ticks = np.arange(0, len(order), max(1, len(order) // 10))
        axes[0].set_yticks(ticks, [client_labels[i] for i in order[ticks]], fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _label_cells(ax, values, fmt: str) -> None:
    """Write each finite value of a heat map drawn with ``imshow`` into its cell."""
    import numpy as np

    for (i, j), v in np.ndenumerate(values):
        if np.isfinite(v):
            ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=7)


def hybrid_weights(weights, clients, title: str = "", mechanisms=("SE", "ECA", "CA")):
    """pFedLA Table 5/11 as a heat map: each client's learned softmax weights per attention slot and mechanism.
    ``weights``: (N, slots, 3); ``clients``: the N row labels (domains)."""
    import matplotlib.pyplot as plt
    import numpy as np

    w = np.asarray(weights, dtype=float)
    n, slots, k = w.shape
    fig, ax = plt.subplots(figsize=(1.1 * slots * k + 2, 0.5 * n + 1.6))
    d = max(0.01, float(np.abs(w - 1 / 3).max()))  # a diverging scale centred on the initial 1/3
    im = ax.imshow(w.reshape(n, slots * k), cmap="RdBu_r", vmin=1 / 3 - d, vmax=1 / 3 + d, aspect="auto")
    _label_cells(ax, w.reshape(n, slots * k), "{:.3f}")
    ax.set_xticks(range(slots * k), [f"L{s + 1} {m}" for s in range(slots) for m in mechanisms], rotation=45, ha="right")
    ax.set_yticks(range(n), clients)
    fig.colorbar(im, ax=ax, label="weight (1/3 at the start)")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def attention_matrices(att, layers, order=None, labels=None, title: str = ""):
    """FedMCSA's learned attention, one panel per layer (model component): clients x clients, row i = the weights of
    client i's personalised model over the uploads (window mean over the rounds both were sampled; grey: never
    together). ``att``: (layers, N, N); ``order``: client order (e.g. grouped by label set); ``labels``: tick labels."""
    import matplotlib.pyplot as plt
    import numpy as np

    att = np.asarray(att, dtype=float)
    order = np.arange(att.shape[-1]) if order is None else np.asarray(order)
    k = att.shape[0]
    fig, axes = plt.subplots(1, k, figsize=(3.4 * k + 1, 3.6), squeeze=False)
    vmax = np.nanpercentile(att, 99) if np.isfinite(att).any() else 1
    cmap = plt.get_cmap("viridis").copy()
    cmap.set_bad("0.85")
    for ax, a, name in zip(axes[0], att, layers):
        im = ax.imshow(a[np.ix_(order, order)], cmap=cmap, vmin=0, vmax=vmax, interpolation="nearest")
        ax.set_title(str(name), fontsize=9)
        if labels is not None and len(order) <= 30:
            ax.set_xticks(range(len(order)), [labels[i] for i in order], rotation=90, fontsize=6)
            ax.set_yticks(range(len(order)), [labels[i] for i in order], fontsize=6)
        else:
            ax.set_xticks([]), ax.set_yticks([])
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="attention weight")
    fig.suptitle(title)
    return fig


def spectral_order(att) -> "np.ndarray":
    """A client order that puts clients attending to each other next to each other: sort by the Fiedler vector
    of the symmetrised attention (mean over layers; pairs never sampled together count as 0)."""
    import numpy as np

    import warnings

    with warnings.catch_warnings():  # pairs never sampled together are NaN in every layer
        warnings.simplefilter("ignore", RuntimeWarning)
        a = np.nan_to_num(np.nanmean(np.asarray(att, dtype=float), axis=0) if np.ndim(att) == 3 else np.asarray(att))
    w = (a + a.T) / 2
    np.fill_diagonal(w, 0)
    lap = np.diag(w.sum(1)) - w
    _, vec = np.linalg.eigh(lap)
    return np.argsort(vec[:, 1]) if vec.shape[1] > 1 else np.arange(len(w))


def pfedla_fig4(avg: pd.DataFrame, default_percent: float, title: str = ""):
    """pFedLA Figure 4's three panels from per-run average accuracies (``report.pfedla_frame`` rows with
    domain == 'avg'): (a) FedBN by attention type at the default data size, (b) FedProx without attention, with
    local SE and with non-local SE, (c) FedBN and FedBN+SE over the local data size (``domain_percent``; runs at
    the default size have it unset)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    avg = avg.assign(domain_percent=avg.domain_percent.fillna(default_percent))
    a = avg[(avg.algorithm == "fedbn") & (avg.domain_percent == default_percent)]
    b = avg[avg.algorithm == "fedprox"]
    b = b.assign(setting=["none" if r.attention == "none" else ("local SE" if r.attention_local else "non-local SE")
                          for r in b.itertuples()])
    c = avg[(avg.algorithm == "fedbn") & avg.attention.isin(["none", "se"])]
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    sns.barplot(data=a, x="attention", y="final", order=["none", "se", "eca", "ca", "hybrid"], errorbar="sd", ax=axes[0])
    axes[0].set_title("(a) FedBN + attention type")
    sns.barplot(data=b, x="setting", y="final", order=["none", "local SE", "non-local SE"], errorbar="sd", ax=axes[1])
    axes[1].set_title("(b) FedProx: local vs non-local SE")
    sns.lineplot(data=c, x="domain_percent", y="final", hue="attention", marker="o", errorbar="sd", ax=axes[2])
    axes[2].set_title("(c) local data size")
    # (a) and (b) differ by a point or two near 85%: bars from 0 would hide them, so the y range spans the runs
    # (every seed, so the error bars fit) and each bar is labelled with its mean
    for ax, runs in ((axes[0], a), (axes[1], b)):
        if len(runs):
            lo, hi = runs.final.min(), runs.final.max()
            ax.set_ylim(max(0.0, lo - max(2.0, 0.5 * (hi - lo))), min(100.0, hi + max(1.0, 0.25 * (hi - lo))))
            ax.bar_label(ax.containers[0], fmt="%.2f", fontsize=8, label_type="center", color="white")
    for ax in axes:
        ax.set_ylabel("average accuracy over domains (%)"), ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig, (a, b, c)


def pfedla_fig3(curves: pd.DataFrame, title: str = ""):
    """pFedLA Figure 3 from ``report.pfedla_curves`` rows: one panel per domain and one for the average over the
    domains, accuracy over rounds, one colour per FL method, dashed without attention and solid with SE (mean
    over seeds, band: one standard deviation)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    domains = [d for d in dict.fromkeys(curves.domain) if d != "avg"] + ["avg"]
    fig, axes = plt.subplots(1, len(domains), figsize=(4.2 * len(domains), 3.6), sharex=True, squeeze=False)
    frame = curves.assign(setting=curves.attention.map({"none": "base", "se": "+ SE"}))
    for k, (ax, d) in enumerate(zip(axes[0], domains)):
        sns.lineplot(data=frame[frame.domain == d], x="round", y="acc", hue="algorithm", style="setting",
                     style_order=["+ SE", "base"], errorbar="sd", ax=ax, legend=k == len(domains) - 1)
        ax.set_title(f"({chr(ord('a') + k)}) {'average over domains' if d == 'avg' else d}")
        ax.set_ylabel("test accuracy (%)"), ax.grid(alpha=0.3)
    sns.move_legend(axes[0][-1], "upper left", bbox_to_anchor=(1.02, 1), fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def pfedla_gains(cmp: pd.DataFrame, title: str = ""):
    """pFedLA Table 1's arrows as two heat maps side by side: attention minus its base method (points), one row per
    (method, attention), one column per domain run, ours (``report.pfedla_paper_vs_ours``'s ``ours``) and the
    paper's. Red: attention helps; blue: it hurts. Returns the figure and the two gain tables (ours, paper)."""
    import matplotlib.pyplot as plt
    import numpy as np

    def gains(col):
        wide = cmp.pivot_table(index=["algorithm", "attention"], columns="domain", values=col, sort=False)
        wide = wide[[d for d in wide.columns if d != "avg"]]
        base = wide.xs("none", level="attention")
        out = wide.drop(index="none", level="attention")
        return out - base.reindex(out.index.get_level_values("algorithm")).to_numpy()

    ours, paper = gains("ours"), gains("paper")
    d = max(0.5, float(np.nanmax(np.abs(np.concatenate([ours.to_numpy(), paper.to_numpy()])))))
    fig, axes = plt.subplots(1, 2, figsize=(2.2 + 1.1 * 2 * ours.shape[1], 0.32 * len(ours) + 1.8), sharey=True)
    for ax, g, name in ((axes[0], ours, "ours"), (axes[1], paper, "paper")):
        im = ax.imshow(g.to_numpy(), cmap="RdBu_r", vmin=-d, vmax=d, aspect="auto")
        _label_cells(ax, g.to_numpy(), "{:+.1f}")
        up = int((g.to_numpy() > 0).sum())
        ax.set_title(f"{name}: {up} of {int(np.isfinite(g.to_numpy()).sum())} cells up")
        ax.set_xticks(range(g.shape[1]), list(g.columns))
    axes[0].set_yticks(range(len(ours)), [f"{a} + {t}" for a, t in ours.index])
    fig.colorbar(im, ax=axes, label="attention − base method (points)")
    fig.suptitle(title)
    return fig, (ours, paper)


def pfedla_gain_intervals(gains: pd.DataFrame, title: str = ""):
    """``report.pfedla_gains`` as a forest plot: one panel per domain (the average last), one row per (method,
    attention), our mean paired gain with its 95% interval (filled: the interval excludes 0) and the paper's gain
    (red x; on the average the paper's is over its own domains). Returns the figure."""
    import matplotlib.pyplot as plt

    domains = [d for d in dict.fromkeys(gains.domain) if d != "avg"] + (["avg"] if "avg" in set(gains.domain) else [])
    rows = list(dict.fromkeys(zip(gains.algorithm, gains.attention)))  # pfedla_gains' order: method, then attention
    fig, axes = plt.subplots(1, len(domains), figsize=(2.6 * len(domains) + 1.6, 0.28 * len(rows) + 1.4),
                             sharey=True, squeeze=False)
    for ax, dom in zip(axes[0], domains):
        g = gains[gains.domain == dom].set_index(["algorithm", "attention"]).reindex(rows)
        y = range(len(rows))
        ax.hlines(y, g.low, g.high, color="0.4", lw=1.2)
        sig = g.sign.fillna("") != ""
        ax.scatter(g.gain[~sig], [i for i, s in zip(y, sig) if not s], s=22, facecolors="white", edgecolors="k", zorder=3)
        ax.scatter(g.gain[sig], [i for i, s in zip(y, sig) if s], s=22, color="k", zorder=3)
        ax.scatter(g.paper_gain, list(y), marker="x", color="tab:red", s=22, zorder=4)
        ax.axvline(0, color="0.6", lw=0.8, ls="--")
        ax.set_title(dom)
        ax.set_xlabel("attention − base (points)")
    axes[0, 0].set_yticks(range(len(rows)), [f"{a} + {t}" for a, t in rows])
    axes[0, 0].invert_yaxis()
    axes[0, -1].scatter([], [], s=22, facecolors="white", edgecolors="k", label="ours, 95% interval contains 0")
    axes[0, -1].scatter([], [], s=22, color="k", label="ours, interval excludes 0")
    axes[0, -1].scatter([], [], marker="x", color="tab:red", label="paper")
    fig.legend(loc="lower center", ncol=3, bbox_to_anchor=(0.5, -0.02), frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def accuracy_vs_cost(frame: pd.DataFrame, hue: str = "method", metric: str = "global_test_acc",
                     targets=(0.95, 0.96), title: str = ""):
    """AdaFL's cost argument as a picture: accuracy against cumulative uploads (the communication cost, log
    scale), mean over seeds, one line per ``hue``, with dotted lines at ``targets``. A curve further left at a
    target reaches it for fewer uploads. ``frame`` is ``runner.results_frame`` with a ``hue`` column."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for name, g in frame.groupby(hue, sort=False):
        curve = g.groupby("round")[[metric, "uploads"]].mean()
        ax.plot(curve.uploads, curve[metric], label=name, linewidth=1)
    for t in targets:
        ax.axhline(t, color="0.5", linestyle=":", linewidth=0.8)
    bottom = max(frame[metric].quantile(0.2), min(targets) - 0.05)
    ax.set_ylim(bottom, frame[metric].max() + 0.005)
    ax.set_xscale("log")
    shown = frame.uploads[(frame[metric] >= bottom) & (frame.uploads > 0)]
    if len(shown):
        ax.set_xlim(shown.min() / 1.5, frame.uploads.max() * 1.5)
    ax.set_xlabel("cumulative uploads (models sent to the server)")
    ax.set_ylabel("global test accuracy" if metric == "global_test_acc" else metric)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    return fig
