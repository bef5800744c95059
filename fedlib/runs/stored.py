"""One stored run's folder, ``<root>/<key>/``, and how it is read: ``read_run`` checks it against its manifest,
its key, its config and meta, and its structure and numbers before anything is returned (``fedlib.runs.store``
describes the layout and the checks); ``seal`` writes the manifest last; ``as_stored`` rounds metrics as
metrics.csv keeps them. A damaged run raises ``DamagedRun``, naming what is wrong; a run without a manifest that
passes every other check raises ``UnsealedRun`` unless the reader opts in (``unsealed=True``).

Why a manifest-less run is left out rather than re-sealed on read: the checks recompute what can be recomputed
(the client means of the per-client accuracies, the test loss from the per-client losses, the selected clients
and uploads from the selection trace), but not every headline number has the arrays it comes from: AdaFL's
``global_test_acc`` is one number per round on the data set's own test set. A metrics.csv whose global accuracy was
raised by 50 points passes every structural check, so sealing it on read would turn an edit into a result with a
valid manifest. Only the user can vouch for such a run (``fedlib.runs.store.Store.reseal``, recorded in its
manifest), or read it as it is (``FEDLIB_READ_UNSEALED=1``), marked unsealed."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from fedlib.config.parts import DataConfig, ModelConfig
from fedlib.config.run import RunConfig, from_dict
from fedlib.core.state import COLUMNS, FAILURE_COLUMNS, NEW_COLUMNS, VAL_COLUMNS, RunResult
from fedlib.runs import nofollow

FILES = ("config.json", "metrics.csv", "clients.npz", "meta.json")


MANIFEST = "manifest.json"


METRICS_FORMAT = "%.6g"  # metrics.csv keeps 6 significant digits (``as_stored``)


MANIFEST_BYTES = 1 << 16  # a manifest names four files (~500 bytes): a larger one is not read whole


CONFIG_BYTES = 1 << 16  # a config is ~1 KB: ``Store.configs`` reads no larger one whole (``read_run`` checks sizes


# against the manifest)
LATER_COLUMNS = ("gm_test_acc", "gm_test_acc_mean", "bytes_up", "bytes_down")  # columns older stored runs lack


class DamagedRun(ValueError):
    """A stored run that fails its integrity check; the message names the folder and what is wrong."""


class UnsealedRun(DamagedRun):
    """A stored run without ``manifest.json`` that passes every structural and numeric check: nothing proves its
    files are the ones its run wrote (deleting the manifest turned the checksum off), so it is left out of tables
    unless the reader opts in (``read_run(..., unsealed=True)``, ``FEDLIB_READ_UNSEALED=1``)."""


class DamagedRunWarning(UserWarning):
    pass


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
    """The bytes of the stored file ``path``; ValueError saying why it cannot be. Opened without following a link
    and checked on the open file (``nofollow.read_regular``): a symlink (to /dev/zero, read forever, or to a file
    outside the store) or a fifo is refused, and a size other than ``size`` (its manifest's) or above ``most`` is
    refused before the file is read whole."""
    try:
        return nofollow.read_regular(path, most=most, size=size)
    except OSError as e:
        raise ValueError(f"cannot read {path.name} ({e.strerror or e})") from None


def read_run(folder: Path, key: str | None = None, unsealed: bool = False) -> RunResult:
    """A stored run read from ``folder`` and checked (manifest, key, structure, numbers); raises ``DamagedRun``
    naming the folder.

    ``key``: the folder's config key (default: its name); config.json must hash to it. ``unsealed``: return a run
    without ``manifest.json`` (after every other check; its ``meta["unsealed"]`` is True) instead of raising
    ``UnsealedRun``: see the module's docstring for why that is the reader's choice."""
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
    unknown = _unregistered(cfg)
    if unknown:  # a run of a user's model or data set: its key holds the registration's version or content hash
        raise bad(f"config.json names {unknown}, which this process has not registered (fedlib.register_model, "
                  "fedlib.register_dataset): register it again to read this run")  # fmt: skip
    # the folder's contents belong to its key: a run copied (or linked) under another run's key is not that run
    legacy = LEGACY_KEYS.get(key) == found
    if found != key and not legacy:
        raise bad(f"config.json is the config of key {found}, not of this folder's key")
    if folder.is_symlink():  # its files would be read from wherever the link points, outside the store
        raise bad(f"the folder is a symbolic link (to {os.readlink(folder)}): a run is read from its store only")
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
    protocols = (
        *(VAL_COLUMNS if cfg.data.val_frac > 0 else ()),
        *(NEW_COLUMNS if cfg.data.new_client_frac > 0 else ()),
    )
    lacking = [c for c in protocols if c not in metrics.columns]
    if lacking:  # the evaluation protocols its config holds out data for (``fedlib.data.holdout``)
        raise bad(f"metrics.csv lacks columns {', '.join(lacking)} (val_frac={cfg.data.val_frac}, "
                  f"new_client_frac={cfg.data.new_client_frac})")  # fmt: skip
    extra = [c for c in (*VAL_COLUMNS, *NEW_COLUMNS) if c in metrics.columns and c not in protocols]
    if extra:
        raise bad(f"metrics.csv has columns {', '.join(extra)}, which its config holds out no data for")
    fails = cfg.selection.dropout > 0 or cfg.selection.stragglers > 0  # clients fail (``fedlib.core.failures``)
    odd = [c for c in FAILURE_COLUMNS if (c in metrics.columns) != fails]
    if odd:
        raise bad(f"metrics.csv {'lacks' if fails else 'has'} columns {', '.join(odd)} (dropout="
                  f"{cfg.selection.dropout}, stragglers={cfg.selection.stragglers})")  # fmt: skip
    if "val_loss" in metrics.columns and (metrics["val_loss"].to_numpy(np.float64) < 0).any():
        raise bad("metrics.csv val_loss holds negative values (a cross-entropy is >= 0)")
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
    held = round(cfg.data.new_client_frac * cfg.data.n_clients)
    if held and (
        len(n) != cfg.data.n_clients - held or meta.get("new_clients") is None or len(meta["new_clients"]) != held
    ):
        raise bad(f"clients.npz holds {len(n)} clients and meta.json new_clients {meta.get('new_clients')!r}; "
                  f"new_client_frac={cfg.data.new_client_frac} of n_clients={cfg.data.n_clients} trains "
                  f"{cfg.data.n_clients - held} and holds out {held}")  # fmt: skip
    if acc.shape != (len(want), len(n)) or loss.shape != acc.shape:
        raise bad(f"clients.npz holds acc {acc.shape}, loss {loss.shape} for {len(want)} rounds x {len(n)} clients")
    if stored_acc.dtype.kind != "f":
        raise bad(f"clients.npz acc is {stored_acc.dtype}, not floating point")
    diverged = np.array(want) == diverged_at
    _check_accuracies(bad, metrics, acc, stored_acc, n, diverged)
    if fails:
        _check_failures(bad, metrics, traces, np.array(want))
    dropped = traces.get("dropped") if fails else None
    _check_derived(bad, metrics, loss, n, traces.get("selected"), np.array(want), diverged, dropped)
    if files is None:
        if not unsealed:
            raise UnsealedRun(
                f"stored run {folder} (key {key}) is unsealed: it has no {MANIFEST}, so nothing shows its files are "
                "the ones its run wrote; left out (FEDLIB_READ_UNSEALED=1 reads it, Store.reseal vouches for it)"
            )
        meta = {**meta, "unsealed": True}
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


def _check_derived(bad, metrics, loss, n, selected, rounds, diverged, dropped=None) -> None:
    """The other metrics that come from stored arrays, recomputed (``fedlib.core.callbacks._evaluate_round``):
    test_loss is the test-size-weighted mean of the per-client losses (0 where no client has test data), selected
    the clients marked in the selection trace in that round, uploads their running sum over every round (less the
    ``dropped`` ones, where clients fail: they uploaded nothing). The
    per-client losses are float16 (each off by at most 2**-11 relative), the metric %.6g: a genuine run's two
    differ by at most 4.9e-4 + 5e-6 relative; twice that is allowed (the committed runs use up to 0.46 of it). A
    round whose weighted loss overflows float16 (inf) is not checked, nor the round a run diverged at. The counts
    are exact. A run stored without the selection trace (the oldest) has only its losses checked."""
    v = metrics["test_loss"].to_numpy(np.float64)
    has = n > 0
    if not has.any():
        off = ~((v == 0) | diverged)
        what = "0 (no client has test data)"
        want = np.zeros_like(v)
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            want = np.where(has, loss, 0.0) @ n.astype(np.float64) / n.sum()
            tol = 2 * (np.finfo(np.float16).eps / 2 + 5e-6) * np.abs(want)
            off = ~((np.abs(v - want) <= tol) | ~np.isfinite(want) | diverged)
        what = "the weighted mean of its per-client losses"
    if off.any():
        i = int(np.flatnonzero(off)[0])
        raise bad(f"metrics.csv test_loss in round {rounds[i]} is {v[i]:.6g}, {what} gives {want[i]:.6g}")
    if selected is None:
        return
    if selected.dtype != np.bool_ or selected.ndim != 2 or selected.shape[0] < rounds[-1]:
        raise bad(f"clients.npz trace_selected is {selected.dtype} {selected.shape}, not rounds x clients booleans")
    per_round = selected.sum(1)
    uploaded = per_round if dropped is None else per_round - dropped.sum(1)
    for col, want_n in (("selected", per_round[rounds - 1]), ("uploads", np.cumsum(uploaded)[rounds - 1])):
        got = metrics[col].to_numpy(np.float64)
        off = got != want_n
        if off.any():
            i = int(np.flatnonzero(off)[0])
            raise bad(f"metrics.csv {col} in round {rounds[i]} is {got[i]:.6g}, its selection trace gives {want_n[i]}")


def _check_failures(bad, metrics, traces, rounds) -> None:
    """A run whose clients fail (``fedlib.core.failures``): its 'dropped' and 'straggled' traces are rounds x clients
    booleans marking selected clients only, none both, and its dropped and straggled columns count them; uploads
    (``_check_derived`` read the selected ones) are the selected less the dropped, summed over the rounds."""
    selected = traces.get("selected")
    marks = {k: traces.get(k) for k in ("dropped", "straggled")}
    for k, m in marks.items():
        if m is None or selected is None or m.dtype != np.bool_ or m.shape != selected.shape:
            raise bad(f"clients.npz trace_{k} is missing or not rounds x clients booleans like trace_selected")
        if (m & ~selected).any():
            raise bad(f"clients.npz trace_{k} marks clients its round did not select")
        got, want_n = metrics[k].to_numpy(np.float64), m.sum(1)[rounds - 1]
        if (got != want_n).any():
            i = int(np.flatnonzero(got != want_n)[0])
            raise bad(f"metrics.csv {k} in round {rounds[i]} is {got[i]:.6g}, its trace_{k} gives {want_n[i]}")
    if (marks["dropped"] & marks["straggled"]).any():
        raise bad("clients.npz marks a client both dropped and straggled in one round")


def _unregistered(cfg: RunConfig) -> str:
    """The model and data set ``cfg`` names that this process has not registered ("" when none)."""
    named = (("model", cfg.model.name, ModelConfig, "name"), ("dataset", cfg.data.dataset, DataConfig, "dataset"))
    missing = []
    for what, name, part, field_ in named:
        if name not in part.__dataclass_fields__[field_].metadata["choices"]:
            missing.append(f"{what}={name!r}")
    return " and ".join(missing)


def seal(folder: Path, resealed: str | None = None) -> None:
    """Write ``folder``'s manifest: each file's size and SHA-256 (what ``read_run`` checks), and its metrics rows;
    ``resealed``: the manifest of a run sealed after it was stored, by the user's word (``Store.reseal``), says so."""
    folder = Path(folder)
    files = {name: _digest((folder / name).read_bytes()) for name in FILES}
    rows = len(pd.read_csv(folder / "metrics.csv"))
    doc = {"format": 1, "rows": rows, "files": files, **({"resealed": resealed} if resealed else {})}
    (folder / MANIFEST).write_text(json.dumps(doc, indent=1, sort_keys=True))


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
