"""Grids of configs through the results store: ``expand`` (a dict of lists into validated configs), ``run_configs``
and ``run_grid`` (skip what is stored, train the rest alone, batched, in processes or on Ray, and store each run as
soon as it finishes: an interrupted grid resumes where it stopped and loses nothing finished), ``results_frame``.
A grid's summary table is a ``fedlib.runs.results.ResultsTable``: the DataFrame it always was, and a ``Results``.
"""

from __future__ import annotations

import dataclasses
import itertools

import pandas as pd
from tqdm.auto import tqdm

from fedlib.config.run import RunConfig, flat_name
from fedlib.executors.graphs import graphs_from_env
from fedlib.runs import feasibility
from fedlib.runs.estimates import known_times
from fedlib.runs.malloc import mode as malloc_mode
from fedlib.runs.pool import _run_parallel
from fedlib.runs.results import Results, ResultsTable, summary_row, tidy_frame
from fedlib.runs.scheduling import BATCH, _longest_first, batches, check_jobs, check_side_by_side, default_jobs
from fedlib.runs.store import Store
from fedlib.runs.threads import check as check_threads
from fedlib.runs.threads import computing
from fedlib.runs.train import config_arg, configs_arg, run, train_together


def expand(base: RunConfig, grid: dict | list[dict]) -> list[RunConfig]:
    """Configs of the product of a dict of lists (a list of dicts: their union, in order), validated.

    Only lists are axes: tuple-valued fields (``hidden``, ``fraction_schedule``, ``domains``) are single values."""
    config_arg(base, "base")
    grids = [grid] if isinstance(grid, dict) else list(grid) if isinstance(grid, (list, tuple)) else None
    if grids is None or not all(isinstance(g, dict) for g in grids):
        raise TypeError(
            f"grid must be a dict of field -> value or list of values, or a list of such dicts; got {grid!r:.80}"
        )
    out, seen = [], set()
    for i, g in enumerate(grids):
        keys = list(g)
        for k in keys:  # an axis computed empty by mistake would return an empty table, silently
            if isinstance(g[k], list) and not g[k]:
                where = f"grid[{k!r}]" if isinstance(grid, dict) else f"grid[{i}][{k!r}]"
                raise ValueError(f"{where} is an empty list: a grid axis needs at least one value")
        # a list is a grid axis; a tuple is one value (hidden sizes, a fraction schedule, a set of domains)
        for values in itertools.product(*(g[k] if isinstance(g[k], list) else [g[k]] for k in keys)):
            cfg = base.replace(**dict(zip(keys, values))).validate()
            if cfg.key() not in seen:
                seen.add(cfg.key())
                out.append(cfg)
    return out


def run_grid(
    base: RunConfig,
    grid: dict | list[dict],
    store: Store | None = None,
    progress: bool = True,
    data_root=None,
    *,
    jobs: int | None = 1,
    backend="local",
    address: str | None = None,
    batch: int = BATCH,
    threads: int | None = None,
) -> ResultsTable:
    """Run every config of the grid (skipping stored ones); one summary row per config (a ``ResultsTable``: also
    ``.frame``, ``.plot()``). ``jobs``, ``backend``, ``address``, ``batch``, ``threads``: where and how the runs
    train (``run_configs``)."""
    cfgs = expand(base, grid)  # validates every config before any training starts
    # the varied fields by their flat names: with dotted ones (``local.lr``) the flat column (``lr``, from
    # ``cfg.changed()``) would be NaN wherever a run had the default value
    varied = ["algorithm", "seed"] + [flat_name(k) for g in ([grid] if isinstance(grid, dict) else grid) for k in g]
    return run_configs(
        cfgs,
        store,
        progress,
        data_root,
        varied,
        jobs=jobs,
        backend=backend,
        address=address,
        batch=batch,
        threads=threads,
    )


def ray_backend(backend="local", address: str | None = None, jobs: int | None = 1):
    """The ``RayBackend`` that ``backend``/``address`` ask for, or None for the local one; bad values are a
    ValueError naming the parameter."""
    if backend == "local":
        if address is not None:
            raise ValueError(f"address={address!r} is for backend='ray'; the local backend trains on this machine")
        return None
    from fedlib.runs.ray_backend import RayBackend

    if isinstance(backend, RayBackend):
        cluster = backend if address is None else dataclasses.replace(backend, address=address)
    elif backend == "ray":
        cluster = RayBackend(address=address)
    else:
        raise ValueError(f"backend={backend!r} must be 'local' (this machine's processes), 'ray' or a RayBackend")
    if jobs not in (1, None):
        raise ValueError(
            f"jobs={jobs!r} is for backend='local'; on Ray the cluster's CPUs decide how many runs train at a time "
            "(RayBackend.num_cpus each)"
        )
    return cluster


def run_configs(
    cfgs: list[RunConfig],
    store: Store | None = None,
    progress: bool = True,
    data_root=None,
    columns=("algorithm", "seed"),
    jobs: int | None = 1,
    backend="local",
    address: str | None = None,
    batch: int = BATCH,
    threads: int | None = None,
) -> ResultsTable:
    """Run validated configs (skipping stored ones); one summary row per config, in the order given, as a
    ``ResultsTable`` (the summary DataFrame, which also knows its runs: ``.frame``, ``.plot()``).

    ``batch``: configs that share data, model and method (``batch_key``: seeds, lr, mu, sigma, lambda, ... may
    differ) train up to ``batch`` at a time as one model (``train_together``), each stored under its own key with
    the metrics of its solo run; ``batch=1`` trains one at a time.

    ``jobs`` > 1 trains that many configs at a time, each in its own process with one thread: the runs are independent,
    and on a CPU several single-threaded small-model runs finish a grid sooner than one run using every core: torch's
    threads spin on small matmuls, and processes with a thread per core each side by side train much slower
    than with one thread each (measured: docs/measurements/). Each run is stored as soon as it finishes, whichever
    process trained it. Runs stopped part-way (a snapshot in the store) go first, then the longest
    (``estimates.seconds``: the stored runs of their kind), so that short runs fill the end. ``jobs=None``: as many
    processes as ``default_jobs`` gives this machine (one per core, within its memory).

    ``backend='ray'`` (or a ``ray_backend.RayBackend``) trains the configs not stored on the Ray cluster at
    ``address`` (else ``RAY_ADDRESS``; neither: a local Ray instance), each unit of up to ``batch`` runs as a task,
    submitted in the same order (stopped, then longest first) and balanced in the same seconds; the results come back
    to this process, which stores them (see ``fedlib.runs.ray_backend``).

    ``threads``: what this process computes with while ``jobs=1`` (None: ``OMP_NUM_THREADS`` if set, else the cores
    other processes leave free, see ``fedlib.runs.threads``); worker processes compute with one thread each.
    """
    check_jobs(jobs)
    check_threads(threads)
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch={batch!r} must be an integer >= 1 (runs trained together at most; 1: one at a time)")
    cfgs = configs_arg(cfgs)
    store = Store.of(store)
    malloc_mode()  # else each worker process would fail on a bad FEDLIB_MALLOC
    graphs_from_env()  # or FEDLIB_CUDA_GRAPHS
    todo = [c for c in cfgs if not store.has(c)]
    for c in todo:  # every run that will train fits, and can be stored, before any trains
        feasibility.check(c)
    if todo:
        store.ready()
    if _in_process_only(todo, jobs, backend):
        jobs = 1
    cluster = ray_backend(backend, address, jobs)
    # runs that were stopped part-way first: they continue from their snapshot (see ``Store.checkpoint``)
    stopped = [c for c in todo if store.checkpoint(c).info() is not None]
    todo = stopped + [c for c in todo if c not in stopped]
    asked = jobs
    if cluster is None:
        jobs = default_jobs(todo, batch) if jobs is None else jobs
    cost = None
    if cluster is not None or jobs > 1:  # the longest runs first, so that short ones fill the end (stopped ones first)
        device = todo[0].resolved_device() if todo else None
        todo, cost = _longest_first(todo, known_times(store, device), keep=len(stopped))
    with computing(threads, todo[0].resolved_device() if todo else "cpu"):  # this process's threads, for both loops
        if cluster is not None:
            cluster.run(todo, store, progress, data_root, batch, cost=cost)
        else:
            units = batches(todo, batch, jobs, cost=cost)
            if jobs > 1 and len(units) > 1:  # the units that train at once must fit together, not just each alone
                jobs = check_side_by_side(units, jobs, explicit=asked is not None)
            if jobs > 1 and len(units) > 1:
                _run_parallel(units, store, jobs, progress, data_root, cost)
            else:
                for unit in units:
                    if len(unit) > 1:
                        train_together(unit, store, progress, data_root)
                    elif unit[0] in stopped:
                        run(unit[0], store, progress=progress, data_root=data_root)
        # a bar only while runs train here (the rest load from the store in moments), cleared when done: in a notebook
        # a bar is a widget, whose saved output reads as frozen ("grid (0 to run, 126 stored): 0%") once its state is
        # gone
        left = sum(not store.has(c) for c in todo)
        bar = tqdm(
            cfgs, desc=f"grid ({left} to run, {len(cfgs) - left} stored)", disable=not progress or not left, leave=False
        )
        # columns: every field the grid varies (even where a value equals the default), then the summary
        rows = [summary_row(cfg, run(cfg, store, progress=progress, data_root=data_root), columns) for cfg in bar]
    return ResultsTable.of_rows(rows, [(cfg, store) for cfg in cfgs])


def _in_process_only(todo: list[RunConfig], jobs: int | None, backend) -> bool:
    """Whether ``todo`` names a model or data set registered in this process (``fedlib.register_model``,
    ``fedlib.register_dataset``). Worker processes (spawned fresh) and Ray tasks would not see the registration: such
    a grid trains here (``jobs=None`` becomes 1; runs sharing data and model still train batched), and ``jobs`` > 1 or
    ``backend='ray'`` is refused naming the registration, rather than failing in the workers on an unknown name."""
    from fedlib.data.own import USER_DATASETS
    from fedlib.models.registry import MODELS

    mine = sorted({f"model={c.model.name!r}" for c in todo if MODELS[c.model.name].version is not None}
                  | {f"dataset={c.data.dataset!r}" for c in todo if c.data.dataset in USER_DATASETS})  # fmt: skip
    if not mine:
        return False
    where = f"jobs={jobs}" if backend == "local" else f"backend={backend!r}"
    if backend != "local" or (jobs is not None and jobs > 1):
        raise ValueError(
            f"{where}: the grid uses {', '.join(mine)}, registered in this process only; worker processes and Ray "
            "tasks start fresh and do not see it. Train it here with jobs=1 (runs that share data and model still "
            "train together, batch=)"
        )
    return True


def results_frame(cfgs: list[RunConfig] | Results, store: Store | None = None) -> pd.DataFrame:
    """Per-round metrics of stored runs in one tidy frame, with the configs' fields as columns (``tidy_frame``).

    ``cfgs``: a list of configs (read from ``store``), or a ``Results``: what ``run_grid``/``run_configs`` return (also
    a row selection of it), ``fedlib.run`` or ``fedlib.experiment``; its runs are read from the stores they came
    from, or from ``store`` where one is given."""
    if isinstance(cfgs, Results):
        if store is None:
            return cfgs.frame
        cfgs = cfgs.configs
    elif isinstance(cfgs, pd.DataFrame):
        raise TypeError(
            "cfgs is a DataFrame that does not know its runs (not a table run_grid returned, or one rebuilt from its "
            "values): pass the table run_grid returned, a row selection of it, or a list of RunConfigs"
        )
    return tidy_frame(Store.of(store).stored(configs_arg(cfgs)))
