"""What a running simulation holds: the ``State`` of the models, the ``Run`` that carries it from round to round,
one ``Round``'s outcome, the ``Schedule`` of local work, and the ``RunResult`` a run produces.

State is explicit: the global model (no client axis) and every client's current model (client axis, N rows); the
latter holds personalised models and the parameters that never leave a client (FedBN's BN, pFedLA's attention).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from fedlib.core import metrics as M
from fedlib.core.failures import Failures
from fedlib.core.protocols import Executor
from fedlib.core.stages import Algorithm, Mixing, Params
from fedlib.data.federated import BatchPlan, FederatedData, Split, sample_epochs, sample_steps

if TYPE_CHECKING:
    from fedlib.core.callbacks import Callback

# per-round columns, in order; *_mean are unweighted client means, the rest sample-weighted
# gm_*: the global model's accuracy, for methods that evaluate personalised models but also keep one (pFedMe's GM);
# selected: the clients the round selected, uploads: the models uploaded so far (fewer where selected clients drop out);
# bytes_up, bytes_down: totals since the first round (``payload_bytes``: the model tensors that travel)
COLUMNS = (
    "round",
    "test_acc",
    "test_acc_mean",
    "test_loss",
    "train_acc",
    "train_loss",
    "global_test_acc",
    "gm_test_acc",
    "gm_test_acc_mean",
    "selected",
    "uploads",
    "bytes_up",
    "bytes_down",
    "seconds",
)
# the evaluation protocols' columns, after COLUMNS in a run whose data holds them out (``fedlib.data.holdout``):
# val_* each client's model on its validation rows (sample-weighted, as test_acc), new_* the clients that never
# trained, with the global model and after fine-tuning it (``fedlib.core.callbacks.NewClients``)
VAL_COLUMNS = ("val_acc", "val_loss")
NEW_COLUMNS = ("new_test_acc", "new_test_acc_mean", "new_ft_test_acc", "new_ft_test_acc_mean")
# the failures' columns, after those in a run where clients fail (``Schedule.failures``, ``fedlib.core.failures``): of
# the round's ``selected`` clients, how many uploaded nothing and how many uploaded part of their work
FAILURE_COLUMNS = ("dropped", "straggled")


@dataclass
class State:
    round: int
    global_params: Params  # name -> tensor (no client axis)
    client_params: Params  # name -> (N, ...): each client's current model (Theta_i)
    sent: Params  # name -> (N, ...): the last personalised model the server sent (W_i)
    fresh: torch.Tensor  # (N,) bool: W_i arrived since the client last trained
    # the method's own state (a stages.MethodState, or its flat name -> tensor dict from a snapshot), by its KEY
    extra: dict[str, Mapping[str, torch.Tensor]] = field(default_factory=dict)


@dataclass
class RunResult:
    """What a run produces: ``metrics`` (one row per evaluated round, ``COLUMNS``), per-client test
    accuracy and mean loss ``client_acc``, ``client_loss`` (rounds evaluated x N), the clients'
    test sizes, and metadata."""

    metrics: pd.DataFrame
    client_acc: np.ndarray
    client_loss: np.ndarray
    client_n: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    config: object = None
    # per-round traces (rounds x N): 'selected' (bool: selected this round; uploaded unless 'dropped') for every run,
    # 'dropped' and 'straggled' (bool) where clients fail (``fedlib.core.failures``), 'selection_scores'
    # (AdaFL's a^(t), from which round t drew its clients) when the selection stage keeps scores; 'hybrid_weights' (N x slots x 3,
    # final round) for pFedLA_h models; 'attention' (windows x layers x N x N) and 'attention_layers' for
    # aggregators that send personalised models (FedMCSA, HeurFedAMP; see ``AttentionTrace``)
    traces: dict[str, Any] = field(default_factory=dict)
    state: State | None = None  # the final state (in memory only, not stored)

    def summary(self) -> dict[str, Any]:
        """Best/final/last-10 accuracies, uploads and time. A diverged run (``diverged_at``: its round, else None)
        reports its final and last-10 accuracies as NaN and its best over the rounds before it diverged.

        ``best_acc`` picks the round on the test set, as the papers do (FedMCSA's BMTA, AdaFL's best accuracy).
        Where the metrics hold a validation accuracy (``val_acc``: ``val_frac`` > 0), also ``test_acc_at_best_val``,
        the test accuracy in the round best on validation (``metrics.at_best``), which does not peek at the test
        set (and ``global_acc_at_best_val``, the global model's on the data set's own test set, where there is one). Where they hold new clients' accuracies (``new_client_frac`` > 0), those of the final round
        (``final_new_acc``: the global model, ``final_new_ft_acc``: after fine-tuning) and, with a validation split,
        at the round best on validation (``new_acc_at_best_val``, ``new_ft_acc_at_best_val``)."""
        m = self.metrics
        val = {"test_acc_at_best_val": M.at_best(m.val_acc, m.test_acc)} if "val_acc" in m else {}
        if "val_acc" in m and not m.global_test_acc.isna().all():  # AdaFL's setting: the data set's own test set
            val["global_acc_at_best_val"] = M.at_best(m.val_acc, m.global_test_acc)
        if "new_test_acc" in m:
            val["final_new_acc"] = float(m.new_test_acc.iloc[-1])
            val["final_new_ft_acc"] = float(m.new_ft_test_acc.iloc[-1])
            if "val_acc" in m:
                val["new_acc_at_best_val"] = M.at_best(m.val_acc, m.new_test_acc)
                val["new_ft_acc_at_best_val"] = M.at_best(m.val_acc, m.new_ft_test_acc)
        return {
            "best_acc": M.best(m.test_acc),
            "best_acc_mean": M.best(m.test_acc_mean),
            "final_acc": float(m.test_acc.iloc[-1]),
            "last10_acc": M.last_mean(m.test_acc, 10),
            # the global model on the data set's own test set (AdaFL's metric; NaN where there is none)
            "best_global_acc": M.best(m.global_test_acc),
            "last10_global_acc": M.last_mean(m.global_test_acc, 10),
            "uploads": int(m.uploads.iloc[-1]),
            "seconds": float(m.seconds.iloc[-1]),
            "diverged_at": self.meta.get("diverged_at"),
            **val,
        }


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

    Personal models are the clients' own (``client_params``), or the ``personal_given(global view)`` models of the
    method's state (``alg.personal``) for methods that keep them apart from what they upload (pFedMe's theta_i) or make
    them from the global model (APFL's mixture).
    """
    if (which or alg.evaluate) == "personal":
        if alg.personal is None:
            return state.client_params, True
        return alg.personal.of(state).personal_given(_global_view(alg, state)), True
    if all(alg.shared(n) for n in state.client_params):
        return state.global_params, False
    return _global_view(alg, state), True


def _global_view(alg: Algorithm, state: State) -> Params:
    """name -> (N, ...): the global model's shared parameters (expanded views) beside each client's local ones."""
    n_clients = next(iter(state.client_params.values())).shape[0]
    return {
        n: (
            state.global_params[n].unsqueeze(0).expand(n_clients, *state.global_params[n].shape) if alg.shared(n) else t
        )
        for n, t in state.client_params.items()
    }


@dataclass(frozen=True)
class Schedule:
    """How clients train each round: ``local_steps`` R (or ``local_epochs`` E) of ``batch_size``, the lr
    schedule eta_t = eta * lr_decay^(t-1) (AdaFL's CIFAR-10 decays 0.99 a round), applied by ``run_round`` to the
    optimiser every method receives, and which selected clients drop out or straggle (``failures``: none by
    default; ``fedlib.core.failures``)."""

    local_steps: int | None = 20
    local_epochs: int | None = None
    batch_size: int = 20
    lr_decay: float = 1.0
    failures: Failures = Failures()

    def plan(self, layout: Split, clients: torch.Tensor, batches_per_step: int, gen: torch.Generator) -> BatchPlan:
        if self.local_epochs is not None:
            return sample_epochs(layout, clients, self.local_epochs, self.batch_size, gen)
        assert self.local_steps is not None
        return sample_steps(layout, clients, self.local_steps * batches_per_step, self.batch_size, gen)

    def lr_scale(self, t: int) -> float:
        """eta_t / eta in round t."""
        return self.lr_decay ** (t - 1)


@dataclass
class Run:
    """What a running ``simulate`` carries from round to round besides the stages: the ``State``, the random
    streams (selection ``rng``, mini-batches ``gen``, evaluation batches ``eval_gen``, seeded from ``seed``), the
    callbacks, when it started (``t0``; a resumed run's is moved back by the time already spent) and the round it
    starts after (``done``: 0, or a snapshot's round). ``state_dict()`` is tensors and plain data. ``val``: the
    validation rows client procedures read (``ClientWork.val``): the data's own split, or those ``simulate`` held
    out of training for the method (``Algorithm.validation``)."""

    alg: Algorithm
    data: FederatedData
    model: nn.Module
    executor: Executor
    rounds: int
    seed: int
    schedule: Schedule
    callbacks: list[Callback] = field(default_factory=list)
    val: Split | None = None

    def __post_init__(self) -> None:
        self.state = init_state(self.model, self.data.n_clients)
        self.diverged_at: int | None = None  # the round whose models became non-finite (the run stops there)
        self.done = 0
        self.t0 = time.perf_counter()
        self.rng = np.random.default_rng(self.seed)
        self.gen = torch.Generator().manual_seed(self.seed + 1)
        self.eval_gen = torch.Generator().manual_seed(self.seed + 2)
        # what every round's plan and aggregation read, on the CPU once (not a device sync per round)
        self.layout = self.data.train.layout()
        self.n_train = self.data.train.sizes.cpu().to(torch.float64)

    def lap(self, stage: str) -> None:
        """The round has finished ``stage`` (or, with ``"round"``, starts): every callback's ``on_stage``."""
        for cb in self.callbacks:
            cb.on_stage(stage)

    def state_dict(self) -> dict[str, Any]:
        st: dict[str, Any] = {f.name: getattr(self.state, f.name) for f in dataclasses.fields(State)}
        st["extra"] = {k: dict(v) for k, v in self.state.extra.items()}  # methods' states as plain name -> tensor
        return {
            "state": st,
            "rng": self.rng.bit_generator.state,
            "gen": self.gen.get_state(),
            "eval_gen": self.eval_gen.get_state(),
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        dev = self.data.train.x.device
        for f in dataclasses.fields(State):
            setattr(self.state, f.name, moved(d["state"][f.name], dev))
        self.rng.bit_generator.state = d["rng"]
        self.gen.set_state(d["gen"])
        self.eval_gen.set_state(d["eval_gen"])


@dataclass
class Round:
    """One round's outcome: who uploaded (``selected``: the uploads' and the mixing's order), what the server made of
    it, the uploads themselves, and the selected clients that failed (``fedlib.core.failures``): ``dropped`` (selected,
    uploaded nothing) and ``stragglers`` (among ``selected``: uploaded part of their work)."""

    t: int
    selected: np.ndarray
    mixing: Mixing
    uploads: Params
    dropped: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    stragglers: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    bytes_up: int = 0  # the uploads' bytes (``payload_bytes``)
    bytes_down: int = 0  # the bytes of the models the server sent the round's training clients


def payload_bytes(params: Params) -> int:
    """The bytes of the tensors ``params`` holds (numel x element size, no framing): what one message of model
    parameters carries. Both the simulation (``Round.bytes_up``, ``bytes_down``) and ``fedlib.flower`` count with it."""
    return sum(t.numel() * t.element_size() for t in params.values())


def traveling(alg: Algorithm, params: Params) -> list[str]:
    """The names of ``params`` that travel between a client and the server: shared (``alg.shared``) floating tensors.
    A shared integer buffer (BatchNorm's ``num_batches_tracked``) is never aggregated, so the global model's stays the
    initial one, which every client already holds: nothing to send."""
    return [k for k, v in params.items() if alg.shared(k) and v.is_floating_point()]


def bytes_down(alg: Algorithm, state: State, clients: torch.Tensor) -> int:
    """What the server sends ``clients`` (about to train) for their start models: the global model's traveling
    tensors to each (``start='global'``), and to each that has one waiting (``state.fresh``) the personalised model
    the server made for it (FedMCSA's, HeurFedAMP's W_i), counted when it is delivered, not when it is made. Called
    before training, while ``fresh`` still says which clients have one waiting."""
    names = traveling(alg, state.client_params)
    one = payload_bytes({k: state.global_params[k] for k in names})
    total = one * len(clients) if alg.start == "global" else 0
    waiting = int(state.fresh[clients].sum())
    if waiting:
        total += waiting * payload_bytes({k: state.sent[k][0] for k in names})
    return total


def probe_bytes(alg: Algorithm, state: State, candidates: int) -> int:
    """What a probe round sends (a selection stage that ``probes``: Power-of-Choice's loss query): the global model's
    traveling tensors to each of the ``candidates`` it asks. A deployment sends them before the round's selection, so
    they are counted in ``bytes_down`` beside the training messages (a selected candidate then receives the model
    again, in its training message, and both are counted: two messages, as ``fedlib.flower`` sends them)."""
    names = traveling(alg, state.global_params)
    return candidates * payload_bytes({k: state.global_params[k] for k in names})


def moved(obj: Any, dev: torch.device | str) -> Any:
    """``obj`` (tensors, possibly in nested dicts) on device ``dev``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dev)
    return {k: moved(v, dev) for k, v in obj.items()} if isinstance(obj, dict) else obj
