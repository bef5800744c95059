"""Snapshots of the Flower path's server: what a ``Server`` holds between rounds (``server_state`` /
``load_server_state``, behind ``Server.state_dict`` / ``load_state_dict``) and the sealed file the ServerApp writes
after every round and resumes from (``Snapshots``).

A server snapshot holds everything the server's next round depends on: the global model, the personalised models it
made (``sent``) and their ``fresh`` flags, the clients' last uploads it keeps for others to download (``client_params``:
FedFomo's; empty for other methods), the method's server state (``state.extra``: FedAvgM's velocity, FedMCSA's
attention), the selection stage's ``state_dict()`` (AdaFL's scores and their history; a dynamic fraction is a pure
function of the round and keeps nothing), the run's random streams (the selection's numpy Generator, the mini-batch
plans' and the evaluation's torch Generators), the counters (uploads, bytes) and what was recorded so far (the metrics
rows, per-client accuracies and losses, the 'selected' trace, refused uploads, stale evaluations, each client's last
report), and the round each client last trained in (``trained``: 0 for none yet, so also who trained before, for
whom FedALA's server draws a sample).

The file is the simulation's snapshot format (``fedlib.runs.checkpoint``): tensors and plain data saved with
``torch.save`` and read back with ``torch.load(weights_only=True)`` only after the seal (``fedlib.runs.seals``: a
SHA-256 written last, over the payload and the snapshot's identity -- the config's key, the rounds, the code that
wrote it; with ``FEDLIB_STORE_KEY`` also an HMAC) has been checked, so nothing read from disk runs code. It is
written to a temporary file and renamed over the last one, so a reader never sees half a snapshot. Unlike the
simulation, which sets a bad snapshot aside and restarts, the ServerApp refuses to start (``SnapshotError`` naming
the file): a deployment's operator decides whether to delete it and start over. A snapshot written by other code is
refused the same way unless ``FEDLIB_RESUME_OTHER_CODE=1``.

The clients' state is theirs (a ClientApp's ``context.state``, which lives as long as the Flower run). A method keeps
state on its clients (``keeps_client_state``) when they do not start from the global model, keep parameters local,
run a client procedure of their own (which may keep per-client state: Ditto's v_i), keep a personal model, or
exchange method state (SCAFFOLD's c_i). Resuming such a method needs every client's state of the round the snapshot
was taken after, so each client reports, in its answer to the query, the round it last trained in: the server
resumes only where each equals the snapshot's ``trained`` (the in-process engine's clients, whose context survives),
and otherwise refuses naming the client -- a new Flower run starts its ClientApps from their initial state, and
training on from it would give other numbers than the run it continues, silently. For the other methods a client's
state after a round is never read again (its start is the global model it is sent), so clients restarted from their
initial state resume the run exactly.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedlib.runs.checkpoint import _from_plain, _to_plain, resume_other_code
from fedlib.runs.seals import code_identity, other_code, read_sealed, store_key, write_sealed

FORMAT = "fedlib.flower.server/1"


class SnapshotError(ValueError):
    """A server snapshot that is not resumed: damaged, of another config or code, or needing clients' lost state."""


def server_state(server: Any) -> dict[str, Any]:
    """What ``server`` holds between rounds (tensors cloned, plain data copied): see the module's docstring."""
    s = server.state
    return {
        "round": s.round,
        "global": {k: v.detach().clone() for k, v in s.global_params.items()},
        "sent": {k: v.detach().clone() for k, v in s.sent.items()},
        "client_params": {k: v.detach().clone() for k, v in s.client_params.items()},
        "fresh": s.fresh.clone(),
        "extra": {k: {n: t.detach().clone() for n, t in dict(v).items()} for k, v in s.extra.items()},
        "select": server.alg.select.state_dict(),
        "rng": server.rng.bit_generator.state,
        "gen": server.gen.get_state(),
        "eval_gen": server.eval_gen.get_state(),
        "uploads": server.uploads,
        "bytes_up": server.bytes_up,
        "bytes_down": server.bytes_down,
        "rows": [dict(r) for r in server.rows],
        "client_acc": [a.copy() for a in server.client_acc],
        "client_loss": [a.copy() for a in server.client_loss],
        "selected": server.selected.copy(),
        "refused": [list(r) for r in server.refused],
        "stale": [list(r) for r in server.stale],
        "test_sizes": server.test_sizes.copy(),
        "last": {i: dataclasses.asdict(r) for i, r in server.last.items()},
        "trained": server.trained.copy(),
        "elapsed": time.perf_counter() - server.t0,
        "params": {k: [str(v.dtype), *v.shape] for k, v in s.global_params.items()},
    }


def load_server_state(server: Any, d: dict[str, Any]) -> None:
    """Put ``server`` where ``server_state`` found the server it was taken from."""
    from fedlib.flower.messages import Report

    params = {k: [str(v.dtype), *v.shape] for k, v in server.state.global_params.items()}
    if d["params"] != params:
        raise SnapshotError("its model's parameters (names, dtypes, shapes) are not this run's")
    s = server.state
    s.round = int(d["round"])
    s.global_params = {k: v.clone() for k, v in d["global"].items()}
    s.sent = {k: v.clone() for k, v in d["sent"].items()}
    s.client_params = {k: v.clone() for k, v in d["client_params"].items()}
    s.fresh = d["fresh"].clone()
    s.extra = {k: {n: t.clone() for n, t in v.items()} for k, v in d["extra"].items()}
    server.alg.select.load_state_dict(d["select"])
    server.rng.bit_generator.state = d["rng"]
    server.gen.set_state(d["gen"])
    server.eval_gen.set_state(d["eval_gen"])
    server.uploads, server.bytes_up, server.bytes_down = int(d["uploads"]), int(d["bytes_up"]), int(d["bytes_down"])
    server.rows = [dict(r) for r in d["rows"]]
    server.client_acc = [np.asarray(a, dtype=np.float64) for a in d["client_acc"]]
    server.client_loss = [np.asarray(a, dtype=np.float64) for a in d["client_loss"]]
    server.selected = np.asarray(d["selected"], dtype=bool).copy()
    server.refused = [(int(t), int(i), str(w)) for t, i, w in d["refused"]]
    server.stale = [(int(t), int(i)) for t, i in d["stale"]]
    server.test_sizes = np.asarray(d["test_sizes"], dtype=np.int64).copy()
    server.last = {
        int(i): Report(**{**r, "val": None if r["val"] is None else tuple(r["val"])}) for i, r in d["last"].items()
    }
    server.trained = np.asarray(d["trained"], dtype=np.int64).copy()
    server.t0 = time.perf_counter() - float(d["elapsed"])


def keeps_client_state(server: Any) -> bool:
    """Whether ``server``'s method keeps state on its clients that a later round reads (see the module's docstring)."""
    alg = server.alg
    local = set(server.names) != set(server.state.global_params)
    return bool(
        alg.start != "global" or local or alg.local_update is not None or alg.personal is not None
        or alg.exchange is not None or server.cfg.model.attention_init == "per_client"
    )  # fmt: skip


class Snapshots:
    """The sealed snapshot file ``path`` of the server of ``cfg`` (None: no snapshots): ``save`` after a round,
    ``resume`` when the server starts."""

    def __init__(self, path: str | os.PathLike | None, cfg: Any) -> None:
        self.path = None if path is None else Path(path)
        self.cfg = cfg
        self.secret = store_key(None)  # FEDLIB_STORE_KEY: with it, only a snapshot sealed under it is resumed

    def identity(self, t: int) -> dict[str, Any]:
        return {"format": FORMAT, "key": self.cfg.key(), "round": t, "rounds": self.cfg.rounds, "code": code_identity()}

    def save(self, server: Any) -> None:
        """Write the snapshot of ``server`` after its round ``server.state.round``: sealed, to a temporary file
        renamed over the last snapshot."""
        if self.path is None:
            return
        snap = _to_plain(server_state(server))
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            write_sealed(tmp, self.identity(snap["round"]), lambda f: torch.save(snap, f), self.secret)
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)

    def load(self) -> dict[str, Any] | None:
        """The snapshot's server state, None if there is no file; ``SnapshotError`` naming the file if it is damaged,
        of another config or written by other code (unless ``FEDLIB_RESUME_OTHER_CODE=1``)."""
        if self.path is None or not os.path.lexists(self.path):
            return None
        try:
            if self.path.is_symlink() or not self.path.is_file():
                raise ValueError("not a regular file")
            identity, payload = read_sealed(self.path, self.secret)
            if identity.get("format") != FORMAT:
                raise ValueError(f"not a fedlib.flower server snapshot (format {identity.get('format')!r})")
            if identity.get("key") != self.cfg.key() or identity.get("rounds") != self.cfg.rounds:
                raise ValueError(f"a snapshot of config {identity.get('key')!r}, not of this run's {self.cfg.key()!r}")
            changed = other_code(identity.get("code") if isinstance(identity.get("code"), dict) else {})
            if changed and not resume_other_code():
                raise ValueError(f"written by other code ({', '.join(changed)} differ; FEDLIB_RESUME_OTHER_CODE=1 "
                                 "resumes it)")  # fmt: skip
            snap = torch.load(payload, map_location="cpu", weights_only=True)
            if not isinstance(snap, dict) or snap.get("round") != identity.get("round"):
                raise ValueError("its contents are not the snapshot its seal describes")
        except Exception as e:  # noqa: BLE001  (any unreadable file: refuse it, never execute it)
            raise SnapshotError(f"snapshot {self.path} is not resumed: {e} (delete it to start the run over)") from e
        return _from_plain(snap)

    def resume(self, server: Any, client_rounds: dict[int, int] | None = None) -> int:
        """Load the snapshot (if any) into ``server``; the first round to run. ``client_rounds``: client -> the round
        it reports it last trained in, which must be the snapshot's where the method keeps client state."""
        snap = self.load()
        if snap is None:
            return 1
        try:
            load_server_state(server, snap)
        except (SnapshotError, KeyError, TypeError, ValueError) as e:
            raise SnapshotError(f"snapshot {self.path} is not resumed: {e} (delete it to start the run over)") from e
        if client_rounds is not None and keeps_client_state(server):
            for i, r in sorted(client_rounds.items()):
                if r != int(server.trained[i]):
                    raise SnapshotError(
                        f"snapshot {self.path} is not resumed: algorithm={server.cfg.method.NAME!r} keeps state on "
                        f"its clients, and client {i} holds its state of round {r}, not of round "
                        f"{int(server.trained[i])} as the snapshot needs (a new Flower run starts its ClientApps from "
                        "their initial state: their context.state lives as long as the run); delete it to start over"
                    )
        return server.state.round + 1
