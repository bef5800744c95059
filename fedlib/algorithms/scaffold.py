"""SCAFFOLD: Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020.

Algorithm 1, paper symbols -> ``RunConfig`` fields / state:
    x (server model)                 -> the global model
    c, c_i (control variates)        -> ``ControlVariates.c`` (no client axis), ``.ci`` (N, ...); both start at 0
    eta_l (local step), K (steps)    -> ``lr`` (times ``lr_decay``^(t-1)), ``local_steps`` or the steps of ``local_epochs``
    eta_g (global step)              -> ``server_lr``
Each sampled client i starts from y_i = x and takes K steps
    y_i <- y_i - eta_l (g_i(y_i) + c - c_i)
(the correction c - c_i is the executors' ``drift``, added to every step's gradient, so the
stacked and the loop executor both run it), then option II of line 12:
    c_i+ = c_i - c + (x - y_i) / (K eta_l)
and the server sets
    x <- x + eta_g mean_S(y_i - x),   c <- c + (|S| / N) mean_S(c_i+ - c_i).

Choices, stated because the paper leaves them open for our setting:
- ``mean_S`` over models is the engine's sample-weighted FedAvg mean (SCAFFOLD writes the plain
  mean; AdaFL's clients all hold 600 samples, where the two agree); the server step eta_g is
  the ``Mixing.beta`` blend x + eta_g (sum_k w_k y_k - x). The control variate's mean is plain.
- K is the number of steps the client actually took: with epoch-based training (AdaFL's E = 5,
  B = 10) clients of different sizes take different numbers of steps.
- With momentum m (AdaFL trains every method with m = 0.5; SCAFFOLD's paper uses plain SGD), option II as written,
  (x - y_i) / (K eta_l), is the mean of the momentum buffers the client stepped along, not of its gradients: with
  buf_k = m buf_{k-1} + h_k (h_k the corrected gradient), sum_k h_k = (1 - m) sum_k buf_k + m buf_K, so it is
  about 1 / (1 - m) times the mean gradient (2x at m = 0.5) and the correction c - c_i overshoots. That is
  ``control_estimate='update'``, the default: option II's formula as written, as common implementations apply it
  with momentum too, and what every stored run used. ``control_estimate='gradient'`` estimates what option II
  estimates under plain SGD, the client's mean gradient: (1 - m) (x - y_i) / (K eta_l), exact but for
  m buf_K / K (the last buffer over the steps: ~0.3% of it at AdaFL's K = 300 steps; tested against the
  gradients replayed by hand). At m = 0 the two are the same, so ``'gradient'`` needs momentum.
- The control-variate update is done inside the client procedure (it needs only the sampled
  clients' own values, so it commutes with the model aggregation).
- What travels (``Algorithm.exchange``, counted in ``bytes_down`` / ``bytes_up``): c down to every training client
  with the model, and each uploading client's delta c_i = c_i+ - c_i up with its model (the paper's line 13: twice
  FedAvg's traffic). The server updates c from the deltas alone (``absorb``, the same function the client procedure
  calls), so c_i never leaves its client.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from fedlib.config.options import MethodOptions, option, register
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm, ClientWork, MethodState, Mixing, Params, WeightedMean, local_sgd
from fedlib.core.state import State


@dataclass(eq=False)
class ControlVariates(MethodState):
    """SCAFFOLD's state: the server's c (no client axis) and every client's c_i (N, ...), both starting at 0."""

    KEY = "scaffold"
    c: Params
    ci: Params
    delta: Params = field(default_factory=dict)  # the round's delta c_i (K, ...), one row per training client


def _variates(state: State) -> ControlVariates:
    """The run's control variates, made at 0 the first time (c over the floating tensors of the global model; c_i
    over the clients' rows this state holds: none on ``fedlib.flower``'s server)."""
    names = [n for n, t in state.global_params.items() if t.is_floating_point()]
    return ControlVariates.of(
        state,
        lambda: ControlVariates(
            {n: torch.zeros_like(state.global_params[n]) for n in names},
            {n: torch.zeros_like(state.client_params[n]) for n in names if n in state.client_params},
        ),
    )


def absorb_deltas(c: Params, delta: Params, n_clients: int) -> None:
    """c <- c + |S|/N mean_S(delta c_i) = c + sum_S(delta c_i) / N, in place."""
    for n, d in delta.items():
        c[n] += d.sum(0) / n_clients


@dataclass
class ScaffoldClient:
    """K corrected local steps per sampled client, then option II's control-variate update."""

    control_estimate: str = "update"  # or "gradient": (1 - momentum) times option II's (module docstring)

    def __call__(self, work: ClientWork) -> Params:
        start, plan, state, clients, local = work.start, work.plan, work.state, work.clients, work.local
        names = [n for n, t in start.items() if t.is_floating_point()]
        n_clients = next(iter(state.client_params.values())).shape[0]
        cv = _variates(state)
        c, ci = cv.c, cv.ci
        drift = {n: c[n].unsqueeze(0) - ci[n][clients] for n in names}  # c - c_i
        lr = local.lr
        trained = work.train(start, drift=drift)
        steps = (
            torch.full((len(clients),), plan.steps, dtype=torch.float64)
            if plan.active is None
            else plan.active.sum(0).clamp_min(1).to(torch.float64)
        ).to(start[names[0]].device)
        if self.control_estimate == "gradient":
            steps = steps / (1.0 - local.momentum)  # (1 - m) (x - y_i) / (K eta_l): the mean gradient, not buffer
        for n in names:
            k_eta = (steps * lr).to(start[n].dtype).view(-1, *([1] * (start[n].dim() - 1)))
            old = ci[n][clients]
            new = old - c[n].unsqueeze(0) + (start[n] - trained[n]) / k_eta  # option II
            ci[n][clients] = new
            cv.delta[n] = new - old
        absorb_deltas(c, cv.delta, n_clients)  # c + |S|/N mean(delta c_i)
        return trained

    # -- what travels (``Exchange``) ----------------------------------------------------------------------------
    def down(self, state: State) -> Params:
        return dict(_variates(state).c)

    def receive(self, state: State, down: Params) -> None:
        _variates(state).c = {n: v.clone() for n, v in down.items()}

    def up(self, state: State) -> Params:
        return {f"delta.{n}": v for n, v in _variates(state).delta.items()}

    def like(self, state: State) -> Params:
        return {f"delta.{n}": torch.zeros_like(v) for n, v in _variates(state).c.items()}

    def absorb(self, state: State, start: Params, uploads: Params, rows: Params, n_samples: torch.Tensor,
               params: list[str], n_clients: int) -> None:  # fmt: skip
        absorb_deltas(_variates(state).c, {k.partition(".")[2]: v for k, v in rows.items()}, n_clients)


@dataclass
class ScaffoldServer:
    """x <- x + eta_g (sum_k w_k y_k - x), w_k the sample shares of the sampled clients."""

    server_lr: float = 1.0

    def __call__(self, uploads: Params, n_samples: torch.Tensor, clients: np.ndarray) -> Mixing:
        m = WeightedMean("samples")(uploads, n_samples, clients)
        return Mixing(to_global=m.to_global, beta=self.server_lr)


@register
@dataclass(frozen=True)
class Scaffold(MethodOptions):
    NAME = "scaffold"
    server_lr: float = option(1.0, gt=0, doc="global step size eta_g")
    control_estimate: str = option(
        "update",
        choices=("update", "gradient"),
        doc="option II's c_i+ from the mean applied update (x - y_i) / (K eta_l), as written (stored runs), or, with "
        "momentum m, the mean gradient (1 - m) (x - y_i) / (K eta_l), which option II estimates under plain SGD",
    )

    def check_with(self, cfg: RunSpec) -> None:
        if self.control_estimate == "gradient" and not cfg.local.momentum:
            raise ValueError(
                "RunConfig.control_estimate='gradient' is 'update' itself without momentum (momentum=0): set it "
                "only with momentum > 0, where the mean applied update is about 1 / (1 - momentum) times the mean "
                "gradient"
            )

    def build(self, cfg: RunSpec) -> Algorithm:
        client = ScaffoldClient(self.control_estimate)
        return Algorithm(
            name=self.NAME,
            local=local_sgd(cfg),
            aggregate=ScaffoldServer(self.server_lr),
            local_update=client,
            exchange=client,
        )
