"""Callbacks: what runs after each round besides the round itself, each with its own state.

``simulate`` is handed a list of callbacks; each has a ``key`` under which a snapshot keeps its ``state_dict()``,
and hooks that default to nothing: ``on_start`` (before the first round; a resumed run's state is loaded by then),
``on_stage`` (each stage of a round has ended: ``Run.lap``), ``after_round``, ``on_end`` (the run has ended, also
by an exception), ``traces`` and ``meta`` (what the callback adds to the ``RunResult``). Here: the evaluation (the
per-round metrics), the traces a method or model declares, a progress bar and a caller's per-round function.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from fedlib.core import metrics as M
from fedlib.core.failures import Failures
from fedlib.core.protocols import Executor
from fedlib.core.stages import Algorithm, Params
from fedlib.core.state import (
    COLUMNS,
    FAILURE_COLUMNS,
    NEW_COLUMNS,
    VAL_COLUMNS,
    Round,
    Run,
    Schedule,
    State,
    evaluation_params,
)
from fedlib.data.federated import BatchPlan, FederatedData, Split, sample_epochs
from fedlib.models.local_attention import hybrid_logits

# the attention trace's cap (``AttentionTrace``: windows x (layers + 1) x N x N float64); above it the run keeps none
# (FedMCSA with 5,000 clients would hold 2 GB a layer and store 1 GB a layer)
ATTENTION_TRACE_BYTES = 256 << 20


class Callback:
    """The hooks ``simulate`` calls, each a no-op here. ``key``: the name a snapshot keeps ``state_dict()`` under
    ("" keeps nothing)."""

    key: ClassVar[str] = ""

    def on_start(self, run: Run) -> None:
        return None

    def on_stage(self, stage: str) -> None:
        return None

    def after_round(self, run: Run, out: Round) -> None:
        return None

    def on_end(self, run: Run) -> None:
        return None

    def traces(self, run: Run) -> dict:
        return {}

    def meta(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, d: dict) -> None:
        return None


@dataclass
class OnRound(Callback):
    """``fn(t, selected, mixing, state)`` after every round: a caller's look at the round (tests, progress ticks)."""

    fn: Callable | None = None

    def after_round(self, run: Run, out: Round) -> None:
        if self.fn is not None:
            self.fn(out.t, out.selected, out.mixing, run.state)


@dataclass
class Evaluation(Callback):
    """Per-round metrics (``COLUMNS``) and per-client accuracies and losses, every ``every`` rounds and the last;
    with the evaluation protocols' columns where the run's data holds them out (``fedlib.data.holdout``):
    ``VAL_COLUMNS`` (every client's evaluated model on its validation rows) and ``NEW_COLUMNS`` (``new_clients``);
    and ``FAILURE_COLUMNS`` where clients fail (``fedlib.core.failures``): ``selected`` counts the clients the round
    selected, ``dropped`` those of them that uploaded nothing, ``straggled`` those that uploaded part of their work,
    and ``uploads`` the models uploaded so far."""

    every: int = 1
    train: bool = False
    finetune_epochs: int = 1  # a new client's fine-tuning epochs (``new_client_finetune_epochs``)
    rows: list = field(default_factory=list)
    accs: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    uploads: int = 0
    bytes_up: int = 0  # totals since the first round (``Round.bytes_up``, ``bytes_down``)
    bytes_down: int = 0
    key: ClassVar[str] = "evaluation"
    init: dict = field(default_factory=dict)  # the model's initial tensors: a new client's local parameters

    def on_start(self, run: Run) -> None:
        self.init = {n: t.detach().clone() for n, t in run.model.state_dict().items()}

    def after_round(self, run: Run, out: Round) -> None:
        self.uploads += len(out.selected)  # the uploaders (the dropped clients are apart: ``Round.dropped``)
        self.bytes_up += out.bytes_up
        self.bytes_down += out.bytes_down
        if out.t % self.every and out.t != run.rounds and run.diverged_at != out.t:
            return
        run.lap("other")  # the callbacks before this one (traces)
        alg, state = run.alg, run.state
        if alg.before_eval is not None:
            alg.before_eval(run.executor, run.model, state, run.data, run.eval_gen)
        tuned = None if alg.finetune is None else finetuned_clients(run, out.t)
        row = _evaluate_round(alg, state, run.data, run.model, out.t, len(out.selected) + len(out.dropped),
                              self.uploads, self.train, run.t0, run.executor.evaluate, tuned)  # fmt: skip
        if run.schedule.failures.on:
            row.update(dropped=len(out.dropped), straggled=len(out.stragglers))
        row["bytes_up"], row["bytes_down"] = self.bytes_up, self.bytes_down
        if run.data.new_clients is not None:
            row.update(new_clients(run, out.t, self.init, self.finetune_epochs))
        if not np.isfinite(row["test_loss"]) or (self.train and not np.isfinite(row["train_loss"])):
            run.diverged_at = out.t
        if run.diverged_at == out.t:  # a non-finite model: no accuracy to report (argmax of NaN is class 0)
            row.update({k: np.nan for k in row if k.endswith(("_acc", "_acc_mean")) and not k.startswith("_")})
            row["_client_acc"] = np.full_like(row["_client_acc"], np.nan)
        self.accs.append(row.pop("_client_acc"))
        self.losses.append(row.pop("_client_loss"))
        self.rows.append(row)
        run.lap("evaluation")

    def last_accuracy(self) -> float:
        # AdaFL's setting keeps no client test split: its accuracy is the global model's on the official test set
        r = self.rows[-1]
        return r["test_acc"] if not np.isnan(r["test_acc"]) else r["global_test_acc"]

    def frame(self) -> pd.DataFrame:
        extra = [c for c in (*VAL_COLUMNS, *NEW_COLUMNS, *FAILURE_COLUMNS) if self.rows and c in self.rows[0]]
        return pd.DataFrame(self.rows, columns=[*COLUMNS, *extra])

    def state_dict(self) -> dict:
        return {"rows": self.rows, "accs": self.accs, "losses": self.losses, "uploads": self.uploads,
                "bytes_up": self.bytes_up, "bytes_down": self.bytes_down}  # fmt: skip

    def load_state_dict(self, d: dict) -> None:
        self.rows, self.accs, self.losses, self.uploads = d["rows"], d["accs"], d["losses"], d["uploads"]
        # a snapshot from before the byte columns: its rows lack them (NaN in the frame), its totals start at 0
        self.bytes_up, self.bytes_down = d.get("bytes_up", 0), d.get("bytes_down", 0)


@dataclass
class ProgressBar(Callback):
    rounds: int = 0
    desc: str = ""
    enabled: bool = True
    evaluation: Evaluation | None = None
    bar: Any = None

    def after_round(self, run: Run, out: Round) -> None:
        if self.bar is None:
            self.bar = tqdm(total=self.rounds, initial=out.t - 1, desc=self.desc, disable=not self.enabled, leave=False)
        self.bar.update(1)
        if run.diverged_at is not None:
            self.bar.set_postfix_str(f"diverged at round {run.diverged_at}")
        elif self.evaluation is not None and self.evaluation.rows and self.evaluation.rows[-1]["round"] == out.t:
            self.bar.set_postfix(acc=f"{self.evaluation.last_accuracy():.4f}")

    def on_end(self, run: Run) -> None:
        if self.bar is not None:
            self.bar.close()


@dataclass
class SelectionTrace(Callback):
    """'selected' (rounds x N, bool: selected in round t; where clients fail, those that uploaded and those that
    dropped out, ``FailureTrace``) for every run, and whatever the selection stage traces (AdaFL: 'selection_scores',
    a^(t), from which round t drew its clients)."""

    n: int = 0
    rounds: int = 0
    selected: np.ndarray = field(init=False)
    key: ClassVar[str] = "selection"

    def __post_init__(self) -> None:
        self.selected = np.zeros((self.rounds, self.n), dtype=bool)

    def after_round(self, run: Run, out: Round) -> None:
        self.selected[out.t - 1, out.selected] = True
        self.selected[out.t - 1, out.dropped] = True

    def traces(self, run: Run) -> dict:
        select = run.alg.select
        return {"selected": self.selected, **(select.traces(self.rounds) if select is not None else {})}

    def state_dict(self) -> dict:
        return {"selected": self.selected}

    def load_state_dict(self, d: dict) -> None:
        self.selected = d["selected"]


@dataclass
class FailureTrace(Callback):
    """Where clients fail (``fedlib.core.failures``): 'dropped' and 'straggled' (rounds x N, bool: of round t's
    selected clients, those that uploaded nothing and those that uploaded part of their work), and in the meta
    ``failures``, the run's options and totals (``dropped``, ``straggled``, ``rounds_without_uploads``)."""

    failures: Failures
    n: int = 0
    rounds: int = 0
    dropped: np.ndarray = field(init=False)
    straggled: np.ndarray = field(init=False)
    empty: int = 0  # rounds whose every selected client dropped out
    key: ClassVar[str] = "failures"

    def __post_init__(self) -> None:
        self.dropped = np.zeros((self.rounds, self.n), dtype=bool)
        self.straggled = np.zeros((self.rounds, self.n), dtype=bool)

    def after_round(self, run: Run, out: Round) -> None:
        self.dropped[out.t - 1, out.dropped] = True
        self.straggled[out.t - 1, out.stragglers] = True
        self.empty += bool(len(out.dropped) and not len(out.selected))

    def traces(self, run: Run) -> dict:
        return {"dropped": self.dropped, "straggled": self.straggled}

    def meta(self) -> dict:
        f = self.failures
        return {
            "failures": {
                "dropout": f.dropout,
                "stragglers": f.stragglers,
                "straggler_work": f.work,
                "dropped": int(self.dropped.sum()),
                "straggled": int(self.straggled.sum()),
                "rounds_without_uploads": self.empty,
            }
        }

    def state_dict(self) -> dict:
        return {"dropped": self.dropped, "straggled": self.straggled, "empty": self.empty}

    def load_state_dict(self, d: dict) -> None:
        self.dropped, self.straggled, self.empty = d["dropped"], d["straggled"], int(d["empty"])


@dataclass
class HybridWeights(Callback):
    """pFedLA_h's 'hybrid_weights' (N x slots x 3): each client's softmax(u) per attention slot after the last
    round, from the local parameters the model declares (``hybrid_logits``)."""

    names: list[str]

    def traces(self, run: Run) -> dict:
        logits = [torch.softmax(run.state.client_params[k].to(torch.float64), -1) for k in self.names]
        return {"hybrid_weights": torch.stack(logits, 1).cpu().numpy()}


class AttentionTrace(Callback):
    """The server's personalisation weights over rounds, compactly: the rounds are cut into ``windows`` equal
    windows, and for each window, layer (mixing-matrix name) and pair of clients (i, j) we keep the mean weight
    client i's personalised model gave client j's upload, over the rounds of the window in which both were
    sampled (NaN if they never were together). FedMCSA's per-layer attention over N = 100 clients and 800 rounds
    would otherwise be 800 x layers x 100 x 100 numbers.

    Still N x N a window and layer: above ``ATTENTION_TRACE_BYTES`` (256 MB: about 1,050 clients of an MLR,
    whose weight and bias are two layers here, 820 of a one-hidden-layer DNN) the run keeps no trace, warns, and says
    why in its meta (``skipped``, stored as ``meta["attention_trace"]``); FedMCSA with 5,000 clients would have held
    2 GB a layer and stored 1 GB."""

    key: ClassVar[str] = "attention"

    def __init__(self, n_clients: int, rounds: int, windows: int = 10) -> None:
        self.n, self.rounds, self.windows = n_clients, rounds, max(1, min(windows, rounds))
        # the layers' names and the sums and counts per window, allocated at the first personalised round
        self.names: list[str] | None = None
        self.sum: np.ndarray | None = None
        self.count: np.ndarray | None = None
        self.skipped: str | None = None  # why no trace is kept (too many clients), else None

    def add(self, t: int, selected: np.ndarray, weights: torch.Tensor | dict[str, torch.Tensor]) -> None:
        mats = weights if isinstance(weights, dict) else {"model": weights}
        if self.skipped is not None:
            return
        if self.names is None:
            size = self.windows * (len(mats) + 1) * self.n * self.n * 8
            if size > ATTENTION_TRACE_BYTES:
                self.skipped = (
                    f"not kept: {self.n} clients' pairs in {len(mats)} layer(s) would take {size / 2**30:.1f} GB, "
                    f"above fedlib.core.callbacks.ATTENTION_TRACE_BYTES ({ATTENTION_TRACE_BYTES >> 20} MB)"
                )
                warnings.warn(f"attention trace {self.skipped}", stacklevel=2)
                return
            self.names = list(mats)
            self.sum = np.zeros((self.windows, len(self.names), self.n, self.n))
            self.count = np.zeros((self.windows, self.n, self.n))
        assert self.sum is not None and self.count is not None  # allocated with the names
        w = (t - 1) * self.windows // self.rounds
        ix = np.ix_(selected, selected)
        for li, name in enumerate(self.names):
            self.sum[w, li][ix] += mats[name].detach().cpu().numpy()
        self.count[w][ix] += 1

    def after_round(self, run: Run, out: Round) -> None:
        if out.mixing.to_personal is not None:
            self.add(out.t, out.selected, out.mixing.to_personal)

    def meta(self) -> dict:
        return {"attention_trace": self.skipped} if self.skipped is not None else {}

    def state_dict(self) -> dict:
        return {"names": self.names, "sum": self.sum, "count": self.count, "skipped": self.skipped}

    def load_state_dict(self, d: dict) -> None:
        self.names, self.sum, self.count = d.get("names"), d.get("sum"), d.get("count")
        self.skipped = d.get("skipped")

    def traces(self, run: Run | None = None) -> dict[str, Any]:
        if self.names is None or self.sum is None or self.count is None:
            return {}
        with np.errstate(invalid="ignore"):
            mean = self.sum / self.count[:, None]
        return {"attention": mean.astype(np.float32), "attention_layers": np.array(self.names)}


def _evaluate_round(alg: Algorithm, state: State, data: FederatedData, model: nn.Module, t: int, n_sel: int,
                    uploads: int, eval_train: bool, t0: float, evaluate: Callable,
                    tuned: Params | None = None) -> dict:  # fmt: skip
    """One evaluation row; ``tuned``: every client's own model (N, ...) evaluated in place of the method's evaluated
    models (``Algorithm.finetune``: the clients' fine-tuned copies of the global model)."""
    params, per_client = evaluation_params(alg, state) if tuned is None else (tuned, True)
    correct, loss, cnt = evaluate(model, params, data.test, per_client)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc, client_loss = correct / cnt, loss / cnt
    row = {
        "round": t,
        "test_acc": M.weighted_mean(acc, cnt),
        "test_acc_mean": M.unweighted_mean(acc, cnt),
        "test_loss": float(loss.sum() / max(cnt.sum(), 1)),
        "train_acc": np.nan,
        "train_loss": np.nan,
        "global_test_acc": np.nan,
        "gm_test_acc": np.nan,
        "gm_test_acc_mean": np.nan,
        "selected": n_sel,
        "uploads": uploads,
        "bytes_up": 0,  # the caller's totals (``Evaluation.after_round``)
        "bytes_down": 0,
        "_client_acc": acc,
        "_client_loss": client_loss,
    }
    if alg.report_global:
        g_params, g_per_client = evaluation_params(alg, state, "global")
        c, _, k = evaluate(model, g_params, data.test, g_per_client)
        with np.errstate(invalid="ignore", divide="ignore"):
            row["gm_test_acc"], row["gm_test_acc_mean"] = M.weighted_mean(c / k, k), M.unweighted_mean(c / k, k)
    if eval_train:
        c, loss, k = evaluate(model, params, data.train, per_client)
        row["train_acc"], row["train_loss"] = float(c.sum() / k.sum()), float(loss.sum() / k.sum())
    if data.global_test is not None and alg.evaluate == "global" and not per_client:
        c, _, k = evaluate(model, params, data.global_split, False)
        row["global_test_acc"] = float(c.sum() / k.sum())
    if data.val is not None:  # the same models on each client's validation rows (``val_frac``)
        c, loss, k = evaluate(model, params, data.val, per_client)
        with np.errstate(invalid="ignore", divide="ignore"):
            row["val_acc"], row["val_loss"] = M.weighted_mean(c / k, k), float(loss.sum() / max(k.sum(), 1))
    row["seconds"] = time.perf_counter() - t0
    return row


def new_clients(run: Run, t: int, init: dict, epochs: int) -> dict:
    """The clients that never trained (``FederatedData.new_clients``), on their test splits: ``new_test_acc`` with
    the global model, ``new_ft_test_acc`` after each fine-tunes it for ``epochs`` (``new_client_finetune_epochs``) epochs of its
    own training rows (sample-weighted; ``*_mean`` unweighted, as ``test_acc``). PFLlib's and FL-bench's new-client
    evaluation.

    What a new client receives: the global model's shared parameters, and its local ones (FedBN's BN, pFedLA's
    attention) as the model initialised them, which is what a client joining the federation would have. A method
    that keeps no global model (Local, FedMCSA, HeurFedAMP: their server sends only personalised models) gives a new
    client its initial model, so its new_test_acc is the initial model's and its new_ft_test_acc that of k epochs
    of local training from it: such a method has nothing for a client it has not seen, and the column says so.
    Fine-tuning is plain SGD with the run's optimiser at round t's learning rate (lr, momentum, weight decay; no
    proximal term and none of the method's own client procedure: the same fine-tuning for every method, so the
    column compares what the methods' global models give). Its mini-batches are drawn from a stream of (seed, t)
    of its own, so the training's stream is untouched and a resumed run draws the same ones."""
    alg, state, new, dev = run.alg, run.state, run.data.new_clients, run.data.train.x.device
    assert new is not None
    k = new.n_clients
    one = {n: state.global_params[n] if alg.shared(n) else init[n].to(dev) for n in state.global_params}
    start = {n: v.unsqueeze(0).expand(k, *v.shape).clone() for n, v in one.items()}
    shared = all(alg.shared(n) for n in one)
    out = {}
    for name, params in (("new_test_acc", one if shared else start), ("new_ft_test_acc", None)):
        if params is None:
            params = fine_tune(run, t, start, new.train, epochs, NEW_CLIENT_STREAM)
        c, _, n = run.executor.evaluate(run.model, params, new.test, params is not one)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[name], out[f"{name}_mean"] = M.weighted_mean(c / n, n), M.unweighted_mean(c / n, n)
    return out


# the random streams of the engine's fine-tunings, (seed, t, stream) each: apart from training's and from each other
NEW_CLIENT_STREAM, FINETUNE_STREAM = 3, 4


def fine_tune(
    run: Run, t: int, start: Params, split: Split, epochs: int, stream: int, objective: object = None
) -> Params:
    """``start`` (name -> (K, ...), one model per client of ``split``) after each client trains it for ``epochs``
    epochs of its rows of ``split``: plain SGD with the run's optimiser at round t's learning rate (lr, momentum,
    weight decay; no proximal term and none of the method's own client procedure), minimising ``objective`` (None:
    the cross-entropy). Its mini-batches are drawn from a stream of (seed, t, ``stream``) of its own, so the
    training's stream is untouched and a resumed run draws the same ones. What a new client's fine-tuning
    (``new_clients``) and a method's evaluation by fine-tuning (``Algorithm.finetune``) both run."""
    plan = fine_tune_plan(run.seed, t, stream, split.layout(), epochs, run.schedule.batch_size)
    return tuned(run.alg, run.executor, run.model, run.schedule, t, start, plan, split, objective)


def fine_tune_plan(seed: int, t: int, stream: int, layout: Split, epochs: int, batch_size: int) -> BatchPlan:
    """The mini-batches of ``fine_tune`` (on the CPU, rows numbered as ``layout``'s): ``epochs`` epochs of every
    client of ``layout``, drawn from the stream (seed, t, ``stream``). Apart from ``tuned`` so that a party that holds
    only the clients' sizes (a federated server) draws them and each client trains on its own column."""
    entropy = np.random.SeedSequence((seed, t, stream)).generate_state(2, np.uint64)
    gen = torch.Generator().manual_seed(int(entropy[0] >> np.uint64(1)))
    return sample_epochs(layout, torch.arange(len(layout.sizes)), epochs, batch_size, gen)


def tuned(alg: Algorithm, executor: Executor, model: nn.Module, schedule: Schedule, t: int, start: Params, plan: BatchPlan,
          split: Split, objective: object = None) -> Params:  # fmt: skip
    """``start`` trained on ``plan`` (``fine_tune_plan``) of ``split``: plain SGD with the run's optimiser at round t's
    learning rate (lr, momentum, weight decay; no proximal term), minimising ``objective`` (None: cross-entropy)."""
    assert alg.local is not None  # ``build_algorithm`` sets the local stage
    dev = split.x.device
    opt = dataclasses.replace(alg.local, mu=0.0, lr=alg.local.lr * schedule.lr_scale(t))
    plan = type(plan)(plan.index.to(dev), *(None if x is None else x.to(dev) for x in (plan.weight, plan.active)))
    return {**start, **executor.train(model, start, plan, split, opt, objective=objective)}


def finetuned_clients(run: Run, t: int) -> Params:
    """Every client's fine-tuning (``Algorithm.finetune``) of the model it would be evaluated with otherwise (the
    global model, with the client's local parameters), on its training rows: the models evaluated in round t."""
    alg, state = run.alg, run.state
    assert alg.finetune is not None
    params, per_client = evaluation_params(alg, state, "global")
    n = run.data.n_clients
    start = {k: (v if per_client else v.unsqueeze(0).expand(n, *v.shape)).clone() for k, v in params.items()}
    ft = alg.finetune
    objective = None if ft.objective is None else ft.objective(run.model)
    return fine_tune(run, t, start, run.data.train, ft.epochs, FINETUNE_STREAM, objective)


def declared_traces(
    alg: Algorithm, model: nn.Module, n_clients: int, rounds: int, failures: Failures | None = None
) -> list[Callback]:
    """The trace callbacks a run records: 'selected' (and the selection stage's own) for every run, the failed
    clients where clients can fail (``failures``), the attention weights where the method declares them
    (``Algorithm.traces``), pFedLA_h's hybrid weights where the model has hybrid slots."""
    out: list[Callback] = [SelectionTrace(n_clients, rounds)]
    if failures is not None and failures.on:
        out.append(FailureTrace(failures, n_clients, rounds))
    if "attention" in alg.traces:
        out.append(AttentionTrace(n_clients, rounds))
    logits = hybrid_logits(model)
    if logits:
        out.append(HybridWeights(logits))
    return out
