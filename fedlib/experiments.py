"""Run a named experiment of ``fedlib.profiles`` headlessly, over the data sets that are present.

    python -m fedlib.experiments fedmcsa_table2 --profile paper [--where seed=0] [--jobs 2] [--dry-run]
    python -m fedlib.experiments adafl_table1 adafl_fig3 adafl_table3 --profile paper --where seed=0 --jobs 2
    python -m fedlib.experiments status --profile paper      # every experiment: stored / to run

``--where FIELD=VALUE`` (repeatable) keeps the configs that match, e.g. one seed of every cell
before the others. Stored runs are skipped and a run that was stopped continues from its last
snapshot (taken every 5 minutes), so the command resumes an interrupted grid.
``--jobs N`` trains N configs at a time, one single-threaded process each (on a CPU: N = the cores).
Several experiments run as one queue, in the order named, a config shared by two of them once.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses

import pandas as pd

from . import profiles
from .config import RunConfig
from .runner import expand, run_configs
from .store import Store


def configs(name: str, profile: str | None = None, where: dict | None = None):
    """(configs to run, absent data sets) of experiment ``name`` at ``profile``."""
    base, grid = profiles.get(name, profile)
    grid, missing = profiles.available_cells(grid, base)
    cfgs = expand(base, grid) if grid else []
    for k, v in (where or {}).items():
        cfgs = [c for c in cfgs if getattr(c, k) == v]
    return cfgs, missing


def status(profile: str | None = None, where: dict | None = None):
    """One row per experiment at ``profile``: configs, stored, to run, how far the interrupted runs got
    (they continue from there), the stored runs' wall hours, absent data."""
    store, rows = Store(), []
    for name in sorted(profiles.EXPERIMENTS):
        cfgs, missing = configs(name, profile, where)
        done = [c for c in cfgs if store.has(c)]
        hours = sum(store.meta(c).get("wall_seconds", 0) for c in done) / 3600
        going = [i for c in cfgs if c not in done and (i := store.checkpoint(c).info())]
        rows.append({"experiment": name, "configs": len(cfgs), "stored": len(done), "to run": len(cfgs) - len(done),
                     "resumable (round/T)": ", ".join(f"{i['round']}/{i['rounds']}" for i in going),
                     "stored wall h": round(hours, 1), "absent data": ", ".join(missing) or ("" if cfgs else "all (no cells)")})
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", nargs="+", choices=["status"] + sorted(profiles.EXPERIMENTS),
                    help="one or more experiments (one queue), or 'status': one line per experiment, stored / to "
                         "run, runs nothing")
    ap.add_argument("--profile", default=None, help="smoke | quick | paper (default: FEDLIB_PROFILE or quick)")
    ap.add_argument("--where", action="append", default=[], help="FIELD=VALUE filter, e.g. seed=0")
    ap.add_argument("--jobs", type=int, default=1, help="configs trained at a time, one process each (default 1)")
    ap.add_argument("--dry-run", action="store_true", help="list the configs and what is stored, run nothing")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs={args.jobs} must be an integer >= 1")
    where = {}
    fields = sorted(f.name for f in dataclasses.fields(RunConfig))
    for w in args.where:
        k, sep, v = w.partition("=")
        if not sep or k not in fields:
            ap.error(f"--where={w!r} must be FIELD=VALUE with FIELD a RunConfig field: {', '.join(fields)}")
        try:
            where[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            where[k] = v
    if "status" in args.experiment:
        if len(args.experiment) > 1:
            ap.error("'status' takes no experiment names: it lists every experiment")
        print(status(args.profile, where).to_string(index=False))
        return 0
    cfgs, missing, seen = [], [], set()
    for name in args.experiment:
        more, absent = configs(name, args.profile, where)
        cfgs += [c for c in more if c.key() not in seen and not seen.add(c.key())]
        missing += [m for m in absent if m not in missing]
    if missing:
        print(f"data absent, skipped: {', '.join(missing)} (see data/README.md)")
    store = Store()
    print(f"{len(cfgs)} configs, {sum(store.has(c) for c in cfgs)} stored, results in {store.root}")
    if args.dry_run:
        for c in cfgs:
            print(("stored  " if store.has(c) else "to run  ") + c.label())
        return 0
    table = run_configs(cfgs, store, columns=("dataset", "model", "algorithm", "sigma", "seed"), jobs=args.jobs)
    print(table.drop(columns=["key"]).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
