"""Client selection: how many clients take part in round t, and which.

AdaFL: Chen, Chong and Quek, "Dynamic Attention-based Communication-Efficient Federated
Learning", 2021 (arXiv:2101.05634), Algorithm 1. Its two components are two
independent knobs here, so every combination in its ablation (and beyond) is a config:

- *how many*: a fraction schedule gamma(t); K = gamma(t) M clients in round t.
  ``ConstantFraction`` (the usual FL) or ``StepFraction`` (AdaFL Sec. 2.3: F distinct fractions
  from gamma^(1) to gamma^(T), each held Delta_T = T / F rounds; Figure 2).
- *which*: ``UniformSelection`` (K clients uniformly without replacement, McMahan et al.) or
  ``AttentionSelection`` (AdaFL Sec. 2.2: K clients without replacement with probabilities
  p = a^(t), the attention scores, updated from model divergence after each aggregation).

Symbols -> arguments: M -> ``n_clients``; gamma^(t) -> ``fraction(t)``; K -> ``count(t, M)``;
a^(t) -> ``AttentionSelection.scores``; alpha -> ``decay``; n (data-size shares) -> ``n_samples``.

Rounding K = gamma M: the paper's fractions times M = 100 are whole numbers; in general we
round half up and keep at least one client (K = max(1, floor(gamma M + 1/2))), after
removing float noise (0.30000000000000004 * 100 is 30, not 31 under a ceiling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import numpy as np
import torch

from fedlib.core.protocols import Params, RunSpec, Selector


class CountSchedule(Protocol):
    """K(t): how many clients upload in round t (``ConstantFraction``, ``StepFraction``)."""

    def count(self, t: int, n_clients: int) -> int: ...


def clients_for(fraction: float, n_clients: int) -> int:
    """K = max(1, round-half-up(gamma M)), at most M."""
    return max(1, min(n_clients, math.floor(round(fraction * n_clients, 9) + 0.5)))


# -- how many: fraction schedules ------------------------------------------------------------------
@dataclass(frozen=True)
class ConstantFraction:
    """gamma(t) = ``fraction`` for every round; or a fixed count S (``clients_per_round``, FedMCSA's S)."""

    fraction: float | None = None
    clients_per_round: int | None = None

    def count(self, t: int, n_clients: int) -> int:
        if self.clients_per_round is not None:
            return min(n_clients, self.clients_per_round)
        if self.fraction is not None:
            return clients_for(self.fraction, n_clients)
        return n_clients


@dataclass(frozen=True)
class StepFraction:
    """AdaFL's dynamic fraction (Sec. 2.3, Figure 2): F equal steps from gamma^(1) to gamma^(T).

    ``start`` gamma^(1), ``end`` gamma^(T), ``steps`` F, ``horizon`` T. Round t (1-based) is in
    phase j = floor((t - 1) F / T) (clipped to F - 1 for t > T), and
    gamma(t) = start + j (end - start) / (F - 1), so Delta_T = T / F and Delta_gamma =
    (end - start) / (F - 1). The paper's instance: 0.1 -> 0.5, F = 5, T = 1000 (Tables 1-2; its
    Dyn. FedAvg uses T = 1500): rounds 1-200 at 0.1, 201-400 at 0.2, ..., 801-1000 at 0.5.
    With F = 1 the fraction is ``start`` throughout.
    """

    start: float
    end: float
    steps: int
    horizon: int

    def __post_init__(self) -> None:
        if not (0 < self.start <= 1 and 0 < self.end <= 1):
            raise ValueError(f"fraction_schedule: fractions must be in (0, 1], got start={self.start}, end={self.end}")
        if self.end < self.start:
            raise ValueError(f"fraction_schedule: the fraction must not decrease (start={self.start} > end={self.end})")
        if not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"fraction_schedule: F (steps) must be an integer >= 1, got {self.steps!r}")
        if not isinstance(self.horizon, int) or self.horizon < self.steps:
            raise ValueError(f"fraction_schedule: the horizon T={self.horizon!r} must be an integer >= F={self.steps}")

    def fraction(self, t: int) -> float:
        if self.steps == 1:
            return self.start
        j = min(self.steps - 1, (t - 1) * self.steps // self.horizon)
        return self.start + j * (self.end - self.start) / (self.steps - 1)

    def count(self, t: int, n_clients: int) -> int:
        return clients_for(self.fraction(t), n_clients)


def schedule_counts(schedule: CountSchedule, rounds: int, n_clients: int) -> np.ndarray:
    """K_t for t = 1..rounds: the uploads of every round (AdaFL's communication cost is their cumulative sum)."""
    return np.array([schedule.count(t, n_clients) for t in range(1, rounds + 1)], dtype=np.int64)


# -- which: uniform or attention ---------------------------------------------------------------------
@dataclass
class UniformSelection(Selector):
    """K(t) clients drawn uniformly without replacement (McMahan et al.); all clients when K = M.

    ``clients_per_round`` (S) or ``fraction`` (C) give a constant K; ``schedule`` a K(t)
    (AdaFL's "Dyn. FedAvg" is this with a ``StepFraction``). All None: full participation.
    """

    clients_per_round: int | None = None
    fraction: float | None = None
    schedule: CountSchedule | None = None

    def count(self, n_clients: int, t: int = 1) -> int:
        sched: CountSchedule = self.schedule or ConstantFraction(self.fraction, self.clients_per_round)
        return sched.count(t, n_clients)

    def select(self, t: int, n_clients: int, rng: np.random.Generator) -> np.ndarray:
        k = self.count(n_clients, t)
        if k == n_clients:
            return np.arange(n_clients)
        return np.sort(rng.choice(n_clients, size=k, replace=False))


@dataclass
class AttentionSelection(Selector):
    """AdaFL's attention-based client selection (Sec. 2.2, Eq. 1-2, Algorithm 1 lines 1, 3-4, 9-12).

    ``scores`` a^(t) start as the data-size shares n_k / n (line 1). Round t draws K(t) clients
    without replacement with probabilities p = a^(t) (numpy's ``Generator.choice(replace=False,
    p=...)``: successive draws, each from p renormalised over the clients not yet drawn). After
    the server aggregates, ``observe`` sets for each selected client i

        d_i = ||w^(t+1) - w_i^(t)||_2                                      (Eq. 1)
        a_i <- alpha a_i + (1 - alpha) d_i / sum_{k in S} d_k * sum_{k in S} a_k   (Eq. 2)

    and leaves unselected clients' scores unchanged, so a stays a probability vector (the
    selected clients' mass is redistributed among them). w^(t+1) is the new global model; for
    personalised aggregators that send each uploader its own model (FedMCSA), the model the
    server sends client i back -- our choice, since there is no single global model to compare
    against; the paper only defines the global case. Distances run over every uploaded
    floating tensor of the state dict, flattened and concatenated (the paper: all weight matrices).
    If every d_i is 0 the scores stay as they are (Eq. 2 would divide by zero).
    """

    observes: ClassVar[bool] = True  # the round calls ``observe`` after each aggregation

    n_samples: np.ndarray
    decay: float = 0.9
    clients_per_round: int | None = None
    fraction: float | None = None
    schedule: CountSchedule | None = None
    scores: np.ndarray = field(init=False)
    history: list[np.ndarray] = field(default_factory=list, init=False)  # a^(t) at every round's selection

    def __post_init__(self) -> None:
        n = np.asarray(self.n_samples, dtype=np.float64)
        if n.ndim != 1 or (n <= 0).any():
            raise ValueError("AttentionSelection.n_samples must be positive client data sizes")
        if not 0 <= self.decay < 1:
            raise ValueError(f"attn_decay (alpha) = {self.decay!r} must be in [0, 1)")
        self.scores = n / n.sum()

    def count(self, n_clients: int, t: int = 1) -> int:
        sched: CountSchedule = self.schedule or ConstantFraction(self.fraction, self.clients_per_round)
        return sched.count(t, n_clients)

    def select(self, t: int, n_clients: int, rng: np.random.Generator) -> np.ndarray:
        if n_clients != len(self.scores):
            raise ValueError(f"AttentionSelection has scores for {len(self.scores)} clients, the data has {n_clients}")
        k = self.count(n_clients, t)
        self.history.append(self.scores.copy())
        if k == n_clients:
            return np.arange(n_clients)
        p = self.scores / self.scores.sum()  # guard against float drift; a stays stochastic by Eq. 2
        return np.sort(rng.choice(n_clients, size=k, replace=False, p=p))

    def state_dict(self) -> dict:
        """What changes from round to round (plain data, for snapshots): the scores and their history."""
        return {"scores": self.scores.copy(), "history": list(self.history)}

    def traces(self, rounds: int) -> dict:
        """'selection_scores' (rounds x N): a^(t) as it was when round t drew its clients."""
        return {"selection_scores": np.array(self.history[-rounds:])} if self.history else {}

    def load_state_dict(self, d: dict) -> None:
        self.scores, self.history = np.asarray(d["scores"], dtype=np.float64), list(d["history"])

    def observe(self, selected: np.ndarray, uploads: Params, reference: Params) -> np.ndarray:
        """Eq. 1-2 for the selected clients; ``uploads[name]`` (K, ...) in ``selected``'s order,
        ``reference[name]`` the new global model (no client axis) or one model per uploader (K, ...)."""
        sq = None
        for name, up in uploads.items():
            ref = reference[name]
            diff = (up - ref).reshape(up.shape[0], -1).to(torch.float64)
            s = (diff * diff).sum(1)
            sq = s if sq is None else sq + s
        assert sq is not None, "AttentionSelection.observe: no uploads"  # a round selects at least one client
        d = sq.sqrt().cpu().numpy()
        self.scores = attention_update(self.scores, np.asarray(selected), d, self.decay)
        return d


def attention_update(scores: np.ndarray, selected: np.ndarray, d: np.ndarray, decay: float) -> np.ndarray:
    """AdaFL Eq. 2 as a pure function: new scores for all clients (unselected unchanged)."""
    a = np.array(scores, dtype=np.float64)
    if d.sum() <= 0:
        return a
    mass = a[selected].sum()
    a[selected] = decay * a[selected] + (1 - decay) * d / d.sum() * mass
    return a


def build_selection(cfg: RunSpec, n_samples: np.ndarray | None = None) -> UniformSelection | AttentionSelection:
    """The selection stage a ``RunConfig`` names: ``selection`` x (``clients_per_round`` | ``fraction`` | ``fraction_schedule``)."""
    s, schedule = cfg.selection, None
    if s.fraction_schedule is not None:
        start, end, steps, *horizon = s.fraction_schedule
        schedule = StepFraction(float(start), float(end), int(steps), int(horizon[0]) if horizon else cfg.rounds)
    if s.rule == "uniform":
        return UniformSelection(s.clients_per_round, s.fraction, schedule)
    if s.rule == "attention":
        if n_samples is None:
            raise ValueError("selection='attention' needs the clients' training-set sizes (n_samples)")
        return AttentionSelection(np.asarray(n_samples), s.attn_decay, s.clients_per_round, s.fraction, schedule)
    raise ValueError(f"RunConfig.selection={s.rule!r} is not one of: uniform, attention")
