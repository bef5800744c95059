"""FedDyn: Acar, Zhao, Matas Navarro, Mattina, Whatmough and Saligrama, "Federated Learning Based on Dynamic
Regularization", ICLR 2021 (Algorithm 1).

Paper symbols -> options / state:
    alpha                       -> ``dyn_alpha``
    theta^{t-1} (server model)  -> the global model, which every selected client starts from
    grad L_k(theta_k^{t-1})     -> ``DynamicState.g`` (N, ...): the client's linear term g_k, starting at 0
    h^t (server state)          -> ``DynamicState.h`` (no client axis), starting at 0
    m (all clients), P_t        -> ``n_clients``, the clients selected in round t
Each selected client k minimises, from theta^{t-1}, with the round's local SGD (``local_steps`` or ``local_epochs``,
``lr``, ``momentum``, ``weight_decay``),

    L_k(theta) - <g_k, theta> + alpha/2 ||theta - theta^{t-1}||^2

(the executors' ``drift`` -g_k and proximal pull ``mu`` = alpha toward the model the client started from), then
updates its linear term; the server updates h and takes the uniform mean of the uploads corrected by h:

    g_k <- g_k - alpha (theta_k - theta^{t-1})
    h   <- h - (alpha / m) sum_{k in P_t} (theta_k - theta^{t-1})
    theta^t = (1 / |P_t|) sum_{k in P_t} theta_k - h / alpha

g_k and h only change for the clients of P_t; both are the method's state, so a resumed run continues them.
Nothing travels but the models (``Algorithm.exchange``): the server updates h from the uploads (``absorb``, the
function the client procedure calls) and each g_k stays on its client.

Choices, stated because the paper leaves them open for our setting:
- The mean over P_t is uniform, as Algorithm 1 writes it, not FedAvg's sample-weighted one: FedDyn's fixed point is a
  stationary point of (1/m) sum_k L_k, and h = (1/m) sum_k g_k is the uniform mean of the linear terms over all m
  clients (both start at 0 and change together), which -h/alpha cancels only against a uniform mean of the models.
  Weighting the mean by n_k alone would break that identity. BatchNorm statistics take the same uniform mean, without
  the h correction (a running statistic is not trained by the objective; it has no g_k and no h).
- Weight decay (``weight_decay``) is part of L_k: the client minimises L_k + wd/2 ||theta||^2 - <g_k, theta> +
  alpha/2 ||theta - theta^{t-1}||^2, so the fixed point is the l2-regularised objective's. The authors' code adds
  alpha to the optimiser's weight decay and puts -alpha theta^{t-1} into the linear term, which is the same
  gradient.
- The lr schedule (``lr_decay``) scales the steps only: alpha is part of the objective, not of the step, so it is
  not scaled with eta_t, and g_k and h are updated from the models alone (no lr in the formulas). A local solver
  that reaches the minimiser would give the same g_k whatever the lr.
- ``lr * dyn_alpha < 2`` is required: a plain SGD step on alpha/2 ||theta - theta^{t-1}||^2 alone multiplies
  theta - theta^{t-1} by (1 - lr alpha), which flips and grows beyond 2.
- Parameters the engine keeps on the clients (pFedLA's local attention) are never aggregated, so they take no linear
  term and no h; the proximal pull (like FedProx's mu) covers them too, toward the client's own value at the round's
  start.
- No setting of alpha is FedAvg: alpha -> 0 makes the client objective FedAvg's, but h / alpha = -(1/m) times the
  sum of every past (theta_k - theta^{t-1}) does not depend on alpha and does not vanish, so the server's model is
  not FedAvg's mean (and at alpha = 0 it is undefined). The golden tests compute the rule by hand instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedlib.config.options import MethodOptions, option, register
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm, ClientWork, MethodState, Params, WeightedMean, local_sgd
from fedlib.core.state import State


@dataclass(eq=False)
class DynamicState(MethodState):
    """FedDyn's state: every client's linear term g_k (N, ...) and the server's h (no client axis), over the shared
    parameters, both starting at 0."""

    KEY = "feddyn"
    g: Params
    h: Params


def _state(state: State, names: list[str]) -> DynamicState:
    """The run's g and h, made at 0 the first time (g over the clients' rows this state holds: none on
    ``fedlib.flower``'s server, where each g_k stays on its client)."""
    return DynamicState.of(
        state,
        lambda: DynamicState(
            {n: torch.zeros_like(state.client_params[n]) for n in names if n in state.client_params},
            {n: torch.zeros_like(state.global_params[n]) for n in names},
        ),
    )


def absorb_moves(h: Params, moved: Params, alpha: float, n_clients: int) -> None:
    """h <- h - (alpha / m) sum_{k in P_t} (theta_k - theta^{t-1}), in place (``moved``: the (K, ...) differences)."""
    for n, d in moved.items():
        h[n] -= (alpha / n_clients) * d.sum(0)


@dataclass
class DynamicClient:
    """Local SGD on L_k - <g_k, theta> + alpha/2 ||theta - theta^{t-1}||^2, then the updates of g_k and of h
    (h needs only the selected clients' own models, so it is updated here, before the server's mean)."""

    alpha: float

    def __call__(self, work: ClientWork) -> Params:
        start, state, clients = work.start, work.state, work.clients
        names = [n for n, _ in work.model.named_parameters() if work.shared(n)]
        n_clients = next(iter(state.client_params.values())).shape[0]
        st = _state(state, names)
        drift = {n: -st.g[n][clients] for n in names}  # the gradient of -<g_k, theta>
        trained = work.train(start, anchor=work.anchor, drift=drift)  # work.local.mu is alpha
        moved = {n: trained[n] - start[n] for n in names}  # theta_k - theta^{t-1}
        for n in names:
            st.g[n][clients] = st.g[n][clients] - self.alpha * moved[n]
        absorb_moves(st.h, moved, self.alpha, n_clients)
        return trained

    # -- what travels (``Exchange``): the models alone; h is updated from them, g_k stays on its client ----------
    def down(self, state: State) -> Params:
        return {}

    def receive(self, state: State, down: Params) -> None:
        pass

    def up(self, state: State) -> Params:
        return {}

    def like(self, state: State) -> Params:
        return {}

    def absorb(self, state: State, start: Params, uploads: Params, rows: Params, n_samples: torch.Tensor,
               params: list[str], n_clients: int) -> None:  # fmt: skip
        moved = {n: uploads[n] - start[n] for n in params}
        absorb_moves(_state(state, params).h, moved, self.alpha, n_clients)


@dataclass
class DynamicServer:
    """theta^t = (uniform mean of the uploads) - h / alpha, per parameter (the engine passes parameters only)."""

    alpha: float

    def __call__(self, global_params: Params, mean: Params, state: State) -> Params:
        h = DynamicState.of(state).h
        return {k: mean[k] - h[k] / self.alpha for k in global_params}


@register
@dataclass(frozen=True)
class FedDyn(MethodOptions):
    NAME = "feddyn"
    dyn_alpha: float = option(
        0.01,
        gt=0,
        le=10,
        doc="FedDyn's alpha: the strength of the dynamic regulariser (the paper tries 0.1, 0.01, 0.001)",
    )

    def check_with(self, cfg: RunSpec) -> None:
        if cfg.local.lr * self.dyn_alpha >= 2:
            raise ValueError(
                f"RunConfig.dyn_alpha={self.dyn_alpha!r} with lr={cfg.local.lr!r}: lr * dyn_alpha must be < 2 (an SGD "
                "step on alpha/2 ||theta - theta^{t-1}||^2 multiplies theta - theta^{t-1} by 1 - lr * alpha, which "
                "grows beyond 2)"
            )

    def build(self, cfg: RunSpec) -> Algorithm:
        client = DynamicClient(self.dyn_alpha)
        return Algorithm(
            name=self.NAME,
            local=local_sgd(cfg, mu=self.dyn_alpha),
            aggregate=WeightedMean("uniform"),
            anchor="start",  # the proximal centre is theta^{t-1}, the model the client received
            local_update=client,
            exchange=client,
            server_step=DynamicServer(self.dyn_alpha),
        )
