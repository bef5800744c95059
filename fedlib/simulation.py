"""The federated round loop: select -> start models -> local update -> aggregate -> evaluate.

``simulate`` runs T rounds of an ``Algorithm`` (a composition of stages, see ``stages.py``)
over a ``FederatedData`` with an executor, and returns per-round metrics and per-client
accuracies. State is explicit: the global model (no client axis) and every client's current
model (client axis, N rows) -- the latter holds personalised models and parameters that
never leave the client (FedBN's BN, pFedLA's attention).
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from . import metrics as M
from .data.federated import BatchPlan, FederatedData, Split, sample_epochs, sample_steps
from .stages import Algorithm, Params, mix

# per-round columns, in order; *_mean are unweighted client means, the rest sample-weighted
# gm_*: the global model's accuracy, for methods that evaluate personalised models but also keep one (pFedMe's GM)
COLUMNS = ("round", "test_acc", "test_acc_mean", "test_loss", "train_acc", "train_loss",
           "global_test_acc", "gm_test_acc", "gm_test_acc_mean", "selected", "uploads", "seconds")


@dataclass
class State:
    round: int
    global_params: Params           # name -> tensor (no client axis)
    client_params: Params           # name -> (N, ...): each client's current model (Theta_i)
    sent: Params                    # name -> (N, ...): the last personalised model the server sent (W_i)
    fresh: torch.Tensor             # (N,) bool: W_i arrived since the client last trained
    extra: dict[str, Params] = field(default_factory=dict)  # per-client state of one method (pFedMe's theta_i)
    lr_scale: float = 1.0           # eta_t / eta this round (``lr_decay``); client procedures scale their steps by it


@dataclass
class RunResult:
    """What a run produces: ``metrics`` (one row per evaluated round, ``COLUMNS``), per-client test
    accuracy and mean loss ``client_acc``, ``client_loss`` (rounds evaluated x N), the clients'
    test sizes, and metadata."""
    metrics: pd.DataFrame
    client_acc: np.ndarray
    client_loss: np.ndarray
    client_n: np.ndarray
    meta: dict = field(default_factory=dict)
    config: object = None
    # per-round traces (rounds x N): 'selected' (bool: uploaded this round) for every run, 'selection_scores'
    # (AdaFL's a^(t) used to draw round t) when the selection stage keeps scores; 'hybrid_weights' (N x slots x 3,
    # final round) for pFedLA_h models; 'attention' (windows x layers x N x N) and 'attention_layers' for
    # aggregators that send personalised models (FedMCSA, HeurFedAMP; see ``AttentionTrace``)
    traces: dict = field(default_factory=dict)
    state: State | None = None      # the final state (in memory only, not stored)

    def summary(self) -> dict:
        m = self.metrics
        return {"best_acc": M.best(m.test_acc), "best_acc_mean": M.best(m.test_acc_mean),
                "final_acc": float(m.test_acc.iloc[-1]), "last10_acc": M.last_mean(m.test_acc, 10),
                # the global model on the data set's own test set (AdaFL's metric; NaN where there is none)
                "best_global_acc": M.best(m.global_test_acc), "last10_global_acc": M.last_mean(m.global_test_acc, 10),
                "uploads": int(m.uploads.iloc[-1]), "seconds": float(m.seconds.iloc[-1])}


def init_state(model: nn.Module, n_clients: int) -> State:
    g = {n: t.detach().clone() for n, t in model.state_dict().items()}
    c = {n: t.unsqueeze(0).repeat(n_clients, *([1] * t.dim())) for n, t in g.items()}
    sent = {n: t.clone() for n, t in c.items()}
    return State(0, g, c, sent, torch.zeros(n_clients, dtype=torch.bool, device=next(iter(g.values())).device))


def _rows(mask: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return mask.view(-1, *([1] * (t.dim() - 1)))


def start_models(alg: Algorithm, state: State, clients: torch.Tensor) -> tuple[Params, Params]:
    """(start, anchor) of the clients' local training.

    Shared parameters start from the global model (``start='global'``), or, with
    ``start='personal'``, from the personalised model W_i the server sent if one arrived since
    the client last trained, else from the client's own model (FedMCSA Algorithm 1, lines 6-8).
    Local parameters (never sent) always continue from the client's own. The proximal
    ``anchor`` is the start model ('start', FedProx) or the last W_i received ('received', FedMCSA's W_local).
    """
    start, anchor = {}, {}
    fresh = state.fresh[clients]
    for n, t in state.client_params.items():
        own = t[clients]
        if not alg.shared(n):
            start[n] = own.clone()
        elif alg.start == "global":
            g = state.global_params[n]
            start[n] = g.unsqueeze(0).expand(len(clients), *g.shape).clone()
        else:
            start[n] = torch.where(_rows(fresh, own), state.sent[n][clients], own)
        anchor[n] = state.sent[n][clients] if alg.anchor == "received" and alg.shared(n) else start[n]
    return start, anchor


def evaluation_params(alg: Algorithm, state: State, which: str | None = None) -> tuple[Params, bool]:
    """(params, per_client) for evaluation: the global model (with each client's local parts) or the personal ones.

    Personal models are the clients' own (``client_params``), or ``state.extra[alg.personal_key]``
    for methods that keep them apart from what they upload (pFedMe's theta_i).
    """
    if (which or alg.evaluate) == "personal":
        return (state.extra[alg.personal_key] if alg.personal_key else state.client_params), True
    if all(alg.shared(n) for n in state.client_params):
        return state.global_params, False
    n_clients = next(iter(state.client_params.values())).shape[0]
    return {n: (state.global_params[n].unsqueeze(0).expand(n_clients, *state.global_params[n].shape)
                if alg.shared(n) else t) for n, t in state.client_params.items()}, True


def simulate(alg: Algorithm, data: FederatedData, model: nn.Module, executor, rounds: int, *,
             local_steps: int | None = 20, local_epochs: int | None = None, batch_size: int = 20,
             seed: int = 0, eval_every: int = 1, eval_train: bool = False, progress: bool = True,
             desc: str | None = None, on_round=None, lr_decay: float = 1.0,
             checkpoint: "Checkpoint | None" = None) -> RunResult:
    """Run ``rounds`` rounds of ``alg``; ``model`` holds the initial weights (on the data's device and dtype).

    ``on_round(t, selected, mixing, state)``, if given, is called after each aggregation
    (e.g. to record attention matrices). ``lr_decay``: round t trains with eta * lr_decay^(t-1)
    (AdaFL's CIFAR-10 schedule); it scales ``alg.local.lr`` and is offered to client
    procedures as ``state.lr_scale``. A selection stage with an ``observe`` method (AdaFL's
    attention) sees, after each aggregation, the uploads and the models the server made of them.
    """
    n = data.n_clients
    dev = data.train.x.device
    state = init_state(model, n)
    rng = np.random.default_rng(seed)               # client selection
    gen = torch.Generator().manual_seed(seed + 1)    # mini-batches
    eval_gen = torch.Generator().manual_seed(seed + 2)  # batches used at evaluation (Per-FedAvg's adaptation)
    n_train = data.train.sizes.cpu().to(torch.float64)
    layout = data.train.layout()
    rows, accs, losses = [], [], []
    selected = np.zeros((rounds, n), dtype=bool)
    attention = AttentionTrace(n, rounds)
    uploads, done, resumed = 0, 0, []
    snap = checkpoint.load(rounds) if checkpoint is not None else None
    if snap is not None:
        for f in dataclasses.fields(State):
            setattr(state, f.name, _moved(snap["state"][f.name], dev))
        rng.bit_generator.state = snap["rng"]
        gen.set_state(snap["gen"])
        eval_gen.set_state(snap["eval_gen"])
        rows, accs, losses, selected, uploads = snap["rows"], snap["accs"], snap["losses"], snap["selected"], snap["uploads"]
        attention.__dict__.update(snap["attention"])
        for name, saved in snap["stages"].items():
            getattr(alg, name).__dict__.update(saved)
        done, resumed = snap["round"], snap["resumed"] + [{"round": snap["round"], "commit": snap["commit"],
                                                       "elapsed": round(snap["elapsed"], 3)}]
    t0 = time.perf_counter() - (snap["elapsed"] if snap is not None else 0.0)
    last_save = time.perf_counter()
    bar = tqdm(range(done + 1, rounds + 1), desc=desc or alg.name, disable=not progress, leave=False,
               initial=done, total=rounds)
    for t in bar:
        state.round = t
        state.lr_scale = lr_decay ** (t - 1)
        local = alg.local if lr_decay == 1 else dataclasses.replace(alg.local, lr=alg.local.lr * state.lr_scale)
        sel = np.asarray(alg.select.select(t, n, rng))
        selected[t - 1, sel] = True
        trainers = sel if alg.trains == "selected" else np.arange(n)
        tr = torch.as_tensor(trainers, device=dev)
        start, anchor = start_models(alg, state, tr)
        if local_epochs is not None:
            plan = sample_epochs(layout, torch.as_tensor(trainers), local_epochs, batch_size, gen)
        else:
            plan = sample_steps(layout, torch.as_tensor(trainers), local_steps * alg.batches_per_step, batch_size, gen)
        plan = _to(plan, dev)
        if alg.local_update is None:
            trained = executor.train(model, start, plan, data.train, local, anchor=anchor if local.mu else None)
        else:  # a method's own client procedure (pFedMe), built from executor.train calls
            trained = alg.local_update(executor, model, start, anchor, plan, data.train, state, tr)
        for name, v in trained.items():
            state.client_params[name][tr] = v
        state.fresh[tr] = False
        # uploads: the selected clients' shared parameters
        pos = torch.as_tensor(np.searchsorted(trainers, sel), device=dev)
        up = {name: v[pos] for name, v in trained.items() if alg.shared(name) and v.is_floating_point()}
        mixing = alg.aggregate(up, n_train[torch.as_tensor(sel)], sel)
        if mixing.to_global is not None:
            new = mix(mixing.to_global.to(dev).unsqueeze(0), up)
            for k, v in new.items():  # w <- (1 - beta) w + beta sum_k p_k w_k   (beta = 1: FedAvg; pFedMe's beta)
                state.global_params[k] = v[0] if mixing.beta == 1 else torch.lerp(state.global_params[k], v[0], mixing.beta)
        sel_t = torch.as_tensor(sel, device=dev)
        if mixing.to_personal is not None:
            attention.add(t, sel, mixing.to_personal)
            for name, v in mix(_moved(mixing.to_personal, dev), up).items():
                state.sent[name][sel_t] = v
            state.fresh[sel_t] = True
        observe = getattr(alg.select, "observe", None)
        if observe is not None:  # AdaFL: d_i = ||w^(t+1) - w_i^(t)|| against what the server made of the uploads
            if mixing.to_personal is not None:
                reference = {k: state.sent[k][sel_t] for k in up}
            else:
                reference = {k: state.global_params[k] for k in up}
            observe(sel, up, reference)
        if on_round is not None:
            on_round(t, sel, mixing, state)
        uploads += len(sel)
        if t % eval_every == 0 or t == rounds:
            if alg.before_eval is not None:
                alg.before_eval(executor, model, state, data.train, eval_gen)
            rows.append(_evaluate_round(alg, state, data, model, t, len(sel), uploads, eval_train, t0))
            accs.append(rows[-1].pop("_client_acc"))
            losses.append(rows[-1].pop("_client_loss"))
            # AdaFL's setting keeps no client test split: its accuracy is the global model's on the official test set
            acc = rows[-1]["test_acc"] if not np.isnan(rows[-1]["test_acc"]) else rows[-1]["global_test_acc"]
            bar.set_postfix(acc=f"{acc:.4f}")
        if checkpoint is not None and t < rounds and time.perf_counter() - last_save >= checkpoint.every_seconds:
            checkpoint.save({"round": t, "rounds": rounds, "elapsed": time.perf_counter() - t0,
                             "state": {f.name: getattr(state, f.name) for f in dataclasses.fields(State)},
                             "rng": rng.bit_generator.state, "gen": gen.get_state(), "eval_gen": eval_gen.get_state(),
                             "rows": rows, "accs": accs, "losses": losses, "selected": selected, "uploads": uploads,
                             "attention": vars(attention), "stages": _stage_states(alg), "resumed": resumed})
            last_save = time.perf_counter()
    bar.close()
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    traces = {"selected": selected, **attention.traces()}
    # pFedLA_h: each client's learned mixing weights softmax(u) per attention slot (SE, ECA, CA), (N, slots, 3)
    logits = sorted(k for k in state.client_params if "attn" in k and k.endswith(".logits"))
    if logits:
        traces["hybrid_weights"] = torch.stack([torch.softmax(state.client_params[k].to(torch.float64), -1)
                                                for k in logits], 1).cpu().numpy()
    if getattr(alg.select, "history", None):
        traces["selection_scores"] = np.array(alg.select.history[-rounds:])
    return RunResult(df, np.array(accs), np.array(losses), data.test.sizes.cpu().numpy(), state=state, traces=traces,
                     meta={"resumed": resumed} if resumed else {})


# the Algorithm's stage objects that may carry state from round to round (AdaFL's scores and their history);
# everything else a method carries lives in ``State`` (``state.extra``)
_STAGES = ("select", "aggregate", "local_update", "before_eval")


def _stage_states(alg: Algorithm) -> dict:
    return {name: dict(vars(obj)) for name in _STAGES
            if (obj := getattr(alg, name)) is not None and hasattr(obj, "__dict__") and vars(obj)}


@dataclass
class Checkpoint:
    """Snapshots of a running ``simulate`` at round ends, so that an interrupted long run (AdaFL's 1000 rounds
    take hours on a CPU) continues where it stopped instead of starting over.

    A snapshot holds everything the next round depends on: the ``State`` (global, client and sent models,
    ``state.extra``), the three random streams (selection, mini-batches, evaluation batches), the stage
    objects' attributes (AdaFL's scores), and the rows, client accuracies and traces so far. Resuming
    therefore gives the numbers an uninterrupted run gives, bit for bit (tested over every registered
    algorithm). ``path`` (a ``.pt`` file) is written atomically, with a small ``.json`` beside it saying
    how far the run got; one is written when ``every_seconds`` have passed since the last (0: every round).
    The result's ``meta['resumed']`` lists the round and git commit of each resumption, since a resumed
    run could mix code versions. ``Store.checkpoint(cfg)`` gives the one ``runner.run`` uses.
    """
    path: Path
    every_seconds: float = 300.0

    def __post_init__(self):
        self.path = Path(self.path)
        if not self.every_seconds >= 0:
            raise ValueError(f"Checkpoint.every_seconds={self.every_seconds!r} must be a number >= 0")

    @property
    def info_path(self) -> Path:
        return self.path.with_suffix(".json")

    def info(self) -> dict | None:
        """{'round', 'rounds', 'elapsed'} of the snapshot on disk, without reading it; None if there is none."""
        try:
            return json.loads(self.info_path.read_text())
        except (OSError, ValueError):
            return None

    def load(self, rounds: int) -> dict | None:
        """The snapshot on disk (tensors on the CPU), if there is one for a run of ``rounds`` rounds (else None)."""
        if not self.path.exists():
            return None
        snap = torch.load(self.path, map_location="cpu", weights_only=False)
        return snap if snap.get("rounds") == rounds else None

    def save(self, snap: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        snap = {**snap, "commit": git_commit()}
        tmp = self.path.with_name(self.path.name + ".tmp")
        torch.save(snap, tmp)
        os.replace(tmp, self.path)  # a reader (or a second interruption) never sees half a snapshot
        info = {k: snap[k] for k in ("round", "rounds")} | {"elapsed": round(snap["elapsed"], 1)}
        self.info_path.write_text(json.dumps(info))

    def clear(self) -> None:
        for p in (self.path, self.info_path):
            p.unlink(missing_ok=True)


def git_commit() -> str | None:
    """The git commit of the checkout fedlib runs from (None outside a git checkout): recorded with every run."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                              capture_output=True, text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


class AttentionTrace:
    """The server's personalisation weights over rounds, compactly: the rounds are cut into ``windows`` equal
    windows, and for each window, layer (mixing-matrix name) and pair of clients (i, j) we keep the mean weight
    client i's personalised model gave client j's upload, over the rounds of the window in which both were
    sampled (NaN if they never were together). FedMCSA's per-layer attention over N = 100 clients and 800 rounds
    would otherwise be 800 x layers x 100 x 100 numbers."""

    def __init__(self, n_clients: int, rounds: int, windows: int = 10):
        self.n, self.rounds, self.windows = n_clients, rounds, max(1, min(windows, rounds))
        self.names, self.sum, self.count = None, None, None

    def add(self, t: int, selected: np.ndarray, weights) -> None:
        mats = weights if isinstance(weights, dict) else {"model": weights}
        if self.names is None:
            self.names = list(mats)
            self.sum = np.zeros((self.windows, len(self.names), self.n, self.n))
            self.count = np.zeros((self.windows, self.n, self.n))
        w = (t - 1) * self.windows // self.rounds
        ix = np.ix_(selected, selected)
        for li, name in enumerate(self.names):
            self.sum[w, li][ix] += mats[name].detach().cpu().numpy()
        self.count[w][ix] += 1

    def traces(self) -> dict:
        if self.names is None:
            return {}
        with np.errstate(invalid="ignore"):
            mean = self.sum / self.count[:, None]
        return {"attention": mean.astype(np.float32), "attention_layers": np.array(self.names)}


def _evaluate_round(alg, state, data, model, t, n_sel, uploads, eval_train, t0) -> dict:
    params, per_client = evaluation_params(alg, state)
    correct, loss, cnt = M.evaluate(model, params, data.test, per_client)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc, client_loss = correct / cnt, loss / cnt
    row = {"round": t, "test_acc": M.weighted_mean(acc, cnt), "test_acc_mean": M.unweighted_mean(acc, cnt),
           "test_loss": float(loss.sum() / max(cnt.sum(), 1)), "train_acc": np.nan, "train_loss": np.nan,
           "global_test_acc": np.nan, "gm_test_acc": np.nan, "gm_test_acc_mean": np.nan, "selected": n_sel, "uploads": uploads,
           "_client_acc": acc, "_client_loss": client_loss}
    if alg.report_global:
        g_params, g_per_client = evaluation_params(alg, state, "global")
        c, _, k = M.evaluate(model, g_params, data.test, g_per_client)
        with np.errstate(invalid="ignore", divide="ignore"):
            row["gm_test_acc"], row["gm_test_acc_mean"] = M.weighted_mean(c / k, k), M.unweighted_mean(c / k, k)
    if eval_train:
        c, l, k = M.evaluate(model, params, data.train, per_client)
        row["train_acc"], row["train_loss"] = float(c.sum() / k.sum()), float(l.sum() / k.sum())
    if data.global_test is not None and alg.evaluate == "global" and not per_client:
        gx, gy = data.global_test
        one = Split(gx, gy, torch.zeros(1, dtype=torch.long, device=gx.device), torch.tensor([len(gy)], device=gx.device))
        c, _, k = M.evaluate(model, params, one, False)
        row["global_test_acc"] = float(c.sum() / k.sum())
    row["seconds"] = time.perf_counter() - t0
    return row


def _to(plan: BatchPlan, dev) -> BatchPlan:
    f = lambda t: None if t is None else t.to(dev)
    return BatchPlan(f(plan.index), f(plan.weight), f(plan.active))


def _moved(obj, dev):
    """``obj`` (tensors, possibly in nested dicts) on device ``dev``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dev)
    return {k: _moved(v, dev) for k, v in obj.items()} if isinstance(obj, dict) else obj
