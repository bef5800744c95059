"""Results store: each run's config hashes to a key; its results live, written atomically, under that key.

Layout of ``<root>/<key>/``:
    config.json   the full RunConfig
    metrics.csv   one row per evaluated round (``fedlib.core.state.COLUMNS``), a tidy table
    clients.npz   per-client test accuracy (float32) and loss (float16) per evaluated round, client test sizes,
                  and the per-round traces (``trace_selected``, ``trace_selection_scores``; see ``RunResult.traces``)
    meta.json     package versions, git commit, device, wall time, date (and ``resumed``: where a run was continued;
                  ``diverged_at``: the round a diverged run stopped at)
    manifest.json written last: each file's size and SHA-256, and the number of metrics rows

Runs in progress keep a snapshot in ``<root>/_partial/<key>.pt`` (``fedlib.runs.checkpoint.Checkpoint``; not
committed), removed once the run is stored.

A run's folder is written in a temporary sibling and renamed into place, so a reader (or an
interrupted grid) only ever sees complete results. The root is ``FEDLIB_RESULTS``, else the project's ``results/``
folder for the paper profile (and for a config run on its own, which has no profile) and ``results/_explore/``
(git-ignored) for the exploring profiles (``default_root``). Folders and files get the permissions the umask allows
(a shared store is readable by the group or others when the umask says so).

Integrity: every read checks a run against its manifest (sizes, checked before a file is read, and hashes), its
key (config.json must hash to the folder's key, so a run copied or linked under another key is not that run; the
one committed run stored under an older schema is pinned by name, ``LEGACY_KEYS``), its config (the fields reading needs)
and meta (``diverged_at`` a round of the run), and its structure and numbers: regular files only (no fifo or
device), the metrics rows its config's rounds and ``eval_every`` give, per-client arrays of matching shape and
non-negative integer test sizes, every accuracy in [0, 1] and NaN only where a run leaves it undefined, and
test_acc / test_acc_mean the weighted / unweighted means of the per-client accuracies (to their stored rounding).
So a truncated, edited, swapped or half-copied run is never shown as a result: ``load`` warns naming its path, key
and what is wrong and returns None, ``has`` is False (the next grid retrains it) and ``save`` moves the damaged
folder to ``_damaged/`` (kept for inspection) before storing the new one. A run without a manifest (the oldest
committed ones) gets every check but the hashes. Nothing is unpickled: JSON, CSV, and ``np.load(allow_pickle=False)``.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import shutil
import stat
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from fedlib.config.run import RunConfig, from_dict
from fedlib.core.state import COLUMNS, RunResult
from fedlib.runs.checkpoint import Checkpoint

FILES = ("config.json", "metrics.csv", "clients.npz", "meta.json")
MANIFEST = "manifest.json"
METRICS_FORMAT = "%.6g"  # metrics.csv keeps 6 significant digits (``as_stored``)
MANIFEST_BYTES = 1 << 16  # a manifest names four files (~500 bytes): a larger one is not read whole
CONFIG_BYTES = 1 << 16  # a config is ~1 KB: ``Store.configs`` reads no larger one whole (``read_run`` checks sizes
# against the manifest)
LATER_COLUMNS = ("gm_test_acc", "gm_test_acc_mean")  # metrics columns the oldest stored runs lack


class DamagedRun(ValueError):
    """A stored run that fails its integrity check; the message names the folder and what is wrong."""


class DamagedRunWarning(UserWarning):
    pass


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


def _digest(data: bytes) -> dict:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def expected_rounds(cfg: RunConfig, diverged_at: int | None = None) -> list[int]:
    """The rounds a run of ``cfg`` evaluates (every ``eval_every`` and the last; a diverged run up to its round)."""
    last = diverged_at if diverged_at is not None else cfg.rounds
    return [t for t in range(1, last + 1) if t % cfg.eval_every == 0 or t == last]


# Folder key -> the key its config.json hashes to now, for the one committed run whose config no longer hashes to its
# folder: stored before domain_percent applied only to feature-shift data, its config says mnist with
# domain_percent=0.1 (a field the run never read, refused by ``validate()`` now) and its key was computed by the
# schema of that time; adafl_fig3's FedAvg-0.1 cell reads it by that key (tests/test_store_keys.py ORPHANS). Pinned
# as a pair, so that this config is accepted under this folder name only, and no other mismatch passes.
LEGACY_KEYS = {"f3e86d78f34c24f9": "80b02409beb5ab9f"}
ACC_COLUMNS = ("test_acc", "test_acc_mean")  # the metrics recomputed from the per-client accuracies


def _read_file(path: Path, size: int | None = None, most: int | None = None) -> bytes:
    """The bytes of the stored file ``path``; ValueError saying why it cannot be. Stat first: a symlink to /dev/zero
    or a fifo would be read forever, and a size other than ``size`` (its manifest's) or above ``most`` is refused
    before the file is read whole."""
    name = path.name
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{name} is not a regular file")
        if size is not None and st.st_size != size:
            raise ValueError(f"{name} has {st.st_size} bytes, its manifest says {size}: changed after it was stored")
        if most is not None and st.st_size > most:
            raise ValueError(f"{name} has {st.st_size} bytes, more than a {name} holds ({most})")
        return path.read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read {name} ({e.strerror or e})") from None


def read_run(folder: Path, key: str | None = None) -> RunResult:
    """A stored run read from ``folder`` and checked (manifest, key, structure, accuracies); raises ``DamagedRun``
    naming the folder.

    ``key``: the folder's config key (default: its name); config.json must hash to it."""
    folder = Path(folder)
    key = key or folder.name

    def bad(what: str) -> DamagedRun:
        return DamagedRun(f"stored run {folder} (key {key}) is damaged: {what}")

    def read(name: str, size: int | None = None, most: int | None = None) -> bytes:
        try:
            return _read_file(folder / name, size, most)
        except ValueError as e:
            raise bad(str(e)) from None

    files = None
    if os.path.lexists(folder / MANIFEST):
        raw = read(MANIFEST, most=MANIFEST_BYTES)
        try:
            files = json.loads(raw)["files"]
        except (ValueError, KeyError, TypeError, RecursionError) as e:  # RecursionError: "[[[[..." nested deep
            raise bad(f"{MANIFEST} unreadable ({type(e).__name__})") from None
        if not isinstance(files, dict) or not all(
            isinstance(e := files.get(name), dict) and type(e.get("bytes")) is int and isinstance(e.get("sha256"), str)
            for name in FILES
        ):
            raise bad(f"{MANIFEST} does not give each of {', '.join(FILES)} as {{bytes, sha256}}")
    blobs = {name: read(name, files[name]["bytes"] if files else None) for name in FILES}
    for name in FILES if files else ():
        if files[name] != _digest(blobs[name]):
            raise bad(f"{name} differs from its manifest entry (size or SHA-256): changed after it was stored")
    try:
        cfg_dict, meta = json.loads(blobs["config.json"]), json.loads(blobs["meta.json"])
        if not isinstance(cfg_dict, dict) or not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except (ValueError, RecursionError) as e:
        raise bad(f"config.json or meta.json is not a JSON object ({e})") from None
    try:
        cfg = from_dict(cfg_dict)
        found = cfg.key()
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise bad(f"config.json is not a valid config ({e})") from None
    # the folder's contents belong to its key: a run copied (or linked) under another run's key is not that run
    legacy = LEGACY_KEYS.get(key) == found
    if found != key and not legacy:
        raise bad(f"config.json is the config of key {found}, not of this folder's key")
    # not ``validate()``: a run stored under its version's rules would read as damaged (and be retrained, its folder set
    # aside) once a later version tightens them; its key already ties config.json to the run. What reading needs:
    for field in ("rounds", "eval_every"):
        if not (type(v := cfg_dict.get(field)) is int and v >= 1):
            raise bad(f"config.json {field}={v!r} is not an integer >= 1")
    diverged_at = meta.get("diverged_at")
    if diverged_at is not None and not (type(diverged_at) is int and 1 <= diverged_at <= cfg.rounds):
        raise bad(f"meta.json diverged_at={diverged_at!r} is not a round in 1..{cfg.rounds}")
    try:
        metrics = pd.read_csv(io.BytesIO(blobs["metrics.csv"]))
    except (ValueError, pd.errors.ParserError) as e:  # EmptyDataError is a ValueError
        raise bad(f"metrics.csv unreadable ({type(e).__name__}: {e})") from None
    lacking = [c for c in COLUMNS if c not in metrics.columns and c not in LATER_COLUMNS]
    if lacking:
        raise bad(f"metrics.csv lacks columns {', '.join(lacking)}")
    want = expected_rounds(cfg, diverged_at)
    if metrics["round"].tolist() != want:
        got = metrics["round"].tolist()
        raise bad(
            f"metrics.csv has rounds {_span(got)}, expected {_span(want)} (rounds={cfg.rounds}, "
            f"eval_every={cfg.eval_every}): truncated or edited"
        )
    try:
        with np.load(io.BytesIO(blobs["clients.npz"]), allow_pickle=False) as z:
            stored_acc, loss, n = z["acc"], z["loss"].astype(np.float64), z["n"]
            acc = stored_acc.astype(np.float64)
            traces = {k[len("trace_") :]: z[k] for k in z.files if k.startswith("trace_")}
    except Exception as e:  # noqa: BLE001  (zip, npy and key errors alike: the file is damaged)
        raise bad(f"clients.npz unreadable ({type(e).__name__}: {str(e)[:100]})") from None
    if n.ndim != 1 or n.dtype.kind not in "iu" or (n < 0).any():
        raise bad(f"clients.npz n (client test sizes) is not a list of non-negative integers ({n.dtype} {n.shape})")
    if acc.shape != (len(want), len(n)) or loss.shape != acc.shape:
        raise bad(f"clients.npz holds acc {acc.shape}, loss {loss.shape} for {len(want)} rounds x {len(n)} clients")
    if stored_acc.dtype.kind != "f":
        raise bad(f"clients.npz acc is {stored_acc.dtype}, not floating point")
    _check_accuracies(bad, metrics, acc, stored_acc, n, np.array(want) == diverged_at)
    return RunResult(metrics, acc, loss, n, meta, cfg, traces=traces)


def _check_accuracies(bad, metrics, acc, stored, n, diverged) -> None:
    """Accuracies are in [0, 1], NaN only where a run leaves them undefined (a client without test data; every
    accuracy of the round a diverged run stopped at; metrics columns a run does not compute, such as train_acc
    without ``eval_train``), and test_acc / test_acc_mean are the weighted / unweighted means of the per-client
    accuracies (``fedlib.core.callbacks._evaluate_round``): what holds for every genuine run, manifest or not."""
    has = n > 0
    if acc.size and not 0 <= acc.min() <= acc.max() <= 1:  # a NaN fails this too: then see where each one is
        outside = ~((acc >= 0) & (acc <= 1))
        if (~np.isnan(acc[outside]) | (has & ~diverged[:, None])[outside]).any():
            raise bad("clients.npz acc holds values outside [0, 1] (or NaN for a client with test data)")
    cols = [i for i, c in enumerate(metrics.columns) if "acc" in c]
    try:
        table = metrics.to_numpy(np.float64)  # the whole table at once: column by column takes several times as long
    except (ValueError, TypeError):
        raise bad("metrics.csv holds values that are not numbers") from None
    if ((table[:, cols] < 0) | (table[:, cols] > 1)).any():
        raise bad(f"metrics.csv {', '.join(metrics.columns[cols])}: values outside [0, 1]")
    if not has.any():  # no client test data (AdaFL's setting): no client mean either
        means = {c: np.full(len(acc), np.nan) for c in ACC_COLUMNS}
    else:
        a = acc if has.all() else np.where(has, acc, 0.0)
        w = n.astype(np.float64)
        means = {"test_acc": a @ w / w.sum(), "test_acc_mean": acc[:, has].mean(1)}
    # the per-client accuracies were rounded to their stored dtype (float16 in the oldest stored runs, float32 in
    # the others: each off by at most eps/2 of at most 1), the metrics to %.6g (relative 5e-6 of at most 1): a genuine
    # run's two differ by at most eps/2 + 5e-6; twice that is allowed (the committed runs use up to 0.24 of it), so
    # that no genuine run is ever read as damaged, and an edit of a tenth of a point (float16) is still caught
    tol = np.finfo(stored.dtype).eps + 1e-5
    for c, mean in means.items():
        v = table[:, metrics.columns.get_loc(c)]
        with np.errstate(invalid="ignore"):
            off = ~((np.abs(v - mean) <= tol) | (np.isnan(v) & np.isnan(mean)) | diverged)
        if off.any():
            t, got, want = int(metrics["round"].to_numpy()[off][0]), v[off][0], mean[off][0]
            raise bad(f"metrics.csv {c} in round {t} is {got:.6g}, its per-client accuracies give {want:.6g}")


def seal(folder: Path) -> None:
    """Write ``folder``'s manifest: each file's size and SHA-256 (what ``read_run`` checks), and its metrics rows."""
    folder = Path(folder)
    files = {name: _digest((folder / name).read_bytes()) for name in FILES}
    rows = len(pd.read_csv(folder / "metrics.csv"))
    (folder / MANIFEST).write_text(json.dumps({"format": 1, "rows": rows, "files": files}, indent=1, sort_keys=True))


def as_stored(metrics: pd.DataFrame) -> pd.DataFrame:
    """``metrics`` as a ``Store.load`` of it reads them: through metrics.csv's text, at its 6 significant digits
    (``fedlib.experiments.verify`` compares a run trained again with its stored one so)."""
    return pd.read_csv(io.StringIO(metrics.to_csv(index=False, float_format=METRICS_FORMAT)))


def _span(rounds: list) -> str:
    return f"[{rounds[0]}..{rounds[-1]}] ({len(rounds)})" if len(rounds) > 3 else str(rounds)


def _stat(p: Path):
    try:
        return p.stat()
    except OSError:
        return None


EXPLORE = "_explore"  # under the committed store, git-ignored: runs of the exploring profiles


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
    without a profile (``default_root``, ``default_reads``)."""

    def __init__(self, root: str | os.PathLike | None = None, reads=()):
        if root is None:
            root, reads = default_root(), default_reads()
        self.root = Path(root)
        self.reads = tuple(r for r in map(Path, reads) if r != self.root)
        self._checked: dict[Path, tuple] = {}  # folder -> (file stamps, problem or None)

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
        """Where ``cfg``'s run in progress keeps its snapshot, taken every ``checkpoint_seconds``."""
        every = checkpoint_seconds() if self.checkpoint_seconds is None else self.checkpoint_seconds
        return Checkpoint(self.root / "_partial" / f"{cfg.key()}.pt", every)

    def has(self, cfg: RunConfig) -> bool:
        """Whether ``cfg`` has a stored result that passes its integrity check."""
        return self.problem(cfg) is None and (self.path(cfg) / "metrics.csv").exists()

    def problem(self, cfg: RunConfig) -> str | None:
        """What is wrong with ``cfg``'s stored run (None if it is sound or absent). Cached while its files are
        unchanged, so asking again costs a few ``stat`` calls."""
        folder = self.path(cfg)
        if not folder.is_dir():
            return None
        stamp = tuple((s.st_size, s.st_mtime_ns) if (s := _stat(folder / f)) else None for f in (*FILES, MANIFEST))
        hit = self._checked.get(folder)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        try:
            read_run(folder, cfg.key())
            found = None
        except DamagedRun as e:
            found = str(e)
        self._checked[folder] = (stamp, found)
        return found

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
        """What is wrong with each damaged run folder in the store (one line each, naming the folder)."""
        out = []
        for d in self._folders():
            try:
                read_run(d)
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
                self._set_aside(final)  # a damaged run: keep it for inspection, store the new one
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
            meta = json.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise DamagedRun(f"stored run {p.parent} (key {cfg.key()}): meta.json unreadable ({e})") from None
        if not isinstance(meta, dict):
            raise DamagedRun(f"stored run {p.parent} (key {cfg.key()}): meta.json is not a JSON object")
        return meta

    def load(self, cfg: RunConfig) -> RunResult | None:
        """``cfg``'s stored result, checked; None if there is none, or (with a ``DamagedRunWarning`` naming the
        folder and the fault) if it is damaged -- a damaged run is never returned as a result."""
        p = self.path(cfg)
        if not p.is_dir():
            return None
        try:
            res = read_run(p, cfg.key())
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
