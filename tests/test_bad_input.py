"""The bad-input suite: configs, store damage, snapshots, divergence, signals, the CLI.

Each case here was seen going wrong on the code before the fix (accepted, silently wrong, or a raw crash with no
path); the data files' cases are in test_bad_data.py. The malicious-snapshot case is
test_checkpoint.py::test_planted_snapshot_runs_no_code_and_the_run_restarts.
"""

import dataclasses
import errno
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import simulate_with, small_synthetic

from fedlib import RunConfig, Store, run
from fedlib.algorithms import build_algorithm
from fedlib.config.options import METHODS
from fedlib.executors import StackedExecutor
from fedlib.models.registry import build_model
from fedlib.runs import feasibility, grids
from fedlib.runs import train as runner
from fedlib.runs.checkpoint import Checkpoint
from fedlib.runs.stored import DamagedRunWarning, read_run

TINY = RunConfig(n_clients=4, clients_per_round=2, rounds=4, local_steps=2, model="mlr")
ROOT = Path(__file__).resolve().parents[1]


# -- configs ----------------------------------------------------------------------------------------------------
def _float_fields():
    """(flat name, config to set it on) for every float option of every part and method."""
    base = RunConfig()
    out = []
    for part in ("data", "model", "local", "selection"):
        for f in dataclasses.fields(getattr(base, part)):
            if f.type in ("float", "float | None") and f.name != "domain_percent":
                out.append((f.name, {}))
    for name, cls in METHODS.items():
        for f in dataclasses.fields(cls):
            if f.type in ("float", "float | None"):
                out.append((f.name, {"algorithm": name, "model": "lenet" if cls.LOCAL_GROUPS else "mlr"}))
    return out


@pytest.mark.parametrize("field, context", _float_fields(), ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_every_float_field_refuses_nan_and_inf(field, context, value):
    """NaN passed every range check (``v < lo`` is False for NaN) and trained NaN losses."""
    with pytest.raises(ValueError, match=f"{field}=.*must be a finite number"):
        RunConfig(**context, **{field: value}).validate()


def test_clients_per_round_above_n_clients_is_refused():
    """It was clamped silently to N (a grid cell labelled S=20 ran with 5)."""
    with pytest.raises(ValueError, match="clients_per_round=10 must be <= n_clients=5.*fraction=1.0"):
        RunConfig(n_clients=5, clients_per_round=10).validate()
    RunConfig(n_clients=5, clients_per_round=None, fraction=1.0).validate()
    RunConfig(n_clients=5, clients_per_round=10, algorithm="local").validate()  # Local samples no clients


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(batch_size=10**7), "batch_size=10000000 exceeds the 3000000 samples dataset='synthetic' can have"),
        (dict(n_clients=10**9), "would need about .* PB of memory"),
        (dict(model="dnn", hidden=(10**6,)), r"would need about .* GB of memory \(clients .*, training .*, data"),
        (dict(dataset="mnist", partition="iid", n_clients=10**5), "n_clients=100000 exceeds the 70000 samples"),
        # it passed, then failed allocating 93 GB for the rounds x clients 'selected' record (a MemoryError)
        (dict(rounds=10**9), r"would need about .* TB of memory \(.*, records .* TB\).*or rounds$"),
    ],
)
def test_runs_that_cannot_fit_are_refused_before_any_data_loads(change, message, tmp_path, monkeypatch):
    """They passed validation, then ate 21 of 23 GB or hung generating data. Now refused, naming the estimate."""
    monkeypatch.setattr(runner, "load_federated", lambda *a, **k: pytest.fail("data loaded"))
    cfg = RunConfig(**{"clients_per_round": 10, **change}).validate()
    with pytest.raises(ValueError, match=message):
        runner.train(cfg, progress=False)
    with pytest.raises(ValueError, match=message):  # a grid refuses before training any of its runs
        grids.run_configs([TINY, cfg], Store(tmp_path), progress=False)
    assert not Store(tmp_path).has(TINY)


def test_a_store_is_a_store_or_its_folder_and_one_that_cannot_hold_results_is_refused_before_training(
    tmp_path, monkeypatch
):
    """``fedlib.run(cfg, "folder")`` failed with "'str' object has no attribute 'load'"; a file given as the store
    failed with FileExistsError after the run had trained."""
    res = run(TINY, str(tmp_path / "s"), progress=False)  # a folder, made
    assert Store(tmp_path / "s").has(TINY) and res.metrics.shape[0] == TINY.rounds
    with pytest.raises(TypeError, match=r"store=42 must be a Store, a folder \(str or path\) or None"):
        run(TINY, 42, progress=False)
    monkeypatch.setattr(runner, "load_federated", lambda *a, **k: pytest.fail("data loaded"))
    afile = tmp_path / "results.txt"
    afile.write_text("not a store")
    for call in (lambda: run(TINY, afile, progress=False), lambda: grids.run_grid(TINY, {"seed": [0]}, afile)):
        with pytest.raises(ValueError, match=f"the results store {afile} is not a folder: pass another store"):
            call()
    # no permission (the tests run as root here, which chmod does not stop: the probe file fails instead)
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", lambda **k: (_ for _ in ()).throw(PermissionError(13, "no")))
    with pytest.raises(ValueError, match=r"the results store .*/t cannot be written \(\[Errno 13\] no\)"):
        run(TINY, tmp_path / "t", progress=False)
    assert run(TINY, tmp_path / "s", progress=False) is not None  # a stored run is read, nothing written


BAD_SETTINGS = {
    "FEDLIB_MALLOC": ("bogus", " is not one of: reuse, default (unset it for the default, reuse)"),
    "FEDLIB_CUDA_GRAPHS": ("maybe", ": one of 1, true, yes, on (record) or 0, false, no, off (do not)"),
    "FEDLIB_CHECKPOINT_SECONDS": ("soon", ": a number of seconds > 0 (unset: 300)"),
}


@pytest.mark.parametrize("variable", sorted(BAD_SETTINGS))
def test_a_bad_setting_is_refused_before_anything_trains(tmp_path, monkeypatch, variable):
    """A bad setting is refused up front, in one line: ``keep_freed_memory`` reads ``FEDLIB_MALLOC`` once a
    process, when the first run trains, so else a grid's workers would each fail with a traceback, and a process
    that had trained before would never look again. ``FEDLIB_CUDA_GRAPHS`` is read where each executor is made (in
    every worker): refused first too. ``FEDLIB_CHECKPOINT_SECONDS``: refused by the CLI in one line, not a
    traceback."""
    value, says = BAD_SETTINGS[variable]
    monkeypatch.setenv(variable, value)
    monkeypatch.setattr(runner, "train", lambda *a, **k: pytest.fail("trained"))
    message = f"{variable}={value!r}{says}"
    calls = [
        lambda: run(TINY, tmp_path, progress=False),
        lambda: grids.run_configs([TINY, TINY.replace(seed=1)], Store(tmp_path), progress=False, jobs=2),
    ]
    if variable == "FEDLIB_CUDA_GRAPHS":
        calls.append(StackedExecutor)
    for call in calls:
        with pytest.raises(ValueError, match=re.escape(message)):
            call()
    out = _cli("fedmcsa_sigma", "--profile", "smoke", "--dry-run", env={variable: value})
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1] == f"python -m fedlib.experiments: error: {message}"


@pytest.mark.parametrize("value", ["0", "-5", "soon", "inf", "nan"])
def test_a_bad_snapshot_interval_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("FEDLIB_CHECKPOINT_SECONDS", value)
    message = f"FEDLIB_CHECKPOINT_SECONDS={value!r}: a number of seconds > 0 (unset: 300)"
    with pytest.raises(ValueError, match=re.escape(message)):
        Store(".").checkpoint(TINY)


def test_the_snapshot_interval_comes_from_the_environment(tmp_path, monkeypatch):
    store = Store(tmp_path)
    monkeypatch.delenv("FEDLIB_CHECKPOINT_SECONDS", raising=False)
    assert store.checkpoint(TINY).every_seconds == 300.0
    monkeypatch.setenv("FEDLIB_CHECKPOINT_SECONDS", " 7.5 ")
    assert store.checkpoint(TINY).every_seconds == 7.5
    store.checkpoint_seconds = 0.0  # a store's own setting wins (tests snapshot every round)
    assert store.checkpoint(TINY).every_seconds == 0.0


def test_a_grid_axis_must_have_values():
    """``run_grid(base, {"lr": []})`` returned an empty table: an axis computed empty by mistake passed silently."""
    with pytest.raises(ValueError, match=r"grid\['lr'\] is an empty list: a grid axis needs at least one value"):
        grids.expand(TINY, {"lr": [], "seed": [0, 1]})
    with pytest.raises(ValueError, match=r"grid\[1\]\['seed'\] is an empty list"):
        grids.expand(TINY, [{"seed": [0]}, {"seed": []}])


def test_the_python_entry_points_name_an_argument_of_the_wrong_kind(tmp_path):
    """Each reached a TypeError or AttributeError deep inside: ``run({"rounds": 2})`` "'dict' object has no attribute
    'validate'", ``run_grid(base, [1, 2])`` "'int' object is not iterable", ``results_frame([1])`` "'int' object has
    no attribute 'key'", ``experiment(..., seeds=0)`` "'int' object is not iterable"."""
    import fedlib

    store = Store(tmp_path)
    for call, says in [
        (
            lambda: run({"rounds": 2}, store),
            r"cfg must be a RunConfig \(RunConfig.of\(...\)\), got dict: \{'rounds': 2\}",
        ),
        (
            lambda: grids.run_grid(TINY, [1, 2], store),
            r"grid must be a dict of field -> value or list of values, or a ",
        ),
        (lambda: grids.run_grid(TINY, "lr", store), r"grid must be a dict .*; got 'lr'"),
        (lambda: grids.run_grid({"rounds": 2}, {"lr": [0.1]}, store), "base must be a RunConfig"),
        (lambda: grids.run_configs(TINY, store), "cfgs must be a list of RunConfig, got RunConfig"),
        (lambda: fedlib.results_frame([TINY, 1], store), r"cfgs\[1\] must be a RunConfig .*, got int: 1"),
    ]:
        with pytest.raises(TypeError, match=says):
            call()
    ex = lambda seeds: fedlib.experiment("quickstart", "smoke", seeds=seeds, stored_only=True, store=store)
    assert [c.get("seed") for c in ex(3).configs] == [3, 3] and len(ex(range(2)).configs) == 4
    assert len(ex(s for s in (0, 1)).configs) == 4  # a generator, read once
    for bad, says in [("0", "seeds='0' must be a list of integers"), ([], r"seeds=\[\] is empty")]:
        with pytest.raises(ValueError, match=says):
            ex(bad)
    assert not any(tmp_path.iterdir())


def test_every_stored_config_fits_this_machine():
    """The estimate errs high, but not so high that the paper's own runs would be refused."""

    for cfg in Store(ROOT / "results").configs():
        feasibility.check(cfg, limit=16 * 2**30)


# -- divergence -------------------------------------------------------------------------------------------------
def test_a_diverging_run_stops_and_says_so(tmp_path):
    """lr 1e4 once stored a NaN model's 18% as the best accuracy, with an empty loss field and nothing in meta."""
    cfg = RunConfig(n_clients=6, clients_per_round=3, rounds=8, local_steps=3, model="dnn", lr=1e4)
    store = Store(tmp_path)
    with pytest.warns(UserWarning, match="diverged at round 3"):
        res = run(cfg, store, progress=False)
    assert res.meta["diverged_at"] == 3 and res.metrics["round"].tolist() == [1, 2, 3]
    last = res.metrics.iloc[-1]
    assert np.isnan(last.test_acc) and not np.isfinite(last.test_loss) and np.isnan(res.client_acc[-1]).all()
    s = res.summary()
    assert s["diverged_at"] == 3 and np.isnan(s["final_acc"]) and np.isnan(s["last10_acc"])
    assert s["best_acc"] == res.metrics.test_acc.iloc[:2].max()  # from the models before it diverged
    again = store.load(cfg)  # stored as diverged, and it passes the integrity check (3 rows is complete)
    assert again.summary()["diverged_at"] == 3 and store.has(cfg)
    assert RunConfig(**{**cfg.changed(), "lr": 0.02}).key() != cfg.key()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_finite_finds_every_nan_and_infinity(dtype):
    """``fedlib.core.simulation.finite`` (the divergence check after every round, from each tensor's amax and amin) is
    ``torch.isfinite(v).all()`` over all tensors: a NaN or an infinity anywhere (the first value, the last, inside
    a vector and in its scalar tail) is found, finite extremes are not, integer tensors are skipped."""
    from fedlib.core.simulation import finite

    g = torch.Generator().manual_seed(0)
    sound = {"w": torch.randn(5, 37, generator=g).to(dtype), "n": torch.arange(4)}
    big = torch.finfo(dtype)
    assert finite(sound) and finite(sound, {"x": torch.tensor([big.max, big.min, big.tiny, -0.0], dtype=dtype)})
    assert finite({}) and finite({"e": torch.empty(0, dtype=dtype)})
    for bad in (math.nan, math.inf, -math.inf):
        for at in (0, 17, 5 * 37 - 1):
            w = sound["w"].clone()
            w.view(-1)[at] = bad
            assert not finite(sound, {"w": w}), (bad, at)


def test_a_sound_run_reports_no_divergence(tmp_path):
    res = run(TINY, Store(tmp_path), progress=False)
    assert res.summary()["diverged_at"] is None and "diverged_at" not in res.meta


# -- store damage -----------------------------------------------------------------------------------------------
def _damage(folder: Path, how: str) -> None:
    if how == "empty metrics":
        (folder / "metrics.csv").write_text("")
    elif how == "rows removed":
        lines = (folder / "metrics.csv").read_text().splitlines()
        (folder / "metrics.csv").write_text("\n".join(lines[:-2]) + "\n")
    elif how == "garbage meta":
        (folder / "meta.json").write_text("{not json")
    elif how == "truncated clients":
        blob = (folder / "clients.npz").read_bytes()
        (folder / "clients.npz").write_bytes(blob[: len(blob) // 2])
    elif how == "one byte flipped":
        blob = bytearray((folder / "clients.npz").read_bytes())
        blob[len(blob) // 2] ^= 0x01
        (folder / "clients.npz").write_bytes(bytes(blob))
    elif how == "metrics.csv missing":
        (folder / "metrics.csv").unlink()


HOW = ["empty metrics", "rows removed", "garbage meta", "truncated clients", "one byte flipped", "metrics.csv missing"]


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("sealed", [True, False], ids=["manifest", "legacy"])
def test_a_damaged_run_is_reported_left_out_and_retrained(how, sealed, tmp_path):
    """One damaged run crashed status for every experiment (raw errors, no path), or -- a truncated metrics.csv --
    was used as complete (notebook 21 printed FedAvg-0.5 at 10.98 instead of 22.0)."""
    store = Store(tmp_path)
    good, _ = run(TINY, store, progress=False), run(TINY.replace(seed=1), store, progress=False)
    other = store.load(TINY.replace(seed=1))
    folder = store.path(TINY)
    if not sealed:  # a run stored before manifests: the structure check alone must catch it
        (folder / "manifest.json").unlink()
    _damage(folder, how)
    if how == "one byte flipped" and not sealed:
        pytest.skip("a flipped byte inside compressed data is only caught by the manifest (or by zlib, by luck)")
    assert not store.has(TINY) and store.has(TINY.replace(seed=1))
    problem = store.problem(TINY)
    assert str(folder) in problem and TINY.key() in problem
    with pytest.warns(DamagedRunWarning, match=f"{folder}.*damaged"):
        assert store.load(TINY) is None
    assert [c.key() for c, _ in store.stored([TINY, TINY.replace(seed=1)])] == [TINY.replace(seed=1).key()]
    assert any(TINY.key() in line for line in store.damaged())
    with pytest.warns(DamagedRunWarning):
        again = run(TINY, store, progress=False)  # retrained; the damaged folder is kept aside
    assert np.array_equal(again.metrics.test_loss, good.metrics.test_loss) and store.has(TINY)
    assert [p.name.split("-")[0] for p in (tmp_path / "_damaged").iterdir()] == [TINY.key()]
    assert store.load(TINY.replace(seed=1)).metrics.equals(other.metrics)


def test_damaged_runs_do_not_break_status_or_the_experiment_summary(tmp_path, monkeypatch):
    from fedlib import experiment

    ex = experiment("quickstart", "smoke", store=tmp_path, progress=False)
    assert not ex.missing_runs
    victim = ex.configs[0]
    _damage(ex.store.path(victim), "garbage meta")
    ex = experiment("quickstart", "smoke", store=tmp_path, stored_only=True, progress=False)
    assert victim in ex.missing_runs and len(ex.damaged) == 1
    assert "damaged, left out (1" in ex.describe() and str(ex.store.path(victim)) in str(ex)
    assert len(ex.table) == len(ex.configs) - 1  # the table leaves it out; the summary says so
    from fedlib.experiments.named import status

    row = status("smoke", store=tmp_path).set_index("experiment").loc["quickstart"]
    assert row["damaged"] == 1 and row["stored"] == len(ex.configs) - 1 and row["to run"] == 1
    # each stored run trained as one of a batch of 4 that took 4 h: an hour each (estimates.run_seconds)
    monkeypatch.setattr(Store, "meta", lambda self, cfg: {"wall_seconds": 14_400.0, "batched": 4})
    row = status("smoke", store=tmp_path).set_index("experiment").loc["quickstart"]
    assert row["stored wall h"] == len(ex.configs) - 1


def test_garbage_config_json_is_left_out_of_configs(tmp_path):
    store = Store(tmp_path)
    run(TINY, store, progress=False)
    (store.path(TINY) / "config.json").write_text("[1, 2")
    with pytest.warns(DamagedRunWarning, match="config.json unreadable"):
        assert store.configs() == []


def test_store_folders_follow_the_umask(tmp_path):
    """Run folders were created 0700 (tempfile.mkdtemp): nobody else could read a shared store."""
    old = os.umask(0o022)
    try:
        store = Store(tmp_path)
        run(TINY, store, progress=False)
    finally:
        os.umask(old)
    folder = store.path(TINY)
    assert folder.stat().st_mode & 0o777 == 0o755
    assert {f.stat().st_mode & 0o777 for f in folder.iterdir()} == {0o644}


def test_every_committed_run_passes_its_integrity_check():
    results = ROOT / "results"
    folders = [d for d in results.iterdir() if d.is_dir() and not d.name.startswith("_")]
    assert len(folders) >= 634
    for d in folders:
        assert (d / "manifest.json").exists(), d
        read_run(d)


# -- snapshots --------------------------------------------------------------------------------------------------
def _simulate(cfg, data, **kw):
    model = build_model(cfg.model.name, data.input_shape, 10, (8,), seed=0, dtype=torch.float64)
    alg = build_algorithm(cfg, n_samples=data.train.sizes.numpy())
    return simulate_with(alg, data, model, StackedExecutor(), cfg.rounds, local_steps=cfg.local_steps,
                    batch_size=cfg.batch_size, seed=cfg.seed, progress=False, **kw)  # fmt: skip


def test_a_corrupt_snapshot_is_set_aside_and_the_run_restarts(tmp_path):
    """It made every rerun of the queue fail, with no path (0 of 2 configs stored)."""
    data = small_synthetic(n_clients=4, rows=60)
    ck = Checkpoint(tmp_path / "run.pt", every_seconds=0)
    ck.path.write_bytes(b"PK\x03\x04 not a snapshot")
    ck.info_path.write_text(json.dumps({"round": 2, "rounds": 4, "elapsed": 1.0}))
    with pytest.warns(UserWarning, match=f"snapshot {ck.path} is not usable.*moved to run.pt.damaged-"):
        res = _simulate(TINY, data, checkpoint=ck)
    assert "resumed" not in res.meta and res.metrics["round"].tolist() == [1, 2, 3, 4]
    assert len(list(tmp_path.glob("run.pt.damaged-*"))) == 1
    assert np.array_equal(res.metrics.test_loss, _simulate(TINY, data).metrics.test_loss)


def test_a_full_disk_while_snapshotting_does_not_kill_the_run(tmp_path, monkeypatch):
    """A full disk killed a healthy run with 'unexpected pos 64 vs 0' and left a .pt.tmp behind."""
    data = small_synthetic(n_clients=4, rows=60)
    ck = Checkpoint(tmp_path / "run.pt", every_seconds=0)
    real_save = torch.save

    def full(obj, f, *a, **k):
        real_save(obj, f, *a, **k)  # a partly written file, then the error
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.warns(UserWarning, match=f"no space left writing {ck.path}; the run continues without snapshots"):
        res = _simulate(TINY, data, checkpoint=ck)
    monkeypatch.undo()
    assert res.metrics["round"].tolist() == [1, 2, 3, 4] and ck.disabled
    assert list(tmp_path.iterdir()) == []  # no temporary file left, no snapshot
    assert np.array_equal(res.metrics.test_loss, _simulate(TINY, data).metrics.test_loss)


def test_snapshot_temporary_files_are_unique_per_process(tmp_path, monkeypatch):
    """Two processes on one config wrote the same .pt.tmp name."""
    names = []
    real_replace = os.replace  # each snapshot is written to its temporary file, then renamed into place
    monkeypatch.setattr(os, "replace", lambda src, dst: (names.append(Path(src).name), real_replace(src, dst))[1])
    _simulate(TINY, small_synthetic(n_clients=4, rows=60), checkpoint=Checkpoint(tmp_path / "run.pt", 0))
    # the snapshot and the small info file beside it (replaced, not written through a link) each by a unique name
    assert {n.split(".")[1] for n in names} == {"pt", "json"}
    assert all(
        n.startswith((f"run.pt.{os.getpid()}-", f"run.json.{os.getpid()}-")) and n.endswith(".tmp") for n in names
    )
    assert len(set(names)) == len(names)


# -- signals ----------------------------------------------------------------------------------------------------
@pytest.fixture
def ctrl_c_reaches_python():
    """Python's own Ctrl-C handler for the test: a pytest started in the background (``cmd &``) inherits SIGINT
    ignored, and then no Ctrl-C reaches the run (what an idle pool worker wants, not what this test checks)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_finishes_the_round_snapshots_it_and_resumes_bit_identical(tmp_path, ctrl_c_reaches_python):
    data = small_synthetic(n_clients=4, rows=60)
    cfg = TINY.replace(rounds=6)
    reference = _simulate(cfg, data)
    ck = Checkpoint(tmp_path / "run.pt", every_seconds=1e9)  # no timed snapshot: only the one Ctrl-C takes

    def ctrl_c(t, *_):
        if t == 3:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt, match=f"stopped after round 3; snapshot in {ck.path}"):
        _simulate(cfg, data, checkpoint=ck, on_round=ctrl_c)
    assert ck.info()["round"] == 3 and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    res = _simulate(cfg, data, checkpoint=ck)
    assert [r["round"] for r in res.meta["resumed"]] == [3]
    assert np.array_equal(res.metrics.test_loss, reference.metrics.test_loss)


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.inf
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _two_workers_training(parent: subprocess.Popen) -> list[int]:
    """The pool workers of a --jobs 2 grid started by ``parent``, once both are training."""
    deadline = time.time() + 120
    workers = []
    while time.time() < deadline and len(workers) < 2:
        time.sleep(0.5)
        workers = [p for p in _children(parent.pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(workers) >= 2, "the grid's workers did not start"
    while time.time() < deadline + 120 and min(_cpu_seconds(p) for p in workers) < 7:
        time.sleep(0.5)  # until both are training (imports and data take ~5 s of CPU)
    return workers


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_grid_workers_stop_when_the_parent_is_killed(tmp_path):
    """`kill -9` of the parent of a --jobs 2 grid orphaned its workers: they stored 5 more runs, then hung."""
    script = (
        "import sys; from fedlib import RunConfig, Store; from fedlib.runs.grids import run_configs\n"
        "cfgs = [RunConfig(n_clients=20, clients_per_round=20, rounds=100000, local_steps=20, model='dnn', seed=s)"
        " for s in range(4)]\n"
        f"run_configs(cfgs, Store({str(tmp_path)!r}), progress=False, jobs=2, batch=1)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        workers = _two_workers_training(parent)
        parent.kill()
        parent.wait()
        deadline = time.time() + 90  # they stop at the end of their round, or 20 s after the parent died
        while time.time() < deadline and any(Path(f"/proc/{p}").exists() for p in workers):
            time.sleep(0.5)
        alive = [p for p in workers if Path(f"/proc/{p}").exists()]
        assert not alive, f"orphaned workers still running: {alive}"
    finally:
        for p in _children(parent.pid):
            os.kill(p, signal.SIGKILL)
        if parent.poll() is None:  # a failed assertion above: the grid (100,000 rounds) must not train on
            parent.kill()
            parent.wait()
    # each worker was interrupted like a Ctrl-C: its run snapshotted the round it had finished
    assert len(list((tmp_path / "_partial").glob("*.json"))) == 2


# -- the command line -------------------------------------------------------------------------------------------
def _cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "fedlib.experiments", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def test_cli_where_matching_nothing_is_an_error_listing_the_values():
    """It printed '0 configs' and exited 0."""
    out = _cli("fedmcsa_sigma", "--profile", "smoke", "--where", "seed=7", "--dry-run")
    assert out.returncode == 2
    assert "where={'seed': 7} matches none of the" in out.stderr and "seed in {0" in out.stderr


@pytest.mark.parametrize("dry", [True, False])
def test_cli_with_every_configs_data_absent_is_a_one_line_error(dry, tmp_path):
    """It printed '0 configs' and then a KeyError traceback from the empty table."""
    out = _cli(
        "adafl_table1", "--profile", "smoke", *(["--dry-run"] if dry else []), env={"FEDLIB_DATA": str(tmp_path)}
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "data absent, skipped: mnist" in out.stdout
    assert out.stderr.strip() == (
        f"python -m fedlib.experiments: error: nothing to train or show: every config needs data absent under "
        f"{tmp_path} (mnist); put it there or set FEDLIB_DATA (see data/README.md)"
    )


def test_cli_with_a_store_that_cannot_hold_results_is_a_one_line_error(tmp_path):
    """It was ``Store.ready``'s ValueError as a traceback."""
    afile = tmp_path / "results.txt"
    afile.write_text("not a store")
    out = _cli("fedmcsa_sigma", "--profile", "smoke", env={"FEDLIB_RESULTS": str(afile)})
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip() == (
        f"python -m fedlib.experiments: error: the results store {afile} is not a folder: pass another store or set "
        "FEDLIB_RESULTS"
    )
    assert _cli("fedmcsa_sigma", "--profile", "smoke", "--dry-run", env={"FEDLIB_RESULTS": str(afile)}).returncode == 0


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_cli_with_a_damaged_data_file_is_a_one_line_error(jobs, tmp_path):
    """It was the reader's DatasetChecksumError as a traceback (through the process pool too)."""
    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ):
        (raw / f"{name}.gz").write_bytes(b"not MNIST")
    env = {"FEDLIB_DATA": str(tmp_path / "data"), "FEDLIB_RESULTS": str(tmp_path / "res")}
    out = _cli("adafl_table1", "--profile", "smoke", "--jobs", jobs, env=env)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"python -m fedlib.experiments: error: {raw / 'train-images-idx3-ubyte.gz'} has md5 ")
    assert "the file is corrupt or not the original" in last


def test_cli_jobs_is_a_count_or_auto():
    """``--jobs auto``: one process per core (``scheduling.default_jobs``); anything else but a count is refused."""
    for bad in ("0", "two", "-1"):
        out = _cli("fedmcsa_sigma", "--profile", "smoke", "--jobs", bad, "--dry-run")
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert f"--jobs={bad} must be an integer >= 1 or auto (one process per core)" in out.stderr
    assert _cli("fedmcsa_sigma", "--profile", "smoke", "--jobs", "auto", "--dry-run").returncode == 0


def test_cli_unknown_profile_is_a_one_line_error():
    """It was a traceback."""
    out = _cli("fedmcsa_sigma", "--profile", "bogus", "--dry-run")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "argument --profile: invalid choice: 'bogus'" in out.stderr.splitlines()[-1]


def test_cli_explicit_profile_beats_the_environment():
    """FEDLIB_PROFILE=smoke ... --profile paper ran smoke."""
    out = _cli("fedmcsa_sigma", "--profile", "paper", "--dry-run", env={"FEDLIB_PROFILE": "smoke"})
    smoke = _cli("fedmcsa_sigma", "--profile", "smoke", "--dry-run")
    assert out.returncode == 0 and smoke.returncode == 0
    assert out.stdout.splitlines()[0] != smoke.stdout.splitlines()[0]  # the paper grid, not the smoke one


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("batch", [1, 2])
def test_ctrl_c_of_a_grid_on_two_processes_stops_it_without_starting_another_run(tmp_path, batch):
    """Ctrl-C in a --jobs 2 grid's parent only (Jupyter's "interrupt the kernel" signals the kernel, not its
    workers): the parent reacts while it waits for a unit, and a worker checks stop before starting a unit, so the
    two runs going snapshot their round, the queued one does not start, and the parent returns within seconds.
    ``batch=2``: two units of two runs as one model each; a pool worker ignores SIGINT and the runs' threads cannot
    take it, so the worker defers the parent's signal to its runs: the four runs snapshot their round."""
    script = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from fedlib import RunConfig, Store; from fedlib.runs.grids import run_configs\n"
        "if __name__ == '__main__':\n"
        "    cfgs = [RunConfig(n_clients=20, clients_per_round=20, rounds=100000, local_steps=20, model='dnn', seed=s)"
        " for s in range(4)]\n"
        f"    run_configs(cfgs, Store({str(tmp_path)!r}), progress=False, jobs=2, batch={batch})\n"
    )
    (tmp_path / "grid.py").write_text(script)
    parent = subprocess.Popen(
        [sys.executable, str(tmp_path / "grid.py")],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        workers = _two_workers_training(parent)
        parent.send_signal(signal.SIGINT)
        out, _ = parent.communicate(timeout=90)  # the two runs end their round; a third would train 100,000
    finally:
        for p in _children(parent.pid):
            os.kill(p, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    going = 2 * batch
    assert f"interrupted: 0 of 4 runs stored, {going} snapshots kept (run again to resume)" in out, out[-2000:]
    assert len(list((tmp_path / "_partial").glob("*.json"))) == going
    assert not any(Path(f"/proc/{p}").exists() for p in workers)
