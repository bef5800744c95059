"""Results store: each run's config hashes to a key; its results live, written atomically, under that key.

Layout of ``<root>/<key>/``:
    config.json   the full RunConfig
    metrics.csv   one row per evaluated round (``simulation.COLUMNS``), a tidy table
    clients.npz   per-client test accuracy (float32) and loss (float16) per evaluated round, client test sizes,
                  and the per-round traces (``trace_selected``, ``trace_selection_scores``; see ``RunResult.traces``)
    meta.json     package versions, git commit, device, wall time, date (and ``resumed``: where a run was continued)

Runs in progress keep a snapshot in ``<root>/_partial/<key>.pt`` (``simulation.Checkpoint``; not
committed), removed once the run is stored.

A run's folder is written in a temporary sibling and renamed into place, so a reader (or an
interrupted grid) only ever sees complete results. The root is ``FEDLIB_RESULTS`` or the
project's ``results/`` folder.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from .config import RunConfig, from_dict
from .simulation import Checkpoint, RunResult


def default_root() -> Path:
    env = os.environ.get("FEDLIB_RESULTS")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parents[1]
    return here / "results" if (here / "pyproject.toml").exists() else Path.cwd() / "results"


class Store:
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_root()

    def path(self, cfg: RunConfig) -> Path:
        return self.root / cfg.key()

    checkpoint_seconds = 300.0  # how much training an interruption may lose at most

    def checkpoint(self, cfg: RunConfig) -> Checkpoint:
        """Where ``cfg``'s run in progress keeps its snapshot, taken every ``checkpoint_seconds``."""
        return Checkpoint(self.root / "_partial" / f"{cfg.key()}.pt", self.checkpoint_seconds)

    def has(self, cfg: RunConfig) -> bool:
        return (self.path(cfg) / "metrics.csv").exists()

    def save(self, cfg: RunConfig, result: RunResult, replace: bool = False) -> Path:
        """Write ``result`` under ``cfg``'s key; an existing result is kept unless ``replace`` (a forced re-run)."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.path(cfg)
        tmp = Path(tempfile.mkdtemp(prefix=f"_tmp-{cfg.key()}-", dir=self.root))
        try:
            (tmp / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1, sort_keys=True))
            result.metrics.to_csv(tmp / "metrics.csv", index=False, float_format="%.6g")
            traces = {
                f"trace_{k}": (v.astype(np.float32) if v.dtype.kind == "f" else v) for k, v in result.traces.items()
            }
            # accuracies at float32: float16 would move a 95% accuracy by up to 0.02 points, the size of the
            # differences the tables print; the losses only feed curves, so float16 keeps them small
            np.savez_compressed(
                tmp / "clients.npz",
                acc=result.client_acc.astype(np.float32),
                loss=result.client_loss.astype(np.float16),
                n=result.client_n,
                **traces,
            )
            (tmp / "meta.json").write_text(json.dumps(result.meta, indent=1, sort_keys=True, default=str))
            if final.exists() and replace:  # swap in the new folder, then drop the old one
                old = Path(tempfile.mkdtemp(prefix=f"_tmp-old-{cfg.key()}-", dir=self.root))
                os.replace(final, old / "run")
                os.replace(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            elif final.exists():  # a concurrent writer finished first: both hold the same pure result
                shutil.rmtree(tmp)
            else:
                os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    def meta(self, cfg: RunConfig) -> dict:
        """A stored run's metadata (versions, commit, device, wall time) without reading its metrics."""
        return json.loads((self.path(cfg) / "meta.json").read_text())

    def load(self, cfg: RunConfig) -> RunResult | None:
        p = self.path(cfg)
        if not (p / "metrics.csv").exists():
            return None
        with np.load(p / "clients.npz") as z:
            acc, loss, n = z["acc"].astype(np.float64), z["loss"].astype(np.float64), z["n"]
            traces = {k[len("trace_") :]: z[k] for k in z.files if k.startswith("trace_")}
        return RunResult(pd.read_csv(p / "metrics.csv"), acc, loss, n, self.meta(cfg), cfg, traces=traces)

    def stored(self, cfgs):
        """(config, result) for each of ``cfgs`` that is in the store, in order; the others are skipped."""
        for cfg in cfgs:
            res = self.load(cfg)
            if res is not None:
                yield cfg, res

    def configs(self) -> list[RunConfig]:
        """Every stored run's config."""
        if not self.root.exists():
            return []
        out = []
        for d in sorted(self.root.iterdir()):
            if d.name.startswith("_tmp") or not (d / "metrics.csv").exists():
                continue
            out.append(from_dict(json.loads((d / "config.json").read_text())))
        return out

    def clean_tmp(self) -> int:
        """Remove leftovers of interrupted writes; returns how many."""
        gone = 0
        if self.root.exists():
            for d in self.root.glob("_tmp-*"):
                shutil.rmtree(d, ignore_errors=True)
                gone += 1
        return gone
