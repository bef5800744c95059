"""Re-train stored runs and compare them with the store: do the stored numbers come out of this code, on this
machine?

    python -m fedlib.experiments.verify fedmcsa_table2 --profile paper --where seed=0 --runs 2
    python -m fedlib.experiments.verify fedmcsa_table2 --profile paper --runs all
    python -m fedlib.experiments.verify adafl_table1 --profile paper --where seed=0 --where fraction=0.1 --tolerance 0.5

Each chosen run is trained again from scratch (``fedlib.runs.train.train``, one process, nothing stored or changed) and
set beside its stored result: the rounds evaluated, the round it diverged at (if it did), the largest per-round
difference of its accuracies, the largest relative difference of its test loss, its uploads, and the differences of
the numbers the papers' tables report (best, final and last-10 mean accuracy). A run **agrees** when it evaluated
the same rounds, diverged at the same round or not at all, uploaded as many models, and its best, final and
last-10 accuracies are within ``--tolerance`` points of the stored ones. The exit status is 1 when a run does not
agree: a store edited by hand, its integrity digests rewritten to match, passes every check of ``fedlib.runs.store`` and
fails here.

Which runs: ``--runs all`` checks every stored run of the experiment (after ``--where``); ``--runs N`` (default
5) a sample of N of them, drawn at random without replacement and kept in the experiment's order, every run when
there are at most N. The sample's seed is printed and ``--sample-seed`` repeats it. At random rather than the first N
(what this command once checked): the first runs of a grid are one cell's seeds, so a fault in another cell, or an
edit made where the check never looks, would never be seen; drawn afresh each time, every stored run is checked
sooner or later, and no run is known in advance to be skipped.

"equal as stored" says whether every per-round accuracy and test loss came out as stored, at the 6 significant digits
metrics.csv keeps (``fedlib.runs.stored.as_stored``). It is reported, not required: training is repeatable to the last
bit only with the same CPU kind, thread count and torch, since another CPU (AVX2 against AVX-512) or thread count sums
in another order and hundreds of rounds carry a last-bit difference forward. The line before each run says how long
it took and on which CPU it was stored (``fedlib.executors.hardware.cpu_name``; the oldest stored runs say only
"x86_64").
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import secrets
import sys

import numpy as np
import pandas as pd
import torch

from fedlib.config.run import PROFILES, RunConfig, resolve_profile
from fedlib.core import metrics as M
from fedlib.core.state import RunResult
from fedlib.executors import hardware
from fedlib.experiments import profiles
from fedlib.experiments.cli import absent_for_empty, parse_where
from fedlib.experiments.named import experiment
from fedlib.runs import estimates
from fedlib.runs.store import Store
from fedlib.runs.stored import as_stored

TOLERANCE = 0.5  # points of accuracy; see ``agrees``
ACCURACIES = ("test_acc", "test_acc_mean", "gm_test_acc", "global_test_acc", "train_acc")
SUMMARY = ("best", "final", "last-10")


def headline(metrics: pd.DataFrame) -> str:
    """The accuracy column a run's tables report: the clients' test accuracy, or, where the clients hold no test data
    (AdaFL's setting), the global model's on the data set's own test set."""
    return "test_acc" if metrics["test_acc"].notna().any() else "global_test_acc"


def summaries(acc: pd.Series) -> dict:
    """Best, final and last-10 mean of the accuracy column ``acc``, as ``RunResult.summary`` takes them (a diverged
    run's last row is NaN: its final and last-10 are NaN, its best the best before it)."""
    return {"best": M.best(acc), "final": float(acc.iloc[-1]), "last-10": M.last_mean(acc, 10)}


def _largest(a: pd.Series, b: pd.Series, relative: bool = False) -> float:
    """The largest |a - b| over the rows where either is a number (relative to |a| with ``relative``); NaN in one
    and a number in the other counts as infinitely far, NaN in both as equal."""
    x, y = a.to_numpy(float), b.to_numpy(float)
    one_nan = np.isnan(x) != np.isnan(y)
    if one_nan.any():
        return np.inf
    both = ~np.isnan(x)
    if not both.any():
        return 0.0
    d = np.abs(x[both] - y[both])
    if relative:
        d = d / np.maximum(np.abs(x[both]), np.finfo(float).tiny)
    return float(d.max())


def compare(stored: RunResult, fresh: RunResult, tolerance: float = TOLERANCE) -> dict:
    """``fresh`` (the run trained again) against ``stored``: one row of ``verify``'s table. Accuracies are
    fractions in the results and points (x 100) here: "best", "final" and "last-10" the stored run's, of its
    ``headline`` accuracy ("accuracy": the clients' ``test_acc``, or AdaFL's ``global_test_acc``), "d ..." the
    run trained again minus the stored one, "max |d acc|" the largest difference of any accuracy column in any
    round, "max rel d loss" that of the test loss relative to the stored one, "same clients" whether the same
    clients uploaded in every round (None where a run kept no selection trace). ``agrees``: the same evaluated
    rounds, the same divergence round (or none), the same uploads, and best, final and last-10 accuracy each within
    ``tolerance`` points (a diverged run's final and last-10 are NaN in both, which counts as equal)."""
    a, b = stored.metrics.reset_index(drop=True), fresh.metrics.reset_index(drop=True)
    same_rounds = a["round"].tolist() == b["round"].tolist()
    sa, sb = stored.summary(), fresh.summary()  # uploads and divergence
    col = headline(a)
    va, vb = summaries(a[col]), summaries(b[col])
    row = {
        "rounds": f"{len(a)}" if same_rounds else f"{len(a)} stored, {len(b)} now",
        "diverged at": sa["diverged_at"] if sa["diverged_at"] == sb["diverged_at"] else
        f"{sa['diverged_at']} stored, {sb['diverged_at']} now",
    }  # fmt: skip
    cols = [c for c in ACCURACIES if c in a and c in b and not (a[c].isna().all() and b[c].isna().all())]
    if same_rounds:
        row["max |d acc|"] = max((100 * _largest(a[c], b[c]) for c in cols), default=0.0)
        row["max rel d loss"] = _largest(a["test_loss"], b["test_loss"], relative=True)
        row["equal as stored"] = all(np.array_equal(a[c].to_numpy(float), b[c].to_numpy(float), equal_nan=True)
                                 for c in [*cols, "test_loss"])  # fmt: skip
    else:
        row["max |d acc|"] = row["max rel d loss"] = np.nan
        row["equal as stored"] = False
    row["accuracy"] = col
    for k in SUMMARY:
        row[k] = 100 * va[k]
        row[f"d {k}"] = 100 * (vb[k] - va[k])
    row["uploads"] = sa["uploads"] if sa["uploads"] == sb["uploads"] else f"{sa['uploads']} stored, {sb['uploads']} now"
    picked = [r.traces.get("selected") for r in (stored, fresh)]  # which clients uploaded, round by round
    row["same clients"] = (
        bool(np.array_equal(*picked)) if all(p is not None for p in picked) else None
    )  # reported: with attention-based selection (AdaFL) a last-bit difference can pick another client
    close = all(abs(row[f"d {k}"]) <= tolerance or (np.isnan(va[k]) and np.isnan(vb[k])) for k in SUMMARY)
    row["agrees"] = bool(same_rounds and sa["diverged_at"] == sb["diverged_at"] and sa["uploads"] == sb["uploads"]
                         and close)  # fmt: skip
    return row


def verify(
    cfgs: list[RunConfig], store: Store, tolerance: float = TOLERANCE, progress: bool = True, columns=None
) -> pd.DataFrame:
    """Train each of ``cfgs`` (stored in ``store``) again and ``compare`` it with its stored result: one row a run,
    labelled by its ``columns`` (config fields, e.g. those its experiment's grid varies; default: its
    ``RunConfig.label``) and its key. A run that cannot be trained again (a config the current rules refuse, too little
    memory, ...) gets its error in an ``error`` column and does not agree; the others go on. Ctrl-C stops after the
    round going: the table holds the runs checked before it, with ``attrs["stopped"]``."""
    rows = []
    for i, cfg in enumerate(cfgs):
        stored = store.load(cfg)
        if stored is None:
            raise LookupError(f"{cfg.label()} (key {cfg.key()}) is not stored (or is damaged) in {store.root}")
        if progress:
            took = estimates.run_seconds(stored.meta) if "wall_seconds" in stored.meta else float("nan")
            where = stored.meta.get("device_name", "?")
            print(f"[{i + 1}/{len(cfgs)}] {cfg.label()} (it took {took:.0f} s on {where} when stored)", flush=True)
        named = {c: cfg.get(c) for c in columns} if columns else {"run": cfg.label()}
        try:
            fresh = _train_as_stored(cfg, stored.meta, progress)
        except KeyboardInterrupt:  # Ctrl-C ends the run at its round's end: the runs checked so far are the table
            print(f"stopped: {len(rows)} of {len(cfgs)} runs checked", flush=True)
            table = pd.DataFrame(rows)
            table.attrs["stopped"] = True
            return table
        except Exception as e:  # noqa: BLE001 - reported in its row; the others go on
            if progress:
                print(f"  cannot train it again: {type(e).__name__}: {e}", flush=True)
            rows.append({**named, "key": cfg.key(), "error": f"{type(e).__name__}: {e}", "agrees": False})
            continue
        fresh = dataclasses.replace(fresh, metrics=as_stored(fresh.metrics))  # the store keeps 6 digits
        rows.append({**named, "key": cfg.key(), **compare(stored, fresh, tolerance)})
    return pd.DataFrame(rows)


SAMPLE = 5  # runs checked by default (``sample``)


def sample(cfgs: list[RunConfig], runs: int | None, seed: int) -> list[RunConfig]:
    """``runs`` of ``cfgs`` drawn at random without replacement by ``seed``, in their order (all of them when
    ``runs`` is None or at least their number): see the module's docstring for why at random."""
    if runs is None or runs >= len(cfgs):
        return list(cfgs)
    picked = set(random.Random(seed).sample(range(len(cfgs)), runs))
    return [c for i, c in enumerate(cfgs) if i in picked]


def _runs(text: str) -> int | None:
    """``--runs``: a count >= 1, or "all" (None)."""
    if text.strip().lower() == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--runs={text}: must be at least 1, or 'all'")
    return value


def _train_as_stored(cfg: RunConfig, meta: dict, progress: bool) -> RunResult:
    """``fedlib.runs.train.train(cfg)`` with as many torch threads as the stored run had (``meta["threads"]``; a
    grid's runs train on one thread each): the thread count decides how the CPU's matmuls sum, so on the same CPU
    kind the run then repeats to the last bit."""
    from fedlib.runs.train import train

    before, threads = torch.get_num_threads(), meta.get("threads")
    if type(threads) is int and threads >= 1:
        torch.set_num_threads(threads)
    try:
        return train(cfg, progress)
    finally:
        torch.set_num_threads(before)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m fedlib.experiments.verify",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "experiment", choices=sorted(profiles.EXPERIMENTS), help="the experiment whose stored runs to check"
    )
    ap.add_argument("--profile", default=None, choices=PROFILES, help="default: FEDLIB_PROFILE or quick")
    ap.add_argument("--where", action="append", default=[], help="FIELD=VALUE filter, e.g. seed=0 or method.mu=0.1")
    ap.add_argument(
        "--runs",
        type=_runs,
        default=SAMPLE,
        help=f"how many of the stored runs to train again, drawn at random, or 'all' (default {SAMPLE})",
    )
    ap.add_argument(
        "--sample-seed",
        type=int,
        default=None,
        help="the seed of the runs drawn (default: a fresh one, printed, so that a check can be repeated)",
    )
    ap.add_argument(
        "--tolerance",
        type=float,
        default=TOLERANCE,
        help=f"points of accuracy a summary may move (default {TOLERANCE})",
    )
    args = ap.parse_args(argv)
    if not args.tolerance >= 0:  # NaN too
        ap.error(f"--tolerance={args.tolerance}: must be a number of points, 0 or more")
    try:
        where = parse_where(args.where)
    except ValueError as e:
        ap.error(str(e))
    try:
        profile = resolve_profile(args.profile)  # a bad FEDLIB_PROFILE
        store = Store.of(None, profile)
        # nothing trains; an experiment with a step (FedMCSA Table 1's winners) takes it from the stored runs it reads
        ex = experiment(args.experiment, profile, where=where, stored_only=True, progress=False, store=store)
    except ValueError as e:  # a --where that matches nothing
        ap.error(str(e))
    if not ex.runs:
        missing = ex.absent if ex.configs or ex.absent else absent_for_empty(args.experiment, profile, ex.inputs)
        absent = f" (data absent under the data root: {', '.join(missing)})" if missing else ""
        ap.error(
            f"no run of {args.experiment} at profile {profile} is stored in {store.root}{absent}: nothing to check"
        )
    seed = secrets.randbelow(2**31) if args.sample_seed is None else args.sample_seed
    cfgs = sample(ex.runs, args.runs, seed)
    how = "all" if len(cfgs) == len(ex.runs) else f"drawn at random, --sample-seed {seed}; --runs all checks every one"
    print(f"{len(cfgs)} of the {len(ex.runs)} stored runs of {args.experiment} ({profile}) ({how}), results in "
          f"{store.root}; training here on {hardware.cpu_name()}")  # fmt: skip
    table = verify(cfgs, store, args.tolerance, columns=ex.columns)
    if table.empty:
        return 130  # stopped before the first run was checked
    with pd.option_context("display.width", 200, "display.max_columns", None, "display.float_format", "{:.4g}".format):
        print(table.drop(columns=["key"]).to_string(index=False))
    bad = int((~table["agrees"]).sum())
    print(f"{len(table) - bad} of {len(table)} agree (summaries within {args.tolerance} points; accuracies in points, "
          "d = trained again - stored)")  # fmt: skip
    return 130 if table.attrs.get("stopped") else 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
