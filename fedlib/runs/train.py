"""Train one config: ``train`` (a pure function of the config, no store) wires data, model, method, executor and
callbacks into ``simulate``; ``run`` returns the stored result when there is one, else trains and stores it;
``train_together`` and ``train_unit`` train several configs as one model (``fedlib.runs.batching``).
"""

from __future__ import annotations

import contextlib
import platform
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from fedlib.algorithms import build_algorithm
from fedlib.config.run import RunConfig
from fedlib.core.callbacks import Callback, Evaluation, OnRound, ProgressBar
from fedlib.core.failures import Failures
from fedlib.core.simulation import simulate
from fedlib.core.state import RunResult, Schedule
from fedlib.data import load_federated
from fedlib.executors import make_executor
from fedlib.executors.graphs import graphs_from_env
from fedlib.executors.hardware import cpu_name
from fedlib.models.local_attention import per_client_attention
from fedlib.models.registry import build_model
from fedlib.runs import feasibility, openmp, worker
from fedlib.runs import threads as threads_module
from fedlib.runs.checkpoint import Checkpoint, Checkpointing, DeferredInterrupt, StopOnRequest, git_commit
from fedlib.runs.malloc import keep_freed_memory
from fedlib.runs.malloc import mode as malloc_mode
from fedlib.runs.results import RunResults
from fedlib.runs.store import Store


def _meta(cfg: RunConfig, device: str, seconds: float, executor: str) -> dict:
    import numpy

    import fedlib

    commit = git_commit()
    dev = torch.cuda.get_device_name() if device == "cuda" else cpu_name()
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


@contextlib.contextmanager
def run_callbacks(
    rounds: int,
    *,
    checkpoint: Checkpoint | None = None,
    stop=None,
    on_round=None,
    eval_every: int = 1,
    eval_train: bool = False,
    finetune_epochs: int = 1,
    progress: bool = True,
    desc: str = "",
    extra: Sequence[Callback] = (),
) -> Iterator[list[Callback]]:
    """The callbacks ``train`` hands ``simulate``, in their order: the caller's ``on_round(t, selected, mixing,
    state)``, the evaluation (every ``eval_every`` rounds and the last; ``eval_train``: on the training data too;
    ``finetune_epochs``: a new client's, ``new_client_finetune_epochs``), the
    progress bar, ``extra``, snapshots and resuming (``checkpoint``: after the callbacks whose round it saves), and
    last Ctrl-C: within the block a first Ctrl-C finishes the round, snapshots it and stops (``DeferredInterrupt``);
    ``stop``: a flag of the caller's instead (a batched run's, whose Ctrl-C the main thread takes)."""
    saver, evaluation = Checkpointing(checkpoint), Evaluation(eval_every, eval_train, finetune_epochs)
    with DeferredInterrupt() if stop is None else contextlib.nullcontext(stop) as flag:
        yield [OnRound(on_round), evaluation, ProgressBar(rounds, desc, progress, evaluation), *extra, saver,
               StopOnRequest(flag, saver)]  # fmt: skip


def train(
    cfg: RunConfig,
    progress: bool = True,
    data_root=None,
    checkpoint: Checkpoint | None = None,
    device: str | None = None,
    *,
    together=None,
    callbacks: Sequence[Callback] = (),
    threads: int | None = None,
) -> RunResult:
    """Train ``cfg`` from scratch (no store): the pure function behind ``run``; with a ``checkpoint``, continue
    from its snapshot if there is one (same result) and snapshot while training. ``device``: where a ``device='auto'``
    config trains (default: ``cfg.resolved_device()``; a Ray task passes the device its resources hold).
    ``together``: a ``_Together`` when the run trains batched with others (``train_together``): their shared data,
    the run's gang executor, the stop flag and the batch's progress. ``callbacks``: more for ``simulate`` (after the
    evaluation and progress bar; e.g. the benchmark's stage timer). ``threads``: torch's thread count on a CPU (None:
    ``OMP_NUM_THREADS`` if set, else the cores other processes leave free, rechecked while training:
    ``fedlib.runs.threads``); the run's metadata records it."""
    threads_module.check(threads)
    since = threads_module.sample()  # the free cores are measured over the set-up below, not over a wait
    cfg.validate()
    feasibility.check(cfg)  # refuse a run that cannot fit before loading its data
    device = device if device is not None and cfg.device == "auto" else cfg.resolved_device()
    if device == "cpu":
        keep_freed_memory()  # each round's large stacked tensors reuse freed memory (see fedlib.runs.malloc)
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
        together.executor
        if together is not None
        else make_executor(cfg.executor, model, group_bytes=worker.group_bytes)
    )
    t0 = time.perf_counter()
    tick = together.tick if together is not None else worker.rounds.tick if worker.rounds is not None else None
    loc, sel = cfg.local, cfg.selection
    failures = Failures(sel.dropout, sel.stragglers, sel.straggler_work)
    schedule = Schedule(loc.local_steps, loc.local_epochs, loc.batch_size, loc.lr_decay, failures)
    with threads_module.computing(threads, device, since) as chosen:
        watch = [threads_module.LoadWatch()] if chosen["threads_by"] == "fedlib" and together is None else []
        with run_callbacks(cfg.rounds, checkpoint=checkpoint, stop=together.stop if together is not None else None,
                           on_round=tick, eval_every=cfg.eval_every, eval_train=cfg.eval_train, progress=progress,
                           finetune_epochs=cfg.data.new_client_finetune_epochs,
                           desc=f"{cfg.method.NAME} {cfg.data.dataset}/{m.name}", extra=[*callbacks, *watch]) as cbs:  # fmt: skip
            result = simulate(algorithm, data, model, executor, schedule, rounds=cfg.rounds, seed=cfg.seed,
                              callbacks=cbs, client_init=client_init)  # fmt: skip
    resumed, simulated = result.meta.get("resumed", []), dict(result.meta)  # simulate's meta
    before = resumed[-1]["elapsed"] if resumed else 0.0  # wall time of the interrupted part(s)
    result.meta = _meta(cfg, device, time.perf_counter() - t0 + before, executor.name)
    if together is None:  # a batched run's thread computes on one thread; ``openmp.threads`` reports the batch's
        result.meta["threads"] = chosen["threads"]  # the count at the start (the block has ended: torch's is back)
    result.meta["threads_by"] = chosen["threads_by"]
    if "threads_seen" in simulated:  # the counts LoadWatch set while the run trained
        result.meta["threads_seen"] = simulated["threads_seen"]
    if resumed:
        result.meta["resumed"] = resumed
    if together is not None:  # trained as one model with others (wall_seconds: the batch's, shared)
        result.meta["batched"] = together.runs
    if "failures" in simulated:  # the selected clients that failed, in total (core.callbacks.FailureTrace)
        result.meta["failures"] = simulated["failures"]
    if "attention_trace" in simulated:  # why the run keeps no attention trace (core.callbacks.AttentionTrace)
        result.meta["attention_trace"] = simulated["attention_trace"]
    if data.new_ids:  # the clients new_client_frac held out (fedlib.data.holdout), by their index in the data set
        result.meta["new_clients"] = list(data.new_ids)
    if "diverged_at" in simulated:
        result.meta["diverged_at"] = simulated["diverged_at"]
        warnings.warn(
            f"{cfg.label()}: diverged at round {simulated['diverged_at']} (a NaN or inf model); the run stopped there"
        )
    result.config = cfg
    return result


def configs_arg(cfgs, name: str = "cfgs") -> list[RunConfig]:
    """``cfgs`` as a list of RunConfigs; anything else a TypeError naming ``name`` (rather than an AttributeError
    deep inside, which a dict or a list of ints would reach)."""
    if isinstance(cfgs, (str, bytes, dict, RunConfig)) or not hasattr(cfgs, "__iter__"):
        raise TypeError(f"{name} must be a list of RunConfig, got {type(cfgs).__name__}")
    return [config_arg(c, f"{name}[{i}]") for i, c in enumerate(cfgs)]


def config_arg(cfg, name: str = "cfg") -> RunConfig:
    """``cfg`` if it is a RunConfig, else a TypeError naming ``name`` (a dict would reach "'dict' object has no
    attribute 'validate'")."""
    if not isinstance(cfg, RunConfig):
        raise TypeError(f"{name} must be a RunConfig (RunConfig.of(...)), got {type(cfg).__name__}: {cfg!r:.60}")
    return cfg


def run(
    cfg: RunConfig,
    store: Store | None = None,
    progress: bool = True,
    force: bool = False,
    data_root=None,
    threads: int | None = None,
) -> RunResults:
    """The stored result of ``cfg``, training and storing it first if needed (``force`` retrains from scratch), as a
    ``RunResults``: the ``RunResult`` (``metrics``, ``summary()``, ...) that is also a ``Results`` (``frame``,
    ``plot()``). Training snapshots itself every few minutes (``Store.checkpoint``): an interrupted run continues
    from there. ``threads``: as ``train``'s."""
    threads_module.check(threads)
    config_arg(cfg).validate()
    store = Store.of(store)
    malloc_mode()  # a bad FEDLIB_MALLOC is an error here, not when training starts
    graphs_from_env()  # so is a bad FEDLIB_CUDA_GRAPHS
    if not force:
        hit = store.load(cfg)
        if hit is not None:
            store.checkpoint(cfg).clear()  # a snapshot left by a stop between storing and cleaning up
            return RunResults.of(hit, cfg)
    store.ready()
    checkpoint = store.checkpoint(cfg)
    if force:
        checkpoint.clear()
    result = train(cfg, progress, data_root, checkpoint, threads=threads)
    store.save(cfg, result, replace=force)
    checkpoint.clear()
    return RunResults.of(result, cfg)


@dataclass
class _Together:
    """What a run trained in a batch gets from ``train_together``."""

    data: object
    executor: object
    stop: object
    runs: int
    tick: object


def train_together(cfgs: list[RunConfig], store: Store, progress: bool = True, data_root=None) -> None:
    """Train ``cfgs`` (one unit of ``batches``) as one model (``fedlib.runs.batching``), storing each run as soon as it
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
    from fedlib.runs.batching import run_together

    first = cfgs[0]
    for c in cfgs:
        c.validate()
        feasibility.check(c)
    device = device if device is not None and first.device == "auto" else first.resolved_device()
    if device == "cpu":
        keep_freed_memory()
    data = load_federated(first, data_root).to(device, getattr(torch, first.dtype))
    model = build_model(first.model.name, data.input_shape, data.n_classes, first.model.hidden, seed=first.seed,
                        dtype=getattr(torch, first.dtype), attention=first.model.attention).to(device)  # fmt: skip
    executor = make_executor(first.executor, model, group_bytes=worker.group_bytes)
    bar = tqdm(total=sum(c.rounds for c in cfgs), desc=f"{len(cfgs)} runs as one model", disable=not progress)
    lock = threading.Lock()

    def tick(*_):
        with lock:
            bar.update(1)
        if worker.rounds is not None:
            worker.rounds.tick()

    def job(cfg):
        def fn(member, stop):
            together = _Together(data, member, stop, len(cfgs), tick)
            result = train(cfg, False, data_root, checkpoint(cfg), device, together=together)
            done(cfg, result)
            return result

        return fn

    with threads_module.computing(device=device):  # the merged arithmetic's threads (each run's own compute with one)
        outcomes, _ = run_together([job(c) for c in cfgs], executor)
    bar.close()
    return outcomes
