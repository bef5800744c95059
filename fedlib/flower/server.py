"""The server's half of a round (``Server``): selection, the mini-batch plans, aggregation and the metrics rows, as
``fedlib.core.simulation.run_round`` runs them (see ``fedlib.flower.rounds``)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from fedlib.config.run import RunConfig
from fedlib.core import metrics as M
from fedlib.core.simulation import _stepped, finite
from fedlib.core.stages import DrawnLocal, Params, mix
from fedlib.core.state import COLUMNS, Round, init_state, moved, payload_bytes, probe_bytes, traveling
from fedlib.data.federated import Split
from fedlib.flower.evaluation import training_clients
from fedlib.flower.messages import STATE, RefusedUpdate, Report, Task, setup
from fedlib.flower.peers import PEERS, sent

# the probe step's messages: (round, candidates, global model's traveling tensors) -> client -> its reported loss
Probe = Callable[[int, np.ndarray, Params], dict[int, float]]


class Server:
    """The server's half of ``cfg``'s rounds over ``n_clients`` clients whose training-set sizes are ``sizes``.

    Holds what ``simulate``'s ``State`` holds that is the server's: the global model, the personalised models it made
    (``sent``) and whether each is waiting for its client (``fresh``), a method's server state (``extra``: FedAvgM's
    velocity), and the run's random streams (selection, mini-batch plans)."""

    def __init__(self, cfg: RunConfig, sizes: np.ndarray, input_shape: tuple[int, ...], n_classes: int) -> None:
        self.cfg, self.n = cfg, len(sizes)
        if self.n != training_clients(cfg):
            raise ValueError(f"fedlib.flower: {self.n} clients reported, the config trains {training_clients(cfg)} "
                             f"(n_clients={cfg.data.n_clients} less the new clients)")  # fmt: skip
        self.alg, model, self.schedule = setup(cfg, input_shape, n_classes, np.asarray(sizes))
        if self.alg.select is not None and self.alg.select.probes and self.alg.start != "global":
            raise ValueError(
                "fedlib.flower: selection that probes the clients' losses needs a method whose clients start from the "
                f"global model (algorithm={cfg.method.NAME!r} starts from start={self.alg.start!r}): its probe would "
                "carry each candidate's own model, not written yet"
            )
        self.model = model
        self.state = init_state(model, self.n)
        self.names = traveling(self.alg, self.state.global_params)
        # the clients' models are theirs: the server holds only the last uploads a method's clients download (peers)
        cp = self.state.client_params
        self.state.client_params = {k: cp[k] for k in self.names} if self.alg.peers is not None else {}
        self.picks: dict[int, np.ndarray] = {}  # this round's ``Peers.choose`` row of each training client
        self.rng = np.random.default_rng(cfg.seed)
        self.gen = torch.Generator().manual_seed(cfg.seed + 1)
        self.eval_gen = torch.Generator().manual_seed(cfg.seed + 2)  # the evaluation stream (``Run.eval_gen``)
        sizes_t = torch.as_tensor(np.asarray(sizes), dtype=torch.int64)
        self.layout = Split(torch.zeros(0), torch.zeros(0).long(), torch.cumsum(sizes_t, 0) - sizes_t, sizes_t)
        self.n_train = sizes_t.to(torch.float64)
        like = self.alg.exchange.like(self.state) if self.alg.exchange is not None else {}  # the method's rows
        self.shapes = {
            **{k: (tuple(self.state.global_params[k].shape), self.state.global_params[k].dtype) for k in self.names},
            **{STATE + k: (tuple(v.shape), v.dtype) for k, v in like.items()},
            **{PEERS + k: (tuple(v.shape), v.dtype) for k, v in (self.alg.peers.like(self.state).items()
                                                                  if self.alg.peers is not None else ())},
        }  # fmt: skip
        self.params = [n for n, _ in model.named_parameters() if n in self.names]  # no buffers
        self.uploads = 0
        self.probed = 0  # this round's probe bytes (``probe_bytes``), added to ``bytes_down`` by ``end``
        self.bytes_up = 0
        self.bytes_down = 0
        self.shared = (0, 0)  # (up, down) bytes of the data shared before round 1 (``gather``), counted in round 1
        self.rows: list[dict[str, Any]] = []
        self.client_acc: list[np.ndarray] = []
        self.client_loss: list[np.ndarray] = []
        self.refused: list[tuple[int, int, str]] = []  # (round, client, why)
        self.selected = np.zeros((cfg.rounds, self.n), dtype=bool)  # the 'selected' trace: who was aggregated
        self.test_sizes = np.zeros(self.n, dtype=np.int64)  # the clients' test rows (reported by the query)
        self.last: dict[int, Report] = {}  # each client's last evaluation report
        self.stale: list[tuple[int, int]] = []  # (round, client): evaluations missed, its last reading kept
        self.trained = np.zeros(self.n, dtype=np.int64)  # the round each client last trained in (0: none yet)
        self.t0 = time.perf_counter()

    # -- a round --------------------------------------------------------------------------------------------------
    def begin(self, t: int, probe: Probe | None = None) -> tuple[np.ndarray, list[Task]]:
        """Round t's selection and what each training client is sent: (selected, tasks). A selection stage that
        ``probes`` (Power-of-Choice) asks its candidates' losses through ``probe`` (see ``losses``)."""
        alg, state = self.alg, self.state
        assert alg.select is not None
        state.round = t
        self.probed = 0
        if alg.select.probes:
            if probe is None:
                raise ValueError("Server.begin: the selection probes the clients' losses; pass probe=")
            asked = probe
            refused: set[int] = set()
            losses = lambda c: self.losses(t, c, asked, refused)
            sel = np.asarray(alg.select.select(t, self.n, self.rng, losses=losses))  # type: ignore[call-arg]
            sel = sel[~np.isin(sel, list(refused))] if refused else sel
        else:
            sel = np.asarray(alg.select.select(t, self.n, self.rng))
        trainers = sel if alg.trains == "selected" else np.arange(self.n)
        tr = torch.as_tensor(trainers)
        before = torch.as_tensor(self.trained[trainers] > 0)  # trained in an earlier round
        self.trained[trainers] = t
        plan = self.schedule.plan(self.layout, tr, alg.batches_per_step, self.gen)
        own = (  # what the client procedure draws from the stream next (FedALA's s% samples), in the same order
            alg.local_update.draw_local(self.layout.sizes[tr], before, self.model, self.gen)
            if isinstance(alg.local_update, DrawnLocal)
            else None
        )
        chosen = set(sel.tolist())
        drawn = alg.share.draw(state, plan) if alg.share is not None else {}  # from the whole plan, as ``simulate``
        picks = alg.peers.choose(state, trainers, self.rng) if alg.peers is not None and len(trainers) else None
        self.picks = {} if picks is None else dict(zip(trainers.tolist(), picks))
        tasks = []
        for j, i in enumerate(trainers.tolist()):
            task = Task(t, i, i in chosen)
            if alg.start == "global":
                task.params = {k: state.global_params[k] for k in self.names}
            if bool(state.fresh[i]):  # a personalised model is waiting for it: delivered now
                task.personal = {k: state.sent[k][i] for k in self.names}
                state.fresh[i] = False
            task.index = plan.index[:, j] - self.layout.offsets[i]
            task.weight = None if plan.weight is None else plan.weight[:, j]
            task.active = None if plan.active is None else plan.active[:, j]
            if alg.exchange is not None:
                task.state = alg.exchange.down(state)
            task.drawn = {k: v[:, j] for k, v in drawn.items()}
            task.local_draws = None if own is None else own[j]
            if i in self.picks:
                task.peers = sent(state.client_params, self.names, self.picks[i])
            tasks.append(task)
        return sel, tasks

    def losses(self, t: int, candidates: np.ndarray, probe: Probe, refused: set[int]) -> np.ndarray:
        """The probe step: the global model's traveling tensors sent to each of ``candidates`` (``probe(t,
        candidates, params)`` -> client -> its loss on the model it would start from, for those that answered),
        counted in ``bytes_down`` as the simulation counts them (``probe_bytes``). A missing or non-finite loss is
        refused and logged in ``refused`` (the client is then no candidate: it ranks last and is dropped from the
        selection), so a client cannot claim the round by answering NaN, which the selection ranks highest."""
        params = {k: self.state.global_params[k] for k in self.names}
        self.probed += probe_bytes(self.alg, self.state, len(candidates))
        got = probe(t, np.asarray(candidates), params)
        out = np.empty(len(candidates))
        for j, i in enumerate(np.asarray(candidates).tolist()):
            v = got.get(i)
            if v is None or not np.isfinite(v):
                self.refused.append((t, i, "no probe answer" if v is None else f"probe loss {v} is not finite"))
                refused.add(i)
                out[j] = -np.inf
            else:
                out[j] = float(v)
        return out

    def gather(self, offers: dict[int, Params]) -> Params:
        """The data a method shares (``Algorithm.share``: FedMix's means) from every client's offer (client ->
        name -> (rows, ...)): concatenated in client order, as the simulation's one offer of all clients' rows, kept
        in the server's state (the round's draws index it) and returned, for the server to send every client.
        Counted in round 1 (``end``): the offers up, the set down to each of the N clients. A missing client, other
        names, other row shapes or dtypes, or a non-finite value is refused (``RefusedUpdate``): the run cannot
        start without every client's part."""
        assert self.alg.share is not None
        if sorted(offers) != list(range(self.n)):
            raise RefusedUpdate(f"shared data: offers from clients {sorted(offers)}, expected 0..{self.n - 1}")
        names = sorted(offers[0])
        for i, o in offers.items():
            if sorted(o) != names or not finite(o):
                raise RefusedUpdate(f"shared data: client {i} offers {sorted(o)} (expected {names}) or non-finite")
            for k in names:
                if o[k].shape[1:] != offers[0][k].shape[1:] or o[k].dtype != offers[0][k].dtype:
                    raise RefusedUpdate(f"shared data: client {i}'s {k} is {o[k].dtype} {tuple(o[k].shape)}, "
                                        f"unlike client 0's {offers[0][k].dtype} {tuple(offers[0][k].shape)}")  # fmt: skip
        shared = {k: torch.cat([offers[i][k] for i in range(self.n)]) for k in names}
        self.alg.share.receive(self.state, shared)
        self.shared = (payload_bytes(shared), self.n * payload_bytes(shared))
        return shared

    def check(self, t: int, client: int, params: Params) -> Params:
        """``params`` if it is a well-formed upload (the traveling names, their shapes and dtype, finite), else
        ``RefusedUpdate`` naming what is wrong; the caller logs it and leaves the upload out of the round."""
        if set(params) != set(self.shapes):
            missing, extra = sorted(set(self.shapes) - set(params)), sorted(set(params) - set(self.shapes))
            raise RefusedUpdate(f"round {t}, client {client}: names differ (missing {missing}, unexpected {extra})")
        for k, v in params.items():
            shape, dtype = self.shapes[k]
            if tuple(v.shape) != shape or v.dtype != dtype:
                raise RefusedUpdate(f"round {t}, client {client}: {k} is {v.dtype} {tuple(v.shape)}, "
                                    f"expected {dtype} {shape}")  # fmt: skip
        if not finite(params):
            raise RefusedUpdate(f"round {t}, client {client}: non-finite values (NaN or inf)")
        return params

    def end(self, t: int, selected: np.ndarray, uploads: dict[int, Params], sent_bytes: int) -> Round:
        """Aggregate round t's uploads (client -> traveling tensors) as ``run_round`` does. ``selected``: the round's
        selection; a selected client whose upload is missing (it failed, or its update was refused) is left out of
        the aggregation and the selection stage's observation, as if it had not been selected."""
        alg, state = self.alg, self.state
        assert alg.aggregate is not None and alg.select is not None
        sel = np.asarray([i for i in selected.tolist() if i in uploads], dtype=np.int64)
        up = {k: torch.stack([uploads[i][k] for i in sel.tolist()]) for k in self.names} if len(sel) else {}
        rows = {k: torch.stack([uploads[i][STATE + k] for i in sel.tolist()]) for k in self._rows()} if len(sel) else {}
        reported: Params = {}
        if alg.peers is not None and len(sel):  # their reports on their downloads, then their uploads are kept
            got = {k[len(PEERS) :]: torch.stack([uploads[i][k] for i in sel.tolist()]) for k in self.shapes
                   if k.startswith(PEERS)}  # fmt: skip
            alg.peers.absorb(state, sel, np.stack([self.picks[i] for i in sel.tolist()]), got)
            for k in self.names:
                state.client_params[k][torch.as_tensor(sel)] = up[k]
            reported = got
        if alg.exchange is not None and len(sel):  # the method's server state, from the uploads (SCAFFOLD's c)
            alg.exchange.absorb(state, {k: state.global_params[k] for k in self.names}, up, rows,
                                self.n_train[torch.as_tensor(sel)], self.params, self.n)  # fmt: skip
        mixing = alg.aggregate(up, self.n_train[torch.as_tensor(sel)], sel) if len(sel) else None
        if mixing is not None and mixing.to_global is not None:
            mean = {k: v[0] for k, v in mix(mixing.to_global.unsqueeze(0), up).items()}
            if alg.server_step is not None:
                mean.update(alg.server_step(*_stepped(self.model, state.global_params, mean), state))
            for k, v in mean.items():
                g = state.global_params[k]
                state.global_params[k] = v if mixing.beta == 1 else torch.lerp(g, v, mixing.beta)
        sel_t = torch.as_tensor(sel)
        if mixing is not None and mixing.to_personal is not None:
            for k, v in mix(moved(mixing.to_personal, "cpu"), up).items():
                state.sent[k][sel_t] = v
            state.fresh[sel_t] = True
        if alg.select.observes and len(sel):
            ref = {k: state.sent[k][sel_t] if mixing.to_personal is not None else state.global_params[k] for k in up}
            alg.select.observe(sel, up, ref)
        self.uploads += len(sel)
        self.selected[t - 1, sel] = True
        shared_up, shared_down = self.shared if t == 1 else (0, 0)  # the shared data: in round 1, as ``simulate``
        b_up = payload_bytes(up) + payload_bytes(rows) + payload_bytes(reported) + shared_up
        b_down = sent_bytes + self.probed + shared_down
        self.bytes_up += b_up
        self.bytes_down += b_down
        return Round(t, sel, mixing, up, bytes_up=b_up, bytes_down=b_down)  # type: ignore[arg-type]

    def state_dict(self) -> dict[str, Any]:
        """What the server holds between rounds (``fedlib.flower.checkpoint.server_state``)."""
        from fedlib.flower.checkpoint import server_state

        return server_state(self)

    def load_state_dict(self, d: dict[str, Any]) -> None:
        from fedlib.flower.checkpoint import load_server_state

        load_server_state(self, d)

    def _rows(self) -> list[str]:
        """The names of the method's rows in an upload (``Algorithm.exchange.like``), without ``STATE``."""
        return [k[len(STATE) :] for k in self.shapes if k.startswith(STATE)]

    def evaluation(self) -> Params:
        """What every client evaluates with: the global model's traveling tensors."""
        return {k: self.state.global_params[k] for k in self.names}

    def record(self, out: Round, reports: list[Report], held: dict[str, float] | None = None) -> dict[str, Any]:
        """Round ``out.t``'s row of metrics (``fedlib.core.state.COLUMNS``) from the clients' reports, made as
        ``fedlib.core.callbacks._evaluate_round`` makes it. A client that did not report (it failed, or left) counts
        with its last report (its accuracy when it was last heard from; before any, 0), and is listed in ``stale``:
        a stored run holds every client's accuracy every evaluated round, and its test_acc is recomputed from them.
        ``held``: the columns the server evaluated itself (``fedlib.flower.evaluation.Held``)."""
        acc, loss, cnt = (np.zeros(self.n) for _ in range(3))
        gc, gk = np.zeros(self.n), np.zeros(self.n)
        val = np.zeros((self.n, 3)) if any(r.val is not None for r in reports) else None
        got = {r.client for r in reports}
        for i in range(self.n):  # a client that did not report keeps its last reading (a stored run has one a round)
            if i not in got:
                last = self.last.get(i, Report(i, 0.0, 0.0, float(self.test_sizes[i])))
                reports = [*reports, dataclasses.replace(last, val=None)]
                self.stale.append((out.t, i))
        for r in reports:
            self.last[r.client] = r
            acc[r.client], loss[r.client], cnt[r.client] = r.correct, r.loss, r.rows
            gc[r.client], gk[r.client] = r.gm_correct, r.gm_rows
            if val is not None and r.val is not None:
                val[r.client] = r.val
        with np.errstate(invalid="ignore", divide="ignore"):
            a, lo = acc / cnt, loss / cnt
            row = {c: np.nan for c in COLUMNS}
            row.update({
                "round": out.t,
                "test_acc": M.weighted_mean(a, cnt),
                "test_acc_mean": M.unweighted_mean(a, cnt),
                "test_loss": float(loss.sum() / max(cnt.sum(), 1)),
                "selected": len(out.selected),
                "uploads": self.uploads,
                "bytes_up": self.bytes_up,
                "bytes_down": self.bytes_down,
            })  # fmt: skip
            if self.alg.report_global:
                row["gm_test_acc"], row["gm_test_acc_mean"] = (
                    M.weighted_mean(gc / gk, gk),
                    M.unweighted_mean(gc / gk, gk),
                )
            if val is not None:
                row["val_acc"] = M.weighted_mean(val[:, 0] / val[:, 2], val[:, 2])
                row["val_loss"] = float(val[:, 1].sum() / max(val[:, 2].sum(), 1))
        row.update(held or {})
        row["seconds"] = time.perf_counter() - self.t0
        self.rows.append(row)
        self.client_acc.append(a)
        self.client_loss.append(lo)
        return row

    def result(self, meta: dict[str, Any] | None = None):
        """The run as a ``RunResult`` (the layout ``Store.save`` writes: metrics, per-client accuracies, the
        'selected' trace), its meta ``meta`` plus the refused uploads."""
        import pandas as pd

        from fedlib.core.state import NEW_COLUMNS, RunResult

        extra = [c for c in NEW_COLUMNS if self.rows and c in self.rows[0]]
        return RunResult(
            pd.DataFrame(self.rows, columns=[*COLUMNS, *extra]),
            np.array(self.client_acc),
            np.array(self.client_loss),
            self.test_sizes,
            meta={**(meta or {}), "refused": [list(r) for r in self.refused], "stale": [list(r) for r in self.stale]},
            config=self.cfg,
            traces={"selected": self.selected},
        )
