"""The messages of a round between ``fedlib.flower``'s server and clients (``Task``, ``Report``), what the
Flower path refuses and the setup both halves build from the config (see ``fedlib.flower.rounds``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from fedlib.algorithms import build_algorithm
from fedlib.config.run import RunConfig
from fedlib.core.stages import Params, keep_local
from fedlib.core.state import Schedule, payload_bytes
from fedlib.flower.evaluation import refuse_unplanned, training_clients
from fedlib.models.groups import param_groups
from fedlib.models.registry import build_model


class RefusedUpdate(ValueError):
    """An upload the server will not aggregate (wrong names, shapes or dtype, or a non-finite value)."""


def setup(cfg: RunConfig, input_shape: tuple[int, ...], n_classes: int, n_samples: np.ndarray | None):
    """(algorithm, initial model, schedule) of ``cfg``, as ``fedlib.runs.train`` builds them: both halves build the
    same ones from the config, so neither sends the other code."""
    cfg.validate()
    if cfg.selection.dropout or cfg.selection.stragglers:
        raise ValueError(
            "fedlib.flower: dropout and stragglers simulate failing clients; in a deployment clients fail on their own "
            "(a client that does not answer is left out of the round): set dropout=0 and stragglers=0"
        )
    dtype, m = getattr(torch, cfg.dtype), cfg.model
    model = build_model(m.name, input_shape, n_classes, m.hidden, seed=cfg.seed, dtype=dtype, attention=m.attention)
    alg = build_algorithm(cfg, n_samples=n_samples)
    refuse_unplanned(alg, cfg.method.NAME)
    if alg.local_groups:  # as ``simulate``: declared groups -> which parameters stay on the clients
        alg.shared = keep_local(param_groups(model), tuple(alg.local_groups))
    lo = cfg.local
    return alg, model, Schedule(lo.local_steps, lo.local_epochs, lo.batch_size, lo.lr_decay)


@dataclass
class Task:
    """What the server sends one training client in round t: whether it uploads (``upload``: it was selected; with
    ``trains='all'`` the others train without uploading), the tensors it starts from (``params``: the global model's
    traveling tensors, and/or ``personal``: the W_i waiting for it), the method's server state it reads (``state``:
    ``Algorithm.exchange.down``, SCAFFOLD's c), the other clients' models it downloads (``peers``: ``Algorithm.peers``)
    and its mini-batch plan (``index`` (steps, B): rows of its own training data; ``weight``, ``active``: epoch
    padding, or None; ``drawn``: its column of the round's draws of a method that shares data,
    ``Algorithm.share.draw``; ``local_draws``: the rows of its own training data its client procedure draws from the
    run's mini-batch stream after the plan, ``DrawnLocal``, or None: all part of the plan, not counted in the bytes)."""

    t: int
    client: int
    upload: bool
    params: Params = field(default_factory=dict)
    personal: Params = field(default_factory=dict)
    index: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    active: torch.Tensor | None = None
    state: Params = field(default_factory=dict)
    drawn: Params = field(default_factory=dict)
    peers: Params = field(default_factory=dict)  # other clients' models it downloads (``fedlib.flower.peers``)
    local_draws: torch.Tensor | None = None

    def bytes_down(self) -> int:
        return sum(payload_bytes(p) for p in (self.params, self.personal, self.state, self.peers))


STATE = "state."  # an upload's names of the method's rows (``Algorithm.exchange.up``), beside the model's


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


def _sizes_for(cfg: RunConfig) -> np.ndarray | None:
    """The ``n_samples`` a client builds its algorithm with: a selection stage needs some, and a client never selects
    (the server's stage is the one that runs), so ones do."""
    return np.ones(training_clients(cfg))
