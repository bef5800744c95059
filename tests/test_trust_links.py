"""No link in a store is followed, and the smaller input faults get messages naming what to change.

Links: a ``_partial/<key>.json`` linked to a user's file had that file overwritten with the snapshot's progress line
(and the link deleted when the run was stored); a snapshot linked to another file was resumed from it; a ``_partial``
folder linked elsewhere had the snapshots written (and deleted) there; a run folder's file, or the folder itself,
linked to a copy outside the store read as a sound run. Inputs: ``experiment(where=...)`` of the wrong type raised an
AttributeError from deep inside; a driver refused by a Ray cluster for want of its token got "Failed to connect",
naming neither the token nor ``RAY_AUTH_MODE`` (the papermill file names are tested in test_run_notebooks.py)."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from helpers import stop_in_round

import fedlib
from fedlib import RunConfig, Store, run
from fedlib.config.run import from_dict
from fedlib.runs import nofollow
from fedlib.runs.stored import DamagedRun, DamagedRunWarning, read_run

RESULTS = Path(__file__).resolve().parents[1] / "results"
ORPHAN = "f3e86d78f34c24f9"  # the legacy run (tests/test_store_keys.py ORPHANS)
needs_results = pytest.mark.skipif(not RESULTS.is_dir(), reason="no results/ beside the package")
TINY = RunConfig(n_clients=4, clients_per_round=2, rounds=6, local_steps=2, model="mlr")
PRECIOUS = "a user's own file\n"


def _victim(tmp_path: Path) -> Path:
    (tmp_path / "elsewhere").mkdir(exist_ok=True)
    victim = tmp_path / "elsewhere" / "notes.txt"
    victim.write_text(PRECIOUS)
    return victim


# -- _partial/ ------------------------------------------------------------------------------------------------------
def test_a_linked_snapshot_info_file_is_replaced_not_written_through(tmp_path, monkeypatch):
    """The symlinked ``_partial/<key>.json``: the run wrote '{"round": 5, ...}' into the file it pointed to."""
    victim, store = _victim(tmp_path), Store(tmp_path / "store")
    monkeypatch.setattr(Store, "checkpoint_seconds", 0.0)
    ck = store.checkpoint(TINY)
    ck.path.parent.mkdir(parents=True)
    os.symlink(victim, ck.info_path)
    res = run(TINY, store, progress=False)
    assert victim.read_text() == PRECIOUS
    assert res.metrics["round"].tolist() == list(range(1, 7)) and store.has(TINY)
    assert not os.path.lexists(ck.info_path) and not os.path.lexists(ck.path)  # cleared once stored


def test_a_linked_snapshot_info_is_not_read(tmp_path):
    victim, store = _victim(tmp_path), Store(tmp_path / "store")
    victim.write_text(json.dumps({"round": 3, "rounds": 6, "elapsed": 1.0}))
    ck = store.checkpoint(TINY)
    ck.path.parent.mkdir(parents=True)
    os.symlink(victim, ck.info_path)
    assert ck.info() is None


def test_a_snapshot_linked_to_a_file_outside_is_not_resumed(tmp_path, monkeypatch):
    """A ``_partial/<key>.pt`` linked to a snapshot elsewhere (here: this very run's, moved out) was resumed from."""
    store = Store(tmp_path / "store")
    stop_in_round(TINY, store, 5, monkeypatch)
    ck = store.checkpoint(TINY)
    outside = tmp_path / "elsewhere.pt"
    shutil.move(ck.path, outside)
    os.symlink(outside, ck.path)
    kept = outside.read_bytes()
    with pytest.warns(UserWarning, match=r"is not usable .*not a regular file \(a symbolic link\)"):
        res = run(TINY, store, progress=False)
    assert "resumed" not in res.meta and res.metrics["round"].tolist() == list(range(1, 7))
    assert outside.read_bytes() == kept  # the file the link named is left as it was


def test_a_linked_partial_folder_keeps_snapshots_out_of_the_other_folder(tmp_path, monkeypatch):
    """``_partial`` linked to another folder: the snapshots were written there (and deleted there once stored)."""
    store, other = Store(tmp_path / "store"), tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text(PRECIOUS)
    store.root.mkdir()
    os.symlink(other, store.root / "_partial")
    with pytest.warns(UserWarning, match=r"_partial is a symbolic link: no snapshot is written through it"):
        stop_in_round(TINY, store, 5, monkeypatch, left=False)
    assert sorted(p.name for p in other.iterdir()) == ["keep.txt"]
    assert store.checkpoint(TINY).info() is None
    # a snapshot placed there is neither read nor deleted through the link
    shutil.copy(other / "keep.txt", other / f"{TINY.key()}.pt")
    with pytest.warns(UserWarning, match="no snapshot is read through it"):
        res = run(TINY, store, progress=False)
    assert "resumed" not in res.meta and store.has(TINY)
    assert sorted(p.name for p in other.iterdir()) == sorted(["keep.txt", f"{TINY.key()}.pt"])


def test_no_link_on_the_way_is_found_where_there_is_none(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert nofollow.link_on_the_way(tmp_path, tmp_path / "a" / "b" / "x.pt") is None
    os.symlink(tmp_path / "a", tmp_path / "c")
    assert nofollow.link_on_the_way(tmp_path, tmp_path / "c" / "b" / "x.pt") == tmp_path / "c"
    assert nofollow.link_on_the_way(tmp_path / "a", tmp_path / "c" / "b" / "x.pt") is None  # not under that root


def test_replace_with_replaces_a_link_and_create_refuses_one(tmp_path):
    victim = _victim(tmp_path)
    os.symlink(victim, tmp_path / "x")
    with pytest.raises(FileExistsError):
        nofollow.create(tmp_path / "x")
    nofollow.replace_with(tmp_path / "x", b"new")
    assert victim.read_text() == PRECIOUS and not (tmp_path / "x").is_symlink()
    assert (tmp_path / "x").read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "x"]  # no temporary file left


# -- run folders ----------------------------------------------------------------------------------------------------
def _committed() -> str:
    for d in sorted(RESULTS.iterdir()):
        if d.is_dir() and not d.name.startswith("_") and d.name != ORPHAN:
            return d.name
    pytest.skip("no committed run")


@needs_results
@pytest.mark.parametrize("name", ["metrics.csv", "config.json", "clients.npz", "meta.json", "manifest.json"])
def test_a_run_file_linked_to_an_identical_copy_outside_is_damaged(name, tmp_path):
    """Linked to a byte-identical copy, the manifest's digests all match: it read as a sound run before."""
    key = _committed()
    shutil.copytree(RESULTS / key, tmp_path / "store" / key)
    folder, outside = tmp_path / "store" / key, tmp_path / name
    shutil.move(folder / name, outside)
    os.symlink(outside, folder / name)
    with pytest.raises(DamagedRun, match=rf"{name} is not a regular file \(a symbolic link to {outside}\)"):
        read_run(folder)
    store, cfg = Store(tmp_path / "store"), from_dict(json.loads((RESULTS / key / "config.json").read_text()))
    assert not store.has(cfg)
    with pytest.warns(DamagedRunWarning, match="not a regular file"):
        assert store.load(cfg) is None
    if name == "meta.json":
        with pytest.raises(DamagedRun, match="meta.json unreadable .*not a regular file"):
            store.meta(cfg)


@needs_results
def test_a_run_folder_linked_in_under_its_own_key_is_not_read(tmp_path):
    """A folder linked to a sound run elsewhere, under that run's own key, was read from wherever it pointed."""
    key = _committed()
    (tmp_path / "store").mkdir()
    os.symlink(RESULTS / key, tmp_path / "store" / key)
    with pytest.raises(DamagedRun, match=f"the folder is a symbolic link \\(to {RESULTS / key}\\)"):
        read_run(tmp_path / "store" / key)
    assert read_run(RESULTS / key).metrics is not None  # the folder it names is sound


# -- experiment(where=...) ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "where, said",
    [
        ("seed=0", r"where='seed=0' is a str; it takes \{field: value or \[values\]\}"),
        ([("seed", 0)], r"where=\[\('seed', 0\)\] is a list; it takes \{field: value or \[values\]\}"),
        ({1: 0}, r"where=\{1: 0\}: the field 1 is not a field name \(a str\)"),
        ({"seed": {0}}, r"where\['seed'\]=\{0\} is a set: give a value, or a list of values"),
    ],
)
def test_where_of_the_wrong_type_is_a_value_error_naming_it(where, said, tmp_path):
    with pytest.raises(ValueError, match=said):
        fedlib.experiment("fedmcsa_table2", "smoke", where=where, stored_only=True, progress=False, store=tmp_path)


def test_where_is_checked_before_an_experiment_s_step_trains(tmp_path, monkeypatch):
    """fedmcsa_table2_tuned first runs Table 1's grid (its step): a bad ``where`` is refused before that."""
    from fedlib.experiments import named

    def no_step(*args, **kwargs):
        raise AssertionError("the step's experiment ran before where was checked")

    monkeypatch.setattr(named, "expand", no_step)
    step = next(iter(named.profiles.STEPS))
    with pytest.raises(ValueError, match="where='seed=0' is a str"):
        fedlib.experiment(step, "smoke", where="seed=0", progress=False, store=tmp_path)


@pytest.mark.parametrize("fields", ["data_seed=1", [("data_seed", 1)]])
def test_fields_of_the_wrong_type_is_a_value_error_naming_it(fields, tmp_path):
    with pytest.raises(ValueError, match=re.escape(f"fields={fields!r} is a {type(fields).__name__}")):
        fedlib.experiment("fedmcsa_table2", "smoke", fields=fields, stored_only=True, progress=False, store=tmp_path)


def test_a_where_that_is_a_dict_still_filters(tmp_path):
    ex = fedlib.experiment("fedmcsa_table2", "smoke", where={"seed": [0]}, stored_only=True, progress=False,
                           store=tmp_path)  # fmt: skip
    assert ex.configs and {c.seed for c in ex.configs} == {0}


# -- a Ray driver without the cluster's token -----------------------------------------------------------------------
@pytest.mark.parametrize("mode", [None, "disabled", "token"])
def test_a_ray_driver_refused_for_its_token_is_told_about_the_token(mode, monkeypatch):
    """What Ray 2.60 raised for a driver without the head's token (observed: a head started with RAY_AUTH_MODE=token
    and a driver without it; Ray logged "InvalidAuthToken: Authentication token is missing or incorrect" for a
    minute, then raised this); our message named neither the token nor RAY_AUTH_MODE."""
    ray = pytest.importorskip("ray")
    from fedlib.runs import ray_backend

    def refused(address=None, **kwargs):
        raise ConnectionError(f"Failed to connect to Ray cluster at {address}")

    monkeypatch.setattr(ray, "init", refused)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_backend, "_probe", lambda address, source: None)  # its port answers
    if mode is None:
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    else:
        monkeypatch.setenv("RAY_AUTH_MODE", mode)
    with pytest.raises(ConnectionError) as e:
        ray_backend.connect("10.0.0.1:6379")
    said = str(e.value)
    assert said.startswith("address='10.0.0.1:6379': could not connect to a Ray cluster there: Failed to connect")
    assert "token" in said and "~/.ray/auth_token" in said and "RAY_AUTH_TOKEN" in said
    if mode == "token":
        assert "RAY_AUTH_MODE=token is set here" in said and "must be the head's" in said
    else:
        assert f"RAY_AUTH_MODE is {repr(mode) if mode else 'not set'} here; export RAY_AUTH_MODE=token" in said
