"""pFedLA's figures (matplotlib): Table 1 as points, Figures 3-4, the hybrid's learned weights (Tables 5/11) and the
gains of attention as heat maps and forest plots.

Each function draws from frames the tables already hold and returns the figure; the notebooks save it
(``fedlib.plotting.savefig``). Nothing here reads the store or runs anything, and the drawing is deterministic, so
the committed figures redraw byte for byte from the committed store. matplotlib is imported inside the functions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedlib.papers.pfedla.grids import DIGITS5, METHODS

# Figures say the papers' names (FedAvg, SE, MNIST-M: ``fedlib.plotting``), show accuracies with a % sign, keep
# legends below the panels and say in a caption what points, bars and bands are.
METHOD_ORDER = list(METHODS)  # the paper's order of the FL methods (Table 1's rows)
ATTENTION_STYLES = {  # none: the base method, grey; one colour and marker per attention kind
    "none": {"color": "0.35", "marker": "o"},
    "se": {"color": "#1f77b4", "marker": "s"},
    "eca": {"color": "#d62728", "marker": "^"},
    "ca": {"color": "#2ca02c", "marker": "D"},
    "hybrid": {"color": "#9467bd", "marker": "v"},
}


def _domain_order(domains) -> list:
    """Domains in the paper's order (digits: MNIST, SVHN, USPS, SynthDigits, MNIST-M), others after, the average
    last."""
    known = [d for d in DIGITS5 if d in set(domains)]
    rest = [d for d in dict.fromkeys(domains) if d not in known and d != "avg"]
    return known + rest + (["avg"] if "avg" in set(domains) else [])


def _method_order(methods) -> list:
    return [m for m in METHOD_ORDER if m in set(methods)] + sorted(set(methods) - set(METHOD_ORDER))


def _row_label(algorithm: str, attention: str) -> str:
    """'FedAvg + SE', 'Ditto + hybrid'."""
    from fedlib.plotting import attention_name, method_name

    return f"{method_name(algorithm)} + {attention_name(attention)}"


def plot_table1(frame: pd.DataFrame, title: str = ""):
    """pFedLA Table 1 as points: one panel per domain and one for the plain average over the domains run, the FL
    methods along x, per method the base (grey) and each attention kind (its own colour and marker), mean over the
    seeds of the last round's accuracy with ± 1 std over the seeds. Each panel's y range is its own (the domains
    differ by 25 points; the attention kinds by one or two). ``frame``: ``pfedla.frame`` rows (local attention)."""
    from fedlib.plotting import attention_name, caption, domain_name, grid_axes, method_name, percent_points_axis

    local = frame[frame.attention_local] if "attention_local" in frame else frame
    domains = _domain_order(local.domain)
    methods = _method_order(local.algorithm)
    attentions = [a for a in ATTENTION_STYLES if a in set(local.attention)]
    fig, axes = grid_axes(len(domains), ncols=2, width=5.6, height=3.4)
    stats = local.groupby(["domain", "algorithm", "attention"]).final.agg(["mean", "std", "count"])
    width = 0.8 / max(1, len(attentions))
    handles = {}
    for ax, dom in zip(axes, domains):
        for k, att in enumerate(attentions):
            xs, ms, sds = [], [], []
            for i, m in enumerate(methods):
                if (dom, m, att) in stats.index:
                    r = stats.loc[(dom, m, att)]
                    xs.append(i + (k - (len(attentions) - 1) / 2) * width)
                    ms.append(r["mean"])
                    sds.append(0.0 if np.isnan(r["std"]) else r["std"])
            st = ATTENTION_STYLES[att]
            h = ax.errorbar(xs, ms, yerr=sds, fmt=st["marker"], color=st["color"], ms=5, capsize=2, lw=1)
            handles[att] = h
        for i in range(1, len(methods)):
            ax.axvline(i - 0.5, color="0.85", lw=0.8)
        ax.set_xticks(range(len(methods)), [method_name(m) for m in methods])
        ax.set_xlim(-0.5, len(methods) - 0.5)
        ax.set_title(f"average over the {len(domains) - 1} domains" if dom == "avg" else domain_name(dom))
        ax.set_ylabel("last-round test accuracy")
        percent_points_axis(ax)
        ax.grid(axis="y", alpha=0.3)
    seeds = int(stats["count"].max()) if len(stats) else 0
    names = {"none": "base method (no attention)", "hybrid": "+ hybrid (pFedLA_h)"}
    labels = [names.get(a, f"+ {attention_name(a)} (pFedLA_s)") for a in attentions]
    fig.suptitle(title)
    fig.tight_layout()
    leg = fig.legend([handles[a] for a in attentions], labels, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                     ncol=len(labels), frameon=False)  # fmt: skip
    caption(
        fig,
        f"points: mean over {seeds} seeds of the last round's accuracy; error bars: ± 1 std over the seeds "
        f"(n = {seeds}); the average is the plain mean over the domains run (the paper's over its five).",
        below=leg,
    )
    return fig


def plot_hybrid_weights(weights, clients, title: str = "", mechanisms=("SE", "ECA", "CA"), seeds: int | None = None):
    """pFedLA Table 5/11 as a heat map: each client's learned softmax weights per attention slot and mechanism
    (columns grouped by slot, each group summing to 1). ``weights``: (N, slots, 3); ``clients``: the N row labels
    (domains); ``seeds``: over how many runs ``weights`` is the mean (for the caption)."""
    import matplotlib.pyplot as plt

    from fedlib.plotting import caption, domain_name, label_cells

    w = np.asarray(weights, dtype=float)
    n, slots, k = w.shape
    fig, ax = plt.subplots(figsize=(0.95 * slots * k + 3.2, 0.55 * n + 1.8))
    d = max(0.01, float(np.abs(w - 1 / 3).max()))  # a diverging scale centred on the initial 1/3
    im = ax.imshow(w.reshape(n, slots * k), cmap="RdBu_r", vmin=1 / 3 - d, vmax=1 / 3 + d, aspect="auto")
    label_cells(ax, w.reshape(n, slots * k), "{:.3f}", fontsize=9, image=im)
    ax.set_xticks(range(slots * k), [m for _ in range(slots) for m in mechanisms])
    for s in range(1, slots):
        ax.axvline(s * k - 0.5, color="k", lw=1.5)
    for s in range(slots):  # the slot's name under its three columns
        ax.text((s + 0.5) * k - 0.5, -0.16, f"attention layer {s + 1}", transform=ax.get_xaxis_transform(),
                ha="center", va="top")  # fmt: skip
    ax.set_yticks(range(n), [domain_name(c) for c in clients])
    ax.set_ylabel("client (its domain)")
    cb = fig.colorbar(im, ax=ax, label="learned weight\n(1/3 each at the start)")
    cb.ax.axhline(1 / 3, color="k", lw=0.8)
    ax.set_title(title)
    fig.tight_layout()
    runs = f"mean over {seeds} seeds of each client's final weights" if seeds else "each client's final weights"
    caption(fig, f"{runs}; the three weights of a layer sum to 1; red: above the initial 1/3, blue: below.")
    return fig


def plot_fig4(avg: pd.DataFrame, default_percent: float, title: str = ""):
    """pFedLA Figure 4's three panels from per-run average accuracies (``frame`` rows with domain == 'avg'):
    (a) FedBN by attention type at the default data size, (b) FedProx without attention, with local SE and with
    non-local SE, (c) FedBN and FedBN+SE over the local data size (``domain_percent``; runs at the default size have
    it unset). Bars and points: mean over the seeds, error bars and band: ± 1 std over them. (a) and (b) in the
    first row, (c) under them."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from fedlib.plotting import caption, draw_lines, percent_points_axis

    avg = avg.assign(domain_percent=avg.domain_percent.fillna(default_percent))
    a = avg[(avg.algorithm == "fedbn") & (avg.domain_percent == default_percent)]
    b = avg[avg.algorithm == "fedprox"]
    b = b.assign(
        setting=[
            "none" if r.attention == "none" else ("local SE" if r.attention_local else "non-local SE")
            for r in b.itertuples()
        ]
    )
    c = avg[(avg.algorithm == "fedbn") & avg.attention.isin(["none", "se"])]
    fig = plt.figure(figsize=(11, 7.4))  # (a) and (b) side by side, (c) below them, as wide as both
    grid = fig.add_gridspec(2, 2)
    axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])]
    order_a = ["none", "se", "eca", "ca", "hybrid"]
    sns.barplot(data=a, x="attention", y="final", order=order_a, errorbar="sd", ax=axes[0], color="#1f77b4")
    axes[0].set_xticks(range(5), ["FedBN", "+ SE", "+ ECA", "+ CA", "+ hybrid"])
    axes[0].set_title("(a) FedBN + attention type")
    order_b = ["none", "local SE", "non-local SE"]
    sns.barplot(data=b, x="setting", y="final", order=order_b, errorbar="sd", ax=axes[1], color="#1f77b4")
    axes[1].set_xticks(range(3), ["FedProx", "+ local SE\n(pFedLA)", "+ non-local SE\n(sent to server)"])
    axes[1].set_title("(b) FedProx: local vs non-local SE")
    names = {"none": "FedBN", "se": "FedBN + SE"}
    handles, labels, _, _ = draw_lines(axes[2], c, "domain_percent", "final", "attention", ["none", "se"],
                                       names=lambda v: names.get(v, str(v)), lw=1.5)  # fmt: skip
    axes[2].set_title("(c) local data size")
    axes[2].set_xlabel("local data size (share of each domain's training pool)")
    percent_points_axis(axes[2], "x") if c.domain_percent.max() > 1 else axes[2].xaxis.set_major_formatter(
        plt.FuncFormatter(lambda v, _: f"{v:.0%}")
    )
    if len(c):
        axes[2].set_xticks(sorted(c.domain_percent.unique()))  # the sizes run, 10% included
    axes[2].legend(handles, labels, loc="lower right", frameon=False)
    for ax in axes[:2]:
        ax.set_xlabel("")
    # (a) and (b) differ by a point or two near 85%: bars from 0 would hide them, so the y range spans the runs
    # (every seed, so the error bars fit) and each bar is labelled with its mean
    for ax, runs in ((axes[0], a), (axes[1], b)):
        if len(runs):
            lo, hi = runs.final.min(), runs.final.max()
            ax.set_ylim(max(0.0, lo - max(2.0, 0.5 * (hi - lo))), min(100.0, hi + max(1.0, 0.25 * (hi - lo))))
            ax.bar_label(ax.containers[0], fmt="%.2f", fontsize=9, label_type="center", color="white")
    for ax in axes:
        ax.set_ylabel("average accuracy over domains")
        percent_points_axis(ax)
        ax.grid(alpha=0.3)
    seeds = (
        int(avg.groupby(["algorithm", "attention", "attention_local", "domain_percent"]).size().max())
        if len(avg)
        else 0
    )
    fig.suptitle(title)
    fig.tight_layout()
    caption(
        fig,
        f"bars and points: mean over {seeds} seeds of the last round's accuracy, averaged over the domains; error "
        f"bars and band: ± 1 std over the seeds (n = {seeds}). (a) and (b) do not start at 0. (c)'s "
        f"{default_percent:.0%} is (a)'s runs.",
    )
    return fig, (a, b, c)


def plot_fig3(curves: pd.DataFrame, title: str = ""):
    """pFedLA Figure 3 from ``curves`` rows: one panel per domain and one for the average over the domains (two
    per row), accuracy over rounds, one colour and marker per FL method, dashed without attention and solid with
    SE, mean over the seeds. No bands: ten overlapping ± 1 std bands hide the curves; the caption gives the seeds'
    spread at the last round instead."""
    from matplotlib.lines import Line2D

    from fedlib.plotting import (
        COLORS,
        MARKERS,
        domain_name,
        finish,
        grid_axes,
        method_name,
        percent_points_axis,
        round_ticks,
    )

    domains = _domain_order(curves.domain)
    methods = _method_order(curves.algorithm)
    fig, axes = grid_axes(len(domains), ncols=2, width=5.6, height=3.5, sharex=True)
    dashes = {"se": "-", "none": "--"}
    for k, (ax, d) in enumerate(zip(axes, domains)):
        sub = curves[curves.domain == d]
        for i, m in enumerate(methods):
            for att in ("none", "se"):
                g = sub[(sub.algorithm == m) & (sub.attention == att)].groupby("round").acc.mean()
                if len(g):
                    ax.plot(g.index, g.values, color=COLORS[i], ls=dashes[att], marker=MARKERS[i], ms=4,
                            mfc="white" if att == "none" else COLORS[i], lw=1.3,
                            label=f"{method_name(m)}{' + SE' if att == 'se' else ''}")  # fmt: skip
        name = f"average over the {len(domains) - 1} domains" if d == "avg" else domain_name(d)
        ax.set_title(f"({chr(ord('a') + k)}) {name}")
        ax.set_ylabel("test accuracy")
        percent_points_axis(ax)
        ax.grid(alpha=0.3)
    for ax in axes[-2:]:
        ax.set_xlabel("round")
        round_ticks(ax)  # the axes share x: one locator sets every panel's
        ax.xaxis.set_tick_params(labelbottom=True)
    handles = [Line2D([], [], color=COLORS[i], marker=MARKERS[i], lw=1.3) for i in range(len(methods))]
    handles += [Line2D([], [], color="k", ls="-", lw=1.3), Line2D([], [], color="k", ls="--", marker="o",
                                                                    mfc="white", lw=1.3)]  # fmt: skip
    labels = [method_name(m) for m in methods] + ["with SE (pFedLA_s)", "base method"]
    last = curves[curves["round"] == curves["round"].max()]
    sd = last.groupby(["algorithm", "attention", "domain"]).acc.std(ddof=1).dropna()
    seeds = int(last.groupby(["algorithm", "attention", "domain"]).size().max()) if len(last) else 0
    spread = (
        f"the seeds' ± 1 std at the last round is {sd.median():.1f} points (median; up to {sd.max():.1f})"
        if len(sd)
        else "one seed"
    )
    finish(fig, handles, labels,
           f"lines: mean over {seeds} seeds (evaluated every {_eval_step(curves)} rounds); solid with SE, dashed "
           f"(open markers) the method alone; no bands: {spread}, wider than most gaps between the curves.",
           title, legend_cols=len(methods) + 2)  # fmt: skip
    return fig


def _eval_step(curves: pd.DataFrame) -> int:
    r = np.unique(curves["round"])
    return int(np.min(np.diff(r))) if len(r) > 1 else 1


def plot_gains(cmp: pd.DataFrame, title: str = ""):
    """pFedLA Table 1's arrows as two heat maps side by side: attention minus its base method (points), one row per
    (method, attention) in the paper's order, one column per domain run, ours (``paper_vs_ours``'s ``ours``) and
    the paper's. Red: attention helps; blue: it hurts. Returns the figure and the two gain tables (ours, paper)."""
    import matplotlib.pyplot as plt

    from fedlib.plotting import caption, domain_name, label_cells

    def gain(col):
        wide = cmp.pivot_table(index=["algorithm", "attention"], columns="domain", values=col, sort=False)
        wide = wide[[d for d in _domain_order(wide.columns) if d != "avg"]]
        base = wide.xs("none", level="attention")
        out = wide.drop(index="none", level="attention")
        out = out.reindex([(m, a) for m in _method_order(out.index.get_level_values(0)) for a in ATTENTION_STYLES
                           if (m, a) in out.index])  # fmt: skip
        return out - base.reindex(out.index.get_level_values("algorithm")).to_numpy()

    ours, paper = gain("ours"), gain("paper")
    d = max(0.5, float(np.nanmax(np.abs(np.concatenate([ours.to_numpy(), paper.to_numpy()])))))
    fig, axes = plt.subplots(1, 2, figsize=(3.4 + 1.15 * 2 * ours.shape[1], 0.36 * len(ours) + 2.0), sharey=True)
    for ax, g, name in ((axes[0], ours, "ours"), (axes[1], paper, "paper (Table 1)")):
        im = ax.imshow(g.to_numpy(), cmap="RdBu_r", vmin=-d, vmax=d, aspect="auto")
        label_cells(ax, g.to_numpy(), "{:+.1f}", fontsize=8.5, image=im)
        up = int((g.to_numpy() > 0).sum())
        ax.set_title(f"{name}:\n{up} of {int(np.isfinite(g.to_numpy()).sum())} cells above base")
        ax.set_xticks(range(g.shape[1]), [domain_name(c) for c in g.columns])
        ax.set_xlabel("domain")
        for i in range(1, len(g)):  # a line between methods
            if g.index[i][0] != g.index[i - 1][0]:
                ax.axhline(i - 0.5, color="k", lw=0.8)
    axes[0].set_yticks(range(len(ours)), [_row_label(a, t) for a, t in ours.index])
    fig.colorbar(im, ax=axes, label="accuracy with attention − without\n(percentage points)")
    fig.suptitle(title)
    seeds = int(cmp.runs.max()) if "runs" in cmp and len(cmp) else None
    ours_is = f"mean over {seeds} seeds of the last round's accuracy" if seeds else "the last round's accuracy"
    caption(fig, f"each cell: the method with attention minus the same method without, on that domain; ours: "
                 f"{ours_is}; red: attention above its base method, blue: below.")  # fmt: skip
    return fig, (ours, paper)


def plot_gain_intervals(gains: pd.DataFrame, title: str = ""):
    """``gains`` as a forest plot: one panel per domain (the average last), one row per (method, attention) in the
    paper's order, our mean paired gain with its 95% interval (filled: the interval excludes 0) and the paper's gain
    (red x; on the average the paper's is over its own domains). Returns the figure."""
    n = int(gains.seeds.max()) if len(gains) else 0
    return _forest(
        gains, "gain", "attention − base\n(percentage points)", title,
        f"circles: mean over the seeds of (with attention − without, same seed), n = {n}; lines: 95% Student-t "
        "interval over the seeds; on the average the paper's gain is over its five domains.",
        paper="paper_gain",
    )  # fmt: skip


def plot_init_effect(effect: pd.DataFrame, title: str = ""):
    """``init_effect``'s changes as a forest plot, as ``plot_gain_intervals`` draws the gains: one panel per domain
    (the average last), one row per (method, attention), the mean paired change (each client's attention drawn on
    its own minus Table 1's one shared draw) with its 95% interval (filled: it excludes 0). Returns the figure."""
    n = int(effect.seeds.max()) if len(effect) else 0
    return _forest(
        effect, "change", "per-client − shared draw\n(percentage points)", title,
        f"circles: mean over the seeds of (each client's attention drawn on its own − one draw for all, same seed), "
        f"n = {n}; lines: 95% Student-t interval over the seeds.",
    )  # fmt: skip


def _forest(frame: pd.DataFrame, value: str, xlabel: str, title: str, note: str, paper: str | None = None):
    """One panel per domain of ``frame`` (the average last), one row per (method, attention) in the paper's order:
    ``frame[value]`` with its interval ``low``..``high`` (a filled circle where ``sign`` says it excludes 0) and,
    with ``paper``, that column's value as a red x."""
    import matplotlib.pyplot as plt

    from fedlib.plotting import caption, domain_name

    domains = [d for d in dict.fromkeys(frame.domain) if d != "avg"] + (["avg"] if "avg" in set(frame.domain) else [])
    pairs = set(zip(frame.algorithm, frame.attention))
    rows = [(m, a) for m in _method_order(frame.algorithm) for a in ATTENTION_STYLES if (m, a) in pairs]
    fig, axes = plt.subplots(
        1, len(domains), figsize=(2.6 * len(domains) + 1.8, 0.28 * len(rows) + 1.6), sharey=True, squeeze=False
    )
    for ax, dom in zip(axes[0], domains):
        g = frame[frame.domain == dom].set_index(["algorithm", "attention"]).reindex(rows)
        y = range(len(rows))
        ax.hlines(y, g.low, g.high, color="0.4", lw=1.2)
        sig = g.sign.fillna("") != ""
        ax.scatter(
            g[value][~sig], [i for i, s in zip(y, sig) if not s], s=22, facecolors="white", edgecolors="k", zorder=3
        )
        ax.scatter(g[value][sig], [i for i, s in zip(y, sig) if s], s=22, color="k", zorder=3)
        if paper is not None:
            ax.scatter(g[paper], list(y), marker="x", color="tab:red", s=22, zorder=4)
        ax.axvline(0, color="0.6", lw=0.8, ls="--")
        for i in range(1, len(rows)):
            if rows[i][0] != rows[i - 1][0]:
                ax.axhline(i - 0.5, color="0.85", lw=0.8)
        ax.set_title(f"average over the {len(domains) - 1} domains" if dom == "avg" else domain_name(dom))
        ax.set_xlabel(xlabel)
    axes[0, 0].set_yticks(range(len(rows)), [_row_label(a, t) for a, t in rows])
    axes[0, 0].invert_yaxis()
    axes[0, -1].scatter([], [], s=22, facecolors="white", edgecolors="k", label="ours, 95% interval contains 0")
    axes[0, -1].scatter([], [], s=22, color="k", label="ours, interval excludes 0")
    if paper is not None:
        axes[0, -1].scatter([], [], marker="x", color="tab:red", label="paper (Table 1)")
    fig.suptitle(title)
    fig.tight_layout()
    leg = fig.legend(loc="upper center", ncol=3, bbox_to_anchor=(0.5, 0.0), frameon=False)
    caption(fig, note, below=leg)
    return fig
