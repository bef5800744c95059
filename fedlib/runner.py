"""Run one config, or a grid of them, through the results store.

``run(cfg)`` returns the stored result when there is one, else trains and stores it.
``run_grid(base, grid)`` expands a dict of lists (or a list of such dicts) into configs,
validates them all before training any, skips those already stored, and stores each run as
soon as it finishes: an interrupted grid resumes where it stopped and loses nothing finished.
"""

from __future__ import annotations

import _thread
import contextlib
import dataclasses
import itertools
import os
import platform
import signal
import threading
import time
import warnings
from dataclasses import dataclass

import pandas as pd
import torch
from tqdm.auto import tqdm

from . import openmp, resources
from .algorithms import build_algorithm
from .config import RunConfig, auto_device, flat_name
from .data import load_federated
from .executors import make_executor
from .executors.graphs import graphs_from_env
from .local_attention import per_client_attention
from .malloc import keep_freed_memory
from .malloc import mode as malloc_mode
from .models import MODELS, build_model
from .simulation import Checkpoint, RunResult, git_commit, simulate
from .store import Store, committed_root


def _meta(cfg: RunConfig, device: str, seconds: float, executor: str) -> dict:
    import numpy

    import fedlib

    commit = git_commit()
    dev = torch.cuda.get_device_name() if device == "cuda" else resources.cpu_name()
    return {
        "fedlib": fedlib.__version__,
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "git_commit": commit,
        "device": device,
        "device_name": dev,
        "executor": executor,
        "threads": openmp.threads(),
        "wall_seconds": round(seconds, 3),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def train(
    cfg: RunConfig,
    progress: bool = True,
    data_root=None,
    checkpoint: Checkpoint | None = None,
    device: str | None = None,
    *,
    together=None,
) -> RunResult:
    """Train ``cfg`` from scratch (no store): the pure function behind ``run``; with a ``checkpoint``, continue
    from its snapshot if there is one (same result) and snapshot while training. ``device``: where a ``device='auto'``
    config trains (default: ``cfg.resolved_device()``; a Ray task passes the device its resources hold).
    ``together``: a ``_Together`` when the run trains batched with others (``train_together``): their shared data,
    the run's gang executor, the stop flag and the batch's progress."""
    cfg.validate()
    resources.check(cfg)  # refuse a run that cannot fit before loading its data
    device = device if device is not None and cfg.device == "auto" else cfg.resolved_device()
    if device == "cpu":
        keep_freed_memory()  # each round's large stacked tensors reuse freed memory (see fedlib.malloc)
    dtype = getattr(torch, cfg.dtype)
    data = together.data if together is not None else load_federated(cfg, data_root).to(device, dtype)
    m = cfg.model

    def drawn(seed):
        return build_model(
            m.name, data.input_shape, data.n_classes, m.hidden, seed=seed, dtype=dtype, attention=m.attention
        )

    model = drawn(cfg.seed).to(device)
    client_init = None
    if m.attention_init == "per_client":  # pFedLA Algorithm 1, line 9
        client_init = {k: v.to(device) for k, v in per_client_attention(drawn, data.n_clients, cfg.seed).items()}
    algorithm = build_algorithm(cfg, n_samples=data.train.sizes.cpu().numpy())
    executor = (
        together.executor if together is not None else make_executor(cfg.executor, model, group_bytes=_GROUP_BYTES)
    )
    t0 = time.perf_counter()
    result = simulate(
        algorithm,
        data,
        model,
        executor,
        cfg.rounds,
        local_steps=cfg.local_steps,
        local_epochs=cfg.local_epochs,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        eval_every=cfg.eval_every,
        eval_train=cfg.eval_train,
        progress=progress,
        desc=f"{cfg.algorithm} {cfg.dataset}/{m.name}",
        lr_decay=cfg.lr_decay,
        checkpoint=checkpoint,
        stop=together.stop if together is not None else None,
        on_round=together.tick if together is not None else _ROUNDS.tick if _ROUNDS is not None else None,
        client_init=client_init,
    )
    resumed, simulated = result.meta.get("resumed", []), dict(result.meta)  # simulate's meta
    before = resumed[-1]["elapsed"] if resumed else 0.0  # wall time of the interrupted part(s)
    result.meta = _meta(cfg, device, time.perf_counter() - t0 + before, executor.name)
    if resumed:
        result.meta["resumed"] = resumed
    if together is not None:  # trained as one model with others (wall_seconds: the batch's, shared)
        result.meta["batched"] = together.runs
    if "attention_trace" in simulated:  # why the run keeps no attention trace (simulation.AttentionTrace)
        result.meta["attention_trace"] = simulated["attention_trace"]
    if "diverged_at" in simulated:
        result.meta["diverged_at"] = simulated["diverged_at"]
        warnings.warn(
            f"{cfg.label()}: diverged at round {simulated['diverged_at']} (a NaN or inf model); the run stopped there"
        )
    result.config = cfg
    return result


def configs_arg(cfgs, name: str = "cfgs") -> list[RunConfig]:
    """``cfgs`` as a list of RunConfigs; anything else a TypeError naming ``name`` (a dict or a list of ints reached
    an AttributeError deep inside)."""
    if isinstance(cfgs, (str, bytes, dict, RunConfig)) or not hasattr(cfgs, "__iter__"):
        raise TypeError(f"{name} must be a list of RunConfig, got {type(cfgs).__name__}")
    return [config_arg(c, f"{name}[{i}]") for i, c in enumerate(cfgs)]


def config_arg(cfg, name: str = "cfg") -> RunConfig:
    """``cfg`` if it is a RunConfig, else a TypeError naming ``name`` (a dict reached "'dict' object has no attribute
    'validate'")."""
    if not isinstance(cfg, RunConfig):
        raise TypeError(f"{name} must be a RunConfig (RunConfig.of(...)), got {type(cfg).__name__}: {cfg!r:.60}")
    return cfg


def run(
    cfg: RunConfig, store: Store | None = None, progress: bool = True, force: bool = False, data_root=None
) -> RunResult:
    """The stored result of ``cfg``, training and storing it first if needed (``force`` retrains from scratch).
    Training snapshots itself every few minutes (``Store.checkpoint``): an interrupted run continues from there."""
    config_arg(cfg).validate()
    store = Store.of(store)
    malloc_mode()  # a bad FEDLIB_MALLOC is an error here, not when training starts
    graphs_from_env()  # so is a bad FEDLIB_CUDA_GRAPHS
    if not force:
        hit = store.load(cfg)
        if hit is not None:
            store.checkpoint(cfg).clear()  # a snapshot left by a stop between storing and cleaning up
            return hit
    store.ready()
    checkpoint = store.checkpoint(cfg)
    if force:
        checkpoint.clear()
    result = train(cfg, progress, data_root, checkpoint)
    store.save(cfg, result, replace=force)
    checkpoint.clear()
    return result


# -- grids as one model (issue 21 item 5; see ``fedlib.batching``) ------------------------------------------------
BATCH = 16  # runs trained together at most (a thread each); ``run_configs(batch=1)`` trains one at a time
BATCH_MEMORY_SHARE = 0.5  # of the memory available: what one batch's estimated peak may take
BALANCE_GAIN = 0.1  # a unit is cut for the processes' balance only where the grid's span shrinks by this share


def batch_key(cfg: RunConfig) -> tuple | None:
    """Configs with equal keys train well together: the same data (one copy serves them all), model, dtype, device,
    executor, method and local schedule; seeds, learning rates, mu, sigma, lambda, rounds... may differ. None: the run
    trains alone (models on the loop executor gain nothing from batching)."""
    if MODELS[cfg.model.name].kernel not in ("chain", "vmap") or cfg.executor == "loop":
        return None
    loc = cfg.local
    return (cfg.data, cfg.model, cfg.dtype, cfg.resolved_device(), cfg.executor, cfg.algorithm,
            loc.local_steps, loc.local_epochs, loc.batch_size)  # fmt: skip


def batches(
    cfgs: list[RunConfig], most: int = BATCH, jobs: int = 1, budget: float | None = None, cost: dict | None = None
) -> list[list[RunConfig]]:
    """``cfgs`` cut into units that train together (``batch_key``), in order of first appearance, each of at most
    ``most`` runs whose estimated memory (``resources.estimate``; the data once) fits in ``budget`` bytes (default:
    ``BATCH_MEMORY_SHARE`` of what this machine has available, shared by ``jobs`` processes; a Ray cluster passes
    its nodes' own) and of at most ``ceil(len(cfgs) / jobs)`` runs, so that the ``jobs`` processes share the work; a
    group cut into k units is cut into k of equal size (20 runs at most 16: 10 + 10, not 16 + 4). With ``jobs`` > 1
    a unit is cut further where that ends the grid sooner (``_balance``; ``cost``: each run's estimated seconds by
    key, ``resources.seconds``, else its rounds)."""
    groups: dict = {}
    for i, c in enumerate(cfgs):
        k = batch_key(c) if most > 1 else None
        groups.setdefault(k if k is not None else ("alone", i), []).append(c)
    if budget is None:
        avail = resources.available_bytes(cfgs[0].resolved_device()) if cfgs else None
        budget = None if avail is None else avail * BATCH_MEMORY_SHARE / jobs

    def cut(group: list, cap: int) -> list:
        out, unit, used = [], [], 0.0
        for c in group:
            est = resources.estimate(c)
            own = resources.run_bytes(est)  # the data is loaded once per unit
            if unit and (len(unit) >= cap or (budget is not None and used + own > budget)):
                out.append(unit)
                unit = []
            if not unit:
                used = est["data"]
            unit.append(c)
            used += own
        return out + [unit]

    # the processes share the work: no unit holds more than its share of the runs, ceil(runs / jobs) (a grid of 16
    # runs of one kind and 2 of another on 2 processes: 8 + 8 + 2, not 16 + 2 with one process idle most of the time)
    cap = min(most, -(-len(cfgs) // jobs))
    units = []
    for group in groups.values():
        parts = cut(group, cap)
        units += cut(group, -(-len(group) // len(parts))) if len(parts) > 1 else parts
    return _balance(units, jobs, cost) if jobs > 1 else units


def _weight(c: RunConfig, cost: dict | None) -> float:
    """A run's share of a grid's work: its estimated seconds (``cost``, by key), else its rounds."""
    return cost[c.key()] if cost is not None else c.rounds


def _span(units: list[list[RunConfig]], jobs: int, cost: dict | None = None) -> float:
    """Work (``_weight``) until the last of ``jobs`` processes is done when each takes the next unit as it gets
    free."""
    free = [0.0] * jobs
    for u in units:
        free[free.index(min(free))] += sum(_weight(c, cost) for c in u)
    return max(free)


def _balance(units: list[list[RunConfig]], jobs: int, cost: dict | None = None) -> list[list[RunConfig]]:
    """``units`` with a unit cut in two, in place, while that shortens the grid on ``jobs`` processes (``_span``,
    in estimated seconds with ``cost``, else in rounds): three batches of three runs on two processes, the third
    trained alone while the other process idles (AdaFL Tables 3-4, quick profile: 1.5x for two processes), become
    2 + 1, 3, 3. A cut undoes some batching (on a GPU, its point), so it must shorten the span by ``BALANCE_GAIN``
    at least. The order is kept (runs stopped part-way stay first)."""
    while True:
        cuts = []  # (span, i, units with unit i cut in two)
        for i, u in enumerate(units):
            if len(u) > 1:
                h = (len(u) + 1) // 2
                trial = units[:i] + [u[:h], u[h:]] + units[i + 1 :]
                cuts.append((_span(trial, jobs, cost), i, trial))
        best = min(cuts, key=lambda c: c[:2], default=None)  # the shortest span; the first unit on a tie
        if best is None or best[0] > _span(units, jobs, cost) * (1 - BALANCE_GAIN):
            return units
        units = best[2]


@dataclass
class _Together:
    """What a run trained in a batch gets from ``train_together``."""

    data: object
    executor: object
    stop: object
    runs: int
    tick: object


def train_together(cfgs: list[RunConfig], store: Store, progress: bool = True, data_root=None) -> None:
    """Train ``cfgs`` (one unit of ``batches``) as one model (``fedlib.batching``), storing each run as soon as it
    finishes; each continues from its snapshot if it has one and snapshots while training. A run that fails does
    not stop the others: the failure is raised once all have ended (the finished ones stored)."""

    def done(cfg, result):
        store.save(cfg, result)
        store.checkpoint(cfg).clear()

    outcomes = train_unit(cfgs, data_root, store.checkpoint, done, progress)
    failed = [(c, e) for c, e in zip(cfgs, outcomes) if isinstance(e, BaseException)]
    if any(isinstance(e, KeyboardInterrupt) for _, e in failed):
        raise KeyboardInterrupt(f"stopped: {len(cfgs) - len(failed)} of {len(cfgs)} batched runs stored, the rest "
                                "snapshotted (run again to resume)")  # fmt: skip
    if failed:
        c, e = failed[0]
        raise RuntimeError(f"{len(failed)} of {len(cfgs)} batched runs failed; first: {c.label()}: {e!r}") from e


def train_unit(
    cfgs: list[RunConfig], data_root, checkpoint, done, progress: bool = True, device: str | None = None
) -> list:
    """Train ``cfgs`` as one model with no store: the body of ``train_together`` and of a Ray task's unit
    (``ray_backend``). ``checkpoint(cfg)``: the run's ``Checkpoint`` or None; ``done(cfg, result)`` is called in the
    run's thread as soon as it finishes (to store it); ``device``: as ``train``'s. Returns each run's ``RunResult``,
    or the exception that ended it."""
    from .batching import run_together

    first = cfgs[0]
    for c in cfgs:
        c.validate()
        resources.check(c)
    device = device if device is not None and first.device == "auto" else first.resolved_device()
    if device == "cpu":
        keep_freed_memory()
    data = load_federated(first, data_root).to(device, getattr(torch, first.dtype))
    model = build_model(first.model.name, data.input_shape, data.n_classes, first.model.hidden, seed=first.seed,
                        dtype=getattr(torch, first.dtype), attention=first.model.attention).to(device)  # fmt: skip
    executor = make_executor(first.executor, model, group_bytes=_GROUP_BYTES)
    bar = tqdm(total=sum(c.rounds for c in cfgs), desc=f"{len(cfgs)} runs as one model", disable=not progress)
    lock = threading.Lock()

    def tick(*_):
        with lock:
            bar.update(1)
        if _ROUNDS is not None:
            _ROUNDS.tick()

    def job(cfg):
        def fn(member, stop):
            together = _Together(data, member, stop, len(cfgs), tick)
            result = train(cfg, False, data_root, checkpoint(cfg), device, together=together)
            done(cfg, result)
            return result

        return fn

    outcomes, _ = run_together([job(c) for c in cfgs], executor)
    bar.close()
    return outcomes


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
        for k in keys:  # an axis computed empty by mistake returned an empty table, silently
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
) -> pd.DataFrame:
    """Run every config of the grid (skipping stored ones); one summary row per config. ``jobs``, ``backend``,
    ``address``, ``batch``: where and how the runs train (``run_configs``)."""
    cfgs = expand(base, grid)  # validates every config before any training starts
    # the varied fields by their flat names: with dotted ones (``local.lr``) the flat column (``lr``, from
    # ``cfg.changed()``) was NaN wherever a run had the default value
    varied = ["algorithm", "seed"] + [flat_name(k) for g in ([grid] if isinstance(grid, dict) else grid) for k in g]
    return run_configs(
        cfgs, store, progress, data_root, varied, jobs=jobs, backend=backend, address=address, batch=batch
    )


def known_times(store: Store, device: str | None = None) -> dict:
    """Seconds a round per kind of run (``resources.stored_times``), what the runs to train are estimated from
    (``resources.seconds``; ``scripts/run_notebooks.py``'s plan too), for runs training on ``device`` (None: this
    machine's, as ``device="auto"`` resolves). Each source overrides the ones before it, for the kinds it holds:
    the checkout's committed store (runs timed on any device, then on ``device``), ``store`` (any device), this
    version's reference timings (``resources.reference_times``: the quick profile on the 2-core CPU), and last
    ``store``'s runs on ``device``, since they were timed on this machine, most likely by this version: the quick
    profile's runs (the one grid of 164 that trained in 36 min on two processes, 2026-11-25, and notebook 12's 7
    later ones) were estimated at 59 min (``span_seconds``) from the committed store's times, 40 min from the
    median of both stores, and 36 min from that store's own."""
    device = auto_device() if device is None else device
    committed, mine = resources.timed_runs(committed_root()), resources.timed_runs(store.root)  # each read once
    return {
        **resources.median_times(committed),
        **resources.median_times(mine),
        **resources.median_times(committed, device),
        **resources.reference_times(device),
        **resources.median_times(mine, device),
    }


def span_seconds(cfgs: list[RunConfig], jobs: int, known: dict, batch: int = BATCH) -> float:
    """Estimated wall seconds of ``run_configs(cfgs, jobs=jobs, batch=batch)``: the runs longest first, cut into
    units and balanced as it cuts them, each unit costing its runs' ``resources.seconds`` (from ``known``,
    ``known_times``) and each process taking the next unit as it gets free. Batching's own gain is not counted
    (on the CPU ~1.2x, the benchmark's W6x); stored times are those of whichever version and machine made them."""
    order, cost = _longest_first(cfgs, known)
    return _span(batches(order, batch, jobs, cost=cost), jobs, cost)


def _longest_first(cfgs: list[RunConfig], known: dict, keep: int = 0) -> tuple[list[RunConfig], dict]:
    """``cfgs`` with all but the first ``keep`` (runs stopped part-way, which go first) sorted longest first, and
    each run's estimated seconds by key (``resources.seconds`` from ``known``)."""
    cost = dict(zip((c.key() for c in cfgs), resources.seconds(cfgs, known)))
    return cfgs[:keep] + sorted(cfgs[keep:], key=lambda c: -cost[c.key()]), cost


def default_jobs(cfgs: list[RunConfig], batch: int = BATCH) -> int:
    """The processes ``run_configs(jobs=None)`` trains the runs ``cfgs`` in: one per core this process may use
    (``resources.cores``), no more than the units they make (``batches``), and no more than fit side by side in
    ``BATCH_MEMORY_SHARE`` of the memory available (each process loads its own data: the largest run's
    ``resources.estimate`` each). On CUDA, also no more than 1 / ``ray_backend.DEFAULT_GPU_SHARE`` processes per
    GPU, the share a run gets on a Ray cluster (not timed here: no GPU was lent; the batches, which merge runs' kernel
    launches, shrink as processes are added). On the 2-core machine two processes trained pFedLA's five FedAvg digit
    runs (quick profile) in 64 s against 109 s for one, with the same numbers (2026-11-25)."""
    from .ray_backend import DEFAULT_GPU_SHARE

    if not cfgs:
        return 1
    device = cfgs[0].resolved_device()
    cores = resources.cores()
    if device == "cuda":
        cores = min(cores, round(torch.cuda.device_count() / DEFAULT_GPU_SHARE))
    cores = max(1, cores)
    jobs = min(cores, len(batches(cfgs, batch, cores)))
    avail = resources.available_bytes(device)
    if avail is not None:
        largest = max(sum(resources.estimate(c).values()) for c in cfgs)
        jobs = min(jobs, int(avail * BATCH_MEMORY_SHARE // largest))
    return max(1, jobs)


def jobs_arg(text: str) -> int | None:
    """A ``--jobs`` value on a command line (``python -m fedlib.experiments``, ``scripts/run_notebooks.py``): a
    count >= 1, or ``auto`` (None: ``default_jobs``); else a ValueError naming the flag."""
    if text == "auto":
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"--jobs={text} must be an integer >= 1 or auto (one process per core)")
    return int(text)


def check_jobs(jobs) -> None:
    """``jobs``: None (one process per core, ``default_jobs``) or an integer >= 1; else a ValueError naming it."""
    if jobs is not None and (not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1):
        raise ValueError(f"jobs={jobs!r} must be an integer >= 1, or None (one process per core: default_jobs)")


def ray_backend(backend="local", address: str | None = None, jobs: int | None = 1):
    """The ``RayBackend`` that ``backend``/``address`` ask for, or None for the local one; bad values are a
    ValueError naming the parameter."""
    if backend == "local":
        if address is not None:
            raise ValueError(f"address={address!r} is for backend='ray'; the local backend trains on this machine")
        return None
    from .ray_backend import RayBackend

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
) -> pd.DataFrame:
    """Run validated configs (skipping stored ones); one summary row per config, in the order given.

    ``batch``: configs that share data, model and method (``batch_key``: seeds, lr, mu, sigma, lambda, ... may
    differ) train up to ``batch`` at a time as one model (``train_together``), each stored under its own key with
    the metrics of its solo run; ``batch=1`` trains one at a time.

    ``jobs`` > 1 trains that many configs at a time, each in its own process with one thread: the runs
    are independent, and on a CPU several single-threaded small-model runs finish a grid sooner than one
    run using every core (on the 2-core machine, two grids side by side with torch's default two threads
    each trained pFedMe^+MCSA at 3.1 rounds/s, with one thread each at 8.7). Each run is stored as soon as
    it finishes, whichever process trained it. Runs stopped part-way (a snapshot in the store) go first, then the
    longest (``resources.seconds``: the stored runs of their kind), so that short runs fill the end.
    ``jobs=None``: as many processes as ``default_jobs`` gives this machine (one per core, within its memory).

    ``backend='ray'`` (or a ``ray_backend.RayBackend``) trains the configs not stored on the Ray cluster at
    ``address`` (else ``RAY_ADDRESS``; neither: a local Ray instance), each unit of up to ``batch`` runs as a task,
    submitted in the same order (stopped, then longest first) and balanced in the same seconds; the results come back
    to this process, which stores them (see ``fedlib.ray_backend``).
    """
    check_jobs(jobs)
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise ValueError(f"batch={batch!r} must be an integer >= 1 (runs trained together at most; 1: one at a time)")
    cfgs = configs_arg(cfgs)
    store = Store.of(store)
    malloc_mode()  # else each worker process would fail on a bad FEDLIB_MALLOC
    graphs_from_env()  # or FEDLIB_CUDA_GRAPHS
    todo = [c for c in cfgs if not store.has(c)]
    for c in todo:  # every run that will train fits, and can be stored, before any trains
        resources.check(c)
    if todo:
        store.ready()
    cluster = ray_backend(backend, address, jobs)
    # runs that were stopped part-way first: they continue from their snapshot (see ``Store.checkpoint``)
    stopped = [c for c in todo if store.checkpoint(c).info() is not None]
    todo = stopped + [c for c in todo if c not in stopped]
    if cluster is None:
        jobs = default_jobs(todo, batch) if jobs is None else jobs
    cost = None
    if cluster is not None or jobs > 1:  # the longest runs first, so that short ones fill the end (stopped ones first)
        device = todo[0].resolved_device() if todo else None
        todo, cost = _longest_first(todo, known_times(store, device), keep=len(stopped))
    if cluster is not None:
        cluster.run(todo, store, progress, data_root, batch, cost=cost)
    else:
        units = batches(todo, batch, jobs, cost=cost)
        if jobs > 1 and len(units) > 1:
            _run_parallel(units, store, jobs, progress, data_root, cost)
        else:
            for unit in units:
                if len(unit) > 1:
                    train_together(unit, store, progress, data_root)
                elif unit[0] in stopped:
                    run(unit[0], store, progress=progress, data_root=data_root)
    bar = tqdm(cfgs, desc=f"grid ({len(todo)} to run, {len(cfgs) - len(todo)} stored)", disable=not progress)
    # columns: every field the grid varies (even where a value equals the default), then the summary
    rows = []
    for cfg in bar:
        res = run(cfg, store, progress=progress, data_root=data_root)
        rows.append({"key": cfg.key(), **cfg.changed(), **{k: cfg.get(k) for k in columns}, **res.summary()})
    return pd.DataFrame(rows)


_GROUP_BYTES: int | None = None  # this process's cache budget for client groups (None: the one-process default)


class _RoundReport:
    """A pool worker's rounds trained, sent to the parent's bar (``_run_parallel``) as (unit, rounds): the workers
    train with their own bars off, and the parent's would otherwise move only when a whole unit ends (hours, at the
    paper profile). At most one message every ``every`` seconds, so that rounds of milliseconds pay no pipe write
    each; batched runs tick from their own threads."""

    def __init__(self, queue, every: float = 0.5):
        self.queue, self.every = queue, every
        self.unit, self.count, self.last = None, 0, time.monotonic()
        self.lock = threading.Lock()

    def tick(self, *_) -> None:
        with self.lock:
            self.count += 1
            if time.monotonic() - self.last >= self.every:
                self._send()

    def start(self, unit: int) -> None:
        with self.lock:
            self.unit, self.count, self.last = unit, 0, time.monotonic()

    def flush(self) -> None:
        with self.lock:
            self._send()

    def _send(self) -> None:
        if self.count:
            self.queue.put((self.unit, self.count))
            self.count = 0
        self.last = time.monotonic()


_ROUNDS: _RoundReport | None = None  # a pool worker's report of its rounds (None: not a pool worker)
_STOP = None  # a pool worker's view of its parent's "start no more units" (a multiprocessing Event)


def _worker_setup(jobs: int, threads: int = 1) -> None:
    """Start of one of ``jobs`` worker processes training side by side: ``threads`` threads (one in the local pool;
    a Ray task's ``num_cpus``), and a share of the cache for the stacked executor's client groups (the processes
    share the L3; see ``StackedExecutor``)."""
    from .executors import PROCESS_CACHE_BYTES

    global _GROUP_BYTES
    torch.set_num_threads(threads)
    _GROUP_BYTES = PROCESS_CACHE_BYTES // jobs  # a value handed to each executor this process makes


def _pool_worker_setup(jobs: int, rounds=None, stop=None) -> None:
    """``_worker_setup`` for a process of the local pool, which also follows its parent: Ctrl-C in the terminal
    reaches every process of the group, so an idle worker ignores it (the parent stops the grid) and a training one
    snapshots at the end of its round and stops (``simulation.DeferredInterrupt``); and it stops when its parent
    dies. ``rounds``: the queue its rounds go to (``_RoundReport``); ``stop``: set when the parent stops the grid.
    The pool hands a worker its next unit before the parent can cancel it, so a worker checks ``stop`` before it
    starts one (a Ctrl-C of a grid on two processes trained a third, queued run to its end)."""
    global _ROUNDS, _STOP
    _worker_setup(jobs)
    _STOP = stop
    if rounds is not None:
        # a worker that exits while its parent no longer reads (a grid stopped by a failure) must not wait on a
        # full pipe to flush progress nobody will show
        rounds.cancel_join_thread()
        _ROUNDS = _RoundReport(rounds)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, daemon=True, name="fedlib-parent").start()


def _exit_with_parent(grace: float = 20.0) -> None:
    """A worker whose parent died (``kill -9`` of the grid) stops too instead of training on as an orphan: it is
    interrupted like a Ctrl-C (its run snapshots at the end of the round), and exits after ``grace`` seconds."""
    import multiprocessing
    from multiprocessing.connection import wait

    parent = multiprocessing.parent_process()
    if parent is None:
        return
    wait([parent.sentinel])  # ready when the parent process has ended, however it ended
    _thread.interrupt_main(signal.SIGINT)
    time.sleep(grace)
    os._exit(1)


class _RoundsBar:
    """``_run_parallel``'s bar: the rounds its workers report per unit (``_RoundReport``), each unit topped up to
    its rounds when it ends (a resumed run trains fewer, a diverged one stops early) and deaf to its reports after;
    the postfix counts the runs stored.

    With ``cost`` (each run's estimated seconds by key, ``resources.seconds``) a unit's round weighs its share of
    the unit's estimate, and the bar shows the share of the work done and the time left. Counted in rounds, a grid
    of LeNet-BN rounds (seconds each) and Synthetic ones (milliseconds) said "6:55:37 left" for a job of 37 minutes
    (every notebook's runs at the quick profile, the longest first, 2026-11-25)."""

    def __init__(self, units: list[list[RunConfig]], desc: str, progress: bool = True, cost: dict | None = None):
        self.units, self.stored = units, 0
        self.left = {i: sum(c.rounds for c in u) for i, u in enumerate(units)}
        self.per_round = {  # the work a round of unit i does: 1 (rounds), or its share of the unit's estimate
            i: 1 if cost is None else sum(_weight(c, cost) for c in u) / max(1, self.left[i])
            for i, u in enumerate(units)
        }
        total = sum(self.left[i] * self.per_round[i] for i in self.left)
        if cost is None:
            self.bar = tqdm(total=total, desc=desc, unit="round", disable=not progress)
        else:  # the counts are estimated seconds from other versions and machines: only the share is shown
            form = "{l_bar}{bar}| [{elapsed}<{remaining}{postfix}]"
            self.bar = tqdm(total=total, desc=desc, bar_format=form, disable=not progress)

    def add(self, i: int, n: int) -> None:
        n = min(n, self.left.get(i, 0))
        if n:
            self.left[i] -= n
            # the estimates' float sums must not pass the total (tqdm warns, and shows a negative time left)
            self.bar.update(min(n * self.per_round[i], self.bar.total - self.bar.n))

    def end(self, i: int) -> None:
        self.add(i, self.left[i])
        u = self.units[i]
        self.stored += len(u)
        self.bar.set_postfix_str(f"{self.stored}/{sum(map(len, self.units))} runs stored")

    def close(self) -> None:
        self.bar.close()


def _run_in_worker(unit: list[RunConfig], where: tuple, data_root, uid: int = 0) -> None:
    if _STOP is not None and _STOP.is_set():  # the grid stopped while this unit waited in the pool's queue
        return
    if _ROUNDS is not None:
        _ROUNDS.start(uid)
    try:
        if len(unit) > 1:
            train_together(unit, Store(*where), progress=False, data_root=data_root)
        else:
            run(unit[0], Store(*where), progress=False, data_root=data_root)
    finally:
        if _ROUNDS is not None:
            _ROUNDS.flush()


@contextlib.contextmanager
def _main_for_spawn():
    """A script read from standard input (``python - <<EOF``, as batch job scripts do) has ``__main__.__file__`` =
    ``'<stdin>'``, which each spawned worker tries to run as a file: FileNotFoundError there, BrokenProcessPool here.
    The workers import what they run by module name and need nothing from ``__main__``, so such a pseudo-path is
    hidden while the pool starts them."""
    import sys

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    hide = isinstance(path, str) and path.startswith("<") and path.endswith(">")  # '<stdin>', '<string>'
    if hide:
        del main.__file__
    try:
        yield
    finally:
        if hide:
            main.__file__ = path


def _run_parallel(
    units: list[list[RunConfig]], store: Store, jobs: int, progress: bool, data_root, cost: dict | None = None
) -> None:
    """Train ``units`` (runs alone, or batches of runs as one model) in ``jobs`` fresh processes (spawned: no forked
    torch state). A failed (or interrupted) unit raises once the units already going have finished and been stored;
    those not started are dropped."""
    import multiprocessing
    import queue
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    ctx = multiprocessing.get_context("spawn")
    todo = [c for u in units for c in u]
    reports, stop = ctx.Queue(), ctx.Event()  # (unit, rounds) from the workers (_RoundReport); no more units
    with (
        _main_for_spawn(),
        ProcessPoolExecutor(
            max_workers=min(jobs, len(units)),
            mp_context=ctx,
            initializer=_pool_worker_setup,
            initargs=(jobs, reports, stop),
        ) as pool,
    ):
        futures = {
            pool.submit(_run_in_worker, u, (store.root, store.reads), data_root, i): i for i, u in enumerate(units)
        }
        bar = _RoundsBar(units, f"training ({jobs} processes)", progress, cost)
        try:
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                with contextlib.suppress(queue.Empty):
                    while True:
                        bar.add(*reports.get_nowait())
                for f in finished:
                    f.result()
                    bar.end(futures[f])
        except KeyboardInterrupt:
            stop.set()
            for f in futures:  # units not yet started are dropped; those running snapshot their last round and stop
                f.cancel()
            for p in list(getattr(pool, "_processes", {}).values()):  # also when only this process got the signal
                with contextlib.suppress(OSError):
                    os.kill(p.pid, signal.SIGINT)
            pool.shutdown(wait=True)
            stored = sum(store.has(c) for c in todo)
            kept = sum(store.checkpoint(c).info() is not None for c in todo if not store.has(c))
            print(f"interrupted: {stored} of {len(todo)} runs stored, {kept} snapshots kept (run again to resume)")
            raise
        except BaseException:
            stop.set()
            for f in futures:  # units not yet started are dropped; those running finish and are stored
                f.cancel()
            raise
        finally:
            bar.close()


def results_frame(cfgs: list[RunConfig], store: Store | None = None) -> pd.DataFrame:
    """Per-round metrics of stored runs in one tidy frame, with the configs' changed fields as columns."""
    store = Store.of(store)
    frames = []
    for cfg, res in store.stored(configs_arg(cfgs)):
        frames.append(
            res.metrics.assign(
                key=cfg.key(), **{k: str(v) if isinstance(v, tuple) else v for k, v in cfg.to_dict().items()}
            )
        )
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
