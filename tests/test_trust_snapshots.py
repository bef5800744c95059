"""A snapshot is resumed only if it is what its writer wrote, for this run, by this code: one forged with
``torch.save`` (safe tensors, the right key and shapes) or with one flipped byte was resumed and its run stored under
a fresh, valid manifest; one written by other code was resumed with no word, so one stored run mixed two codes; a
full disk surfaced torch's "unexpected pos" instead of naming it. The keyed seal (``FEDLIB_STORE_KEY``) refuses a
snapshot re-sealed by someone without the key, which an unkeyed checksum cannot."""

import errno
import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import stop_in_round

import fedlib
from fedlib import RunConfig, Store, run
from fedlib.runs import seals
from fedlib.runs.checkpoint import Checkpoint

TINY = RunConfig(n_clients=4, clients_per_round=2, rounds=6, local_steps=2, model="mlr")
KEY = "0123456789abcdef0123456789abcdef"


def _stopped(store: Store, monkeypatch, t_stop: int = 5, cfg: RunConfig = TINY) -> Checkpoint:
    """``cfg`` run in ``store`` and stopped in round ``t_stop``: its snapshot (of round ``t_stop - 1``) is left."""
    return stop_in_round(cfg, store, t_stop, monkeypatch)


@pytest.fixture
def snapshots(monkeypatch):
    """A snapshot every round, and no keyed seal unless a test sets one."""
    monkeypatch.setattr(Store, "checkpoint_seconds", 0.0)
    monkeypatch.delenv(seals.KEY_ENV, raising=False)
    monkeypatch.delenv("FEDLIB_RESUME_OTHER_CODE", raising=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """TINY trained without a stop, as stored: what every refused snapshot's restarted run, and every resumed one,
    must store."""
    store = Store(tmp_path_factory.mktemp("ref"))
    run(TINY, store, progress=False)
    return store.load(TINY)


def _same(res, ref) -> bool:
    return res.metrics.drop(columns="seconds").equals(ref.metrics.drop(columns="seconds")) and np.array_equal(
        res.client_acc, ref.client_acc
    )


def _scale_floats(tree, by: float):
    """Every float tensor in ``tree`` times ``by``: a forgery that keeps every key, dtype and shape."""
    for k, v in tree.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            tree[k] = v * by
        elif isinstance(v, dict):
            _scale_floats(v, by)


def _restarted(store: Store, ck: Checkpoint, reference, match: str, aside: str = "damaged"):
    with pytest.warns(UserWarning, match=match):
        res = run(TINY, store, progress=False)
    assert "resumed" not in res.meta and "resumed" not in store.load(TINY).meta
    assert _same(store.load(TINY), reference)
    assert len(list(ck.path.parent.glob(f"{ck.path.name}.{aside}-*"))) == 1
    return res


# -- forged and damaged ---------------------------------------------------------------------------------------------
def test_a_snapshot_forged_with_torch_save_is_not_resumed(tmp_path, monkeypatch, snapshots, reference):
    """Read back, its models scaled and written with ``torch.save``: every key, dtype and shape right, and before
    the seal it was resumed and its run sealed with a valid manifest (a best accuracy no training gave)."""
    store = Store(tmp_path)
    ck = _stopped(store, monkeypatch)
    snap = torch.load(ck.path, map_location="cpu", weights_only=True)
    _scale_floats(snap["run"], 1.5)
    torch.save(snap, ck.path)
    _restarted(store, ck, reference, f"snapshot {ck.path} is not usable .no seal")


def test_a_snapshot_with_one_flipped_byte_is_not_resumed(tmp_path, monkeypatch, snapshots, reference):
    """One byte of a tensor's data flipped (in its largest tensor): before the seal it was resumed and stored as
    sound."""
    store = Store(tmp_path)
    ck = _stopped(store, monkeypatch)
    snap = torch.load(ck.path, map_location="cpu", weights_only=True)
    tensors = []

    def collect(tree):
        for v in tree.values() if isinstance(tree, dict) else tree if isinstance(tree, list) else ():
            if isinstance(v, torch.Tensor):
                tensors.append(v)
            else:
                collect(v)

    collect(snap["run"])
    raw = max(tensors, key=lambda t: t.numel() * t.element_size()).contiguous().numpy().tobytes()
    data = bytearray(ck.path.read_bytes())
    at = data.find(raw)
    assert at >= 0 and data.count(raw) == 1
    data[at + len(raw) // 2] ^= 0x01
    ck.path.write_bytes(bytes(data))
    _restarted(store, ck, reference, f"snapshot {ck.path} is not usable .its checksum does not match its contents")


# -- other code ---------------------------------------------------------------------------------------------------
OTHER = {"fedlib version": (fedlib, "__version__", "0.0.1"), "edited checkout": (seals, "SOURCE", "0" * 64)}


@pytest.mark.parametrize("change", OTHER, ids=list(OTHER))
def test_a_snapshot_of_other_code_restarts_its_run(change, tmp_path, monkeypatch, snapshots, reference):
    """The first half trained by other code (another fedlib version; the same commit with edited files): before,
    it was resumed with no word, and the stored run's numbers came from two codes under one commit."""
    store = Store(tmp_path)
    where, name, value = OTHER[change]
    with monkeypatch.context() as m:
        m.setattr(where, name, value)
        m.setattr(fedlib.runs.checkpoint, "git_commit", lambda: "0" * 40)  # what the code before recorded
        ck = _stopped(store, monkeypatch)
    field = {"fedlib version": "fedlib", "edited checkout": "source"}[change]
    _restarted(store, ck, reference, f"written by other code \\({field} {value[:12]} -> .*FEDLIB_RESUME_OTHER_CODE=1",
               aside="other-code")  # fmt: skip


def test_a_snapshot_of_other_code_resumes_when_asked_and_records_both(tmp_path, monkeypatch, snapshots, reference):
    """``FEDLIB_RESUME_OTHER_CODE=1``: resumed, and meta.json says which code wrote the first half and which the
    rest (here the same arithmetic, so the numbers are the uninterrupted run's)."""
    store = Store(tmp_path)
    with monkeypatch.context() as m:
        m.setattr(fedlib, "__version__", "0.0.1")
        _stopped(store, monkeypatch)
    monkeypatch.setenv("FEDLIB_RESUME_OTHER_CODE", "1")
    res = run(TINY, store, progress=False)
    (entry,) = store.load(TINY).meta["resumed"]
    assert entry["round"] == 4 and entry["code_changed"] == ["fedlib"] and entry["fedlib"] == "0.0.1"
    assert entry["code"]["fedlib"] == "0.0.1" and entry["resumed_by"] == seals.code_identity()
    assert entry["resumed_by"]["fedlib"] == fedlib.__version__ != "0.0.1"
    assert res.meta["resumed"] == [entry] and _same(store.load(TINY), reference)


def test_a_commit_that_leaves_the_package_unchanged_resumes_with_both_commits(tmp_path, monkeypatch, snapshots):
    """The commit alone is recorded, not compared: the package's digest decides (a docs-only commit changes no
    number). Both commits are on record: the snapshot's in ``resumed``, the second half's in ``git_commit``."""
    store = Store(tmp_path)
    with monkeypatch.context() as m:
        m.setattr(seals, "_commit", lambda: "0" * 40)
        _stopped(store, monkeypatch)
    res = run(TINY, store, progress=False)
    (entry,) = res.meta["resumed"]
    assert entry["commit"] == "0" * 40 and "code_changed" not in entry
    assert res.meta["git_commit"] == seals.git_commit()


def test_a_bad_resume_other_code_value_is_refused_before_training(tmp_path, monkeypatch, snapshots):
    monkeypatch.setenv("FEDLIB_RESUME_OTHER_CODE", "maybe")
    with pytest.raises(ValueError, match="FEDLIB_RESUME_OTHER_CODE='maybe': 1 to resume .*0 or unset to restart"):
        run(TINY, Store(tmp_path), progress=False)
    assert not (tmp_path / TINY.key()).exists()
    with pytest.raises(TypeError, match="Checkpoint.resume_other_code='yes' must be True, False or None"):
        Checkpoint(tmp_path / "x.pt", resume_other_code="yes")


# -- full disk ----------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device that is always full)")
def test_a_full_disk_while_snapshotting_is_named(tmp_path, monkeypatch, snapshots):
    """Every write of a snapshot's temporary file goes to /dev/full, the kernel's full disk: torch's own writer
    reported it as "[enforce fail at inline_container.cc] unexpected pos 704 vs 598"."""
    real_save, real_open = torch.save, os.open

    def save(obj, f, *a, **k):  # a path: torch opens the file itself (the code before the seal)
        return real_save(obj, "/dev/full" if isinstance(f, (str, Path)) else f, *a, **k)

    def open_(path, flags, *a, **k):  # the sealed writer opens its temporary file with os.open
        if str(path).endswith(".tmp"):
            return real_open("/dev/full", os.O_WRONLY)
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(os, "open", open_)
    store = Store(tmp_path)
    ck = store.checkpoint(TINY)
    with pytest.warns(UserWarning, match=f"^no space left writing {ck.path}; the run continues without snapshots$"):
        res = run(TINY, store, progress=False)
    monkeypatch.undo()
    assert res.metrics["round"].tolist() == list(range(1, 7)) and store.has(TINY)
    assert list((tmp_path / "_partial").iterdir()) == []  # no temporary file left


def test_a_write_that_fails_with_enospc_is_named(tmp_path, monkeypatch):
    """The same through the write itself raising OSError(ENOSPC) part-way."""
    real_save = torch.save

    def full(obj, f, *a, **k):
        real_save(obj, io.BytesIO())
        f.write(b"x" * 10)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    ck = Checkpoint(tmp_path / "run.pt", every_seconds=0)
    with pytest.warns(UserWarning, match=f"^no space left writing {ck.path}; the run continues without snapshots$"):
        ck.save({"round": 1, "rounds": 2, "elapsed": 0.0})
    assert ck.disabled and list(tmp_path.iterdir()) == []


# -- the keyed seal -----------------------------------------------------------------------------------------------
def _reseal(ck: Checkpoint, key: bytes | None, by: float = 1.5) -> None:
    """What a forger who knows the format does: read the snapshot, change its models, seal it again (with ``key``,
    or unkeyed)."""
    identity, payload = seals.read_sealed(ck.path)
    snap = torch.load(payload, map_location="cpu", weights_only=True)
    _scale_floats(snap["run"], by)
    tmp = ck.path.with_name("forged.tmp")
    seals.write_sealed(tmp, identity, lambda f: torch.save(snap, f), key)
    os.replace(tmp, ck.path)


@pytest.mark.parametrize("forger", [None, b"a key that is not the store's"], ids=["unkeyed", "another key"])
def test_with_a_store_key_a_resealed_snapshot_is_not_resumed(forger, tmp_path, monkeypatch, snapshots, reference):
    monkeypatch.setenv(seals.KEY_ENV, KEY)
    store = Store(tmp_path)
    ck = _stopped(store, monkeypatch)
    _reseal(ck, forger)
    why = "it has no keyed seal, and FEDLIB_STORE_KEY is set" if forger is None else "its keyed seal does not match"
    _restarted(store, ck, reference, f"snapshot {ck.path} is not usable .{why}")


def test_with_a_store_key_a_sound_snapshot_resumes(tmp_path, monkeypatch, snapshots, reference):
    monkeypatch.setenv(seals.KEY_ENV, KEY)
    store = Store(tmp_path)
    ck = _stopped(store, monkeypatch)
    assert seals.read_sealed(ck.path, KEY.encode())  # sealed under the key
    res = run(TINY, store, progress=False)
    assert [r["round"] for r in res.meta["resumed"]] == [4] and _same(store.load(TINY), reference)


def test_without_a_key_a_resealed_snapshot_is_resumed(tmp_path, monkeypatch, snapshots, reference):
    """The trust boundary, pinned: an unkeyed checksum proves integrity, not origin. Someone who can write the store
    and knows the format can seal a forgery, and it is resumed (scaled models: other numbers than training gives)."""
    store = Store(tmp_path)
    ck = _stopped(store, monkeypatch)
    _reseal(ck, None)
    res = run(TINY, store, progress=False)
    assert [r["round"] for r in res.meta["resumed"]] == [4] and not _same(store.load(TINY), reference)


def test_a_short_store_key_is_refused_before_training(tmp_path, monkeypatch, snapshots):
    monkeypatch.setenv(seals.KEY_ENV, "short")
    with pytest.raises(ValueError, match="FEDLIB_STORE_KEY .* has 5 characters: give at least 16"):
        run(TINY, Store(tmp_path), progress=False)
    assert not (tmp_path / TINY.key()).exists()


def test_the_store_key_is_not_shown(tmp_path, monkeypatch):
    """A Checkpoint's repr (in a traceback, a log, pytest's output) showed the key."""
    monkeypatch.setenv(seals.KEY_ENV, KEY)
    ck = Checkpoint(tmp_path / "run.pt")
    assert ck.secret == KEY.encode() and KEY not in repr(ck) and KEY not in str(ck)
