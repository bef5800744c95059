"""The memory estimate (``fedlib.runs.feasibility.estimate``) errs high: each case trains in a fresh process, whose
peak resident memory above what the interpreter held once fedlib and torch were imported (``ru_maxrss``) must not
exceed the estimate, nor lie below a third of it (an estimate that high would refuse runs that fit). The cases span
what the estimate counts: a data-bound run (many Synthetic clients: 4,000 of them once peaked at 2.9x the estimate,
which counted one copy of the data where loading holds three), per-client state (a wide model: FedAvg, HeurFedAMP's
attention over all clients, Ditto's personal models in float64) and the image path (MNIST's MLP). And ``run_grid``
with ``jobs=N`` refuses, before anything trains, N units that would not fit side by side though each fits alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedlib import RunConfig
from fedlib.data import readers
from fedlib.runs import feasibility

ROOT = Path(__file__).resolve().parents[1]
HIGH_AT_MOST = 3.0  # the estimate may err high, but by no more than this factor

CASES = {
    "synthetic-500-clients": dict(dataset="synthetic", model="dnn", hidden=(20,), n_clients=500, rounds=2),
    "wide-fedavg": dict(dataset="synthetic", model="dnn", hidden=(2000,), n_clients=100, rounds=2),
    "wide-heurfedamp": dict(
        dataset="synthetic", model="dnn", hidden=(2000,), n_clients=100, rounds=2, algorithm="heurfedamp"
    ),
    "wide-ditto-float64": dict(
        dataset="synthetic", model="dnn", hidden=(1500,), n_clients=100, rounds=2, algorithm="ditto", dtype="float64"
    ),
    "wide-pfedme+mcsa": dict(
        dataset="synthetic", model="dnn", hidden=(2000,), n_clients=100, rounds=2, algorithm="pfedme+mcsa"
    ),
    "mnist-mlp": dict(dataset="mnist", partition="labels", model="mlp", n_clients=20, rounds=2),
}

CHILD = """
import json, resource, sys
import fedlib.runs.train as t
from fedlib import RunConfig
cfg = RunConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(sys.argv[1]).items()}).validate()
with open("/proc/self/statm") as f:
    before = int(f.read().split()[1]) * resource.getpagesize()
t.train(cfg, progress=False)
# VmHWM, not ru_maxrss: ru_maxrss keeps the forking parent's peak across exec (a 2.5 GB pytest worker read as
# every run's peak)
hwm = next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:")) * 1024
print(json.dumps({"peak": hwm - before}))
"""


def measured_peak(fields: dict) -> int:
    """Bytes the run of ``fields`` adds at its peak to a fresh process that has imported fedlib."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(fields)], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])["peak"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
@pytest.mark.parametrize("name", list(CASES))
def test_estimate_errs_high(name):
    fields = CASES[name]
    if fields["dataset"] != "synthetic" and readers.missing([fields["dataset"]]):
        pytest.skip(f"data absent: {fields['dataset']}")
    cfg = RunConfig(**fields).validate()
    estimated = sum(feasibility.estimate(cfg).values())
    peak = measured_peak(fields)
    print(f"{name}: peak {peak / 2**20:.0f} MB, estimate {estimated / 2**20:.0f} MB ({estimated / peak:.2f}x)")
    assert peak <= estimated, f"{name}: measured {peak / 2**20:.0f} MB > estimated {estimated / 2**20:.0f} MB"
    assert estimated <= HIGH_AT_MOST * peak, (
        f"{name}: estimated {estimated / 2**20:.0f} MB, over {HIGH_AT_MOST}x the measured {peak / 2**20:.0f} MB"
    )


def _two_units_that_fit_alone_only(monkeypatch):
    """Two configs of different methods (two units), and a memory limit each fits in alone but both do not together
    (their estimates and a worker process each)."""
    from fedlib.executors import hardware
    from fedlib.runs import grids, scheduling

    cfgs = [RunConfig(n_clients=4, clients_per_round=2, rounds=2, local_steps=2, model="mlr", algorithm=a).validate()
            for a in ("fedavg", "fedprox")]  # fmt: skip
    together = scheduling.side_by_side([[c] for c in cfgs], 2)
    alone = max(scheduling.unit_bytes([c]) for c in cfgs) + scheduling.WORKER_BYTES
    assert alone < together
    monkeypatch.setattr(hardware, "available_bytes", lambda device="cpu": (alone + together) / 2)
    monkeypatch.setattr(grids, "_run_parallel", lambda *a, **k: pytest.fail("training started"))
    return cfgs


def test_run_grid_with_jobs_refuses_units_that_fit_alone_but_not_together(tmp_path, monkeypatch):
    """Each run was checked alone: jobs=N of runs that fit one at a time but not N at a time started them all."""
    from fedlib.runs import grids
    from fedlib.runs.store import Store

    cfgs = _two_units_that_fit_alone_only(monkeypatch)
    store = Store(tmp_path / "store")
    with pytest.raises(feasibility.TooLarge, match=r"jobs=2: the 2 largest units .* each fits alone: use jobs=1"):
        grids.run_grid(cfgs[0], {"algorithm": ["fedavg", "fedprox"]}, store, progress=False, jobs=2, batch=1)
    assert not any(store.has(c) for c in cfgs)
    # jobs=None chooses the processes itself: as many as fit side by side, here one
    monkeypatch.setattr(grids, "default_jobs", lambda *a, **k: 2)
    grids.run_grid(cfgs[0], {"algorithm": ["fedavg", "fedprox"]}, store, progress=False, jobs=None, batch=1)
    assert all(store.has(c) for c in cfgs)


def test_cli_with_jobs_refuses_units_that_fit_alone_but_not_together(monkeypatch):
    """The command line says so in one line naming --jobs, before training."""
    from fedlib.experiments import cli

    cfgs = _two_units_that_fit_alone_only(monkeypatch)
    import types

    monkeypatch.setattr(cli, "experiment", lambda *a, **k: types.SimpleNamespace(configs=cfgs, absent=[]))
    with pytest.raises(SystemExit) as stop:
        cli.main(["fedmcsa_table2", "--profile", "smoke", "--jobs", "2", "--batch", "1"])
    assert "jobs=2: the 2 largest units" in str(stop.value.code) and "--jobs 1" in str(stop.value.code)
