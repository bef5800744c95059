"""The stages a federated round is composed of:

    select clients -> start models -> local update -> aggregate on the server -> evaluate

Each paper's method is one stage (AdaFL: selection; FedMCSA: aggregation; pFedLA: which
parameters are shared), so methods combine by configuration. This module holds the
server-side maths as plain functions (in the spirit of Flower's ``aggregate.py``) and the
small stage objects the round loop (``fedlib.core.simulation``) calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol, TypeVar, runtime_checkable

import numpy as np
import torch
from torch import nn

from fedlib.core.protocols import Executor, Params, RunSpec, Selector
from fedlib.core.selection import UniformSelection  # noqa: F401  (re-exported: algorithms build it from here)
from fedlib.data.federated import BatchPlan, FederatedData, Split
from fedlib.executors.sgd import LocalSGD

if TYPE_CHECKING:
    from collections.abc import Iterator

    from fedlib.core.state import State

_M = TypeVar("_M", bound="MethodState")


# -- a method's own state between rounds ---------------------------------------------------------------
class MethodState(Mapping):
    """A method's own state between rounds (SCAFFOLD's control variates, Ditto's and pFedMe's personal models,
    FedAvgM's velocity, ...), declared as a dataclass whose fields are ``Params`` (name -> tensor, with or without
    the client axis). It lives in ``State.extra[KEY]``; as a ``Mapping`` it is its flat ``state_dict()``
    (``"<field>.<name>" -> tensor``), which is what snapshots save, and ``of(state)`` rebuilds it from one.
    ``personal()``: the models evaluated as the clients' personal ones, for methods that keep them apart."""

    KEY: ClassVar[str] = ""
    # every subclass is a dataclass (declared so, for ``dataclasses.fields`` on the base's methods)
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {f"{f.name}.{n}": t for f in dataclasses.fields(self) for n, t in getattr(self, f.name).items()}

    @classmethod
    def from_state_dict(cls: type[_M], d: Mapping[str, torch.Tensor]) -> _M:
        parts: dict[str, Params] = {f.name: {} for f in dataclasses.fields(cls)}
        for k, t in d.items():
            name, _, param = k.partition(".")
            parts[name][param] = t
        return cls(**parts)

    @classmethod
    def of(cls: type[_M], state: State, init: Callable[[], _M] | None = None) -> _M:
        """The method's state in ``state.extra``: made by ``init()`` the first time, rebuilt from a snapshot's plain
        dict after a resumption."""
        cur = state.extra.get(cls.KEY)
        if cur is None:
            if init is None:
                raise KeyError(f"{cls.__name__}: no state under {cls.KEY!r} yet (the method has not trained)")
            cur = init()
        elif not isinstance(cur, cls):
            cur = cls.from_state_dict(cur)
        state.extra[cls.KEY] = cur
        return cur

    def personal(self) -> Params:
        raise NotImplementedError(f"{type(self).__name__} holds no personal models")

    def personal_given(self, global_view: Params) -> Params:
        """The personal models evaluated, given the clients' view of the current global model (``global_view``:
        name -> (N, ...), the global model's shared parameters beside each client's local ones, possibly expanded
        views): for methods whose personal model is made from the global one (APFL's alpha_i v_i + (1 - alpha_i) w).
        By default ``personal()``, which needs no global model."""
        return self.personal()

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.state_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.state_dict())

    def __len__(self) -> int:
        return len(self.state_dict())


# -- aggregation --------------------------------------------------------------------------------
@dataclass
class Mixing:
    """What the server makes of K uploaded models, as convex weights over the uploads.

    ``to_global``: (K,) weights; the new global model is sum_k w_k P_k.
    ``to_personal``: (K, K) matrix, or one per parameter name; row i holds the weights of
    the personalised model sent back to the i-th uploader (attention aggregators).
    """

    to_global: torch.Tensor | None = None
    to_personal: torch.Tensor | dict[str, torch.Tensor] | None = None
    beta: float = 1.0  # new global = (1 - beta) old + beta (sum_k w_k P_k); pFedMe's server beta


def mix(weights: torch.Tensor | dict[str, torch.Tensor], uploads: Params) -> Params:
    """Apply a mixing matrix ``weights`` (R, K) (or one per name) to uploads (K, ...): out[n] (R, ...) = W @ P[n]."""
    out = {}
    for n, p in uploads.items():
        w = weights[n] if isinstance(weights, dict) else weights
        out[n] = (w.to(p.dtype) @ p.reshape(p.shape[0], -1)).reshape(w.shape[0], *p.shape[1:])
    return out


def weighted_mean(uploads: Params, weights: torch.Tensor) -> Params:
    """sum_k w_k P_k / sum_k w_k per parameter: FedAvg's server update."""
    w = (weights / weights.sum()).unsqueeze(0)
    return {n: t[0] for n, t in mix(w, uploads).items()}


@dataclass
class WeightedMean:
    """FedAvg aggregation: the new global model is the mean of the uploads weighted by n_k (``by='samples'``) or equally."""

    by: str = "samples"

    def __call__(self, uploads: Params, n_samples: torch.Tensor, clients: np.ndarray) -> Mixing:
        if self.by not in ("samples", "uniform"):
            raise ValueError(f"WeightedMean.by={self.by!r} is not one of: samples, uniform")
        w = n_samples.to(torch.float64) if self.by == "samples" else torch.ones(len(clients), dtype=torch.float64)
        return Mixing(to_global=w / w.sum())


# -- shared vs local parameters ----------------------------------------------------------------------
def all_shared(name: str) -> bool:
    return True


def shared_except(*markers: str) -> Callable[[str], bool]:
    """A parameter is kept local when its name contains one of ``markers``: for hand-built ``Algorithm``s; the
    registered methods keep declared groups local (``keep_local``, ``Algorithm.local_groups``)."""
    return lambda name: not any(m in name for m in markers)


@dataclass(frozen=True)
class keep_local:
    """``shared`` from declared groups: a parameter travels unless its group (``groups[name]``, from
    ``fedlib.models.groups.param_groups``) is one of ``local`` (FedBN: ``("bn",)``, pFedLA: ``("attn",)``)."""

    groups: dict[str, str]
    local: tuple[str, ...]

    def __call__(self, name: str) -> bool:
        return self.groups.get(name, "") not in self.local

    def __hash__(self) -> int:
        return hash(self.local)


def local_sgd(cfg: RunSpec, **changes: float) -> LocalSGD:
    """The client optimiser of a run config's local part (``lr``, ``momentum``, ``weight_decay``), with ``changes``
    (a method's proximal ``mu``); the lr schedule is applied per round by the engine, in one place."""
    lo = cfg.local
    return LocalSGD(lr=lo.lr, momentum=lo.momentum, weight_decay=lo.weight_decay, **changes)


# -- the composition ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClientWork:
    """What a method's client procedure (``Algorithm.local_update``) is handed for the round's K training clients:
    their indices ``clients``, the models they ``start`` from and their proximal ``anchor`` (name -> (K, ...)),
    their rows of ``plan`` on ``split``, the run's ``state`` and ``local``, the round's optimiser (the schedule's
    lr of the round applied: the one lr every client procedure steps with).

    ``val``: every client's validation rows (N clients; a procedure takes its clients' with
    ``fedlib.data.holdout.rows_of``): the data's validation split (``val_frac``) where it has one, else the rows the
    engine held out of training for a method that asks for them (``Algorithm.validation``); None when neither.
    ``rng``: the run's random stream (the one selection draws from, snapshotted with the run), for a procedure that
    draws (FedFomo's exploration): what it draws is then part of the run's seeded sequence and a resumed run draws
    it again. ``shared``: which parameter names travel (``Algorithm.shared``, local groups resolved). ``gen``: the
    run's mini-batch stream (the one ``plan`` was drawn from), for a procedure that draws samples of its own
    (FedALA's s% of local data); snapshots save it, so a resumed run draws the same ones. None where a caller builds
    the work by hand. ``drawn``: the round's draws of a method that shares data (``Share.draw``), (steps, K, ...),
    where its caller drew them from the whole round's plan (``fedlib.flower``'s server); None: the procedure draws
    them itself. ``peers``: (picks (K, slots), models name -> (R, ...)): the other clients' models the round's
    clients download (``Algorithm.peers``: FedFomo's), ``picks[j]`` numbering rows of ``models`` (-1: an empty
    slot); None where the algorithm declares none or a caller builds the work by hand. ``local_draws``: what a
    ``DrawnLocal`` procedure would draw from ``gen``, one entry per client (its rows, numbered within its own training
    rows; None: nothing drawn), where the caller drew it (``fedlib.flower``'s server, which holds the stream); None:
    the procedure draws from ``gen`` itself."""

    executor: Executor
    model: nn.Module
    start: Params
    anchor: Params
    plan: BatchPlan
    split: Split
    state: State
    clients: torch.Tensor
    local: LocalSGD
    val: Split | None = None
    rng: np.random.Generator | None = None
    shared: Callable[[str], bool] = all_shared
    gen: torch.Generator | None = None
    drawn: Params | None = None
    peers: tuple[np.ndarray, Params] | None = None
    local_draws: list[torch.Tensor | None] | None = None

    def train(self, params: Params, plan: BatchPlan | None = None, opt: LocalSGD | None = None, **kw: Any) -> Params:
        """``executor.train`` of ``params`` on the round's split, with the round's plan and optimiser unless given."""
        plan, opt = self.plan if plan is None else plan, self.local if opt is None else opt
        return self.executor.train(self.model, params, plan, self.split, opt, **kw)


@dataclass(frozen=True)
class FineTune:
    """Evaluation by fine-tuning (FedBABU): before each evaluation every client fine-tunes the model it would be
    evaluated with otherwise (the global model, with its own local parameters) for ``epochs`` epochs of its training
    rows, and the fine-tuned models are evaluated as the clients' personal ones; they are not kept (the next round
    starts from the global model as if no client had fine-tuned). The fine-tuning is the engine's one
    (``fedlib.core.callbacks.fine_tune``, as a new client's: plain SGD at the round's lr, a random stream of its own);
    ``objective(model)``: the objective it minimises on the run's model (None: the cross-entropy; e.g. FedRep's
    ``FrozenParts`` of the model's body, to tune the head only)."""

    epochs: int
    objective: Callable[[nn.Module], Any] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int) or self.epochs < 1:
            raise ValueError(f"FineTune.epochs={self.epochs!r} must be an integer >= 1")


# the signatures of the stages ``Algorithm`` holds (``State`` quoted: ``fedlib.core.state`` imports this module)
Aggregate = Callable[[Params, torch.Tensor, np.ndarray], Mixing]  # (uploads, n_k of the uploaders, uploaders)
LocalUpdate = Callable[[ClientWork], Params]  # -> the trained models of the work's clients
ServerStep = Callable[[Params, Params, "State"], Params]  # (global, mean of the uploads, state) -> new global


class Exchange(Protocol):
    """The method state that travels beside the model (``Algorithm.exchange``): what the server sends every training
    client (``down``) and what each uploading client sends back (``up``), with how the server updates its own part of
    the state from it (``absorb``). The simulation keeps one ``State`` and the client procedure updates all of it; the
    declaration is what counts the bytes (``bytes_down``, ``bytes_up``) and what lets ``fedlib.flower`` split it.

    - ``down(state)``: the server's tensors (no client axis) every training client reads this round;
    - ``receive(state, down)``: a client puts them in its own state before it trains;
    - ``up(state)``: (K, ...) rows, one per client of the round's training (in order), that the server reads;
      ``like(state)``: one client's row of each (its shape and dtype: what the server checks an upload against);
    - ``absorb(state, start, uploads, rows, n_samples, params, n_clients)``: the server's update of its state from
      the uploading clients' models ``uploads`` (K, ...), their ``rows`` and training sizes, ``start`` the global
      model they started from, ``params`` the shared parameter names (no buffers), before the aggregation: what the
      client procedure does to the server's part of the state in the simulation, by the same function."""

    def down(self, state: State) -> Params: ...

    def receive(self, state: State, down: Params) -> None: ...

    def up(self, state: State) -> Params: ...

    def like(self, state: State) -> Params: ...

    def absorb(self, state: State, start: Params, uploads: Params, rows: Params, n_samples: torch.Tensor,
               params: list[str], n_clients: int) -> None: ...  # fmt: skip


class Share(Protocol):
    """Data every client contributes once and the server broadcasts to every client before the first round's training
    (``Algorithm.share``: FedMix's batch means), with the round's draws a client procedure makes against it.

    - ``offer(split, n_classes)``: what ``split``'s clients contribute from their training rows, name -> (rows, ...),
      their rows one client after the other in client order (a client with no rows has none): so the set is the same
      whether one offer is made of the whole training split (the simulation) or each client offers its own rows and
      the server concatenates them along dim 0 in client order (``fedlib.flower``);
    - ``receive(state, shared)``: the set put in a state (the simulation's one, or a client's own);
    - ``draw(state, plan)``: the round's draws the client procedure makes from the whole round's plan (FedMix's
      pairing of samples with shared rows), name -> (steps, K, ...) over the plan's K clients; the simulation's
      procedure draws them itself, ``fedlib.flower``'s server draws them and hands each client its column, as its
      mini-batches (``ClientWork.drawn``; not counted in the bytes, as the plan is not).

    Bytes, counted in round 1 by the simulation and ``fedlib.flower`` alike: each client's offer up once (the whole
    set, in all) and the whole set down to each of the N training clients once."""

    def offer(self, split: Split, n_classes: int) -> Params: ...

    def receive(self, state: State, shared: Params) -> None: ...

    def draw(self, state: State, plan: BatchPlan) -> Params: ...


class Peers(Protocol):
    """Other clients' models a method's training clients download each round beyond their start models
    (``Algorithm.peers``: FedFomo's M models). The server chooses them; each client reports a row back with its
    upload, that the server folds into its state. The engine counts the downloads in ``bytes_down`` (each model: one
    upload's traveling tensors) and the rows in ``bytes_up``; ``fedlib.flower`` sends them in the messages.

    - ``slots``: models per client (M);
    - ``choose(state, clients, rng)``: (K, slots) indices of the clients whose last uploads each of ``clients``
      downloads, -1 in the empty slots (the last ones), drawn from the run's random stream ``rng`` after the
      selection (``ClientWork.peers`` hands them to the client procedure);
    - ``report(state)``: (K, ...) rows the round's training clients send back, in order, once they trained;
      ``like(state)``: one client's row of each (its shape and dtype);
    - ``absorb(state, clients, picks, rows)``: the server's update from the rows of the uploading ``clients``
      (their ``picks``): FedFomo's affinities."""

    @property
    def slots(self) -> int: ...

    def choose(self, state: State, clients: np.ndarray, rng: np.random.Generator) -> np.ndarray: ...

    def report(self, state: State) -> Params: ...

    def like(self, state: State) -> Params: ...

    def absorb(self, state: State, clients: np.ndarray, picks: np.ndarray, rows: Params) -> None: ...


@runtime_checkable
class DrawnLocal(Protocol):
    """A client procedure (``Algorithm.local_update``) that draws rows from the run's mini-batch stream right after
    the round's plan, apart from its work, so that whoever holds the stream and only the clients' sizes draws them
    in the simulation's order and hands each client its own (``fedlib.flower``: the server draws, each client's
    ``ClientWork.local_draws`` holds its entry). ``draw_local(sizes, trained_before, model, generator)``: for the
    round's K training clients (in order) with ``sizes`` (K,) training rows, ``trained_before`` (K,) bool: whether
    each trained in an earlier round, on ``model`` (the run's, for its structure: buffers or not), each one's rows
    numbered within its own training rows, or None where it draws nothing; the procedure calls it itself with
    ``ClientWork.gen`` where ``ClientWork.local_draws`` is None, so both paths draw the same rows."""

    def draw_local(
        self, sizes: torch.Tensor, trained_before: torch.Tensor, model: nn.Module, generator: torch.Generator
    ) -> list[torch.Tensor | None]: ...


BeforeEval = Callable[[Executor, nn.Module, "State", FederatedData, torch.Generator], None]


@runtime_checkable
class DrawnBeforeEval(Protocol):
    """A ``before_eval`` stage whose random draws are apart from its work, so that whoever holds only the clients'
    sizes draws them and each client does its own part (``fedlib.flower``: the server draws from the run's
    evaluation stream, each client adapts on its column). ``draw(data, generator)``: the mini-batches, (steps, N, B)
    rows numbered within each client's own rows (``data`` may hold only the splits' sizes, ``Split.layout``);
    ``apply(executor, model, state, data, plan)``: the stage's work on ``data``'s clients with ``plan``. The stage
    called is ``apply(..., draw(data, generator))``."""

    def draw(self, data: FederatedData, generator: torch.Generator) -> BatchPlan: ...

    def apply(
        self, executor: Executor, model: nn.Module, state: State, data: FederatedData, plan: BatchPlan
    ) -> None: ...


@dataclass
class Algorithm:
    """One FL method as a composition of stages.

    ``select``: which clients upload this round. ``trains``: 'selected' (FedAvg) or 'all'
    (pFedMe/FedMCSA train every client and aggregate only the selected). ``start``: clients
    start from the 'global' model, or 'personal': from the personalised model W_i the server
    sent them if one arrived since they last trained, else from their own model.
    ``local``: the client objective/optimiser (``LocalSGD``); ``anchor``: what the proximal
    term pulls toward ('start': the model the client started the round from, FedProx;
    'received': the last W_i the server sent, FedMCSA's W_local). ``aggregate``: uploads ->
    ``Mixing``. ``shared``: which parameter names travel. ``evaluate``: test the 'global'
    model or each client's own ('personal') model. ``local_update``: a method's own client
    procedure (default: ``executor.train`` with ``local``), called as ``local_update(work: ClientWork) -> uploaded
    models``; its derived optimisers (Ditto's proximal one) are made from ``work.local``, the round's.
    ``personal``: the ``MethodState`` class whose ``personal()`` models are evaluated (pFedMe's theta_i), for
    methods that keep them apart from what they upload.
    ``report_global``: also evaluate the global model every round (``gm_*`` columns).
    ``batches_per_step``: mini-batches a local step consumes (Per-FedAvg: 2, or 3 for HF).
    ``before_eval(executor, model, state, data, generator)``: prepares the evaluated models from the run's
    ``FederatedData`` and its evaluation stream (Per-FedAvg adapts the global model on each client's training data,
    or on its test data as pFedMe's code does); a ``DrawnBeforeEval`` also runs where the clients are apart. ``local_groups``: declared
    parameter groups (``fedlib.models.groups.param_groups``) that never leave the client; the engine turns
    them into ``shared`` for the model at hand. ``server_step(global, mean, state) -> new global``: a
    server optimiser taking the uploads' mean as its pseudo-gradient target (FedAvgM, FedAdam); it keeps
    its own tensors in ``state.extra`` under its method's key, so snapshots carry them. ``validation``: the
    fraction of each client's training rows the method's client procedure needs as validation rows when the data
    holds none out (``val_frac`` = 0): the engine moves them out of the training split before the first round
    (``simulation.method_validation``: the same rows for every run on the data) and hands them to the procedure
    as ``ClientWork.val`` (FedFomo weighs other clients' models on them); 0: none. ``finetune``: evaluate each
    client's fine-tuning of the global model (``FineTune``: FedBABU) in place of the evaluated models above. ``traces``: what the
    method records for the result beyond every run's ``selected`` (``"attention"``: the personalisation weights of
    aggregators that send each uploader its own model, FedMCSA and HeurFedAMP); only runs that declare a trace
    pay for recording it. ``exchange``: the method state that travels beside the model (``Exchange``: SCAFFOLD's
    control variates, FedDyn's h, FedNova's steps), counted in the bytes and split by ``fedlib.flower``. ``share``:
    data the clients contribute once and every client receives before round 1 (``Share``: FedMix's batch means).
    ``peers``: other clients' models each training client downloads (``Peers``: FedFomo's), chosen by the server.
    """

    name: str
    select: Selector | None = None  # set by ``build_algorithm`` from the config's selection part
    local: LocalSGD | None = None  # the clients' optimiser before the lr schedule
    aggregate: Aggregate | None = None  # required: ``__post_init__`` refuses None
    trains: str = "selected"
    start: str = "global"
    anchor: str = "start"
    evaluate: str = "global"
    shared: Callable[[str], bool] = field(default=all_shared)
    local_update: LocalUpdate | None = None
    personal: type[MethodState] | None = None
    report_global: bool = False
    batches_per_step: int = 1
    before_eval: BeforeEval | None = None
    local_groups: tuple[str, ...] = ()  # parameter groups the method keeps on the clients (FedBN: ("bn",))
    server_step: ServerStep | None = None  # (global, mean of uploads, state) -> new global (FedAvgM, FedAdam)
    traces: tuple[str, ...] = ()  # records beyond 'selected' ("attention": FedMCSA's, HeurFedAMP's weights)
    validation: float = 0.0  # training rows held out for the client procedure where the data has no val split
    finetune: FineTune | None = None  # clients fine-tune the global model before evaluation (FedBABU)
    exchange: Exchange | None = None  # method state that travels beside the model (SCAFFOLD's control variates)
    share: Share | None = None  # data the clients share once, before round 1 (FedMix's batch means)
    peers: Peers | None = None  # other clients' models the training clients download (FedFomo's)

    def __post_init__(self) -> None:
        if self.aggregate is None:
            raise ValueError(f"Algorithm {self.name!r} needs an aggregate stage")
        if not 0 <= self.validation < 1:
            raise ValueError(f"Algorithm.validation={self.validation!r} must be in [0, 1)")
        for attr, allowed in (
            ("trains", ("selected", "all")),
            ("start", ("global", "personal")),
            ("anchor", ("start", "received")),
            ("evaluate", ("global", "personal")),
        ):
            if getattr(self, attr) not in allowed:
                raise ValueError(f"Algorithm.{attr}={getattr(self, attr)!r} is not one of: {', '.join(allowed)}")
