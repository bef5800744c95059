"""Snapshots of a running simulation, and stopping it cleanly: ``Checkpoint`` (the snapshot file of one run),
``Checkpointing`` (the callback that writes snapshots and resumes from one), ``DeferredInterrupt`` and
``StopOnRequest`` (a first Ctrl-C finishes the round, snapshots it and stops).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedlib.core.callbacks import Callback
from fedlib.core.state import Round, Run, State
from fedlib.runs import nofollow
from fedlib.runs.seals import SealError, code_identity, git_commit, other_code, read_sealed, store_key, write_sealed

__all__ = ["Checkpoint", "Checkpointing", "DeferredInterrupt", "StopOnRequest", "git_commit", "param_shapes"]


@dataclass
class Checkpointing(Callback):
    """Snapshots at round ends (every ``checkpoint.every_seconds``), and resuming from one: the run's state and
    random streams, the selection stage's state and every keyed callback's state -- tensors and plain data.

    ``on_start`` resumes: it loads the snapshot (if there is one for this run), restores the run and each callback
    by its ``key``, moves the run's clock back by the time already spent and sets ``run.done`` to the snapshot's
    round. Put it after the callbacks whose state it saves (a snapshot after round t holds round t's evaluation); the
    others' ``on_start`` then run before the state is restored, so none may depend on it."""

    checkpoint: Checkpoint | None = None
    resumed: list = field(default_factory=list)
    last_save: float = 0.0

    def on_start(self, run: Run) -> None:
        snap = self.checkpoint.load(run.rounds, param_shapes(run.state)) if self.checkpoint is not None else None
        if snap is not None:
            run.load_state_dict(snap["run"])
            run.alg.select.load_state_dict(snap["select"])
            for cb in run.callbacks:
                if cb.key:
                    cb.load_state_dict(snap["callbacks"].get(cb.key, {}))
            run.t0 = time.perf_counter() - snap["elapsed"]
            run.done = snap["round"]
            self.resumed = snap["resumed"] + [_resumption(snap)]
        self.last_save = time.perf_counter()

    def after_round(self, run: Run, out: Round) -> None:
        ck = self.checkpoint
        if ck is None or out.t >= run.rounds or time.perf_counter() - self.last_save < ck.every_seconds:
            return
        self.save(run, out.t)

    def meta(self) -> dict:
        return {"resumed": self.resumed} if self.resumed else {}

    def save(self, run: Run, t: int) -> Path | None:
        """Snapshot the run as it is after round ``t`` (now); the snapshot's path, or None if none was written."""
        ck = self.checkpoint
        if ck is None or ck.disabled:
            return None
        ck.save(
            {
                "round": t,
                "rounds": run.rounds,
                "elapsed": time.perf_counter() - run.t0,
                "run": run.state_dict(),
                "params": param_shapes(run.state),
                "select": run.alg.select.state_dict(),
                "resumed": self.resumed,
                "callbacks": {cb.key: cb.state_dict() for cb in run.callbacks if cb.key},
            }
        )
        self.last_save = time.perf_counter()
        return None if ck.disabled else ck.path


def _resumption(snap: dict) -> dict:
    """What ``meta['resumed']`` records of one resumption: the round, the time spent before, and the code that wrote
    the snapshot (fedlib version, commit, package digest); resumed by other code (``resume_other_code``), also
    ``code_changed`` and the code that went on (``resumed_by``), so both halves of the run are on record."""
    code = snap["code"]
    entry = {"round": snap["round"], "commit": code.get("commit"), "elapsed": round(snap["elapsed"], 3)}
    entry |= {"fedlib": code.get("fedlib"), "source": code.get("source")}
    if snap["code_changed"]:
        now = code_identity()
        entry |= {"code_changed": snap["code_changed"], "code": code, "resumed_by": now}
    return entry


@dataclass
class StopOnRequest(Callback):
    """Ctrl-C as a callback: once ``stop.requested`` turns True (``DeferredInterrupt``, or a batched run's flag), the
    run stops after the round it is in, with a snapshot of that round (``saver``), so an interrupted run loses
    nothing it finished. Put it last, so that the snapshot holds the round's evaluation."""

    stop: Any
    saver: Checkpointing

    def after_round(self, run: Run, out: Round) -> None:
        if self.stop.requested and out.t < run.rounds and run.diverged_at is None:
            where = self.saver.save(run, out.t)
            raise KeyboardInterrupt(f"stopped after round {out.t}" + (f"; snapshot in {where}" if where else ""))


class DeferredInterrupt:
    """Within it, a first Ctrl-C (SIGINT) only sets ``requested``: the round loop finishes the round, snapshots it
    and stops, so an interrupted run loses nothing it finished. A second Ctrl-C stops at once. Only the main thread
    can take signals; elsewhere (and where SIGINT was ignored: an idle worker) this does nothing."""

    def __init__(self):
        self.requested, self.previous = False, None

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print("\ninterrupt: stopping after this round, with a snapshot (Ctrl-C again: stop now)", file=sys.stderr)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False


@dataclass
class Checkpoint:
    """Snapshots of a running ``simulate`` at round ends, so that an interrupted long run (AdaFL's 1000 rounds
    take hours on a CPU) continues where it stopped instead of starting over.

    A snapshot holds everything the next round depends on: the ``State`` (global, client and sent models,
    ``state.extra``), the three random streams (selection, mini-batches, evaluation batches), the selection
    stage's ``state_dict()`` (AdaFL's scores) and every callback's (the rows, client accuracies and traces so
    far) -- tensors and plain data only, read back with ``torch.load(weights_only=True)``. Resuming
    therefore gives the numbers an uninterrupted run gives, bit for bit (tested over every registered
    algorithm). ``path`` (a ``.pt`` file) is written atomically, with a small ``.json`` beside it saying
    how far the run got; one is written when ``every_seconds`` have passed since the last (0: every round).

    A snapshot is sealed like a stored result (``fedlib.runs.seals``): its SHA-256, written last, covers its
    tensors and plain data and its identity -- the run it belongs to (its file's name, ``key``: in a store, the
    config key; and the model's parameter names, dtypes and shapes) and the code that wrote it (fedlib's version,
    git commit and package digest, torch's and numpy's versions); with ``secret`` (default ``FEDLIB_STORE_KEY``)
    also an HMAC under that key, and then only a snapshot with a matching HMAC is resumed. A snapshot that fails
    its seal (a flipped bit, an edit, a forgery without the key) or belongs to another run is set aside with a
    warning and the run restarts: resuming it would store its rounds as this run's. One written by other code
    (``seals.DECIDING``) restarts too, since its remaining rounds would be trained by code its first rounds were
    not, unless ``resume_other_code`` (default ``FEDLIB_RESUME_OTHER_CODE=1``) says to go on; the result's
    ``meta['resumed']`` then records both codes (``_resumption``). No link is followed: the snapshot and its info
    are read and written as regular files only (``nofollow``), and in a store (``root``) nothing is read or written
    where a folder between the store and the file is a link. ``Store.checkpoint(cfg)`` gives the one
    ``fedlib.runs.train.run`` uses.
    """

    path: Path
    every_seconds: float = 300.0
    disabled: bool = False  # set when a write failed: the run continues without snapshots
    root: Path | None = None  # the store the snapshot belongs to (``Store.checkpoint``): it stays inside it
    # the keyed seal's key; None: FEDLIB_STORE_KEY (unset: no keyed seal). Kept out of the repr, so that no traceback
    # or log shows it
    secret: bytes | str | None = field(default=None, repr=False)
    resume_other_code: bool | None = None  # None: FEDLIB_RESUME_OTHER_CODE (unset: restart)

    def __post_init__(self):
        self.path = Path(self.path)
        self.root = Path(self.root) if self.root is not None else None
        if not self.every_seconds >= 0:
            raise ValueError(f"Checkpoint.every_seconds={self.every_seconds!r} must be a number >= 0")
        # read here, where a run's snapshot is first asked for, so that a bad value stops it before it trains
        self.secret = store_key(self.secret)
        if self.resume_other_code is None:
            self.resume_other_code = resume_other_code()
        elif not isinstance(self.resume_other_code, bool):
            raise TypeError(f"Checkpoint.resume_other_code={self.resume_other_code!r} must be True, False or None")

    @property
    def key(self) -> str:
        """The run this snapshot belongs to: its file's name without ``.pt`` (``Store.checkpoint``: the config key)."""
        return self.path.stem

    @property
    def info_path(self) -> Path:
        return self.path.with_suffix(".json")

    def outside(self) -> Path | None:
        """The link between ``root`` and the snapshot (``_partial`` made a link to another folder), if there is one:
        through it the store's snapshots would be read, written and deleted outside the store, so none are."""
        return nofollow.link_on_the_way(self.root, self.path) if self.root is not None else None

    def info(self) -> dict | None:
        """{'round', 'rounds', 'elapsed'} of the snapshot on disk, without reading it; None if there is none. Not
        sealed: it only orders a grid's runs and reports progress, the snapshot itself is checked when resumed."""
        if self.outside() is not None:
            return None
        try:  # a link is not followed, and a fifo or a device planted there would be read forever: neither is read
            return json.loads(nofollow.read_regular(self.info_path, most=1 << 12))
        except (OSError, ValueError, RecursionError):
            return None

    def load(self, rounds: int, params: dict | None = None) -> dict | None:
        """The snapshot on disk (tensors on the CPU), if there is one for a run of ``rounds`` rounds (else None).
        ``params``: the run's ``param_shapes``, which the snapshot's must equal.

        Its seal is checked before anything reads its payload, and the payload is read with
        ``torch.load(weights_only=True)``: a snapshot is tensors and plain data, so a file planted in a store cannot
        run code. One that is not such a snapshot (an older format, unsealed, or damaged), fails its seal, is
        another run's (copied under this one's name, or of another model), or was written by other code (unless
        ``resume_other_code``) is set aside with a warning, and the run restarts from round 1."""
        if (link := self.outside()) is not None:
            warnings.warn(
                f"{link} is a symbolic link: no snapshot is read through it (the run starts at round 1)", stacklevel=2
            )
            return None
        if not os.path.lexists(self.path):
            return None
        try:
            if not nofollow.regular(self.path):  # a link (to /dev/zero: read until memory ran out) is not followed
                raise ValueError("not a regular file" + (" (a symbolic link)" if self.path.is_symlink() else ""))
            identity, payload = read_sealed(self.path, self.secret)
            if identity.get("format") != SNAPSHOT_FORMAT:
                raise ValueError(f"not a fedlib snapshot of format {SNAPSHOT_FORMAT}")
            # resuming another run's snapshot would store its rounds as this run's
            if identity.get("key") != self.key:
                raise ValueError(f"a snapshot of run {identity.get('key')!r}, not of {self.key!r}")
            code = identity.get("code") if isinstance(identity.get("code"), dict) else {}
            changed = other_code(code)
            if changed and not self.resume_other_code:
                return self._other_code(code, changed)
            snap = torch.load(payload, map_location="cpu", weights_only=True)
            if not isinstance(snap, dict) or snap.get("rounds") != identity.get("rounds"):
                raise ValueError("its contents are not the snapshot its seal describes")
            if params is not None and snap.get("params") != params:
                raise ValueError("its model's parameters (names, dtypes, shapes) are not this run's")
        except Exception as e:  # noqa: BLE001  (any unreadable file: refuse it, never execute it)
            aside = self._set_aside()
            why = str(e) if isinstance(e, SealError) else f"{type(e).__name__}: {str(e)[:120]}"
            warnings.warn(
                f"snapshot {self.path} is not usable ({why}); moved to {aside.name} and the run restarts from round 1",
                stacklevel=2,
            )
            return None
        if snap.get("rounds") != rounds:
            return None
        return _from_plain(snap) | {"code": code, "code_changed": changed}

    def _other_code(self, code: dict, changed: list[str]) -> None:
        now = code_identity()
        diff = ", ".join(f"{k} {str(code.get(k))[:12]} -> {str(now[k])[:12]}" for k in changed)
        aside = self._set_aside("other-code")
        warnings.warn(
            f"snapshot {self.path} was written by other code ({diff}); moved to {aside.name} and the run restarts "
            f"from round 1, so that all its rounds come from one code (to resume it instead, move it back and set "
            f"{RESUME_ENV}=1: the run's meta.json then records both codes)",
            stacklevel=3,
        )
        return None

    def _set_aside(self, why: str = "damaged") -> Path:
        """Move a refused snapshot out of the way (kept for inspection), so the next run does not trip on it."""
        aside = self.path.with_name(f"{self.path.name}.{why}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        try:
            os.replace(self.path, aside)
        except OSError:
            self.path.unlink(missing_ok=True)
        self.info_path.unlink(missing_ok=True)
        return aside

    def save(self, snap: dict) -> None:
        """Write a snapshot atomically, sealed (``fedlib.runs.seals.write_sealed``: checksum last). A failed write (a
        full disk) is reported naming the file and snapshots stop (``disabled``): the run goes on, it only loses the
        ability to resume."""
        if self.disabled:
            return
        if (link := self.outside()) is not None:
            self.disabled = True
            warnings.warn(f"{link} is a symbolic link: no snapshot is written through it; the run continues without "
                          "snapshots", stacklevel=2)  # fmt: skip
            return
        snap = _to_plain(snap)
        identity = {
            "format": SNAPSHOT_FORMAT,
            "key": self.key,
            "round": snap["round"],
            "rounds": snap["rounds"],
            "code": code_identity(),
        }
        # unique per process: two processes on one config never write the same temporary file
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
        info = {k: snap[k] for k in ("round", "rounds")} | {"elapsed": round(snap["elapsed"], 1)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_sealed(tmp, identity, lambda f: torch.save(snap, f), self.secret)
            os.replace(tmp, self.path)  # a reader (or a second interruption) never sees half a snapshot
            nofollow.replace_with(self.info_path, json.dumps(info).encode())  # a link there: replaced, not followed
        except (OSError, RuntimeError) as e:  # an OSError as the OS gave it (write_sealed keeps torch's wrapping off)
            tmp.unlink(missing_ok=True)
            self.disabled = True
            no_space = getattr(e, "errno", None) == errno.ENOSPC or "No space left" in str(e)
            what = "no space left" if no_space else f"{type(e).__name__}: {str(e)[:100]}"
            warnings.warn(f"{what} writing {self.path}; the run continues without snapshots", stacklevel=2)

    def clear(self) -> None:
        if self.outside() is not None:
            return
        for p in (self.path, self.info_path):  # a link is removed itself, never what it points to
            p.unlink(missing_ok=True)


# 1: pickled objects, refused (loading one could run code); 2: tensors and plain data, refused (it does not say
# which run it belongs to); 3: and its run's key and parameter shapes, refused (unsealed: an edit or a flipped bit
# was resumed); 4: sealed (``fedlib.runs.seals``), with the code that wrote it
SNAPSHOT_FORMAT = 4

RESUME_ENV = "FEDLIB_RESUME_OTHER_CODE"


def resume_other_code() -> bool:
    """``FEDLIB_RESUME_OTHER_CODE``: 1 resumes a snapshot written by other code, 0 or unset restarts its run; any
    other value is a ValueError naming it. An environment variable, so that it reaches a grid's workers, Ray
    tasks and notebooks without an argument through every entry point."""
    text = os.environ.get(RESUME_ENV, "").strip().lower()
    if text in ("", "0", "no", "false"):
        return False
    if text in ("1", "yes", "true"):
        return True
    raise ValueError(
        f"{RESUME_ENV}={os.environ[RESUME_ENV]!r}: 1 to resume a snapshot written by other code (recorded in the "
        "run's meta.json), 0 or unset to restart such a run"
    )


def param_shapes(state: State) -> dict:
    """Each client-model parameter's dtype and shape (clients first), as plain data: what a snapshot is for."""
    return {n: [str(t.dtype), *t.shape] for n, t in state.client_params.items()}


def _to_plain(obj):
    """Snapshot content as what ``torch.load(weights_only=True)`` reads: numpy arrays become tensors (marked, so
    they come back as arrays), numpy scalars Python numbers; dicts, lists, tuples, str, numbers, None stay."""
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(obj)) if obj.dtype != object else obj.tolist()}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_plain(v) for v in obj)
    return obj


def _from_plain(obj):
    if isinstance(obj, dict):
        if set(obj) == {"__ndarray__"}:
            v = obj["__ndarray__"]
            return v.numpy() if isinstance(v, torch.Tensor) else np.array(v)
        return {k: _from_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_from_plain(v) for v in obj)
    return obj
