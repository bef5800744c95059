"""One entry point for the named experiments (``fedlib.profiles.EXPERIMENTS``), used by every notebook and the CLI.

    ex = fedlib.experiment("fedmcsa_table2", "paper", stored_only=True)   # in a notebook: read what is stored
    ex.configs, ex.absent, ex.missing_runs, ex.table, ex.frame

    python -m fedlib.experiments fedmcsa_table2 --profile paper [--where seed=0] [--jobs 2] [--dry-run]
    python -m fedlib.experiments adafl_table1 adafl_fig3 adafl_table3 --profile paper --where seed=0 --jobs 2
    python -m fedlib.experiments fedmcsa_table1 --profile paper   # the grid, then the winners step, then the winners
    python -m fedlib.experiments status --profile paper      # every experiment: stored / to run
    python -m fedlib.experiments fedmcsa_sigma --profile quick --backend ray --address HEAD:6379   # on a Ray cluster

``--where FIELD=VALUE`` (repeatable; FIELD flat, ``mu``, or dotted, ``method.mu``) keeps the configs that match, e.g.
one seed of every cell before the others. Stored runs are skipped and a run that was stopped continues from its last
snapshot (taken every 5 minutes), so the command resumes an interrupted grid. Runs are stored under
``FEDLIB_RESULTS``, else in results/ at the paper profile and in the git-ignored results/_explore/ at the others.
``--jobs N`` trains N configs at a time, one single-threaded process each (on a CPU: N = the cores; ``--jobs auto``:
one per core, as many as the memory holds, ``runner.default_jobs``).
``--batch N`` (default 16): configs that share data, model and method (seeds, lr, sigma, ... differ) train up to N
at a time as one model (``fedlib.batching``), each with its solo run's numbers; ``--batch 1`` trains one at a time.
``--backend ray`` trains each unit of runs (``--batch``) as a task on a Ray cluster: the one at ``--address
HOST:PORT`` (else ``RAY_ADDRESS``; neither: a Ray instance started on this machine); this process stores the results
(README, "More than one machine"; ``fedlib.ray_backend``).
Several experiments run as one queue, in the order named, a config shared by two of them once. An experiment with
a step (FedMCSA Table 1's winners) queues the experiment the step reads first, trains the queue so far, runs the
step on the stored results, then queues its own configs.
"""

from __future__ import annotations

import argparse
import ast
import functools
from dataclasses import dataclass, field

import pandas as pd

from . import profiles, resources, runner
from .config import PROFILES, RunConfig, flat_field_names, flat_name, resolve_profile
from .data.readers import DatasetChecksumError, DatasetFormatError, DatasetNotFoundError
from .executors.graphs import graphs_from_env
from .malloc import mode as malloc_mode
from .runner import BATCH, expand, results_frame, run_configs
from .store import Store, StoreNotWritable, checkpoint_seconds


class NothingStoredError(LookupError):
    """``Experiment.table`` / ``frame`` of an experiment read with ``stored_only`` and none of its runs stored."""


@dataclass
class Experiment:
    """A named experiment at one profile: what it runs and what came of it.

    ``base``, ``grid``: the profile's base config and grid cells (flat names, the absent data sets' cells left
    out, ``seeds`` applied); ``configs``: the expanded configs (after ``where``); ``absent``: the data sets absent
    under the data root; ``inputs``: a step's output the grid took (FedMCSA Table 1: ``{'winners': ...}``) and
    ``after`` the experiment it was computed from. ``runs`` / ``missing_runs``: the configs with / without a stored
    result; ``table``: one summary row per run (``runner.run_configs``), ``frame``: per-round results
    (``runner.results_frame``), both over ``stored_runs()``: ``runs``, or, read with ``stored_only`` and none stored,
    a ``NothingStoredError`` that says so. ``store_for(cfg)``: where a setting is read or trained (``explore`` for one
    outside the grid)."""

    name: str
    profile: str
    base: RunConfig
    grid: list
    configs: list
    absent: list
    store: Store
    stored_only: bool = False
    inputs: dict = field(default_factory=dict)
    after: "Experiment | None" = None
    explore: Store | None = None  # where settings outside the grid go (``store_for``); None: ``store``

    @property
    def runs(self) -> list[RunConfig]:
        return [c for c in self.configs if self.store.has(c)]

    @property
    def missing_runs(self) -> list[RunConfig]:
        return [c for c in self.configs if not self.store.has(c)]

    def store_for(self, cfg: RunConfig) -> Store:
        """Where ``cfg`` is read or trained: ``store`` for the experiment's own configs, ``explore`` for any other
        setting (notebook 00's panel), which ``fedlib.experiment`` makes the exploring profiles' store
        (``FEDLIB_RESULTS``, else the git-ignored results/_explore/) unless it was given a store: a setting tried
        beside the paper profile's grid was stored among the committed paper runs."""
        own = cfg.key() in {c.key() for c in self.configs}
        return self.store if own or self.explore is None else self.explore

    @property
    def damaged(self) -> list[str]:
        """What is wrong with each damaged stored run among ``configs`` (they count as missing: left out of the
        tables, retrained by the next ``train``)."""
        return [p for c in self.configs if (p := self.store.problem(c)) is not None]

    @property
    def columns(self) -> list[str]:
        """The fields the grid varies (the table's columns besides the summary)."""
        return list(dict.fromkeys(["algorithm", "seed"] + [k for cell in self.grid for k in cell]))

    def train(
        self,
        jobs: int | None = 1,
        progress: bool = True,
        backend="local",
        address: str | None = None,
        batch: int = BATCH,
    ) -> "Experiment":
        """Train the configs not yet stored (``jobs`` at a time, up to ``batch`` runs as one model, or on a Ray
        cluster: ``backend='ray'``, ``address``; see ``runner.run_configs``) and keep the summary table."""
        self.__dict__["table"] = _table(
            self.configs, self.store, self.columns, progress=progress, jobs=jobs, backend=backend, address=address,
            batch=batch,
        )  # fmt: skip
        self.__dict__.pop("frame", None)
        return self

    @functools.cached_property
    def table(self) -> pd.DataFrame:
        return _table(self.stored_runs(), self.store, self.columns, progress=False)

    @functools.cached_property
    def frame(self) -> pd.DataFrame:
        return results_frame(self.stored_runs(), self.store)

    def stored_runs(self) -> list[RunConfig]:
        """``runs``, to draw: read with ``stored_only``, an experiment with configs and none of them stored has
        nothing to draw, and says so (``NothingStoredError``, naming the store and how to train them); its table was
        an empty frame without columns, and a notebook failed a cell later with a KeyError."""
        runs = self.runs
        if self.stored_only and self.configs and not runs:
            raise NothingStoredError(
                f"{self.name}, profile {self.profile}: none of its {len(self.configs)} runs is in the store "
                f"{self.store.root} (stored only: nothing trains); train them with STORED_ONLY = False in the "
                f"notebook, or python -m fedlib.experiments {self.name} --profile {self.profile}"
            )
        return runs

    def summary(self) -> str:
        sets = sorted({c.get("dataset") for c in self.configs})
        lines = [
            f"{self.name}, profile {self.profile}: {len(self.configs)} configs, {len(self.runs)} with results"
            f"{' (stored only: nothing trains)' if self.stored_only else ''}; data sets: {', '.join(sets) or '-'}"
            f"; absent: {', '.join(self.absent) or 'none'}"
        ]
        damaged = self.damaged
        if damaged:
            lines.append(
                f"damaged, left out ({len(damaged)}; the next training run replaces them): " + "; ".join(damaged[:3])
            )
        missing = self.missing_runs
        if missing:
            lines.append(
                f"not in the store ({len(missing)}): "
                + "; ".join(c.label() for c in missing[:3])
                + (" ..." if len(missing) > 3 else "")
            )
        return "\n".join(lines)

    __str__ = summary

    def __repr__(self) -> str:
        return f"<Experiment {self.summary()}>"


def _table(cfgs: list[RunConfig], store: Store, columns, **kw) -> pd.DataFrame:
    """``runner.run_configs`` (trains what is not stored) with ``columns`` read by flat name (``cfg.get``), so a name
    that is also a typed part of the config (``model``) gives its flat value."""
    if not cfgs:
        return pd.DataFrame()
    table = run_configs(cfgs, store, columns=("seed",), **kw)
    for k in columns:
        table[k] = [c.get(k) for c in cfgs]
    return table


def _seeds(seeds) -> list:
    """``seeds`` as a list: an int is one seed (``-p SEEDS=0`` in a notebook); a string or another non-iterable is a
    ValueError (``seeds=0`` was "'int' object is not iterable"; each seed's own value is checked by the config)."""
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        return [seeds]
    if isinstance(seeds, (str, bytes, dict)) or not hasattr(seeds, "__iter__"):
        raise ValueError(f"seeds={seeds!r} must be a list of integers, e.g. [0, 1, 2], or one integer")
    seeds = list(seeds)  # once: a generator or a range
    if not seeds:
        raise ValueError("seeds=[] is empty: give at least one seed, or None for the profile's")
    return seeds


def _where(where: dict | None) -> dict:
    """``where`` under flat names (dotted ones by their last component); unknown names are a ValueError."""
    return {flat_name(k): v for k, v in (where or {}).items()}


def _matches(cfg: RunConfig, where: dict) -> bool:
    # a list is a set of accepted values (as in grid cells); a tuple is one value (hidden sizes, a schedule)
    return all(cfg.get(k) in v if isinstance(v, list) else cfg.get(k) == v for k, v in where.items())


def _check_inputs(name: str, inputs) -> dict:
    """``inputs`` as a dict: None or ``{keyword: the step's output}`` for an experiment with a step (``profiles.STEPS``:
    ``{'winners': {(dataset, model, row): RunConfig}}``, what ``fedmcsa.table1_winners`` returns); anything else is a
    ValueError naming the argument and what it takes (a string of winners was an AttributeError in the grid)."""
    if inputs is None:
        return {}
    step = profiles.STEPS.get(name)
    takes = (
        f"{{{step[1]!r}: the output of {step[2].__module__}.{step[2].__name__}, a dict of RunConfigs}} or None"
        if step
        else "None or {} (only an experiment with a step takes inputs: "
        + ", ".join(f"{n} takes {s[1]!r}" for n, s in profiles.STEPS.items())
        + ")"
    )
    if not isinstance(inputs, dict):
        raise ValueError(f"inputs={inputs!r}: experiment {name!r} takes {takes}")
    unknown = [k for k in inputs if step is None or k != step[1]]
    if unknown:
        raise ValueError(f"inputs={inputs!r}: experiment {name!r} takes no {unknown[0]!r}; it takes {takes}")
    for k, v in inputs.items():
        if not isinstance(v, dict) or not all(isinstance(c, RunConfig) for c in v.values()):
            raise ValueError(f"inputs[{k!r}]={v!r}: experiment {name!r} takes {takes}")
    return dict(inputs)


def experiment(
    name: str,
    profile: str | None = None,
    *,
    seeds=None,
    stored_only: bool = False,
    where: dict | None = None,
    fields: dict | None = None,
    jobs: int | None = 1,
    progress: bool = True,
    inputs: dict | None = None,
    store: Store | str | None = None,
    available: "profiles.Available | None" = None,
    backend="local",
    address: str | None = None,
    batch: int = BATCH,
) -> Experiment:
    """Experiment ``name`` at ``profile`` (explicit beats env FEDLIB_PROFILE; default 'quick') over the data sets
    present: trained where not stored (``jobs`` at a time; None: one process per core, ``runner.default_jobs``), or with
    ``stored_only`` read from the store only (nothing trains; ``missing_runs`` lists the rest). ``seeds``: only these
    seeds (every cell's); ``where``: ``{field: value or [values]}``, fields flat or dotted (``method.mu``); ``fields``:
    values set in every cell (e.g. ``{'data_seed': 1}``; a list is an axis, as in grids). An experiment with a step
    (``profiles.STEPS``: FedMCSA Table 1's winners) first gets the experiment the step reads (trained unless
    ``stored_only``), then runs the step on the store, unless ``inputs`` gives its output (``{'winners': ...}``).
    ``store``: a ``Store`` or its root (default: ``FEDLIB_RESULTS``, else results/ for the paper profile and
    results/_explore/, git-ignored, for the others: ``store.default_root``); ``available``: the data sets to
    count as present (default: what is under the data root, ``profiles.Available.scan()``). ``backend``: ``'local'``
    (this machine, ``jobs`` processes) or ``'ray'`` (each unit of runs a task on the Ray cluster at ``address``, else
    ``RAY_ADDRESS``, else a local Ray instance; or a ``ray_backend.RayBackend``); this process stores the results
    either way. ``batch``: runs that share data, model and method train up to that many at a time as one model, each
    with its solo run's numbers (``fedlib.batching``; 1: one at a time)."""
    profile = resolve_profile(profile)
    runner.ray_backend(backend, address, jobs)  # bad values fail here, before any training
    if name not in profiles.EXPERIMENTS:
        raise ValueError(f"experiment={name!r} is not one of: {', '.join(profiles.EXPERIMENTS)}")
    if available is not None and not isinstance(available, profiles.Available):
        raise ValueError(
            f"available={available!r}: must be a fedlib.profiles.Available (the data sets to count as present, e.g. "
            "fedlib.profiles.Available.scan()) or None (what is under the data root)"
        )
    inputs, after = _check_inputs(name, inputs), None
    given, store = store, Store.of(store, profile)  # none given: paper runs in results/, others in results/_explore/
    available = available if available is not None else profiles.Available.scan()
    if name in profiles.STEPS:
        prior, keyword, step = profiles.STEPS[name]
        if keyword not in inputs:
            after = experiment(
                prior,
                profile,
                stored_only=stored_only,
                jobs=jobs,
                progress=progress,
                store=store,
                available=available,
                backend=backend,
                address=address,
                batch=batch,
            )
            inputs[keyword] = step(after.configs, store)
    base, grid = profiles.get(name, profile, available, **inputs)
    grid, absent = profiles.available_cells(profiles.flat_cells(grid), base, available)
    if seeds is not None:
        seeds = _seeds(seeds)
        grid = [{**cell, "seed": list(seeds)} for cell in grid]
    if fields:
        fields = profiles.flat_cells([fields])[0]
        grid = [{**cell, **fields} for cell in grid]
    where = _where(where)
    every = expand(base, grid) if grid else []
    cfgs = [c for c in every if _matches(c, where)]
    if every and where and not cfgs:
        present = "; ".join(f"{k} in {{{', '.join(sorted({repr(c.get(k)) for c in every}))}}}" for k in where)
        raise ValueError(f"where={where} matches none of the {len(every)} configs of {name!r} ({present})")
    explore = store if given is not None else Store.of(None, "quick")  # the exploring profiles' default
    ex = Experiment(name, profile, base, grid, cfgs, absent, store, stored_only, inputs, after, explore)
    return ex if stored_only else ex.train(jobs, progress, backend, address, batch)


def configs(name: str, profile: str | None = None, where: dict | None = None):
    """(configs, absent data sets) of experiment ``name`` at ``profile``; nothing trains."""
    ex = experiment(name, profile, where=where, stored_only=True, progress=False)
    return ex.configs, ex.absent


def status(profile: str | None = None, where: dict | None = None, store: Store | str | None = None):
    """One row per experiment at ``profile``: configs, stored, damaged (left out, retrained by the next run), to run,
    how far the interrupted runs got (they continue from there), the stored runs' wall hours (a run trained as one
    model with others counts its share: ``resources.run_seconds``), absent data."""
    store, rows = Store.of(store, resolve_profile(profile)), []
    for name in sorted(profiles.EXPERIMENTS):
        ex = experiment(name, profile, where=where, stored_only=True, progress=False, store=store)
        cfgs, done = ex.configs, ex.runs
        hours = sum(resources.run_seconds(m) for c in done if "wall_seconds" in (m := store.meta(c))) / 3600  # checked
        going = [i for c in cfgs if c not in done and (i := store.checkpoint(c).info())]
        rows.append(
            {
                "experiment": name,
                "configs": len(cfgs),
                "stored": len(done),
                "damaged": len(ex.damaged),
                "to run": len(cfgs) - len(done),
                "resumable (round/T)": ", ".join(f"{i['round']}/{i['rounds']}" for i in going),
                "stored wall h": round(hours, 1),
                "absent data": ", ".join(ex.absent) or ("" if cfgs else "all (no cells)"),
            }
        )
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "experiment",
        nargs="+",
        choices=["status"] + sorted(profiles.EXPERIMENTS),
        help="one or more experiments (one queue), or 'status': one line per experiment, stored / to run, runs nothing",
    )
    ap.add_argument(
        "--profile",
        default=None,
        choices=PROFILES,
        help="smoke | quick | paper (beats FEDLIB_PROFILE; default: FEDLIB_PROFILE or quick)",
    )
    ap.add_argument("--where", action="append", default=[], help="FIELD=VALUE filter, e.g. seed=0 or method.mu=0.1")
    ap.add_argument(
        "--jobs",
        default="1",
        help="configs trained at a time, one process each (default 1; auto: one per core, within the memory)",
    )
    ap.add_argument(
        "--batch",
        type=int,
        default=BATCH,
        help=f"runs sharing data, model and method trained together as one model, at most (default {BATCH}; 1: one "
        "at a time); each gets its solo run's numbers",
    )
    ap.add_argument("--dry-run", action="store_true", help="list the configs and what is stored, run nothing")
    ap.add_argument(
        "--backend",
        choices=["local", "ray"],
        default="local",
        help="local: this machine, --jobs processes (default); ray: each unit of runs (--batch) a task on a Ray "
        "cluster",
    )
    ap.add_argument(
        "--address",
        default=None,
        help="with --backend ray: the Ray head, HOST:PORT (default: RAY_ADDRESS, else a Ray instance on this machine)",
    )
    ap.add_argument("--cpus-per-run", type=int, default=None, help="with --backend ray: CPUs (threads) per task (1)")
    ap.add_argument(
        "--gpus-per-run",
        type=float,
        default=None,
        help="with --backend ray: a GPU's share per task (default 0.25 where the cluster has GPUs, else 0)",
    )
    ap.add_argument(
        "--placement", action="store_true", help="with --backend ray: show how many runs each node is training"
    )
    args = ap.parse_args(argv)
    try:
        args.jobs = runner.jobs_arg(args.jobs)
        malloc_mode()  # a bad FEDLIB_MALLOC: here, not as a traceback from every worker
        graphs_from_env()  # a bad FEDLIB_CUDA_GRAPHS likewise
        checkpoint_seconds()  # and FEDLIB_CHECKPOINT_SECONDS (a traceback from the grid)
        resolve_profile(args.profile)  # a bad FEDLIB_PROFILE (--profile's choices are checked above): a usage error
    except ValueError as e:
        ap.error(str(e))
    if args.batch < 1:
        ap.error(f"--batch={args.batch} must be an integer >= 1 (1: one run at a time)")
    backend = "local"
    ray_only = {"--address": args.address, "--cpus-per-run": args.cpus_per_run, "--gpus-per-run": args.gpus_per_run}
    if args.backend == "local":
        given = [k for k, v in {**ray_only, "--placement": args.placement or None}.items() if v is not None]
        if given:
            ap.error(f"{', '.join(given)}: only with --backend ray")
    else:
        if args.jobs != 1:
            ap.error("--jobs is for --backend local; on Ray the cluster's CPUs (and --cpus-per-run) decide")
        from .ray_backend import RayBackend

        try:
            backend = RayBackend(
                address=args.address,
                num_cpus=1 if args.cpus_per_run is None else args.cpus_per_run,
                num_gpus=args.gpus_per_run,
                placement=args.placement,
            )
        except ValueError as e:
            ap.error(str(e).replace("num_cpus=", "--cpus-per-run=").replace("num_gpus=", "--gpus-per-run="))
    try:
        where = parse_where(args.where)
    except ValueError as e:
        ap.error(str(e))
    return _main(ap, args, where, backend)


def parse_where(items: list[str]) -> dict:
    """``--where FIELD=VALUE`` arguments as ``{flat field: value}``, the value a Python literal where it reads as one
    (``seed=0``: 0), else the string; a ValueError naming the argument and the fields allowed otherwise."""
    where = {}
    for w in items:
        k, sep, v = w.partition("=")
        try:
            k = flat_name(k) if sep else None
        except ValueError:
            k = None
        if k is None:
            raise ValueError(
                f"--where={w!r} must be FIELD=VALUE with FIELD a config field, flat or dotted (method.mu): "
                f"{', '.join(sorted(flat_field_names()))}"
            )
        try:
            where[k] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            where[k] = v
    return where


DATA_ERRORS = (DatasetNotFoundError, DatasetChecksumError, DatasetFormatError)


def absent_for_empty(name: str, profile: str, inputs: dict) -> list[str]:
    """The data sets absent under the data root that experiment ``name`` would run on, for one whose grid is empty:
    an experiment that has cells only for the data sets present (pFedLA's Office grids, its digits grids below two
    domains) reports no absent data set (``Experiment.absent``), so its grid is built again as if every data set were
    present and checked against what is (``profiles.available_cells``)."""
    from .data import readers
    from .data.domains import DOMAINS

    every = profiles.Available(frozenset({"synthetic", *readers.DATASETS, *DOMAINS}), tuple(DOMAINS.items()))
    base, grid = profiles.get(name, profile, every, **inputs)
    return profiles.available_cells(profiles.flat_cells(grid), base, profiles.Available.scan())[1]


def _main(ap, args, where, backend) -> int:
    def planned(name, **kw) -> Experiment:
        """The experiment's configs, nothing trained; bad input (a --where that matches nothing) is a usage error."""
        try:
            return experiment(name, args.profile, stored_only=True, progress=False, store=store, **kw)
        except ValueError as e:
            ap.error(str(e))

    if "status" in args.experiment:
        if len(args.experiment) > 1:
            ap.error("'status' takes no experiment names: it lists every experiment")
        profile = resolve_profile(args.profile)
        store = Store.of(None, profile)
        print(f"profile {profile}, results in {store.root}")  # the exploring profiles' store is not the committed one
        print(status(profile, where, store).to_string(index=False))
        return 0
    names = []
    for name in args.experiment:  # an experiment with a step: the experiment the step reads goes first
        prior = profiles.STEPS.get(name, (None,))[0]
        if prior is not None and prior not in names:
            names.append(prior)
        if name not in names:
            names.append(name)
    store, queue, seen, missing = Store.of(None, resolve_profile(args.profile)), [], set(), []

    def flush(final: bool = False):
        """Train (or, dry, list) the queue so far; the last call reports even an empty queue (nothing matched)."""
        if not queue and not (final and not seen):
            return
        print(f"{len(queue)} configs, {sum(store.has(c) for c in queue)} stored, results in {store.root}")
        if args.dry_run:
            for c in queue:
                print(("stored  " if store.has(c) else "to run  ") + c.label())
        else:
            cols = ("dataset", "model", "algorithm", "sigma", "seed")
            try:
                table = _table(queue, store, cols, jobs=args.jobs, backend=backend, batch=args.batch)
            except (ConnectionError, ImportError, StoreNotWritable, *DATA_ERRORS) as e:
                # a wrong --address / RAY_ADDRESS, Ray not installed; a store that is a file or read-only (refused
                # before anything trains); a data file absent, damaged or malformed (the message names it; the runs
                # finished before it are stored)
                raise SystemExit(f"python -m fedlib.experiments: error: {e}") from None
            if table.empty:  # no configs at all (a grid empty for another reason than absent data): nothing to show
                print("nothing to run: no configs")
            else:
                print(table.drop(columns=["key"]).to_string())
        queue.clear()

    for name in names:
        inputs = {}
        if name in profiles.STEPS:
            prior, keyword, step = profiles.STEPS[name]
            flush()  # the step reads the stored results of the experiment before it: train those first
            before = planned(prior)
            inputs[keyword] = step(before.configs, store)
            print(
                f"step {step.__name__}: {len(inputs[keyword])} {keyword} from {len(before.runs)} of "
                f"{len(before.configs)} {prior} runs stored"
            )
        ex = planned(name, where=where, inputs=inputs)
        queue += [c for c in ex.configs if c.key() not in seen and not seen.add(c.key())]
        absent = ex.absent if ex.configs or ex.absent else absent_for_empty(name, ex.profile, inputs)
        missing += [m for m in absent if m not in missing]
        if missing and name == names[-1]:
            print(f"data absent, skipped: {', '.join(missing)} (see data/README.md)")
    if missing and not seen:  # it printed "0 configs" and then failed on an empty table (a KeyError traceback)
        from .data.readers import data_root

        raise SystemExit(
            f"python -m fedlib.experiments: error: nothing to train or show: every config needs data absent under "
            f"{data_root()} ({', '.join(missing)}); put it there or set FEDLIB_DATA (see data/README.md)"
        )
    flush(final=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
