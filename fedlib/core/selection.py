"""Client selection: how many clients take part in round t, and which.

AdaFL: Chen, Chong and Quek, "Dynamic Attention-based Communication-Efficient Federated
Learning", 2021 (arXiv:2101.05634), Algorithm 1. Its two components are two
independent knobs here, so every combination in its ablation (and beyond) is a config:

- *how many*: a fraction schedule gamma(t); K = gamma(t) M clients in round t.
  ``ConstantFraction`` (the usual FL) or ``StepFraction`` (AdaFL Sec. 2.3: F distinct fractions
  from gamma^(1) to gamma^(T), each held Delta_T = T / F rounds; Figure 2).
- *which*: ``UniformSelection`` (K clients uniformly without replacement, McMahan et al.),
  ``AttentionSelection`` (AdaFL Sec. 2.2: K clients without replacement with probabilities
  p = a^(t), the attention scores, updated from model divergence after each aggregation) or
  ``PowerOfChoice`` (Cho, Wang and Joshi's baseline for loss-biased selection; its own section below).

Symbols -> arguments: M -> ``n_clients``; gamma^(t) -> ``fraction(t)``; K -> ``count(t, M)``;
a^(t) -> ``AttentionSelection.scores``; alpha -> ``decay``; n (data-size shares) -> ``n_samples``.

Rounding K = gamma M: the paper's fractions times M = 100 are whole numbers; in general we
round half up and keep at least one client (K = max(1, floor(gamma M + 1/2))), after
removing float noise (0.30000000000000004 * 100 is 30, not 31 under a ceiling).
"""

from __future__ import annotations

import math
from collections.abc import Callable
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


# -- which: Power-of-Choice ----------------------------------------------------------------------------
LOSSES = ("pow-d",)  # how a candidate's loss is measured (the paper's cpow-d and rpow-d are not implemented)


@dataclass
class PowerOfChoice(Selector):
    """Power-of-Choice client selection: of d candidates drawn by data share, the m whose loss is highest.

    Cho, Wang and Joshi, "Client Selection in Federated Learning: Convergence Analysis and Power-of-Choice Selection
    Strategies", 2020 (arXiv:2010.01243), the pow-d strategy. Its convergence analysis shows that skewing selection
    towards clients of higher local loss speeds up convergence at the price of a non-vanishing error term; d sets the
    skew, and d = m is the unbiased data-share sampling the paper starts from.

    Round t, as the paper's steps and this class's arguments:

    1. the server draws a candidate set A of d clients without replacement, client k with probability p_k = n_k / n
       (its share of the training data; ``n_samples``), by numpy's ``Generator.choice(replace=False, p=...)`` on the
       run's selection stream, as ``AttentionSelection`` draws;
    2. it sends the current model to the candidates and each returns its local loss F_k(w^(t)), the mean cross-entropy
       over all its training rows (pow-d; ``losses``, computed by the round: ``fedlib.core.protocols.Selector.probes``);
    3. it keeps the m = K(t) candidates of highest loss (ties to the lower client index, so a seed gives one selection).

    Symbols -> arguments: d -> ``candidates`` (``RunConfig.poc_candidates``), m -> ``count(t, M)`` (``clients_per_round``,
    ``fraction`` or ``fraction_schedule``, as for every rule), p_k -> ``n_samples`` / their sum; the strategy ->
    ``loss`` (``RunConfig.poc_loss``).

    The paper's other variants, not implemented (``poc_loss`` accepts only "pow-d"): cpow-d, where each candidate
    estimates its loss on a mini-batch of b rows instead of all its data (less computation), and rpow-d, where the
    server ranks by the loss each client reported while training in the last round it took part in (no extra
    communication or computation, stale values). Its aggregation averages the m selected updates with equal weights,
    since data share already entered through the draw; here the method aggregates as it always does (its own weights),
    so that the rule composes with every method as AdaFL's selection does.

    Choices the paper leaves open:

    - "the current global model" for a method without one: each candidate's loss is that of the model it would start
      the round from (``fedlib.core.state.start_models``): the global model for FedAvg's family (with the client's own
      local parameters where the method keeps some, FedBN's BatchNorm), the personalised model the server last sent it
      for FedMCSA's family;
    - d: ``None`` stands for d = min(M, 2 m(t)), the smallest whole multiple of m that skews at all (the paper tries
      several d; a fixed one does not follow a fraction schedule's m); a given d must be at least the largest m of the run and at most M (``RunConfig.validate``);
    - d = m or m = M: every candidate is kept, so no loss is computed (and none is charged).

    Cost: the losses are computation the candidates do and upload (one forward pass over their training data, one
    number each) beyond their local training, and the current model the server sends each of the d candidates to
    compute it on: the round counts that download in ``bytes_down`` (``fedlib.core.state.probe_bytes``: d models a
    round, beside the m training messages, as a deployment sends them; ``fedlib.flower`` counts the same). ``traces`` records them per round ('candidate_losses', rounds x M: the
    candidates' losses, NaN for clients not asked), so ``probe_rows`` gives the rows evaluated each round.
    """

    probes: ClassVar[bool] = True  # the round passes ``select`` the candidates' losses

    n_samples: np.ndarray
    candidates: int | None = None  # d; None: min(M, 2 m(t))
    loss: str = "pow-d"
    clients_per_round: int | None = None
    fraction: float | None = None
    schedule: CountSchedule | None = None
    history: list[np.ndarray] = field(default_factory=list, init=False)  # candidate losses (NaN: not asked)

    def __post_init__(self) -> None:
        n = np.asarray(self.n_samples, dtype=np.float64)
        if n.ndim != 1 or (n <= 0).any():
            raise ValueError("PowerOfChoice.n_samples must be positive client data sizes")
        if self.candidates is not None and (isinstance(self.candidates, bool) or self.candidates < 1):
            raise ValueError(f"poc_candidates (d) = {self.candidates!r} must be None or an integer >= 1")
        if self.loss not in LOSSES:
            raise ValueError(f"poc_loss={self.loss!r} is not one of: {', '.join(LOSSES)}")
        self.n_samples = n

    def count(self, n_clients: int, t: int = 1) -> int:
        sched: CountSchedule = self.schedule or ConstantFraction(self.fraction, self.clients_per_round)
        return sched.count(t, n_clients)

    def d(self, t: int, n_clients: int) -> int:
        """The round's candidate count d (at least m, at most M)."""
        m = self.count(n_clients, t)
        if self.candidates is None:
            return min(n_clients, 2 * m)
        if not m <= self.candidates <= n_clients:
            raise ValueError(
                f"poc_candidates (d) = {self.candidates} must be between the round's m = {m} and M = {n_clients}"
            )
        return self.candidates

    def select(
        self,
        t: int,
        n_clients: int,
        rng: np.random.Generator,
        losses: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> np.ndarray:
        if n_clients != len(self.n_samples):
            raise ValueError(f"PowerOfChoice has sizes for {len(self.n_samples)} clients, the data has {n_clients}")
        m, d = self.count(n_clients, t), self.d(t, n_clients)
        row = np.full(n_clients, np.nan)
        if m == n_clients:
            self.history.append(row)
            return np.arange(n_clients)
        p = self.n_samples / self.n_samples.sum()
        cand = np.sort(rng.choice(n_clients, size=d, replace=False, p=p))
        if d == m:  # every candidate is kept: nothing to rank
            self.history.append(row)
            return cand
        if losses is None:
            raise ValueError("PowerOfChoice.select needs the candidates' losses (the round passes losses=)")
        f = np.asarray(losses(cand), dtype=np.float64)
        row[cand] = f
        self.history.append(row)
        return top_loss(cand, f, m)

    def traces(self, rounds: int) -> dict:
        """'candidate_losses' (rounds x M): round t's candidates' losses on their start models, NaN elsewhere."""
        return {"candidate_losses": np.array(self.history[-rounds:])} if self.history else {}

    def state_dict(self) -> dict:
        return {"history": list(self.history)}

    def load_state_dict(self, d: dict) -> None:
        self.history = [np.asarray(h, dtype=np.float64) for h in d["history"]]


def top_loss(candidates: np.ndarray, losses: np.ndarray, m: int) -> np.ndarray:
    """The m of ``candidates`` with the highest ``losses`` (ties to the lower client index), sorted.

    A NaN loss (a candidate whose model has diverged) ranks highest: the server cannot tell it is small."""
    cand = np.asarray(candidates)
    f = np.where(np.isnan(losses), np.inf, np.asarray(losses, dtype=np.float64))
    order = np.lexsort((cand, -f))  # by loss descending, then by client index
    return np.sort(cand[order[:m]])


def probe_rows(candidate_losses: np.ndarray, n_samples: np.ndarray) -> np.ndarray:
    """Training rows the candidates evaluated in each round (from the 'candidate_losses' trace): the computation
    Power-of-Choice asks of clients beyond their local training, one forward pass per row."""
    asked = ~np.isnan(np.asarray(candidate_losses, dtype=np.float64))
    return (asked * np.asarray(n_samples, dtype=np.int64)[None, :]).sum(1)


def build_selection(
    cfg: RunSpec, n_samples: np.ndarray | None = None
) -> UniformSelection | AttentionSelection | PowerOfChoice:
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
    if s.rule == "power_of_choice":
        if n_samples is None:
            raise ValueError("selection='power_of_choice' needs the clients' training-set sizes (n_samples)")
        return PowerOfChoice(
            np.asarray(n_samples), s.poc_candidates, s.poc_loss, s.clients_per_round, s.fraction, schedule
        )
    raise ValueError(f"RunConfig.selection={s.rule!r} is not one of: uniform, attention, power_of_choice")
