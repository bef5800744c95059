"""The bytes a stored run sent: its ``bytes_up`` / ``bytes_down`` columns (totals since round 1), the recorded ones
where the run has them, else derived from what the run stored, with the simulation's own rule.

Runs stored before the round loop counted bytes have neither column. They need not be trained again: the model
tensors that travel (``fedlib.core.state.traveling``: the shared floating tensors, numel x element size) are fixed by
the config, and how many of them travel each round follows from the round's uploads (the ``uploads`` column, one row
per round, or the ``selected`` trace) and the method's round. The rule, exactly as ``fedlib.core.simulation`` counts
(``Round.bytes_up``, ``fedlib.core.state.bytes_down``), with M the bytes of one model's traveling tensors, u_t the
round's uploads and N the clients:

- up: u_t x M (every upload is a model's traveling tensors);
- down, ``start='global'``: every training client receives the global model: u_t x M where only the selected train
  (FedAvg, FedProx, Per-FedAvg, AdaFL's runs), N x M where all train (pFedMe);
- down, the methods that send each uploader its own model W_i (FedMCSA, HeurFedAMP: every client trains each round,
  ``start='personal'``): a W_i is counted when it is delivered, at the client's next training, i.e. the round after
  it was made: u_{t-1} x M (nothing in round 1; the last round's W_i are never delivered);
- Local: nothing travels.

Only these methods are derived (the ones the papers' notebooks draw against bytes); any other is refused by name,
as is a run whose clients fail (``dropout``, ``stragglers``: who trains then differs from who uploads) or whose
selection probes its candidates (Power-of-Choice: how many were asked is not stored). The test
(tests/test_traffic.py) checks derived == recorded exactly on fresh runs of each.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from fedlib.algorithms import build_algorithm
from fedlib.core.state import payload_bytes, traveling
from fedlib.data import load_federated
from fedlib.models.registry import build_model

BYTES = ("bytes_up", "bytes_down")
UNITS = {"MB": 1e6, "GB": 1e9}
# method -> does its server send each uploader a personalised model W_i (delivered when the client next trains)?
DERIVED = {
    "fedavg": False,
    "fedprox": False,
    "perfedavg": False,
    "pfedme": False,
    "local": False,
    "fedmcsa": True,
    "heurfedamp": True,
}


def model_bytes(cfg, root=None) -> tuple[int, int, str, str]:
    """(M, N, start, trains) of ``cfg``: the bytes of one model's traveling tensors, the clients, and the method's
    ``Algorithm.start`` and ``Algorithm.trains``. Builds the model on the config's data (cached in-process)."""
    data = load_federated(cfg, root)
    m = cfg.model
    model = build_model(
        m.name, data.input_shape, data.n_classes, m.hidden, seed=cfg.seed, dtype=getattr(torch, cfg.dtype),
        attention=m.attention,
    )  # fmt: skip
    alg = build_algorithm(cfg, n_samples=data.train.sizes.cpu().numpy())
    if alg.select is not None and alg.select.probes:
        raise ValueError(
            f"{cfg.label()}: its selection probes candidates (the global model to each, counted in bytes_down), "
            "which the stored columns do not record; only runs whose selection does not probe are derived"
        )
    sd = model.state_dict()
    return payload_bytes({k: sd[k] for k in traveling(alg, sd)}), data.n_clients, alg.start, alg.trains


def derived_bytes(cfg, metrics: pd.DataFrame, selected: np.ndarray | None = None, root=None) -> pd.DataFrame:
    """``metrics`` (a run's per-round frame) with ``bytes_up`` / ``bytes_down`` derived from its config and uploads
    (module docstring), int64. The per-round uploads come from ``selected`` (the run's ``selected`` trace, rounds x
    N) where given, else from the ``uploads`` column, which then needs a row for every round 1..T."""
    name = cfg.method.NAME
    if name not in DERIVED:
        raise ValueError(
            f"method {name!r}: its bytes are not derived from a stored run (rule written only for "
            f"{', '.join(sorted(DERIVED))}); store it again to record them"
        )
    sel = cfg.selection
    if sel.dropout or sel.stragglers:
        raise ValueError(
            f"{cfg.label()}: dropout={sel.dropout}, stragglers={sel.stragglers}: with failing clients who trains "
            "differs from who uploads, and the stored columns do not say who; only runs without failures are derived"
        )
    rounds = metrics["round"].to_numpy(dtype=np.int64)
    if selected is not None:
        per_round = np.asarray(selected, dtype=bool).sum(axis=1).astype(np.int64)
    elif np.array_equal(rounds, np.arange(1, len(rounds) + 1)):
        per_round = np.diff(metrics["uploads"].to_numpy(dtype=np.int64), prepend=0)
    else:
        raise ValueError(
            f"{cfg.label()}: evaluated at rounds {rounds[:3].tolist()}...: the uploads column has no row for every "
            "round; pass the run's 'selected' trace"
        )
    m, n, start, trains = model_bytes(cfg, root)
    up = per_round * m
    if start == "global":
        down = (per_round if trains == "selected" else np.full_like(per_round, n)) * m
    elif DERIVED[name]:  # W_i made in round t - 1, delivered when the client trains in round t
        if trains != "all":
            raise ValueError(f"method {name!r} with trains={trains!r}: only every client training is derived")
        down = np.concatenate([[0], per_round[:-1]]) * m
    else:
        down = np.zeros_like(per_round)
    out = metrics.copy()
    out["bytes_up"], out["bytes_down"] = np.cumsum(up)[rounds - 1], np.cumsum(down)[rounds - 1]
    return out


def recorded(metrics: pd.DataFrame) -> bool:
    """Whether ``metrics`` holds the run's recorded byte columns (every row filled)."""
    return all(c in metrics and metrics[c].notna().all() for c in BYTES)


def run_bytes(cfg, result, root=None) -> pd.DataFrame:
    """A stored run's per-round metrics with its byte columns: the recorded ones where present, else derived
    (``derived_bytes``, from its ``selected`` trace where stored)."""
    if recorded(result.metrics):
        return result.metrics
    return derived_bytes(cfg, result.metrics, result.traces.get("selected"), root)


def with_bytes(frame: pd.DataFrame, cfgs, root=None) -> pd.DataFrame:
    """An experiment's tidy frame (``Experiment.frame``: rows of (run ``key``, evaluated round), a run's round
    possibly on several rows, as pFedMe's two models in ``fedlib.papers.fedmcsa.method_frame``) with every run's byte
    columns: recorded where the run has them, else derived from its rows (``derived_bytes``); ``bytes_from`` says
    which. ``cfgs``: the frame's configs."""
    by_key = {c.key(): c for c in cfgs}
    out = frame.copy()
    out["bytes_from"] = "recorded"
    for key, g in frame.groupby("key", sort=False):
        if recorded(g):
            continue
        rounds = g.drop_duplicates("round").sort_values("round")
        d = derived_bytes(by_key[key], rounds, root=root).set_index("round")
        for c in BYTES:
            out.loc[g.index, c] = g["round"].map(d[c]).to_numpy()
        out.loc[g.index, "bytes_from"] = "derived"
    return out.astype({c: np.int64 for c in BYTES})


def bytes_table(
    frame: pd.DataFrame,
    metric: str = "test_acc",
    hue: str = "method",
    panel: str | None = None,
    targets=(),
    unit: str = "MB",
) -> pd.DataFrame:
    """The numbers behind ``plot_accuracy_vs_bytes``, per (``panel``,) ``hue``: the ``unit`` (MB or GB) sent up and
    down by the last round (mean over seeds) and, per target accuracy, the ``unit`` (up + down) at which the
    mean-over-seeds curve first reaches it (NaN: never)."""
    scale = UNITS[unit]
    keys = [panel, hue] if panel else [hue]
    rows = []
    for key, g in frame.groupby(keys, sort=False):
        curve = g.groupby("round")[[metric, "bytes_up", "bytes_down"]].mean()
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        row[f"up {unit}"], row[f"down {unit}"] = curve.bytes_up.iloc[-1] / scale, curve.bytes_down.iloc[-1] / scale
        sent = (curve.bytes_up + curve.bytes_down) / scale
        for t in targets:
            hit = sent[curve[metric] >= t]
            row[f"{unit} to {t * 100:g}%"] = hit.iloc[0] if len(hit) else np.nan
        rows.append(row)
    return pd.DataFrame(rows).set_index(keys)


def plot_accuracy_vs_bytes(frame: pd.DataFrame, metric: str = "test_acc", hue: str = "method", panel: str | None = None,
                           order=None, targets=(), title: str = "", unit: str = "MB"):  # fmt: skip
    """Accuracy against the bytes sent so far, up and down together (``with_bytes``' columns, in ``unit``: MB or GB;
    log scale), one curve per ``hue`` (the mean over its seeds, which share their bytes), one panel per value of
    ``panel`` (None: one panel); dotted lines at ``targets``. Runs that send nothing (Local) have no place on a log axis and are left out,
    as the caption says. A curve further left at an accuracy reached it for fewer bytes."""
    from fedlib import plotting

    frame = frame.assign(mb=(frame.bytes_up + frame.bytes_down) / UNITS[unit])
    silent = sorted(set(frame[hue][frame.groupby(hue)["mb"].transform("max") == 0]))
    frame = frame[~frame[hue].isin(silent) & (frame.mb > 0)]
    values = sorted(frame[panel].unique()) if panel else [None]
    fig, axes = plotting.grid_axes(len(values), 2, width=6, height=4)
    order = list(dict.fromkeys(frame[hue])) if order is None else order
    handles, labels, seeds = [], [], 1
    for ax, v in zip(axes, values):
        sub = frame if v is None else frame[frame[panel] == v]
        handles, labels, n, _ = plotting.draw_lines(ax, sub, "mb", metric, hue, order, lw=1.0)
        seeds = max(seeds, n)
        for t in targets:
            ax.axhline(t, color="0.5", linestyle=":", linewidth=0.8)
        bottom = sub[metric].quantile(0.1) if not targets else max(sub[metric].quantile(0.2), min(targets) - 0.05)
        if bottom >= sub[metric].max():  # a short run below every target: its whole curve
            bottom = sub[metric].min()
        ax.set_ylim(bottom, sub[metric].max() + 0.005)
        ax.set_xscale("log")
        shown = sub.mb[sub[metric] >= bottom]  # the x range of the points above the axis' bottom
        ax.set_xlim(shown.min() / 1.5, sub.mb.max() * 1.5)
        ax.set_title("" if v is None else plotting.method_name(v))
        ax.set_xlabel(f"cumulative bytes sent, up + down ({unit})")
        ax.set_ylabel(plotting.ACCURACY_LABELS.get(metric, metric))
        plotting.percent_axis(ax)
        ax.grid(alpha=0.3, which="both")
    text = plotting.caption_text(seeds) + "; bytes: the model tensors that travel (fedlib.papers.traffic)"
    if silent:
        text += f"; left out, sending nothing: {', '.join(plotting.method_name(s) for s in silent)}"
    plotting.finish(fig, handles, labels, text, title, legend_cols=4)
    return fig
