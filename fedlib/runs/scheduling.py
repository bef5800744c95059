"""How a grid's runs are cut into units and spread over processes: ``batches`` (runs that share data, model and
method train together as one model, cut for the processes' balance and the memory), ``default_jobs`` (one process per
core, within the memory), and the span of a plan from each run's estimated seconds.
"""

from __future__ import annotations

import torch

from fedlib.config.run import RunConfig
from fedlib.executors import hardware
from fedlib.models.registry import MODELS
from fedlib.runs import estimates, feasibility

# -- grids as one model (see ``fedlib.runs.batching``) -----------------------------------------------------------------
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
    return (cfg.data, cfg.model, cfg.dtype, cfg.resolved_device(), cfg.executor, cfg.method.NAME,
            loc.local_steps, loc.local_epochs, loc.batch_size)  # fmt: skip


def batches(
    cfgs: list[RunConfig], most: int = BATCH, jobs: int = 1, budget: float | None = None, cost: dict | None = None
) -> list[list[RunConfig]]:
    """``cfgs`` cut into units that train together (``batch_key``), in order of first appearance, each of at most
    ``most`` runs whose estimated memory (``feasibility.estimate``; the data once) fits in ``budget`` bytes (default:
    ``BATCH_MEMORY_SHARE`` of what this machine has available, shared by ``jobs`` processes; a Ray cluster passes
    its nodes' own) and of at most ``ceil(len(cfgs) / jobs)`` runs, so that the ``jobs`` processes share the work; a
    group cut into k units is cut into k of equal size (20 runs at most 16: 10 + 10, not 16 + 4). With ``jobs`` > 1
    a unit is cut further where that ends the grid sooner (``_balance``; ``cost``: each run's estimated seconds by
    key, ``estimates.seconds``, else its rounds)."""
    groups: dict = {}
    for i, c in enumerate(cfgs):
        k = batch_key(c) if most > 1 else None
        groups.setdefault(k if k is not None else ("alone", i), []).append(c)
    if budget is None:
        avail = hardware.available_bytes(cfgs[0].resolved_device()) if cfgs else None
        budget = None if avail is None else avail * BATCH_MEMORY_SHARE / jobs

    def cut(group: list, cap: int) -> list:
        out, unit, used = [], [], 0.0
        for c in group:
            est = feasibility.estimate(c)
            own = feasibility.run_bytes(est)  # the data is loaded once per unit
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
    """``units`` with a unit cut in two, in place, while that shortens the grid on ``jobs`` processes (``_span``, in
    estimated seconds with ``cost``, else in rounds): three batches of three runs on two processes, the third trained
    alone while the other process idles (AdaFL Tables 3-4 at the quick profile), become 2 + 1, 3, 3. A cut undoes some
    batching (on a GPU, its point), so it must shorten the span by ``BALANCE_GAIN`` at least. The order is kept (runs
    stopped part-way stay first)."""
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


def span_seconds(cfgs: list[RunConfig], jobs: int, known: dict, batch: int = BATCH) -> float:
    """Estimated wall seconds of ``run_configs(cfgs, jobs=jobs, batch=batch)``: the runs longest first, cut into
    units and balanced as it cuts them, each unit costing its runs' ``estimates.seconds`` (from ``known``,
    ``estimates.known_times``) and each process taking the next unit as it gets free. Batching's own gain is not counted
    (small on the CPU: the benchmark's W6x line); stored times are those of whichever version and machine made them."""
    order, cost = _longest_first(cfgs, known)
    return _span(batches(order, batch, jobs, cost=cost), jobs, cost)


def _longest_first(cfgs: list[RunConfig], known: dict, keep: int = 0) -> tuple[list[RunConfig], dict]:
    """``cfgs`` with all but the first ``keep`` (runs stopped part-way, which go first) sorted longest first, and
    each run's estimated seconds by key (``estimates.seconds`` from ``known``)."""
    cost = dict(zip((c.key() for c in cfgs), estimates.seconds(cfgs, known)))
    return cfgs[:keep] + sorted(cfgs[keep:], key=lambda c: -cost[c.key()]), cost


def default_jobs(cfgs: list[RunConfig], batch: int = BATCH) -> int:
    """The processes ``run_configs(jobs=None)`` trains the runs ``cfgs`` in: one per core this process may use
    (``hardware.cores``), no more than the units they make (``batches``), and no more than fit side by side in
    ``BATCH_MEMORY_SHARE`` of the memory available (each process loads its own data: the largest run's
    ``feasibility.estimate`` each). On CUDA, also no more than 1 / ``DEFAULT_GPU_SHARE`` processes per GPU, the
    share a run gets on a Ray cluster (the batches, which merge runs' kernel launches, shrink as processes are
    added). On a CPU, single-threaded processes side by side finish a grid of small models sooner than one process
    with a thread per core, with the same numbers: torch's threads spin on small matmuls (measured:
    docs/measurements/)."""
    from fedlib.runs.scheduling import DEFAULT_GPU_SHARE

    if not cfgs:
        return 1
    device = cfgs[0].resolved_device()
    cores = hardware.cores()
    if device == "cuda":
        cores = min(cores, round(torch.cuda.device_count() / DEFAULT_GPU_SHARE))
    cores = max(1, cores)
    jobs = min(cores, len(batches(cfgs, batch, cores)))
    avail = hardware.available_bytes(device)
    if avail is not None:
        largest = max(sum(feasibility.estimate(c).values()) for c in cfgs)
        jobs = min(jobs, int(avail * BATCH_MEMORY_SHARE // largest))
    return max(1, jobs)


WORKER_BYTES = 400 * 2**20  # a worker process's own memory before its run: Python, torch, fedlib (measured: 320 MB)


def unit_bytes(unit: list[RunConfig]) -> float:
    """A unit's estimated peak (``feasibility.estimate``): its runs' own parts, and its data once."""
    ests = [feasibility.estimate(c) for c in unit]
    return max(e["data"] for e in ests) + sum(feasibility.run_bytes(e) for e in ests)


def side_by_side(units: list[list[RunConfig]], jobs: int) -> float:
    """Bytes ``jobs`` worker processes may hold at once: the ``jobs`` largest units (``unit_bytes``; any of them
    may train at the same time) and each process's own ``WORKER_BYTES``."""
    sizes = sorted((unit_bytes(u) for u in units), reverse=True)[:jobs]
    return sum(sizes) + len(sizes) * WORKER_BYTES


def check_side_by_side(units: list[list[RunConfig]], jobs: int, explicit: bool = True) -> int:
    """The ``jobs`` that trains ``units`` within the memory available: ``jobs`` itself when the ``jobs`` largest
    units fit side by side (``side_by_side``); else, for a ``jobs`` the user chose (``explicit``), a ValueError
    naming it, the need and the most that fit, raised before any run trains (each run was checked alone, and
    ``--jobs 4`` of runs of 5 GB each on 16 GB would otherwise be refused by nothing and fail, or swap, as they
    started); for a chosen one (``jobs=None``, ``default_jobs``), the most that fit."""
    avail = hardware.available_bytes(units[0][0].resolved_device()) if units and units[0] else None
    if avail is None or jobs <= 1 or side_by_side(units, jobs) <= avail:
        return jobs
    fits = max([k for k in range(1, jobs) if side_by_side(units, k) <= avail], default=1)
    if not explicit:
        return fits
    mb = 2**20
    sizes = sorted((unit_bytes(u) for u in units), reverse=True)[:jobs]
    raise feasibility.TooLarge(
        f"jobs={jobs}: the {len(sizes)} largest units of runs that would train side by side need about "
        f"{side_by_side(units, jobs) / mb:,.0f} MB together ({', '.join(f'{b / mb:,.0f}' for b in sizes)} MB, and "
        f"{WORKER_BYTES / mb:.0f} MB for each worker process), more than the {avail / mb:,.0f} MB available; each "
        f"fits alone: use jobs={fits} (--jobs {fits}), or fewer runs per unit (batch=, --batch)"
    )


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


DEFAULT_GPU_SHARE = 0.25  # a GPU's share a run gets on a cluster with GPUs: the paper's models are small
