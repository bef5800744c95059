"""FedALA: Zhang, Hua, Wang, Song, Xue, Ma, Guan, "FedALA: Adaptive Local Aggregation for Personalized Federated
Learning", AAAI 2023 (arXiv:2212.01197), Algorithm 1.

A selected client i does not overwrite its old local model Theta_i with the global Theta it receives; it starts its
local training from the adaptive local aggregation (Eq. 3-4)
    Theta^_i = Theta_i + (Theta - Theta_i) * [1^{|Theta_i| - p}; W_i^p]      (element-wise)
so the lower layers take the global values and the top p layers an element-wise mix, W_i^p in [0, 1] initialised
to ones. W_i^p is learned (Eq. 6) on a random s% of the client's training data with the loss of Theta^_i, the
gradient taken with respect to W_i^p only and the result clipped:
    W_i^p <- clip(W_i^p - eta grad_{Theta^} L(Theta^_i; batch) * (Theta - Theta_i), 0, 1)     per mini-batch,
in the start phase (the first round with a local model to keep) until the loss converges, in later rounds for one
epoch of the sample. The client then trains Theta^_i as FedAvg does and uploads it; the server averages the uploads
(sample-weighted, as the authors' server). The personal model (``test_acc``) is the client's local model after ALA
and training; the global model is reported beside it (``gm_*``).
Paper symbols -> ``RunConfig``: p -> ``ala_layers``, eta -> ``ala_eta``, s -> ``ala_rand_percent``, the start phase's
convergence test -> ``ala_threshold`` over ``ala_window`` losses (the code's ``threshold``, ``num_pre_loss``), capped
at ``ala_max_epochs``; the local learning rate and epochs -> ``lr``, ``local_epochs`` (or ``local_steps``); the
ALA batch -> ``batch_size``. Defaults: the code's (eta 1.0, s 80, ``layer_idx`` 2, threshold 0.1, 10 losses).

Choices, read from the authors' code (``utils/ALA.py``, ``clientALA.py``) where the paper leaves them open:
- "Layers" are parameter tensors counted from the output end, as the code's ``layer_idx`` (its default 2: the last
  Linear layer's weight and bias, the paper's p = 1 layer). ``ala_layers`` at least the model's number of parameter
  tensors mixes the whole model element-wise.
- Buffers (BatchNorm statistics) take the global values, as every parameter below the top p: the engine averages
  them as FedAvg does (the code's server averages parameters only and leaves each client its own statistics).
  Parameters the engine keeps local (FedBN's BN, pFedLA's attention) stay the client's own (Theta - Theta_i = 0).
- The start phase: the code skips ALA while the local model equals the global one (its first round, every client
  starting from the global model) and trains W until convergence the round after. Here a client skips ALA the first
  time it trains (its local model is then the initial model, nothing of its own to keep) and runs the start phase
  the second time, whichever rounds those are (with partial participation); later times one epoch.
- Convergence: as the code, the loss of the epoch's last batch (at Theta^_i before that batch's step) is recorded
  each epoch and W is trained until more than ``ala_window`` losses are recorded and the standard deviation (numpy's,
  ddof 0) of the last ``ala_window`` is below ``ala_threshold``; the loss is the model's on that batch as
  ``executor.evaluate`` computes it (evaluation mode: no dropout). The code has no cap (a loss that never settles
  would loop forever); ``ala_max_epochs`` bounds the start phase.
- The s% sample: ``max(1, floor(s/100 n_i))`` rows drawn uniformly without replacement, in a random order, from the
  run's mini-batch stream (``ClientWork.gen``, so snapshots resume it), and cut into batches of ``batch_size`` (the
  last one shorter) that every epoch of the round visits in the same order (the code's loader does not shuffle). The
  code takes a contiguous window of the stored rows at a random start, which samples the data's storage order (a
  partition that stores a client's rows by class would give it fewer classes); the paper says "randomly sample".
  In a model with batch statistics (BatchNorm) a last batch of a single row (of several) is dropped: training mode
  cannot normalise one row. The draw is apart from the W learning (``FedALAClient.draw_local``, a ``DrawnLocal``):
  ``fedlib.flower``'s server draws the samples from its copy of the stream and sends each client its rows.
- Every client's epoch ends at the same call (its batches placed at the epoch's last steps), so the losses of the
  convergence test are one evaluation for all clients; a client takes its batches in its own order either way. Each
  W step is one call for the clients that have a batch at that step, and only them.
- A gradient at Theta^ on a batch is Theta^ - SGD(Theta^, lr=1), one step of ``executor.train``, so both executors
  and batched runs learn W (the float64 executors agree to 1e-10: tested); W itself never enters a model.
``ala_eta = 0`` leaves W at ones: every client starts from the global model and FedALA is FedAvg (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedlib.config.options import MethodOptions, option, register
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm, ClientWork, MethodState, Params, WeightedMean, local_sgd
from fedlib.data.federated import BatchPlan, Split, gather_rows
from fedlib.executors import LocalSGD

_PROBE = LocalSGD(lr=1.0)  # one plain step at lr 1: p - step(p) is the batch gradient at p


@dataclass(eq=False)
class ALAState(MethodState):
    """FedALA's W_i^p of every client (top-p parameter name -> (N, ...), ones at the start) and how many rounds each
    client has trained (``seen["rounds"]``: (N,), which says whether it has a local model and its start phase)."""

    KEY = "fedala"
    W: Params
    seen: Params


def top_layers(names: list[str], p: int) -> list[str]:
    """The last ``p`` parameter tensors (all of them where ``p`` reaches past the first)."""
    return names[max(0, len(names) - p) :]


@dataclass
class ALASample:
    """The round's s% samples of the ALA clients as an epoch of right-aligned batches: ``index`` (S, K, B) rows of
    the training split, ``weight`` (S, K, B) 1 for a real row, ``active`` (S, K) whether the client has a batch at
    that step (its nb_k batches are the epoch's last nb_k steps)."""

    index: torch.Tensor
    weight: torch.Tensor
    active: torch.Tensor

    @staticmethod
    def rows(sizes: torch.Tensor, which: torch.Tensor, percent: float, batch: int, gen: torch.Generator,
             no_single: bool = False) -> list[torch.Tensor | None]:  # fmt: skip
        """The s% sample of each ``which`` client with ``sizes`` rows (others: None), numbered within its own rows.
        ``no_single``: a sample whose last batch would hold one row of several drops that row (BatchNorm cannot
        take a batch of one in training mode)."""
        sizes = sizes.cpu()
        rows: list[torch.Tensor | None] = [None] * len(sizes)
        for j in range(len(sizes)):  # client order: the draws do not depend on the executor
            if bool(which[j]) and int(sizes[j]) > 0:
                n = int(sizes[j])
                m = max(1, int(percent / 100 * n))
                if no_single and m > 1 and m % batch == 1:
                    m -= 1
                rows[j] = torch.randperm(n, generator=gen)[:m]
        return rows

    @staticmethod
    def draw(split: Split, clients: torch.Tensor, which: torch.Tensor, percent: float, batch: int,
             gen: torch.Generator, no_single: bool = False) -> ALASample:  # fmt: skip
        """``rows`` drawn for ``which`` of ``clients`` from ``gen``, then ``place``d on ``split``."""
        sizes = split.sizes.cpu()[clients.cpu()]
        return ALASample.place(split, clients, ALASample.rows(sizes, which, percent, batch, gen, no_single), batch)

    @staticmethod
    def place(split: Split, clients: torch.Tensor, drawn: list[torch.Tensor | None], batch: int) -> ALASample:
        """The clients' samples ``drawn`` (``rows``) as an epoch of right-aligned batches of ``split``."""
        offsets = split.offsets.cpu()[clients.cpu()]
        k = len(clients)
        rows = [None if r is None else offsets[j] + r.cpu() for j, r in enumerate(drawn)]
        nb = [0 if r is None else -(-len(r) // batch) for r in rows]
        steps = max(nb, default=0)
        index = torch.zeros((steps, k, batch), dtype=torch.long)
        weight = torch.zeros((steps, k, batch), dtype=torch.float32)
        active = torch.zeros((steps, k), dtype=torch.bool)
        for j, r in enumerate(rows):
            if r is None:
                continue
            for b in range(nb[j]):
                part = r[b * batch : (b + 1) * batch]
                s = steps - nb[j] + b
                index[s, j, : len(part)] = part
                index[s, j, len(part) :] = part[0]  # padding: a real row, weight 0
                weight[s, j, : len(part)] = 1.0
                active[s, j] = True
        dev = split.x.device
        return ALASample(index.to(dev), weight.to(dev), active.to(dev))

    @property
    def steps(self) -> int:
        return self.index.shape[0]

    def step(self, s: int, live: torch.Tensor) -> tuple[torch.Tensor, BatchPlan]:
        """(the clients that take step s: ``live`` ones with a batch there, their one-step plan). The plan holds only
        them, every one stepping (no mask), so the stacked executor runs its plain path."""
        idx = (self.active[s] & live).nonzero().flatten()
        w = self.weight[s : s + 1, idx]
        return idx, BatchPlan(self.index[s : s + 1, idx], None if bool((w > 0).all()) else w)

    def last_batches(self, split: Split, live: torch.Tensor) -> Split:
        """Each ``live`` client's last batch (the epoch's last step) as a split of K clients (others: no rows)."""
        keep = self.active[-1] & live
        w = self.weight[-1] > 0
        counts = (w & keep[:, None]).sum(1)
        rows = self.index[-1][w & keep[:, None]]
        offsets = torch.cumsum(counts, 0) - counts
        return Split(gather_rows(split.x, rows), split.y[rows], offsets, counts)


@dataclass
class FedALAClient:
    """ALA (W learning, then the mix) before the round's local training from the mixed model."""

    layers: int
    eta: float
    percent: float
    threshold: float
    window: int
    max_epochs: int
    batch_size: int

    def __call__(self, work: ClientWork) -> Params:
        state, clients = work.state, work.clients
        names = [n for n, _ in work.model.named_parameters()]
        top = top_layers(names, self.layers)

        def init() -> ALAState:
            n = state.fresh.shape[0]
            w = {k: torch.ones_like(state.client_params[k]) for k in top}
            return ALAState(w, {"rounds": torch.zeros(n, dtype=torch.long, device=state.fresh.device)})

        st = ALAState.of(state, init)
        seen = st.seen["rounds"][clients]
        ala = seen >= 1  # has a local model of its own (trained before)
        if work.local_draws is not None:
            self.check(work, seen)
        start = work.start
        if bool(ala.any()):
            own = {n: state.client_params[n][clients] for n in top}
            W = {n: st.W[n][clients] for n in top}
            if self.eta:  # eta = 0: W stays at ones, and the run's stream is not drawn from (FedAvg exactly)
                W = self.learn(W, own, ala, seen == 1, work, self.sample(work, seen))
                for n in top:
                    st.W[n][clients] = W[n]
            start = {**start, **self.mixed(own, start, W, ala)}
        st.seen["rounds"][clients] = seen + 1
        return work.train(start)

    @staticmethod
    def mixed(own: Params, glob: Params, W: Params, ala: torch.Tensor) -> Params:
        """Theta^ = Theta_i + (Theta - Theta_i) * W on the top layers of the ALA clients (``torch.lerp``: exactly Theta
        where W = 1, Theta_i where W = 0); the others take Theta."""
        out = {}
        for n, t in own.items():
            m = ala.view(-1, *([1] * (t.dim() - 1)))
            out[n] = torch.where(m, torch.lerp(t, glob[n], W[n]), glob[n])
        return out

    def draw_local(
        self, sizes: torch.Tensor, trained_before: torch.Tensor, model: nn.Module, generator: torch.Generator
    ) -> list[torch.Tensor | None]:
        """``DrawnLocal``: the round's s% samples (``ALASample.rows``) of the clients that run ALA (trained before),
        drawn from the run's mini-batch stream; none where ``ala_eta`` = 0 or no client runs ALA (the stream is then
        not drawn from)."""
        which = trained_before.cpu().bool()
        if not self.eta or not bool(which.any()):
            return [None] * len(sizes)
        has_stats = any(True for _ in model.buffers())
        return ALASample.rows(sizes, which, self.percent, self.batch_size, generator, has_stats)

    def sample(self, work: ClientWork, seen: torch.Tensor) -> ALASample:
        """The round's samples: ``work.local_draws`` where the caller drew them, else drawn from ``work.gen``."""
        drawn = work.local_draws
        if drawn is None:
            if work.gen is None:
                raise ValueError("FedALA draws its s% samples from the run's stream: ClientWork.gen is None")
            drawn = self.draw_local(work.split.sizes[work.clients], seen >= 1, work.model, work.gen)
        return ALASample.place(work.split, work.clients, drawn, self.batch_size)

    def check(self, work: ClientWork, seen: torch.Tensor) -> None:
        """``work.local_draws``, where given, holds a sample for exactly the clients ``draw_local`` draws one for."""
        assert work.local_draws is not None
        sizes, ala = work.split.sizes.cpu()[work.clients.cpu()], seen.cpu() >= 1
        if len(work.local_draws) != len(sizes):
            raise ValueError(
                f"FedALA: ClientWork.local_draws has {len(work.local_draws)} entries for {len(sizes)} clients"
            )
        for j, r in enumerate(work.local_draws):
            if (r is not None) != (bool(self.eta) and bool(ala[j]) and int(sizes[j]) > 0) or (
                r is not None and not len(r)
            ):
                raise ValueError(
                    f"FedALA: ClientWork.local_draws[{j}] is {'None' if r is None else f'{len(r)} rows'}; client "
                    f"{int(work.clients[j])} has trained {int(seen[j])} rounds before: it needs a sample exactly when "
                    "it has (with training rows, ala_eta > 0)"
                )

    def learn(
        self, W: Params, own: Params, ala: torch.Tensor, first: torch.Tensor, work: ClientWork, sample: ALASample
    ) -> Params:
        """W of the ALA clients after the start phase (``first``) or one epoch (the others), on ``sample``."""
        diff = {n: work.start[n] - own[n] for n in own}  # Theta - Theta_i (0 where the engine keeps n local)
        losses: list[list[float]] = [[] for _ in range(len(ala))]
        live = ala.clone()
        for _ in range(self.max_epochs if bool(first.any()) else 1):
            if not bool(live.any()):
                break
            for s in range(sample.steps):
                if s == sample.steps - 1 and bool((live & first).any()):  # the epoch's last batch: its loss
                    full = {**work.start, **self.mixed(own, work.start, W, ala)}
                    self.record(losses, work, full, sample.last_batches(work.split, live & first), live & first)
                idx, plan = sample.step(s, live)
                if not len(idx):
                    continue
                Wj = {n: t[idx] for n, t in W.items()}
                model = {n: t[idx] for n, t in work.start.items()}
                model.update({n: torch.lerp(own[n][idx], model[n], Wj[n]) for n in W})  # Theta^ (ALA clients only)
                probed = work.train(model, plan, _PROBE)
                for n in W:  # grad wrt W = grad wrt Theta^ * (Theta - Theta_i)
                    W[n][idx] = (Wj[n] - self.eta * (model[n] - probed[n]) * diff[n][idx]).clamp(0.0, 1.0)
            live = live & first
            for j in live.nonzero().flatten().tolist():
                recent = losses[j][-self.window :]
                if len(losses[j]) > self.window and float(np.std(recent)) < self.threshold:
                    live[j] = False
        return W

    @staticmethod
    def record(losses: list[list[float]], work: ClientWork, model: Params, part: Split, which: torch.Tensor) -> None:
        _, loss, n = work.executor.evaluate(work.model, model, part, True)
        for j in which.nonzero().flatten().tolist():
            losses[j].append(float(loss[j] / n[j]))


@register
@dataclass(frozen=True)
class FedALA(MethodOptions):
    NAME = "fedala"
    ala_layers: int = option(2, ge=1, doc="p: parameter tensors, from the output end, that ALA mixes element-wise")
    ala_eta: float = option(1.0, ge=0, doc="eta: learning rate of the ALA weights W")
    ala_rand_percent: float = option(80.0, gt=0, le=100, doc="s: percent of the local training data W learns on")
    ala_threshold: float = option(0.1, gt=0, doc="start phase: std of the recent ALA losses below which W stops")
    ala_window: int = option(10, ge=1, le=1000, doc="start phase: ALA losses (one an epoch) the std is taken over")
    ala_max_epochs: int = option(100, ge=1, le=10000, doc="start phase: at most this many epochs of W learning")

    def build(self, cfg: RunSpec) -> Algorithm:
        """FedAvg's selection and server mean, FedALA's client procedure, each client's own model evaluated."""
        return Algorithm(
            name=self.NAME,
            local=local_sgd(cfg),
            aggregate=WeightedMean("samples"),
            local_update=FedALAClient(
                self.ala_layers,
                self.ala_eta,
                self.ala_rand_percent,
                self.ala_threshold,
                self.ala_window,
                self.ala_max_epochs,
                cfg.local.batch_size,
            ),
            evaluate="personal",
            report_global=True,
        )
