"""The two halves of a federated round, as a server and a client that exchange messages: what ``fedlib.flower``'s
Flower apps run, with no Flower in it (so it is tested on its own, and the apps only carry its messages).

``simulate`` (``fedlib.core.simulation.run_round``) runs a round on one machine with every client's state in one
``State``. Here the same stages of the same ``Algorithm`` (``build_algorithm(cfg)``) are split where the messages
go: the ``Server`` selects (``alg.select``, AdaFL's scores included), draws the round's mini-batch plan, sends each
training client what it starts from, aggregates the uploads (``alg.aggregate``, ``server_step``, the per-client
mixtures of FedMCSA and HeurFedAMP) and lets the selection stage observe; a ``Client`` holds its own rows of the
state (its model, the last personalised model it received, a method's per-client state such as Ditto's v_i) and
trains with the run's executor and the method's client procedure (``alg.local_update``). Parameters a method keeps
local (FedBN's ``bn``, pFedLA's ``attn``) live only in the client's state: they are in no message.

Choices that keep a Flower run equal to ``simulate`` (tested in float64 to 1e-10):

- the server draws every round's mini-batch plan from the run's stream (``Schedule.plan``, as ``simulate`` does)
  and sends each client its column, as row numbers into the client's own training rows; a real deployment may let
  clients draw their own batches (same method, other batches);
- the server learns the clients' training-set sizes first (``Client.sizes``): FedAvg's weights and AdaFL's initial
  scores need them;
- a personalised model W_i is sent when client i next trains (``bytes_down`` counts it then), as ``simulate``'s
  ``fresh`` flag says it arrives;
- evaluation: the server sends every client the global model's traveling tensors and each reports its test counts;
  the server makes the round's row of metrics from them as ``simulate``'s ``Evaluation`` does. Evaluation messages
  are not counted in the bytes (they measure the method, they are not part of it).

Not supported (refused when the server is built, naming why): selection that probes clients' losses
(Power-of-Choice: a query round per round, not written yet), methods whose server stages read clients' state
(SCAFFOLD's control variates, FedMix's shared means: ``UNSUPPORTED``), ``before_eval`` stages (Per-FedAvg's
adaptation draws from one run-wide stream), data sets with a global test set or held-out new clients.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedlib.algorithms import build_algorithm
from fedlib.config.run import RunConfig
from fedlib.core import metrics as M
from fedlib.core.simulation import _stepped, finite
from fedlib.core.stages import ClientWork, Params, keep_local, mix
from fedlib.core.state import (
    COLUMNS,
    Round,
    Schedule,
    evaluation_params,
    init_state,
    moved,
    payload_bytes,
    start_models,
    traveling,
)
from fedlib.data.federated import BatchPlan, Split
from fedlib.executors import make_executor
from fedlib.models.groups import param_groups
from fedlib.models.local_attention import per_client_attention
from fedlib.models.registry import build_model

# methods whose client procedure or server stages read other clients' state or server state the clients need
UNSUPPORTED = {
    "scaffold": "its clients need the server's control variate c and upload c_i: a second message, not written yet",
    "fedmix": "its clients need every client's shared batch means: a broadcast, not written yet",
    "perfedavg": "its evaluation adapts the global model with mini-batches of one run-wide stream (before_eval)",
    "perfedavg-hf": "its evaluation adapts the global model with mini-batches of one run-wide stream (before_eval)",
    "local": "it has no server: every client trains alone and uploads nothing, so there is nothing to deploy",
    "feddyn": "its server step reads what the client procedure adds to the run's state (h's update): a second "
    "message, not written yet",
    "fednova": "its server step reads each client's normalised correction from the run's state: a second message, "
    "not written yet",
    "apfl": "its personal model mixes the client's v_i with the current global model at evaluation: not wired to "
    "the client's evaluate yet",
    "fedbabu": "it fine-tunes every client before evaluation: not wired to the client's evaluate yet",
    "fedrod": "it evaluates the sum of the generic and the personal head: not wired to the client's evaluate yet",
    "fedala": "its clients draw their s% samples from the run's one mini-batch stream: a client-side stream, not "
    "written yet",
    "fedfomo": "its clients download other clients' models and need held-out rows and the run's random stream: not "
    "written yet",
}


class RefusedUpdate(ValueError):
    """An upload the server will not aggregate (wrong names, shapes or dtype, or a non-finite value)."""


def setup(cfg: RunConfig, input_shape: tuple[int, ...], n_classes: int, n_samples: np.ndarray | None):
    """(algorithm, initial model, schedule) of ``cfg``, as ``fedlib.runs.train`` builds them: both halves build the
    same ones from the config, so neither sends the other code."""
    cfg.validate()
    if cfg.method.NAME in UNSUPPORTED:
        raise ValueError(
            f"fedlib.flower: algorithm={cfg.method.NAME!r} is not supported: {UNSUPPORTED[cfg.method.NAME]}"
        )
    if cfg.selection.dropout or cfg.selection.stragglers:
        raise ValueError(
            "fedlib.flower: dropout and stragglers simulate failing clients; in a deployment clients fail on their own "
            "(a client that does not answer is left out of the round): set dropout=0 and stragglers=0"
        )
    dtype, m = getattr(torch, cfg.dtype), cfg.model
    model = build_model(m.name, input_shape, n_classes, m.hidden, seed=cfg.seed, dtype=dtype, attention=m.attention)
    alg = build_algorithm(cfg, n_samples=n_samples)
    if alg.before_eval is not None:
        raise ValueError(f"fedlib.flower: algorithm={cfg.method.NAME!r} has a before_eval stage, not supported")
    if alg.local_groups:  # as ``simulate``: declared groups -> which parameters stay on the clients
        alg.shared = keep_local(param_groups(model), tuple(alg.local_groups))
    lo = cfg.local
    return alg, model, Schedule(lo.local_steps, lo.local_epochs, lo.batch_size, lo.lr_decay)


@dataclass
class Task:
    """What the server sends one training client in round t: whether it uploads (``upload``: it was selected; with
    ``trains='all'`` the others train without uploading), the tensors it starts from (``params``: the global model's
    traveling tensors, and/or ``personal``: the W_i waiting for it) and its mini-batch plan (``index`` (steps, B):
    rows of its own training data; ``weight``, ``active``: epoch padding, or None)."""

    t: int
    client: int
    upload: bool
    params: Params = field(default_factory=dict)
    personal: Params = field(default_factory=dict)
    index: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    active: torch.Tensor | None = None

    def bytes_down(self) -> int:
        return payload_bytes(self.params) + payload_bytes(self.personal)


@dataclass
class Report:
    """A client's test counts for the round's metrics row (``correct``, ``loss`` sum, ``rows``), the global model's
    (``gm_*``, for methods that report it beside the personal ones) and its validation counts, where it has some."""

    client: int
    correct: float
    loss: float
    rows: float
    gm_correct: float = np.nan
    gm_rows: float = np.nan
    val: tuple[float, float, float] | None = None


class Server:
    """The server's half of ``cfg``'s rounds over ``n_clients`` clients whose training-set sizes are ``sizes``.

    Holds what ``simulate``'s ``State`` holds that is the server's: the global model, the personalised models it made
    (``sent``) and whether each is waiting for its client (``fresh``), a method's server state (``extra``: FedAvgM's
    velocity), and the run's random streams (selection, mini-batch plans)."""

    def __init__(self, cfg: RunConfig, sizes: np.ndarray, input_shape: tuple[int, ...], n_classes: int) -> None:
        self.cfg, self.n = cfg, len(sizes)
        if self.n != cfg.data.n_clients:
            raise ValueError(f"fedlib.flower: {self.n} clients reported, the config has n_clients={cfg.data.n_clients}")
        self.alg, model, self.schedule = setup(cfg, input_shape, n_classes, np.asarray(sizes))
        if self.alg.select is not None and self.alg.select.probes:
            raise ValueError(
                "fedlib.flower: selection that probes the clients' losses (Power-of-Choice) is not supported"
            )
        self.model = model
        self.state = init_state(model, self.n)
        self.state.client_params = {}  # the clients' models are theirs: the server never holds them
        self.names = traveling(self.alg, self.state.global_params)
        self.rng = np.random.default_rng(cfg.seed)
        self.gen = torch.Generator().manual_seed(cfg.seed + 1)
        sizes_t = torch.as_tensor(np.asarray(sizes), dtype=torch.int64)
        self.layout = Split(torch.zeros(0), torch.zeros(0).long(), torch.cumsum(sizes_t, 0) - sizes_t, sizes_t)
        self.n_train = sizes_t.to(torch.float64)
        self.shapes = {
            k: (tuple(self.state.global_params[k].shape), self.state.global_params[k].dtype) for k in self.names
        }
        self.uploads = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.rows: list[dict[str, Any]] = []
        self.client_acc: list[np.ndarray] = []
        self.client_loss: list[np.ndarray] = []
        self.refused: list[tuple[int, int, str]] = []  # (round, client, why)
        self.selected = np.zeros((cfg.rounds, self.n), dtype=bool)  # the 'selected' trace: who was aggregated
        self.test_sizes = np.zeros(self.n, dtype=np.int64)  # the clients' test rows (reported by the query)
        self.last: dict[int, Report] = {}  # each client's last evaluation report
        self.stale: list[tuple[int, int]] = []  # (round, client): evaluations missed, its last reading kept
        self.t0 = time.perf_counter()

    # -- a round --------------------------------------------------------------------------------------------------
    def begin(self, t: int) -> tuple[np.ndarray, list[Task]]:
        """Round t's selection and what each training client is sent: (selected, tasks)."""
        alg, state = self.alg, self.state
        assert alg.select is not None
        state.round = t
        sel = np.asarray(alg.select.select(t, self.n, self.rng))
        trainers = sel if alg.trains == "selected" else np.arange(self.n)
        tr = torch.as_tensor(trainers)
        plan = self.schedule.plan(self.layout, tr, alg.batches_per_step, self.gen)
        chosen = set(sel.tolist())
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
            tasks.append(task)
        return sel, tasks

    def check(self, t: int, client: int, params: Params) -> Params:
        """``params`` if it is a well-formed upload (the traveling names, their shapes and dtype, finite), else
        ``RefusedUpdate`` naming what is wrong; the caller logs it and leaves the upload out of the round."""
        if set(params) != set(self.names):
            missing, extra = sorted(set(self.names) - set(params)), sorted(set(params) - set(self.names))
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
        self.bytes_up += payload_bytes(up)
        self.bytes_down += sent_bytes
        return Round(t, sel, mixing, up, bytes_up=payload_bytes(up), bytes_down=sent_bytes)  # type: ignore[arg-type]

    def evaluation(self) -> Params:
        """What every client evaluates with: the global model's traveling tensors."""
        return {k: self.state.global_params[k] for k in self.names}

    def record(self, out: Round, reports: list[Report]) -> dict[str, Any]:
        """Round ``out.t``'s row of metrics (``fedlib.core.state.COLUMNS``) from the clients' reports, made as
        ``fedlib.core.callbacks._evaluate_round`` makes it. A client that did not report (it failed, or left) counts
        with its last report (its accuracy when it was last heard from; before any, 0), and is listed in ``stale``:
        a stored run holds every client's accuracy every evaluated round, and its test_acc is recomputed from them."""
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
        row["seconds"] = time.perf_counter() - self.t0
        self.rows.append(row)
        self.client_acc.append(a)
        self.client_loss.append(lo)
        return row

    def result(self, meta: dict[str, Any] | None = None):
        """The run as a ``RunResult`` (the layout ``Store.save`` writes: metrics, per-client accuracies, the
        'selected' trace), its meta ``meta`` plus the refused uploads."""
        import pandas as pd

        from fedlib.core.state import RunResult

        return RunResult(
            pd.DataFrame(self.rows, columns=list(COLUMNS)),
            np.array(self.client_acc),
            np.array(self.client_loss),
            self.test_sizes,
            meta={**(meta or {}), "refused": [list(r) for r in self.refused], "stale": [list(r) for r in self.stale]},
            config=self.cfg,
            traces={"selected": self.selected},
        )


class Client:
    """Client ``index``'s half: its own training and test rows (``train``, ``test``, ``val``: ``Split``s of one
    client) and its rows of the run's state, kept between rounds (``state_dict`` / ``load_state_dict``: what a
    Flower ClientApp keeps in ``context.state``)."""

    def __init__(self, cfg: RunConfig, index: int, train: Split, test: Split, input_shape: tuple[int, ...],
                 n_classes: int, val: Split | None = None) -> None:  # fmt: skip
        self.cfg, self.index, self.train_split, self.test, self.val = cfg, index, train, test, val
        self.model_shape, self.n_classes = tuple(input_shape), n_classes
        self.alg, self.model, self.schedule = setup(cfg, input_shape, n_classes, _sizes_for(cfg))
        self.executor = make_executor(cfg.executor, self.model)
        self.state = init_state(self.model, 1)
        if cfg.model.attention_init == "per_client":  # pFedLA Algorithm 1, line 9: this client's own draw
            m, dtype = cfg.model, getattr(torch, cfg.dtype)

            def drawn(seed):
                return build_model(
                    m.name, input_shape, n_classes, m.hidden, seed=seed, dtype=dtype, attention=m.attention
                )

            for k, v in per_client_attention(drawn, cfg.data.n_clients, cfg.seed).items():
                self.state.client_params[k][0] = v[index]
                self.state.sent[k][0] = v[index]
        self.names = traveling(self.alg, self.state.global_params)

    def sizes(self) -> tuple[int, int]:
        """(training rows, test rows): what the server asks first."""
        return int(self.train_split.sizes[0]), int(self.test.sizes[0])

    def fit(self, task: Task) -> Params:
        """Train as ``run_round`` trains this client in round ``task.t``; returns the upload (empty unless
        ``task.upload``)."""
        alg, state = self.alg, self.state
        assert alg.local is not None
        state.round = task.t
        for k, v in task.params.items():
            state.global_params[k] = v.clone()
        for k, v in task.personal.items():
            state.sent[k][0] = v
        if task.personal:
            state.fresh[0] = True
        scale = self.schedule.lr_scale(task.t)
        local = alg.local if scale == 1 else dataclasses.replace(alg.local, lr=alg.local.lr * scale)
        tr = torch.zeros(1, dtype=torch.int64)
        start, anchor = start_models(alg, state, tr)
        assert task.index is not None
        f = lambda x: None if x is None else x[:, None]
        plan = BatchPlan(task.index[:, None], f(task.weight), f(task.active))
        if alg.local_update is None:
            trained = self.executor.train(self.model, start, plan, self.train_split, local,
                                          anchor=anchor if local.mu else None)  # fmt: skip
        else:
            work = ClientWork(
                self.executor, self.model, start, anchor, plan, self.train_split, state, tr, local, shared=alg.shared
            )
            trained = alg.local_update(work)
        for k, v in trained.items():
            state.client_params[k][tr] = v
        state.fresh[tr] = False
        if not task.upload:
            return {}
        return {k: trained[k][0] for k in self.names}

    def evaluate(self, t: int, params: Params) -> Report:
        """This client's test counts on the model it is evaluated with (``evaluation_params``), the global model's
        traveling tensors ``params`` received."""
        alg, state = self.alg, self.state
        for k, v in params.items():
            state.global_params[k] = v.clone()
        if alg.personal is not None and alg.personal.KEY not in state.extra:
            # not trained yet: its personal model is its initial one, as the method's state holds it in ``simulate``
            # (made from every client's model when the first client trains: this one's is still its initial one)
            p, per_client = state.client_params, True
        else:
            p, per_client = evaluation_params(alg, state)
        c, lo, n = self.executor.evaluate(self.model, p, self.test, per_client)
        rep = Report(self.index, float(c[0]), float(lo[0]), float(n[0]))
        if alg.report_global:
            g, gper = evaluation_params(alg, state, "global")
            gc, _, gk = self.executor.evaluate(self.model, g, self.test, gper)
            rep.gm_correct, rep.gm_rows = float(gc[0]), float(gk[0])
        if self.val is not None:
            vc, vl, vk = self.executor.evaluate(self.model, p, self.val, per_client)
            rep.val = (float(vc[0]), float(vl[0]), float(vk[0]))
        return rep

    # -- the state a ClientApp keeps between messages -----------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        s = self.state
        out = {f"client.{k}": v for k, v in s.client_params.items()}
        out.update({f"sent.{k}": v for k, v in s.sent.items()})
        out.update({f"global.{k}": v for k, v in s.global_params.items()})
        out["fresh"] = s.fresh.to(torch.uint8)
        for key, ms in s.extra.items():
            out.update({f"extra.{key}.{k}": v for k, v in dict(ms).items()})
        return out

    def load_state_dict(self, d: dict[str, torch.Tensor]) -> None:
        s = self.state
        extra: dict[str, dict[str, torch.Tensor]] = {}
        for name, v in d.items():
            part, _, rest = name.partition(".")
            if part == "client":
                s.client_params[rest] = v
            elif part == "sent":
                s.sent[rest] = v
            elif part == "global":
                s.global_params[rest] = v
            elif part == "fresh":
                s.fresh = v.to(torch.bool)
            elif part == "extra":
                key, _, k = rest.partition(".")
                extra.setdefault(key, {})[k] = v
        s.extra = dict(extra)  # rebuilt as the method's state class by ``MethodState.of`` on first use


def _sizes_for(cfg: RunConfig) -> np.ndarray | None:
    """The ``n_samples`` a client builds its algorithm with: a selection stage needs some, and a client never selects
    (the server's stage is the one that runs), so ones do."""
    return np.ones(cfg.data.n_clients)


def client_splits(data, i: int) -> tuple[Split, Split, Split | None]:
    """Client ``i``'s training, test and validation rows of a ``FederatedData``, each as a one-client ``Split``."""

    def one(split: Split | None) -> Split | None:
        if split is None:
            return None
        x, y = split.client(i)
        z = torch.zeros(1, dtype=torch.int64)
        return Split(x.clone(), y.clone(), z, torch.tensor([len(y)], dtype=torch.int64))

    train, test = one(data.train), one(data.test)
    assert train is not None and test is not None
    return train, test, one(data.val)


def refuse_unsupported_data(data) -> None:
    """The data a Flower run cannot reproduce yet: a global test set (AdaFL's setting evaluates the global model on
    the data set's own test set: the server would need it) and held-out new clients."""
    if data.global_test is not None:
        raise ValueError(
            "fedlib.flower: data with a global test set (the server would evaluate on it) is not supported"
        )
    if data.new_clients is not None:
        raise ValueError("fedlib.flower: held-out new clients (new_client_frac > 0) are not supported")


def drive(cfg: RunConfig, data) -> Server:
    """``cfg``'s rounds with a ``Server`` and a ``Client`` per client of ``data`` exchanging their messages in
    process, without Flower: the message protocol on its own (what the Flower apps carry, message for message)."""
    refuse_unsupported_data(data)
    clients = [Client(cfg, i, *client_splits(data, i)[:2], data.input_shape, data.n_classes,
                      val=client_splits(data, i)[2]) for i in range(data.n_clients)]  # fmt: skip
    sizes = np.array([c.sizes()[0] for c in clients])
    server = Server(cfg, sizes, data.input_shape, data.n_classes)
    for t in range(1, cfg.rounds + 1):
        selected, tasks = server.begin(t)
        uploads = {}
        for task in tasks:
            up = clients[task.client].fit(task)
            if task.upload:
                uploads[task.client] = server.check(t, task.client, up)
        out = server.end(t, selected, uploads, sum(task.bytes_down() for task in tasks))
        if t % cfg.eval_every == 0 or t == cfg.rounds:
            params = server.evaluation()
            server.record(out, [c.evaluate(t, params) for c in clients])
    return server
