"""How long runs will take, before they train: the seconds a round of each kind of run (``KIND_FIELDS``) from the
stored runs of that kind and from this version's reference timings (``round_seconds.json``, written by
``scripts/reference_timings.py``), layered by ``known_times``; ``seconds`` gives each config its estimate.
"""

from __future__ import annotations

import json
import math
import statistics
import warnings
from pathlib import Path

from fedlib.config.run import auto_device
from fedlib.runs import estimates
from fedlib.runs.store import Store, committed_root


def known_times(store: Store, device: str | None = None) -> dict:
    """Seconds a round per kind of run (``stored_times``), what the runs to train are estimated from (``seconds``;
    ``scripts/run_notebooks.py``'s plan too), for runs training on ``device`` (None: this machine's, as
    ``device="auto"`` resolves). Each source overrides the ones before it, for the kinds it holds: the checkout's
    committed store (runs timed on any device, then on ``device``), ``store`` (any device), this version's reference
    timings (``reference_times``: the quick profile on a 2-core CPU), and last ``store``'s runs on ``device``, since
    they were timed on this machine, most likely by this version. That order is the estimates' accuracy: a grid's
    time (``scheduling.span_seconds``) is foretold best from the user's own store and worst from the committed
    store's times alone, which older versions on other machines took (measured: docs/measurements/)."""
    device = auto_device() if device is None else device
    committed, mine = estimates.timed_runs(committed_root()), estimates.timed_runs(store.root)  # each read once
    return {
        **estimates.median_times(committed),
        **estimates.median_times(mine),
        **estimates.median_times(committed, device),
        **estimates.reference_times(device),
        **estimates.median_times(mine, device),
    }


# what a round costs depends on these (n_clients last: ``seconds_for`` scales by it). domain_percent, the share of
# each domain a client holds: a round at 100% costs several times one at 10% (None; FedBN's digits runs); the local
# epochs or steps: AdaFL's MNIST SCAFFOLD rows cost several times as much a round at E = 5 (the paper profile) as
# at E = 1 (the quick one)
KIND_FIELDS = (
    "dataset",
    "model",
    "algorithm",
    "attention",
    "domain_percent",
    "local_epochs",
    "local_steps",
    "n_clients",
)


def _kind(cfg) -> tuple:  # a RunConfig or a stored run's flat config.json: both have .get
    return tuple(cfg.get(k) for k in KIND_FIELDS)


def run_seconds(meta: dict) -> float:
    """A stored run's own wall seconds from its ``meta.json``: ``wall_seconds``, over ``batched`` where it trained
    as one model with others (``fedlib.runs.train.train_together``: each of the batch's runs stores the batch's
    time)."""
    return float(meta["wall_seconds"]) / int(meta.get("batched", 1))


def stored_times(*roots, device: str | None = None) -> dict[tuple, float]:
    """Median wall seconds a round of the runs stored under ``roots`` (store folders), per kind of run
    (``KIND_FIELDS``): a run's time over its rounds, so that a kind's runs at every profile count, and one run timed
    on a busy machine does not decide (the median outvotes it). Reads each run's ``config.json`` and ``meta.json``
    as JSON only; a damaged run is skipped. A run trained as one model in a batch of n
    (``fedlib.runs.train.train_together``; ``meta["batched"]``) stores the batch's time: it counts its share, that
    time over n. On the CPU, where batching gains little (the benchmark's W6x line), the share is near a solo run's
    time and the batch's time n times it: the shares, not the stored times, add up to what the grid took.
    ``device`` ("cpu", "cuda"): only the runs that trained there (``meta["device"]``): the committed store holds
    GPU runs too, whose rounds are several times shorter than the CPU's. (``timed_runs`` and ``median_times``: the
    same in two steps, for a caller that wants several devices' medians from one read.)"""
    return median_times(timed_runs(*roots), device)


def timed_runs(*roots) -> list[tuple[tuple, dict, float]]:
    """(kind, meta, seconds a round) of every run stored under ``roots`` that says how long it took
    (``stored_times``)."""
    out = []
    folders = dict.fromkeys(Path(r).resolve() for r in roots if r is not None)  # a root given twice counts once
    for d in (d for r in folders if r.is_dir() for d in r.iterdir()):
        try:
            cfg, meta = json.loads((d / "config.json").read_text()), json.loads((d / "meta.json").read_text())
            wall, rounds = run_seconds(meta), int(cfg["rounds"])
            kind = _kind(cfg)
        except (OSError, ValueError, TypeError, KeyError, AttributeError, ZeroDivisionError):
            continue
        if wall > 0 and rounds > 0:
            out.append((kind, meta, wall / rounds))
    return out


def median_times(runs: list[tuple[tuple, dict, float]], device: str | None = None) -> dict[tuple, float]:
    """Per kind, the median seconds a round of ``timed_runs``' ``runs`` (``device``: of those that trained there)."""
    times: dict = {}
    for kind, meta, seconds in runs:
        if device is None or meta.get("device") == device:
            times.setdefault(kind, []).append(seconds)
    return {k: statistics.median(v) for k, v in times.items()}


REFERENCE_TIMES = Path(__file__).with_name("round_seconds.json")


def reference_times(device: str, path: Path | None = None) -> dict[tuple, float]:
    """This version's seconds a round per kind of run (``KIND_FIELDS``) on the reference machine, for ``device``
    (only "cpu" is recorded: a 2-core CPU, the one docs/measurements/ describes), read as JSON from ``path``
    (``scripts/reference_timings.py`` writes it from a store the quick profile filled from empty). What a run's time is
    estimated from where the user's own store holds no run of its kind (``known_times``): the committed store's runs
    were trained by older versions, several times slower a round for some kinds (Synthetic, AdaFL's MNIST MLP), so that
    a plan from them alone (``scripts/run_notebooks.py --plan``) would foretell about twice the quick profile's time. A
    damaged file is skipped with a warning (an estimate is not worth stopping a job for); {} for another device."""
    path = REFERENCE_TIMES if path is None else Path(path)
    try:
        doc = json.loads(path.read_text())
        if doc.get("device") != device:
            return {}
        out = {}
        for row in doc["seconds_a_round"]:
            seconds = float(row["seconds"])
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"seconds={row['seconds']!r}")
            out[_kind(row)] = seconds
        return out
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        warnings.warn(f"{path}: not a table of seconds a round ({e!r}); estimating without it", stacklevel=2)
        return {}


def write_reference_times(root, path: Path | None = None) -> dict:
    """Write ``reference_times``' file (``path``, default the package's) from the CPU runs stored under ``root``
    (their ``stored_times``), with where and by what they were timed (CPUs, commits, threads, the last finish);
    returns what it wrote. ``scripts/reference_timings.py`` is its command line."""
    runs = [r for r in timed_runs(root) if r[1].get("device") == "cpu"]
    metas = [meta for _, meta, _ in runs]
    seen = lambda field: sorted({str(m.get(field)) for m in metas})
    times = median_times(runs)
    doc = {
        "about": "seconds a round per kind of run, this version on the reference machine (fedlib.runs.feasibility."
        "reference_times); written by scripts/reference_timings.py from a store the quick profile filled from empty",
        "device": "cpu",
        "cpus": seen("device_name"),
        "commits": seen("git_commit"),
        "threads": seen("threads"),
        "runs": len(metas),
        "last_finished": max((str(m.get("finished", "")) for m in metas), default=""),
        "seconds_a_round": [
            {**dict(zip(KIND_FIELDS, k)), "seconds": round(v, 6)} for k, v in sorted(times.items(), key=str)
        ],
    }
    head, rows = json.dumps({k: v for k, v in doc.items() if k != "seconds_a_round"}, indent=1), doc["seconds_a_round"]
    body = ",\n".join(f"  {json.dumps(r)}" for r in rows)  # a kind a line
    path = REFERENCE_TIMES if path is None else Path(path)
    path.write_text(f'{head[:-2]},\n "seconds_a_round": [\n{body}\n ]\n}}\n')
    return doc


def seconds_for(cfg, known: dict) -> float | None:
    """Estimated wall seconds of one run: its rounds times the median seconds a round of its kind stored
    (``stored_times``, ``reference_times``), else of the kind that differs in its client count alone, the nearest,
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
    kinds stored (one second a round when none is). What a round costs varies a hundredfold across fedlib's kinds
    (a Synthetic DNN round against a LeNet-BN digits round or an AdaFL MNIST MLP round), so a grid's rounds alone
    say little about its time: ``grids.run_configs``, ``scheduling`` and ``pool`` order, balance and draw the
    progress of a grid on several processes by these. They are relative: stored times come from whichever
    version and machine trained them."""
    fallback = statistics.median(known.values()) if known else 1.0
    out = []
    for c in cfgs:
        est = seconds_for(c, known)
        out.append(est if est is not None else c.get("rounds") * fallback)
    return out
