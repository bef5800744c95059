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

import pandas as pd
import torch
from tqdm.auto import tqdm

from . import resources
from .algorithms import build_algorithm
from .config import RunConfig
from .data import load_federated
from .executors import make_executor
from .malloc import keep_freed_memory
from .models import build_model
from .simulation import Checkpoint, RunResult, git_commit, simulate
from .store import Store


def _meta(cfg: RunConfig, device: str, seconds: float, executor: str) -> dict:
    import numpy

    import fedlib

    commit = git_commit()
    dev = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or platform.machine()
    return {
        "fedlib": fedlib.__version__,
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "git_commit": commit,
        "device": device,
        "device_name": dev,
        "executor": executor,
        "threads": torch.get_num_threads(),
        "wall_seconds": round(seconds, 3),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def train(
    cfg: RunConfig,
    progress: bool = True,
    data_root=None,
    checkpoint: Checkpoint | None = None,
    device: str | None = None,
) -> RunResult:
    """Train ``cfg`` from scratch (no store): the pure function behind ``run``; with a ``checkpoint``, continue
    from its snapshot if there is one (same result) and snapshot while training. ``device``: where a ``device='auto'``
    config trains (default: ``cfg.resolved_device()``; a Ray task passes the device its resources hold)."""
    cfg.validate()
    resources.check(cfg)  # refuse a run that cannot fit before loading its data
    device = device if device is not None and cfg.device == "auto" else cfg.resolved_device()
    if device == "cpu":
        keep_freed_memory()  # each round's large stacked tensors reuse freed memory (see fedlib.malloc)
    dtype = getattr(torch, cfg.dtype)
    data = load_federated(cfg, data_root).to(device, dtype)
    m = cfg.model
    model = build_model(
        m.name, data.input_shape, data.n_classes, m.hidden, seed=cfg.seed, dtype=dtype, attention=m.attention
    ).to(device)
    algorithm = build_algorithm(cfg, n_samples=data.train.sizes.cpu().numpy())
    executor = make_executor(cfg.executor, model, group_bytes=_GROUP_BYTES)
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
    )
    resumed, diverged = result.meta.get("resumed", []), dict(result.meta)
    before = resumed[-1]["elapsed"] if resumed else 0.0  # wall time of the interrupted part(s)
    result.meta = _meta(cfg, device, time.perf_counter() - t0 + before, executor.name)
    if resumed:
        result.meta["resumed"] = resumed
    if "diverged_at" in diverged:
        result.meta["diverged_at"] = diverged["diverged_at"]
        warnings.warn(
            f"{cfg.label()}: diverged at round {diverged['diverged_at']} (a NaN or inf model); the run stopped there"
        )
    result.config = cfg
    return result


def run(
    cfg: RunConfig, store: Store | None = None, progress: bool = True, force: bool = False, data_root=None
) -> RunResult:
    """The stored result of ``cfg``, training and storing it first if needed (``force`` retrains from scratch).
    Training snapshots itself every few minutes (``Store.checkpoint``): an interrupted run continues from there."""
    cfg.validate()
    store = store or Store()
    if not force:
        hit = store.load(cfg)
        if hit is not None:
            store.checkpoint(cfg).clear()  # a snapshot left by a stop between storing and cleaning up
            return hit
    checkpoint = store.checkpoint(cfg)
    if force:
        checkpoint.clear()
    result = train(cfg, progress, data_root, checkpoint)
    store.save(cfg, result, replace=force)
    checkpoint.clear()
    return result


def expand(base: RunConfig, grid: dict | list[dict]) -> list[RunConfig]:
    """Configs of the product of a dict of lists (a list of dicts: their union, in order), validated.

    Only lists are axes: tuple-valued fields (``hidden``, ``fraction_schedule``, ``domains``) are single values."""
    grids = [grid] if isinstance(grid, dict) else list(grid)
    out, seen = [], set()
    for g in grids:
        keys = list(g)
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
    jobs: int = 1,
    backend="local",
    address: str | None = None,
) -> pd.DataFrame:
    """Run every config of the grid (skipping stored ones); one summary row per config. ``jobs``, ``backend``,
    ``address``: where the runs train (``run_configs``)."""
    cfgs = expand(base, grid)  # validates every config before any training starts
    varied = ["algorithm", "seed"] + [k for g in ([grid] if isinstance(grid, dict) else grid) for k in g]
    return run_configs(cfgs, store, progress, data_root, varied, jobs=jobs, backend=backend, address=address)


def ray_backend(backend="local", address: str | None = None, jobs: int = 1):
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
    if jobs != 1:
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
    jobs: int = 1,
    backend="local",
    address: str | None = None,
) -> pd.DataFrame:
    """Run validated configs (skipping stored ones); one summary row per config, in the order given.

    ``jobs`` > 1 trains that many configs at a time, each in its own process with one thread: the runs
    are independent, and on a CPU several single-threaded small-model runs finish a grid sooner than one
    run using every core (on the 2-core machine, two grids side by side with torch's default two threads
    each trained pFedMe^+MCSA at 3.1 rounds/s, with one thread each at 8.7). Each run is stored as soon as
    it finishes, whichever process trained it. Runs stopped part-way (a snapshot in the store) go first.

    ``backend='ray'`` (or a ``ray_backend.RayBackend``) trains each config not stored as a task on the Ray cluster at
    ``address`` (else ``RAY_ADDRESS``; neither: a local Ray instance); the results come back to this process,
    which stores them (see ``fedlib.ray_backend``).
    """
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs={jobs!r} must be an integer >= 1")
    cluster = ray_backend(backend, address, jobs)
    store = store or Store()
    todo = [c for c in cfgs if not store.has(c)]
    for c in todo:  # every run that will train fits, before any trains
        resources.check(c)
    # runs that were stopped part-way first: they continue from their snapshot (see ``Store.checkpoint``)
    stopped = [c for c in todo if store.checkpoint(c).info() is not None]
    todo = stopped + [c for c in todo if c not in stopped]
    if cluster is not None:
        cluster.run(todo, store, progress, data_root)
    elif jobs > 1 and len(todo) > 1:
        _run_parallel(todo, store, jobs, progress, data_root)
    else:
        for cfg in stopped:
            run(cfg, store, progress=progress, data_root=data_root)
    bar = tqdm(cfgs, desc=f"grid ({len(todo)} to run, {len(cfgs) - len(todo)} stored)", disable=not progress)
    # columns: every field the grid varies (even where a value equals the default), then the summary
    rows = []
    for cfg in bar:
        res = run(cfg, store, progress=progress, data_root=data_root)
        rows.append({"key": cfg.key(), **cfg.changed(), **{k: cfg.get(k) for k in columns}, **res.summary()})
    return pd.DataFrame(rows)


_GROUP_BYTES: int | None = None  # this process's cache budget for client groups (None: the one-process default)


def _worker_setup(jobs: int, threads: int = 1) -> None:
    """Start of one of ``jobs`` worker processes training side by side: ``threads`` threads (one in the local pool;
    a Ray task's ``num_cpus``), and a share of the cache for the stacked executor's client groups (the processes
    share the L3; see ``StackedExecutor``)."""
    from .executors import PROCESS_CACHE_BYTES

    global _GROUP_BYTES
    torch.set_num_threads(threads)
    _GROUP_BYTES = PROCESS_CACHE_BYTES // jobs  # a value handed to each executor this process makes


def _pool_worker_setup(jobs: int) -> None:
    """``_worker_setup`` for a process of the local pool, which also follows its parent: Ctrl-C in the terminal
    reaches every process of the group, so an idle worker ignores it (the parent stops the grid) and a training one
    snapshots at the end of its round and stops (``simulation.DeferredInterrupt``); and it stops when its parent
    dies."""
    _worker_setup(jobs)
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


def _run_in_worker(cfg: RunConfig, root: str, data_root) -> None:
    run(cfg, Store(root), progress=False, data_root=data_root)


def _run_parallel(todo: list[RunConfig], store: Store, jobs: int, progress: bool, data_root) -> None:
    """Train ``todo`` in ``jobs`` fresh processes (spawned: no forked torch state). A failed (or interrupted)
    run raises once the runs already going have finished and been stored; the runs not started are dropped."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=min(jobs, len(todo)), mp_context=ctx, initializer=_pool_worker_setup, initargs=(jobs,)
    ) as pool:
        futures = {pool.submit(_run_in_worker, c, str(store.root), data_root): c for c in todo}
        bar = tqdm(as_completed(futures), total=len(futures), desc=f"training ({jobs} processes)", disable=not progress)
        try:
            for f in bar:
                c = futures[f]
                f.result()
                bar.set_postfix_str(f"{c.algorithm} {c.dataset}/{c.model} seed {c.seed}")
        except KeyboardInterrupt:
            for f in futures:  # runs not yet started are dropped; those running snapshot their last round and stop
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
            for f in futures:  # runs not yet started are dropped; those running finish and are stored
                f.cancel()
            raise


def results_frame(cfgs: list[RunConfig], store: Store | None = None) -> pd.DataFrame:
    """Per-round metrics of stored runs in one tidy frame, with the configs' changed fields as columns."""
    store = store or Store()
    frames = []
    for cfg, res in store.stored(cfgs):
        frames.append(
            res.metrics.assign(
                key=cfg.key(), **{k: str(v) if isinstance(v, tuple) else v for k, v in cfg.to_dict().items()}
            )
        )
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
