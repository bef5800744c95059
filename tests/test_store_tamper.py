"""A stored run or snapshot that is not what its key says is never shown as a result or resumed: a run folder copied
or linked under another run's key, numbers edited in a run whose manifest was deleted, malformed files (which
crashed the readers), and a snapshot copied to another run's name. Each case read as good, resumed, or crashed
before ``read_run`` tied a folder's contents to its key and checked its accuracies."""

import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import stop_in_round

from fedlib import RunConfig, Store, run
from fedlib.config.run import from_dict
from fedlib.core import simulation
from fedlib.runs import checkpoint as checkpointing
from fedlib.runs import nofollow
from fedlib.runs.stored import LEGACY_KEYS, DamagedRun, DamagedRunWarning, read_run

RESULTS = Path(__file__).resolve().parents[1] / "results"
ORPHAN = "f3e86d78f34c24f9"  # tests/test_store_keys.py ORPHANS
needs_results = pytest.mark.skipif(not RESULTS.is_dir(), reason="no results/ beside the package")


def _committed(want_data: bool = True) -> str:
    """The first committed run (by key) whose clients all have test data (``want_data``) or none has (AdaFL)."""
    for d in sorted(RESULTS.iterdir()):
        if d.is_dir() and not d.name.startswith("_") and d.name != ORPHAN:
            with np.load(d / "clients.npz") as z:
                n = z["n"]
            if (n > 0).all() if want_data else not (n > 0).any():
                return d.name
    pytest.skip("no such committed run")


def _cfg(folder: Path):
    return from_dict(json.loads((folder / "config.json").read_text()))


def _copy(key: str, dest: Path, manifest: bool = True) -> Path:
    shutil.copytree(RESULTS / key, dest / key)
    if not manifest:  # a run stored before manifests, as far as the reader can tell
        (dest / key / "manifest.json").unlink()
    return dest / key


@pytest.fixture
def guarded_reads(monkeypatch):
    """Reading a device or a fifo hangs or fills memory, and so does a huge file read whole: such a read fails the
    test here instead (on the code before, it was made). Records the name of each file read."""
    read = []

    def guard(real):
        def read_whole(self, *args, **kwargs):
            st = os.stat(self)
            if not stat.S_ISREG(st.st_mode) or st.st_size > 2**26:
                raise AssertionError(f"read {self} whole ({st.st_size} bytes, mode {st.st_mode:o})")
            read.append(self.name)
            return real(self, *args, **kwargs)

        return read_whole

    monkeypatch.setattr(Path, "read_bytes", guard(Path.read_bytes))
    monkeypatch.setattr(Path, "read_text", guard(Path.read_text))
    real_regular = nofollow.read_regular  # the store's reads: a file is recorded once it was read whole

    def read_regular(path, *args, **kwargs):
        data = real_regular(path, *args, **kwargs)
        read.append(Path(path).name)
        return data

    monkeypatch.setattr(nofollow, "read_regular", read_regular)
    return read


# -- a run under another run's key --------------------------------------------------------------------------------
@needs_results
@pytest.mark.parametrize("how", ["copy", "symlink"])
def test_a_run_copied_or_linked_under_another_key_is_not_that_run(how, tmp_path):
    keys = sorted(d.name for d in RESULTS.iterdir() if d.is_dir() and not d.name.startswith("_") and d.name != ORPHAN)
    a, b = keys[0], keys[1]
    if how == "copy":
        shutil.copytree(RESULTS / a, tmp_path / b)
    else:
        os.symlink(RESULTS / a, tmp_path / b)
    store, cfg_b = Store(tmp_path), _cfg(RESULTS / b)
    assert not store.has(cfg_b)
    with pytest.warns(DamagedRunWarning, match=f"{tmp_path / b}.*config.json is the config of key {a}"):
        assert store.load(cfg_b) is None
    assert len(store.damaged()) == 1 and b in store.damaged()[0]


@needs_results
def test_the_legacy_orphan_loads_by_its_key_and_nowhere_else(tmp_path):
    """The one committed run whose config re-hashes to another key is accepted under its own folder name only."""
    assert set(LEGACY_KEYS) == {ORPHAN}
    res = read_run(RESULTS / ORPHAN)
    assert res.metrics["round"].iloc[-1] == 1000
    now = _cfg(RESULTS / ORPHAN).key()
    # under the key its config hashes to it is consistent, and no config can ask for it there: validate() refuses
    # mnist with domain_percent before any lookup (read_run does not validate: a later version's rules would
    # otherwise turn runs stored under today's into damaged ones)
    shutil.copytree(RESULTS / ORPHAN, tmp_path / now)
    assert read_run(tmp_path / now).metrics["round"].iloc[-1] == 1000
    with pytest.raises(ValueError, match="domains/domain_percent set but dataset='mnist'"):
        _cfg(RESULTS / ORPHAN).validate()
    other = _committed()
    shutil.copytree(RESULTS / other, tmp_path / ORPHAN)  # another run under the orphan's name
    with pytest.raises(DamagedRun, match=f"config.json is the config of key {other}"):
        read_run(tmp_path / ORPHAN)


# -- edited numbers in a run without its manifest -------------------------------------------------------------------
def _edit_metrics(folder: Path, column: str, value) -> None:
    m = pd.read_csv(folder / "metrics.csv")
    m.loc[len(m) - 1, column] = value(m.loc[len(m) - 1, column]) if callable(value) else value
    m.to_csv(folder / "metrics.csv", index=False, float_format="%.6g")  # as Store.save writes it


def _edit_clients(folder: Path, name: str, change) -> None:
    with np.load(folder / "clients.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays[name] = change(arrays[name])
    np.savez_compressed(folder / "clients.npz", **arrays)


def _nan_first(a):
    a = a.copy()
    a[-1, 0] = np.nan
    return a


EDITS = {
    "test_acc 7.5": lambda f: _edit_metrics(f, "test_acc", 7.5),
    "test_acc NaN": lambda f: _edit_metrics(f, "test_acc", np.nan),
    "test_acc +0.01": lambda f: _edit_metrics(f, "test_acc", lambda v: v + 0.01),
    "test_acc_mean -0.01": lambda f: _edit_metrics(f, "test_acc_mean", lambda v: v - 0.01),
    "train_acc -0.5": lambda f: _edit_metrics(f, "train_acc", -0.5),
    "client acc 1.5": lambda f: _edit_clients(f, "acc", lambda a: np.where(a > 0.5, 1.5, a).astype(a.dtype)),
    "client acc NaN": lambda f: _edit_clients(f, "acc", _nan_first),
    "n negative": lambda f: _edit_clients(f, "n", lambda n: -n),
    "n float": lambda f: _edit_clients(f, "n", lambda n: n + 0.5),
}


@needs_results
@pytest.mark.parametrize("edit", list(EDITS))
def test_edited_numbers_are_caught_without_the_manifest(edit, tmp_path):
    key = _committed()
    folder = _copy(key, tmp_path, manifest=False)
    assert read_run(folder, unsealed=True).metrics.equals(read_run(RESULTS / key).metrics)  # sound before the edit
    EDITS[edit](folder)
    store = Store(tmp_path)
    assert not store.has(_cfg(folder))
    with pytest.raises(DamagedRun, match=f"{folder} \\(key {key}\\) is damaged: (metrics.csv|clients.npz)"):
        read_run(folder)


@needs_results
def test_an_accuracy_where_no_client_has_test_data_is_caught_without_the_manifest(tmp_path):
    """AdaFL's setting keeps no client test split: test_acc is NaN in every round, and a number there is made up."""
    key = _committed(want_data=False)
    folder = _copy(key, tmp_path, manifest=False)
    read_run(folder, unsealed=True)
    _edit_metrics(folder, "test_acc", 0.5)
    with pytest.raises(DamagedRun, match="metrics.csv test_acc in round .* is 0.5, its per-client accuracies give nan"):
        read_run(folder)


# -- malformed files ----------------------------------------------------------------------------------------------
def _set_json(folder: Path, name: str, **changes) -> None:
    d = json.loads((folder / name).read_text())
    (folder / name).write_text(json.dumps({**d, **changes}))


def _rekey(folder: Path) -> Path:
    """The folder renamed to the key its (edited) config hashes to: a bad config that cannot be told by its key."""
    return folder.rename(folder.parent / _cfg(folder).key())


def _link(folder: Path, name: str, target: str) -> None:
    (folder / name).unlink()
    os.symlink(target, folder / name)


def _fifo(folder: Path, name: str) -> None:
    (folder / name).unlink()
    os.mkfifo(folder / name)


MALFORMED = {  # what was done -> (manifest kept, the damage, what the error says)
    "manifest files a list": (True, lambda f: _set_json(f, "manifest.json", files=[]), "manifest.json does not give"),
    "eval_every 0": (False, lambda f: _set_json(f, "config.json", eval_every=0), "eval_every=0 is not an integer >= 1"),
    "rounds 1e3": (False, lambda f: _set_json(f, "config.json", rounds=1e3), "rounds=1000.0 is not an integer >= 1"),
    "diverged_at 'x'": (False, lambda f: _set_json(f, "meta.json", diverged_at="x"), "diverged_at='x' is not a round"),
    "diverged_at 2.5": (False, lambda f: _set_json(f, "meta.json", diverged_at=2.5), "diverged_at=2.5 is not a round"),
    "metrics.csv -> /dev/zero": (False, lambda f: _link(f, "metrics.csv", "/dev/zero"), "not a regular file"),
    "meta.json a fifo": (False, lambda f: _fifo(f, "meta.json"), "meta.json is not a regular file"),
    "manifest.json -> /dev/zero": (True, lambda f: _link(f, "manifest.json", "/dev/zero"), "not a regular file"),
}


@needs_results
@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_files_are_damaged_runs_not_crashes(case, tmp_path, guarded_reads):
    manifest, damage, says = MALFORMED[case]
    good = _committed()
    folder = _copy(good, tmp_path, manifest)
    damage(folder)
    if case.startswith(("eval_every", "rounds")):
        folder = _rekey(folder)
    with pytest.raises(DamagedRun, match=f"{folder}.*{says}"):
        read_run(folder)
    # one such folder kills none of the readers; a sound run beside it is read
    sound = _copy(_committed(want_data=False), tmp_path)
    store = Store(tmp_path)
    cfg = _cfg(folder)
    assert not store.has(cfg) and not store.has(cfg)  # the second from the cache
    assert store.has(_cfg(sound)) and store.load(_cfg(sound)) is not None
    with pytest.warns(DamagedRunWarning):
        assert store.load(cfg) is None
    assert [folder.name in line for line in store.damaged()] == [True]


@needs_results
def test_a_file_of_another_size_than_its_manifest_says_is_not_read(tmp_path, guarded_reads):
    """Its size is checked before it is read whole: a huge file planted in a run would otherwise fill memory."""
    folder = _copy(_committed(), tmp_path)
    size = (folder / "metrics.csv").stat().st_size
    with open(folder / "metrics.csv", "ab") as f:
        f.truncate(size + 2**30)  # sparse: takes no disk
    with pytest.raises(DamagedRun, match=f"metrics.csv has {size + 2**30} bytes, its manifest says {size}"):
        read_run(folder)
    assert "metrics.csv" not in guarded_reads
    # nor is a huge manifest (it has no manifest of its own to say its size)
    guarded_reads.clear()
    folder = _copy(_committed(), tmp_path / "b")
    with open(folder / "manifest.json", "ab") as f:
        f.truncate(2**30)
    with pytest.raises(DamagedRun, match=f"manifest.json has {2**30} bytes, more than a manifest.json holds"):
        read_run(folder)
    assert "manifest.json" not in guarded_reads


@needs_results
def test_configs_reads_no_device_fifo_or_huge_config(tmp_path, guarded_reads):
    """``Store.configs`` read each config.json whole, unchecked: one linked to /dev/zero filled memory, a fifo hung
    it. Each such run is left out with a warning; a sound run beside them is listed."""
    sound = _copy(_committed(want_data=False), tmp_path)
    keys = sorted(d.name for d in RESULTS.iterdir() if d.is_dir() and not d.name.startswith("_"))
    planted = [_copy(k, tmp_path) for k in [k for k in keys if k not in (sound.name, ORPHAN)][:3]]
    _link(planted[0], "config.json", "/dev/zero")
    _fifo(planted[1], "config.json")
    with open(planted[2] / "config.json", "ab") as f:
        f.truncate(2**30)  # sparse: takes no disk
    want = [_cfg(sound)]
    guarded_reads.clear()
    with pytest.warns(DamagedRunWarning) as seen:
        assert Store(tmp_path).configs() == want
    said = " ".join(str(w.message) for w in seen)
    assert said.count("config.json is not a regular file") == 2
    assert f"config.json has {2**30} bytes, more than a config.json holds" in said
    assert guarded_reads.count("config.json") == 1  # the sound run's only


# -- snapshots ----------------------------------------------------------------------------------------------------
TINY = RunConfig(n_clients=4, clients_per_round=2, rounds=6, local_steps=2, model="mlr")


@pytest.mark.parametrize("other", [dict(seed=1), dict(model="dnn")], ids=["same model", "another model"])
def test_a_snapshot_copied_to_another_run_is_not_resumed(other, tmp_path, monkeypatch):
    a, b = TINY, TINY.replace(**other)
    store = Store(tmp_path / "s")
    stop_in_round(a, store, 5, monkeypatch)
    ck_a, ck_b = store.checkpoint(a), store.checkpoint(b)
    shutil.copy(ck_a.path, ck_b.path)
    shutil.copy(ck_a.info_path, ck_b.info_path)
    with pytest.warns(UserWarning, match=f"snapshot {ck_b.path} is not usable.*a snapshot of run '{a.key()}'"):
        res = run(b, store, progress=False)
    assert "resumed" not in res.meta and "resumed" not in store.load(b).meta
    fresh = Store(tmp_path / "fresh")
    assert res.metrics.drop(columns="seconds").equals(run(b, fresh, progress=False).metrics.drop(columns="seconds"))
    assert store.load(b).metrics.drop(columns="seconds").equals(fresh.load(b).metrics.drop(columns="seconds"))


def test_a_snapshot_of_another_model_under_the_same_name_is_not_resumed(tmp_path, monkeypatch):
    """Outside a store a snapshot's name need not be a config key: its parameters' shapes tell the model."""
    from helpers import simulate_with, small_synthetic

    from fedlib.algorithms import build_algorithm
    from fedlib.executors import StackedExecutor
    from fedlib.models.registry import build_model

    data = small_synthetic(n_clients=4, rows=60)

    def simulate(cfg, **kw):
        model = build_model(cfg.model.name, data.input_shape, 10, (8,), seed=0, dtype=data.train.x.dtype)
        alg = build_algorithm(cfg, n_samples=data.train.sizes.numpy())
        return simulate_with(alg, data, model, StackedExecutor(), cfg.rounds, local_steps=cfg.local_steps,
                                   batch_size=cfg.batch_size, seed=cfg.seed, progress=False, **kw)  # fmt: skip

    ck = checkpointing.Checkpoint(tmp_path / "run.pt", every_seconds=0)

    def stop(t, *_):
        if t == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        simulate(TINY, checkpoint=ck, on_round=stop)
    assert ck.info()["round"] == 2
    dnn = TINY.replace(model="dnn")
    with pytest.warns(UserWarning, match="is not usable.*parameters .names, dtypes, shapes. are not this run's"):
        res = simulate(dnn, checkpoint=ck)
    assert "resumed" not in res.meta and res.metrics["round"].tolist() == list(range(1, 7))
    assert res.metrics.drop(columns="seconds").equals(simulate(dnn).metrics.drop(columns="seconds"))


def test_a_snapshot_or_its_info_that_is_not_a_regular_file_is_not_read(tmp_path, monkeypatch, guarded_reads):
    """A snapshot linked to /dev/zero was handed to ``torch.load`` (read until memory ran out), a fifo as its info
    file was read forever: neither is read; the snapshot is set aside and its run restarts."""
    real = simulation.torch.load

    def load(path, *args, **kwargs):
        assert stat.S_ISREG(os.stat(path).st_mode), f"torch.load of {path}, not a regular file"
        return real(path, *args, **kwargs)

    monkeypatch.setattr(simulation.torch, "load", load)
    ck = checkpointing.Checkpoint(tmp_path / "_partial" / "0123456789abcdef.pt", 0)
    ck.path.parent.mkdir()
    os.symlink("/dev/zero", ck.path)
    os.mkfifo(ck.info_path)
    assert ck.info() is None
    with pytest.warns(UserWarning, match="not a regular file"):
        assert ck.load(3) is None
    assert not os.path.lexists(ck.path) and not os.path.lexists(ck.info_path)
