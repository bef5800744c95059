"""Results store: each run's config hashes to a key; its results live, written atomically, under that key.

Layout of ``<root>/<key>/``:
    config.json   the full RunConfig
    metrics.csv   one row per evaluated round (``fedlib.core.state.COLUMNS``), a tidy table
    clients.npz   per-client test accuracy (float32) and loss (float16) per evaluated round, client test sizes,
                  and the per-round traces (``trace_selected``, ``trace_selection_scores``, ``trace_dropped``, ...;
                  see ``RunResult.traces``)
    meta.json     package versions, git commit, device, wall time, date (and ``resumed``: where a run was continued;
                  ``diverged_at``: the round a diverged run stopped at)
    manifest.json written last: each file's size and SHA-256, and the number of metrics rows

Runs in progress keep a snapshot in ``<root>/_partial/<key>.pt`` (``fedlib.runs.checkpoint.Checkpoint``, sealed by
``fedlib.runs.seals``; not committed), removed once the run is stored.

A run's folder is written in a temporary sibling and renamed into place, so a reader (or an
interrupted grid) only ever sees complete results. The root is ``FEDLIB_RESULTS``, else the project's ``results/``
folder for the paper profile (and for a config run on its own, which has no profile) and ``results/_explore/``
(git-ignored) for the exploring profiles (``default_root``). Folders and files get the permissions the umask allows
(a shared store is readable by the group or others when the umask says so).

Integrity: every read checks a run against its manifest (sizes, checked before a file is read, and hashes), its
key (config.json must hash to the folder's key, so a run copied or linked under another key is not that run; the
one committed run stored under an older schema is pinned by name, ``LEGACY_KEYS``), its config (the fields reading needs)
and meta (``diverged_at`` a round of the run), and its structure and numbers: regular files only (no link, fifo or
device), the metrics rows its config's rounds and ``eval_every`` give, per-client arrays of matching shape and
non-negative integer test sizes, every accuracy in [0, 1] and NaN only where a run leaves it undefined, and every
metric that comes from a stored array recomputed from it (``fedlib.runs.stored``: test_acc / test_acc_mean from the
per-client accuracies, test_loss from the per-client losses, selected and uploads from the selection trace, and,
where clients fail, dropped and straggled from their traces).
So a truncated, edited, swapped or half-copied run is never shown as a result: ``load`` warns naming its path, key
and what is wrong and returns None, ``has`` is False (the next grid retrains it) and ``save`` moves the damaged
folder to ``_damaged/`` (kept for inspection) before storing the new one. A run without a manifest is *unsealed*:
it gets every check but the hashes and is then left out the same way, unless the store reads unsealed runs
(``read_unsealed``, ``FEDLIB_READ_UNSEALED=1``), or the user vouches for it with ``reseal`` (every committed run has
a manifest). Nothing is unpickled: JSON, CSV, and ``np.load(allow_pickle=False)``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from fedlib.config.run import RunConfig, from_dict
from fedlib.core.state import RunResult
from fedlib.runs.checkpoint import Checkpoint
from fedlib.runs.stored import (
    CONFIG_BYTES,
    FILES,
    MANIFEST,
    METRICS_FORMAT,
    DamagedRun,
    DamagedRunWarning,
    UnsealedRun,
    _read_file,
    _stat,
    read_run,
    seal,
)

CHECKPOINT_ENV = "FEDLIB_CHECKPOINT_SECONDS"


def checkpoint_seconds() -> float:
    """``FEDLIB_CHECKPOINT_SECONDS`` (seconds between a run's snapshots, > 0; default 300), or an error naming it."""
    text = os.environ.get(CHECKPOINT_ENV, "").strip()
    if not text:
        return 300.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{CHECKPOINT_ENV}={text!r}: a number of seconds > 0 (unset: 300)")
    return value


UNSEALED_ENV = "FEDLIB_READ_UNSEALED"


def read_unsealed_default() -> bool:
    """``FEDLIB_READ_UNSEALED``: 1 reads runs without a manifest (marked unsealed), 0 or unset leaves them out; any
    other value is an error naming it, so that a typo does not silently decide what a table shows."""
    text = os.environ.get(UNSEALED_ENV, "").strip()
    if text not in ("", "0", "1"):
        raise ValueError(f"{UNSEALED_ENV}={text!r}: 1 (read runs without a manifest) or 0 / unset (leave them out)")
    return text == "1"


class StoreNotWritable(ValueError):
    """The results store cannot hold results (a file where its folder should be, no permission): ``Store.ready``."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _open_up(folder: Path) -> None:
    """``tempfile.mkdtemp`` makes a folder only its owner can read; give it (and its files) what the umask allows."""
    mask = _umask()
    os.chmod(folder, 0o777 & ~mask)
    for f in folder.iterdir():
        os.chmod(f, 0o666 & ~mask)


EXPLORE = "_explore"  # under the committed store, git-ignored: runs of the exploring profiles
DEPLOYED = "_deployed"  # under a store: its deployed runs (fedlib.flower), each under its simulated twin's key


def default_root(profile: str | None = None) -> Path:
    """Where runs are written when no store is given: ``FEDLIB_RESULTS``; else, in a checkout, the committed
    ``results/`` for the paper profile alone and ``results/_explore/`` (git-ignored) for everything else: the
    exploring profiles (quick, smoke) and a run whose profile is not known (``fedlib.run(cfg)``, ``run_grid``),
    which also reads the committed runs (``default_reads``); an installed package (no checkout) writes to
    ./results, and ./results/_explore for the exploring profiles. Every entry point that knows the profile
    (``fedlib.experiment``, the experiments CLI, the notebook job) asks here, so that no exploring run (a
    notebook opened at the quick profile, a first library example) is stored among the committed paper runs,
    whose count the tests check."""
    env = os.environ.get("FEDLIB_RESULTS")
    if env:
        return Path(env)
    committed = committed_root()
    root = committed or Path.cwd() / "results"
    return root if profile == "paper" or (profile is None and committed is None) else root / EXPLORE


def default_reads(profile: str | None = None) -> tuple[Path, ...]:
    """The stores read, never written, after ``default_root(profile)``: the committed ``results/`` for a run whose
    profile is not known, so that ``fedlib.run(paper_cfg)`` returns the committed run instead of training it again
    into results/_explore/; nothing when ``FEDLIB_RESULTS`` is set, for a profile, or outside a checkout."""
    committed = committed_root()
    if os.environ.get("FEDLIB_RESULTS") or profile is not None or committed is None:
        return ()
    return (committed,)


def committed_root() -> Path | None:
    """The checkout's committed store (``results/`` beside ``pyproject.toml``); None for an installed package."""
    here = Path(__file__).resolve().parents[2]  # fedlib/runs/store.py -> the checkout
    return here / "results" if (here / "pyproject.toml").exists() else None


class Store:
    """The results store: a folder of runs, one per config key (``root``), written atomically and checked on every
    read. ``reads``: stores consulted after ``root`` for a run ``root`` lacks, never written (a run they hold is
    read from there; one trained again, ``force``, is written to ``root``). ``Store()``: the default store of a run
    without a profile (``default_root``, ``default_reads``). ``read_unsealed``: whether a run without a manifest
    that passes every other check is read (marked ``meta["unsealed"]``) rather than left out (None:
    ``FEDLIB_READ_UNSEALED``; ``fedlib.runs.stored`` says why leaving it out is the default)."""

    def __init__(self, root: str | os.PathLike | None = None, reads=(), read_unsealed: bool | None = None):
        if root is None:
            root, reads = default_root(), default_reads()
        self.root = Path(root)
        self.reads = tuple(r for r in map(Path, reads) if r != self.root)
        if read_unsealed is not None and type(read_unsealed) is not bool:
            raise TypeError(f"read_unsealed={read_unsealed!r} must be True, False or None ({UNSEALED_ENV})")
        self.read_unsealed = read_unsealed_default() if read_unsealed is None else read_unsealed
        self._checked: dict[Path, tuple] = {}  # folder -> (file stamps, problem or None, unsealed)

    @staticmethod
    def of(store: "Store | str | os.PathLike | None", profile: str | None = None) -> "Store":
        """``store`` as a ``Store``: itself, the store at that folder (a str or path), or the default one for
        ``profile`` (None: ``default_root``). What every entry point's ``store`` argument takes (so a folder passed to
        ``fedlib.run`` works, and anything else is a TypeError naming it)."""
        if isinstance(store, Store):
            return store
        if store is None:
            return Store(default_root(profile), default_reads(profile))
        if isinstance(store, (str, os.PathLike)):
            return Store(store)
        raise TypeError(f"store={store!r} must be a Store, a folder (str or path) or None (the default store)")

    def deployed(self) -> "Store":
        """The store of this store's deployed runs (``root/_deployed``: ``python -m fedlib.flower local``'s default),
        each under the key of the config it ran, the key of its simulated twin in ``root``; its folder starts with
        "_", so this store's listings leave it out."""
        return Store(self.root / DEPLOYED)

    def ready(self) -> "Store":
        """The store, its folder made if needed; a ``StoreNotWritable`` (a ValueError) naming it if it cannot hold
        results (a file there, no permission). Asked before training, so that no run trains to find it cannot be
        stored (a file given as the store would fail with FileExistsError after training)."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = tempfile.NamedTemporaryFile(dir=self.root, prefix=".write-test-")
            probe.close()
        except OSError as e:
            what = "is not a folder" if self.root.exists() and not self.root.is_dir() else f"cannot be written ({e})"
            raise StoreNotWritable(
                f"the results store {self.root} {what}: pass another store or set FEDLIB_RESULTS"
            ) from None
        return self

    def path(self, cfg: RunConfig) -> Path:
        """The folder of ``cfg``'s run: under ``root`` if it is there, else under the first of ``reads`` that has it;
        where it would be written (under ``root``) if none has."""
        key = cfg.key()
        if not (self.root / key).is_dir():
            for r in self.reads:
                if (r / key).is_dir():
                    return r / key
        return self.root / key

    # how much training an interruption may lose at most; None: ``FEDLIB_CHECKPOINT_SECONDS``, else 300 s (read
    # where a run starts, so a grid's workers take it from the grid's environment; ``benchmarks.bench --table`` sets it
    # low to count the rounds a window trained)
    checkpoint_seconds: float | None = None

    def checkpoint(self, cfg: RunConfig) -> Checkpoint:
        """Where ``cfg``'s run in progress keeps its snapshot, taken every ``checkpoint_seconds``; inside the store
        (``root``): a ``_partial`` that is a link is not written or read through."""
        every = checkpoint_seconds() if self.checkpoint_seconds is None else self.checkpoint_seconds
        return Checkpoint(self.root / "_partial" / f"{cfg.key()}.pt", every, root=self.root)

    def has(self, cfg: RunConfig) -> bool:
        """Whether ``cfg`` has a stored result that passes its integrity check."""
        return self.problem(cfg) is None and (self.path(cfg) / "metrics.csv").exists()

    def problem(self, cfg: RunConfig) -> str | None:
        """What is wrong with ``cfg``'s stored run (None if it is sound or absent; an unsealed run is a problem
        unless the store reads them). Cached while its files are unchanged, so asking again costs a few ``stat``
        calls."""
        return self._check(cfg)[0]

    def state(self, cfg: RunConfig) -> str:
        """``cfg``'s stored run: "absent", "stored" (sound; or unsealed and read, ``read_unsealed``), "unsealed"
        (no manifest, every other check passed: left out) or "damaged" -- what ``status`` and the experiment
        summary count."""
        problem, unsealed = self._check(cfg)
        if problem is None:
            return "stored" if (self.path(cfg) / "metrics.csv").exists() else "absent"
        return "unsealed" if unsealed else "damaged"

    def _check(self, cfg: RunConfig) -> tuple[str | None, bool]:
        folder = self.path(cfg)
        if not folder.is_dir():
            return None, False
        stamp = tuple((s.st_size, s.st_mtime_ns) if (s := _stat(folder / f)) else None for f in (*FILES, MANIFEST))
        hit = self._checked.get(folder)
        if hit is not None and hit[0] == stamp:
            found, unsealed = hit[1:]
        else:
            try:
                read_run(folder, cfg.key(), unsealed=True)
                found, unsealed = None, not os.path.lexists(folder / MANIFEST)
            except DamagedRun as e:
                found, unsealed = str(e), False
            self._checked[folder] = (stamp, found, unsealed)
        if unsealed and not self.read_unsealed:
            return f"stored run {folder} (key {cfg.key()}) is unsealed: it has no {MANIFEST}", True
        return found, unsealed

    def reseal(self, cfg: RunConfig) -> Path:
        """Seal ``cfg``'s unsealed run (one without a manifest) after every check ``read_run`` makes, on the user's
        word: the checks cannot recompute every headline number (``fedlib.runs.stored``), so only someone who knows
        where the files came from should vouch for them. The manifest records ``"resealed"`` with the time, so that
        such a run stays distinguishable from one sealed by the run that wrote it. A ``DamagedRun`` if the run fails a
        check; a ValueError naming the folder if it is absent or already sealed."""
        folder = self.path(cfg)
        if not (folder / "metrics.csv").exists():
            raise ValueError(f"reseal: no stored run of key {cfg.key()} in {self.root}")
        if os.path.lexists(folder / MANIFEST):
            raise ValueError(f"reseal: {folder} already has its {MANIFEST}")
        read_run(folder, cfg.key(), unsealed=True)
        seal(folder, resealed=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        self._checked.pop(folder, None)
        return folder

    def _folders(self) -> list[Path]:
        """Every run folder (names not starting with "_"): ``root``'s, then those of ``reads`` that ``root`` lacks."""
        seen, out = set(), []
        for r in (self.root, *self.reads):
            if r.is_dir():
                for d in sorted(r.iterdir()):
                    if d.is_dir() and not d.name.startswith("_") and d.name not in seen:
                        seen.add(d.name)
                        out.append(d)
        return out

    def damaged(self) -> list[str]:
        """What is wrong with each damaged run folder in the store (one line each, naming the folder); an unsealed
        one is listed unless the store reads them."""
        out = []
        for d in self._folders():
            try:
                read_run(d, unsealed=self.read_unsealed)
            except DamagedRun as e:
                out.append(str(e))
        return out

    def save(self, cfg: RunConfig, result: RunResult, replace: bool = False) -> Path:
        """Write ``result`` under ``cfg``'s key; an existing result is kept unless ``replace`` (a forced re-run)."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / cfg.key()  # never into ``reads``
        tmp = Path(tempfile.mkdtemp(prefix=f"_tmp-{cfg.key()}-", dir=self.root))
        try:
            (tmp / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1, sort_keys=True))
            result.metrics.to_csv(tmp / "metrics.csv", index=False, float_format=METRICS_FORMAT)
            traces = {
                f"trace_{k}": (v.astype(np.float32) if v.dtype.kind == "f" else v) for k, v in result.traces.items()
            }
            # accuracies at float32: float16 would move a 95% accuracy by up to 0.02 points, the size of the
            # differences the tables print; the losses only feed curves, so float16 keeps them small
            with np.errstate(over="ignore"):  # a diverged run's huge losses become inf in float16
                loss16 = result.client_loss.astype(np.float16)
            np.savez_compressed(
                tmp / "clients.npz",
                acc=result.client_acc.astype(np.float32),
                loss=loss16,
                n=result.client_n,
                **traces,
            )
            (tmp / "meta.json").write_text(json.dumps(result.meta, indent=1, sort_keys=True, default=str))
            seal(tmp)  # last: the manifest
            _open_up(tmp)
            if final.exists() and not replace and self.problem(cfg) is not None:
                self._set_aside(final)  # a damaged or unsealed run: keep it for inspection, store the new one
            if final.exists() and replace:  # swap in the new folder, then drop the old one
                old = Path(tempfile.mkdtemp(prefix=f"_tmp-old-{cfg.key()}-", dir=self.root))
                os.replace(final, old / "run")
                os.replace(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            elif final.exists():  # a concurrent writer finished first: both hold the same pure result
                shutil.rmtree(tmp)
            else:
                try:
                    os.replace(tmp, final)
                except OSError:  # renaming onto a folder that is not empty: one stored between the check and here
                    if not (final / MANIFEST).exists():
                        raise
                    shutil.rmtree(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    def _set_aside(self, folder: Path) -> Path:
        dest = self.root / "_damaged" / f"{folder.name}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(folder, dest)
        warnings.warn(f"damaged run {folder} moved to {dest} (a new result takes its place)", DamagedRunWarning, 2)
        self._checked.pop(folder, None)
        return dest

    def meta(self, cfg: RunConfig) -> dict:
        """A stored run's metadata (versions, commit, device, wall time) without reading its metrics."""
        p = self.path(cfg) / "meta.json"
        try:
            meta = json.loads(_read_file(p, most=CONFIG_BYTES))
        except (ValueError, RecursionError) as e:
            raise DamagedRun(f"stored run {p.parent} (key {cfg.key()}): meta.json unreadable ({e})") from None
        if not isinstance(meta, dict):
            raise DamagedRun(f"stored run {p.parent} (key {cfg.key()}): meta.json is not a JSON object")
        return meta

    def load(self, cfg: RunConfig) -> RunResult | None:
        """``cfg``'s stored result, checked; None if there is none, or (with a ``DamagedRunWarning`` naming the
        folder and the fault) if it is damaged, or unsealed and the store does not read those -- a damaged run is
        never returned as a result."""
        p = self.path(cfg)
        if not p.is_dir():
            return None
        try:
            res = read_run(p, cfg.key(), unsealed=self.read_unsealed)
        except UnsealedRun as e:
            warnings.warn(str(e), DamagedRunWarning, stacklevel=2)
            return None
        except DamagedRun as e:
            warnings.warn(f"{e}; left out (the next grid run retrains it)", DamagedRunWarning, stacklevel=2)
            return None
        res.config = cfg
        return res

    def stored(self, cfgs):
        """(config, result) for each of ``cfgs`` that is in the store, in order; the others are skipped."""
        for cfg in cfgs:
            res = self.load(cfg)
            if res is not None:
                yield cfg, res

    def configs(self) -> list[RunConfig]:
        """Every stored run's config."""
        out = []
        for d in self._folders():
            if not (d / "metrics.csv").exists():
                continue
            try:
                out.append(from_dict(json.loads(_read_file(d / "config.json", most=CONFIG_BYTES))))
            except (ValueError, TypeError, RecursionError) as e:
                warnings.warn(f"stored run {d}: config.json unreadable ({e}); left out", DamagedRunWarning, 2)
        return out

    def clean_tmp(self) -> int:
        """Remove leftovers of interrupted writes; returns how many."""
        gone = 0
        if self.root.exists():
            for d in self.root.glob("_tmp-*"):
                shutil.rmtree(d, ignore_errors=True)
                gone += 1
        return gone
