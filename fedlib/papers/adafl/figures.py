"""AdaFL's figures (matplotlib): Figure 2's schedules, the attention's selection over rounds, accuracy against cost.

Each function draws from arrays or frames already read and returns the figure; the notebooks save it
(``fedlib.plotting.savefig``). Nothing here reads the store or runs anything, and the drawing is deterministic, so
the committed figures redraw byte for byte from the committed store. matplotlib is imported inside the functions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


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
    plotting.round_ticks(a), plotting.round_ticks(b)
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
    plotting.round_ticks(heat)
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
