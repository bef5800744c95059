"""Memory a run will need, estimated from its config before anything is allocated, and refused when it cannot fit;
and the time it will take, estimated from the stored runs of its kind (``stored_times``, ``seconds``).

A config such as ``n_clients=10**9``, ``hidden=(10**6,)`` or ``batch_size=10**7`` passes every per-field check and
then fills the machine (21 of 23 GB) or hangs while generating data. ``check(cfg)`` estimates the run's peak memory
from the config alone and raises a ``ValueError`` with the estimate, its parts and the limit when it exceeds what is
available. The estimate counts what the engine holds (``fedlib.simulation.State``: every client's model and the last
one the server sent, plus the global model and a method's own state), what local training holds at once (the
trainers' parameters, gradients, optimiser state and start points, and their activations for a batch), and the data
set's tensors, and what the run records as it goes (``records``: per round, who uploaded; per evaluated round, every
client's accuracy and loss; AdaFL's scores; the attention trace, capped at ``ATTENTION_TRACE_BYTES``). It is meant
to catch orders of magnitude, not to predict to the megabyte: it errs high by design (factors below), and only the
runs about to train are checked (a stored result is read on any machine).
"""

from __future__ import annotations

import functools
import json
import math
import os
import statistics
from pathlib import Path

import torch

from .models import MODELS

# (input shape, samples in the whole data set) per data set; Synthetic is generated per client (sizes below)
DATA = {
    "mnist": ((1, 28, 28), 70_000),
    "fmnist": ((1, 28, 28), 70_000),
    "cifar10": ((3, 32, 32), 60_000),
    "digits": ((3, 28, 28), 5 * 80_000),  # MNIST, SVHN, USPS, SynthDigits, MNIST-M (at most, before domain_percent)
    "office31": ((3, 224, 224), 4_110),
    "officehome": ((3, 224, 224), 15_588),
    "domainnet": ((3, 224, 224), 6 * 100_000),
}
SYNTHETIC_SHAPE = (60,)
SYNTHETIC_MEAN_SIZE = 2_300  # E[(floor(LogNormal(4, 2)) + 50) * 5] ~ (e^6 + 50) * 5 (fedlib.data.synthetic)
SYNTHETIC_MAX_SIZE = 30_000  # a bound on one client's size there (pFedMe's data set: 250 to 25,810)

STATE_COPIES = 3  # client models, the models the server sent, and a method's per-client state (pFedMe, SCAFFOLD)
TRAIN_COPIES = 4  # per trainer: parameters, gradients, momentum, the start point (anchor)
ACTIVATION_COPIES = 3  # forward outputs kept for backward, their gradients, workspace
ROW_BYTES = 2048  # one evaluated round's metrics row: a dict of ~17 Python numbers (fedlib.simulation.Evaluation)
# the attention trace's cap (``fedlib.simulation.AttentionTrace``: windows x (layers + 1) x N x N float64); above it
# the run keeps none (FedMCSA with 5,000 clients would hold 2 GB a layer and store 1 GB a layer)
ATTENTION_TRACE_BYTES = 256 << 20


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1024 or unit == "PB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} PB"


@functools.lru_cache(maxsize=64)
def model_size(name: str, hidden: tuple | None, attention: str, input_shape: tuple, n_classes: int) -> tuple[int, int]:
    """(parameters and buffers, activations per sample) of a model. Parameters are counted on the meta device
    (nothing allocated, whatever the widths); activations from the widths for Linear chains, and for conv nets
    from one real forward pass of the model at its default widths (a forward on the meta device would import
    torch's compiler stack: seconds per process)."""
    spec = MODELS[name]
    kw = {"attention": attention} if spec.attention_slots else {}
    widths = hidden if hidden is not None else spec.default_hidden
    with torch.device("meta"):
        params = sum(t.numel() for t in spec.build(input_shape, n_classes, widths, **kw).state_dict().values())
    if spec.kernel == "chain":
        return params, math.prod(input_shape) * 2 + 2 * sum(widths) + n_classes  # input, flatten, pre/post ReLU
    return params, math.prod(input_shape) + sum(widths) + _conv_activations(name, attention, input_shape, n_classes)


@functools.lru_cache(maxsize=16)
def _conv_activations(name: str, attention: str, input_shape: tuple, n_classes: int) -> int:
    spec = MODELS[name]
    kw = {"attention": attention} if spec.attention_slots else {}
    model = spec.build(input_shape, n_classes, spec.default_hidden, **kw).eval()
    acts = [0]

    def count(module, inputs, output):
        if isinstance(output, torch.Tensor) and not list(module.children()):
            acts[0] += output.numel()

    hooks = [m.register_forward_hook(count) for m in model.modules()]
    with torch.no_grad():
        model(torch.zeros(1, *input_shape))
    for h in hooks:
        h.remove()
    return acts[0]


def estimate(cfg) -> dict[str, float]:
    """Bytes the run of ``cfg`` holds at its peak, by part: 'clients', 'training', 'data'."""
    d, m = cfg.data, cfg.model
    b = 8 if cfg.dtype == "float64" else 4
    if d.dataset == "synthetic":
        shape, samples = SYNTHETIC_SHAPE, d.n_clients * SYNTHETIC_MEAN_SIZE
    else:
        shape, samples = DATA[d.dataset]
    params, acts = model_size(m.name, m.hidden, m.attention, shape, 10)  # class count: a rounding error here
    n = d.n_clients
    s = cfg.selection
    trainers = n if not cfg.method.SELECTS else min(n, s.clients_per_round or math.ceil((s.fraction or 1.0) * n))
    return {
        "clients": n * params * b * STATE_COPIES,
        "training": trainers * (params * TRAIN_COPIES + cfg.local.batch_size * acts * ACTIVATION_COPIES) * b,
        "data": samples * math.prod(shape) * b,
        "records": records(cfg),
    }


def records(cfg) -> float:
    """Bytes of what ``fedlib.simulation.simulate`` records over the run: 'selected' (rounds x N, bool); per evaluated
    round (every ``eval_every`` and the last) every client's accuracy and loss (float64, kept in lists and then copied
    into arrays: 4 x 8 bytes a client) and the metrics row; AdaFL's selection scores (rounds x N float64, list and
    array); the attention trace, as if every method kept one of a model of 7 parameter tensors, up to its cap
    (N = 100: 5.6 MB). ``rounds=10**9`` once passed every check and then failed allocating 93 GB for 'selected'."""
    n, rounds = cfg.data.n_clients, cfg.rounds
    evaluated = -(-rounds // cfg.eval_every) + 1
    total = rounds * n + evaluated * (4 * 8 * n + ROW_BYTES)
    if cfg.selection.rule == "attention":
        total += 2 * 8 * rounds * n
    return total + min(ATTENTION_TRACE_BYTES, 10 * (7 + 1) * 8 * n * n)


def run_bytes(est: dict) -> float:
    """The part of ``estimate`` each run of a unit holds on its own: all but the data, which the unit loads once."""
    return sum(v for k, v in est.items() if k != "data")


def available_bytes(device: str = "cpu") -> int | None:
    """What a run may use: free GPU memory on CUDA, else MemAvailable (Linux) or physical memory; None if unknown."""
    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.mem_get_info()[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def cores(cgroup: str = "/sys/fs/cgroup") -> int:
    """The CPUs this process may keep busy: the cores it may run on (``os.sched_getaffinity``), fewer where a cgroup
    quota caps its CPU time (a container started with ``--cpus 2`` on a 64-core host sees 64 cores; cgroup v2
    ``cpu.max``, v1 ``cpu/cpu.cfs_quota_us``), rounded up; at least 1."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    for quota_file, period_file in (("cpu.max", None), ("cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us")):
        try:
            fields = Path(cgroup, quota_file).read_text().split()
            if period_file is not None:
                fields.append(Path(cgroup, period_file).read_text().strip())
            quota, period = float(fields[0]), float(fields[1])  # "max 100000" (no quota) fails here
        except (OSError, ValueError, IndexError):
            continue
        if quota > 0 and period > 0:
            n = min(n, math.ceil(quota / period))
    return max(1, n)


def check(cfg, limit: int | None = None) -> dict[str, float]:
    """Raise ``ValueError`` when ``cfg``'s estimated peak memory exceeds ``limit`` (default: ``available_bytes``);
    returns the estimate. The data set must also hold at least one sample per client."""
    d = cfg.data
    if d.dataset != "synthetic" and d.dataset in DATA and d.n_clients > DATA[d.dataset][1]:
        raise ValueError(
            f"RunConfig.n_clients={d.n_clients} exceeds the {DATA[d.dataset][1]} samples of dataset={d.dataset!r}"
        )
    most = d.n_clients * SYNTHETIC_MAX_SIZE if d.dataset == "synthetic" else DATA.get(d.dataset, (0, math.inf))[1]
    if cfg.local.batch_size > most:
        raise ValueError(
            f"RunConfig.batch_size={cfg.local.batch_size} exceeds the {most} samples dataset={d.dataset!r} can have "
            f"(n_clients={d.n_clients}): a batch is drawn from one client's data"
        )
    parts = estimate(cfg)
    limit = limit if limit is not None else available_bytes(cfg.resolved_device())
    total = sum(parts.values())
    if limit is not None and total > limit:
        detail = ", ".join(f"{k} {_bytes(v)}" for k, v in parts.items())
        raise ValueError(
            f"RunConfig: this run would need about {_bytes(total)} of memory ({detail}), more than the "
            f"{_bytes(limit)} available; lower n_clients, the model's hidden widths, batch_size, "
            "clients_per_round or rounds"
        )
    return parts


KIND_FIELDS = ("dataset", "model", "algorithm", "attention", "n_clients")


def _kind(cfg) -> tuple:  # a RunConfig or a stored run's flat config.json: both have .get
    return tuple(cfg.get(k) for k in KIND_FIELDS)


def run_seconds(meta: dict) -> float:
    """A stored run's own wall seconds from its ``meta.json``: ``wall_seconds``, over ``batched`` where it trained
    as one model with others (``runner.train_together``: each of the batch's runs stores the batch's time)."""
    return float(meta["wall_seconds"]) / int(meta.get("batched", 1))


def stored_times(*roots) -> dict[tuple, float]:
    """Median wall seconds a round of the runs stored under ``roots`` (store folders), per kind of run
    (``KIND_FIELDS``): a run's time over its rounds, so that a kind's runs at every profile count, and one run timed
    on a busy machine does not decide (the committed store's one quick-profile LeNet-BN run took 10 s a round, its
    24 paper-profile runs 0.5-2.9 s). Reads each run's ``config.json`` and ``meta.json`` as JSON only; a damaged run
    is skipped. A run trained as one model in a batch of n (``runner.train_together``; ``meta["batched"]``) stores
    the batch's time: it counts its share, that time over n. On the CPU, where batching gains ~1.2x (the
    benchmark's W6x), the share is near a solo run's time, and the batch's time n times it: the quick profile's
    164 runs stored 8,382 s of wall time, 4,275 s in shares, and took ~4,400 s of two processes' time (2026-11-25)."""
    times: dict = {}
    folders = dict.fromkeys(Path(r).resolve() for r in roots if r is not None)  # a root given twice counts once
    for d in (d for r in folders if r.is_dir() for d in r.iterdir()):
        try:
            cfg, meta = json.loads((d / "config.json").read_text()), json.loads((d / "meta.json").read_text())
            wall, rounds = run_seconds(meta), int(cfg["rounds"])
        except (OSError, ValueError, TypeError, KeyError, AttributeError, ZeroDivisionError):
            continue
        if wall > 0 and rounds > 0:
            times.setdefault(_kind(cfg), []).append(wall / rounds)
    return {k: statistics.median(v) for k, v in times.items()}


def seconds_for(cfg, known: dict) -> float | None:
    """Estimated wall seconds of one run: its rounds times the median seconds a round of its kind stored
    (``stored_times``), else of the same data set, model, algorithm and attention at the nearest client count,
    scaled by clients; None: no such run stored."""
    *same, n = _kind(cfg)
    if (*same, n) in known:
        return cfg.get("rounds") * known[(*same, n)]
    near = [(k[-1], v) for k, v in known.items() if list(k[:-1]) == same and k[-1]]
    if not near or not n:
        return None
    n_near, per_round = min(near, key=lambda kv: abs(kv[0] - n))
    return cfg.get("rounds") * per_round * n / n_near


def seconds(cfgs: list, known: dict) -> list[float]:
    """``seconds_for`` of each config; a kind not stored gets its rounds times the median seconds a round of the
    kinds stored (one second a round when none is). What a round costs varies 100-fold across fedlib's kinds (a
    Synthetic DNN round 0.02 s, a LeNet-BN digits round 0.5-2.9 s, an AdaFL MNIST MLP round 1.8 s: the committed
    store, 2026-11-25), so a grid's rounds alone say little about its time: ``runner`` orders, balances and draws
    the progress of a grid on several processes by these. They are relative: stored times come from whichever
    version and machine trained them."""
    fallback = statistics.median(known.values()) if known else 1.0
    out = []
    for c in cfgs:
        est = seconds_for(c, known)
        out.append(est if est is not None else c.get("rounds") * fallback)
    return out
