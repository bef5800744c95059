"""FedNova: Wang, Liu, Liang, Joshi and Poor, "Tackling the Objective Inconsistency Problem in Heterogeneous
Federated Optimization", NeurIPS 2020 (Sec. 5, normalised averaging).

FedAvg's clients and selection; the server normalises each upload by the local work that produced it:

    d_i = (theta^t - theta_i) / a_i
    theta^{t+1} = theta^t - tau_eff sum_i p_i d_i,        p_i = n_i / sum_j n_j   (the selected clients)

Paper symbols -> options / run:
    tau_i            -> the local SGD steps client i actually took this round: its steps in the round's batch plan
                        (``local_steps``, or ``local_epochs`` of ceil(n_i / B) steps each, or fewer where the plan
                        stops a client early), never the configured count
    rho              -> ``momentum`` (the clients' heavy-ball SGD; the buffer starts at 0 every round)
    a_i              -> tau_i for plain SGD; with momentum sum_{k < tau_i} (1 - rho^{k+1}) / (1 - rho), the sum of
                        the weights the momentum puts on the tau_i gradients (||a_i||_1 of the paper)
    tau_eff          -> ``nova_tau_eff``: 'normalizer' (the default), sum_i p_i ||a_i||_1, the effective steps of
                        the paper's general rule, which its authors' optimiser computes; or 'steps', sum_i p_i tau_i,
                        its plain-SGD form, applied as printed under momentum too

With plain SGD the two ``nova_tau_eff`` are the same, and with equal tau_i FedNova is FedAvg exactly (tested: every
coefficient tau_eff p_i / a_i is p_i to the bit, so the update adds 0 to FedAvg's mean). With momentum and equal
tau_i, 'steps' moves the global model tau / a (about 1 - rho) times as far as FedAvg; 'normalizer' is FedAvg there.

How it is computed: theta^{t+1} = sum_i c_i theta_i + (1 - sum_i c_i) theta^t with c_i = tau_eff p_i / a_i, which is
FedAvg's mean sum_i p_i theta_i plus sum_i (c_i - p_i)(theta_i - theta^t). The client procedure, which holds the
round's plan, computes that correction (``NovaCorrection``, the method's state) and the server step adds it to the
engine's sample-weighted mean; c_i / p_i is computed as sum_j n_j (t_j / a_i) / sum_j n_j, exactly 1 when the t_j
and a_i are equal.

Choices, stated because the paper leaves them open for our setting:
- BatchNorm running statistics take FedAvg's mean, not the normalised one: they are not sums of gradient steps,
  and the normalised update extrapolates (without momentum sum_i c_i = (sum_i p_i tau_i)(sum_i p_i / tau_i) > 1
  whenever the tau_i differ; about 25 for 1 and 100 steps at equal p), which can drive a running variance below zero.
- A client that took no step this round (a plan that stops it before its first step) has no direction (0/0): it
  is left out of p and tau_eff; its upload is the model it received. If no client stepped the model stays.
- What travels (``Algorithm.exchange``): each uploading client's tau_i (one float64) with its model; the server,
  which knows the sizes n_i, computes a_i, c_i and the correction from the uploads (``absorb``, the function the
  client procedure calls).
- Weight decay is part of the client's gradient (as in the authors' optimiser), so it does not change a_i; the lr
  schedule changes the step size between rounds, not within one, so a_i does not depend on it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from fedlib.algorithms.fedavg import FedAvg
from fedlib.config.options import MethodOptions, option, register
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm, ClientWork, MethodState, Params
from fedlib.core.state import State
from fedlib.data.federated import BatchPlan


@dataclass(eq=False)
class NovaCorrection(MethodState):
    """The round's sum_i (c_i - p_i)(theta_i - theta^t) per shared parameter (no client axis), made by the client
    procedure and added by the server step to FedAvg's mean; every round overwrites it."""

    KEY = "fednova"
    step: Params
    tau: Params = dataclasses.field(default_factory=dict)  # {"tau": (K,)} the round's tau_i of its training clients


def correction(start: Params, trained: Params, names: list[str], n: torch.Tensor, tau: torch.Tensor, momentum: float,
               tau_eff: str) -> Params:  # fmt: skip
    """sum_i (c_i - p_i)(theta_i - theta^t) per parameter of ``names``, for clients of sizes ``n`` that took ``tau``
    steps from ``start`` to ``trained`` (K, ...)."""
    p = n / n.sum()  # FedAvg's weights, as the engine's mean computes them (``WeightedMean('samples')``)
    c = coefficients(n, tau, momentum, tau_eff)
    dev = start[names[0]].device if names else torch.device("cpu")
    e = (c - p).to(dev)
    step = {}
    for k in names:
        moved = trained[k] - start[k]  # theta_i - theta^t
        step[k] = (e.to(moved.dtype).view(-1, *[1] * (moved.dim() - 1)) * moved).sum(0)
    return step


def steps_taken(plan: BatchPlan) -> torch.Tensor:
    """(K,) float64 on the CPU: the local steps each client of ``plan`` takes (its active steps; all of the plan's
    where it has no ``active``)."""
    if plan.active is None:
        return torch.full((plan.index.shape[1],), float(plan.steps), dtype=torch.float64)
    return plan.active.sum(0).cpu().to(torch.float64)


def normalizer(tau: torch.Tensor, momentum: float) -> torch.Tensor:
    """a_i: tau_i, or with momentum rho sum_{k < tau_i} (1 - rho^{k+1}) / (1 - rho), summed term by term
    ((1 - rho^{k+1}) / (1 - rho) = sum_{j <= k} rho^j, so no subtraction loses digits); 0 for tau_i = 0."""
    if not momentum:
        return tau.clone()
    most = int(tau.max()) if len(tau) else 0
    weights = np.cumsum(momentum ** np.arange(most, dtype=np.float64))  # the k-th gradient's total weight
    totals = np.concatenate([[0.0], np.cumsum(weights)])  # totals[t] = a for t steps
    return torch.as_tensor(totals[tau.to(torch.int64).numpy()], dtype=torch.float64)


def coefficients(n: torch.Tensor, tau: torch.Tensor, momentum: float, tau_eff: str) -> torch.Tensor:
    """c_i = tau_eff p_i / a_i of the clients with sizes ``n`` and steps ``tau`` (0 for a client without steps)."""
    a = normalizer(tau, momentum)
    stepped = tau > 0
    if not bool(stepped.any()):
        return torch.zeros_like(n)
    n = torch.where(stepped, n, torch.zeros_like(n))
    total = n.sum()
    t = tau if tau_eff == "steps" else a
    a_safe = torch.where(stepped, a, torch.ones_like(a))
    ratio = (n.unsqueeze(0) * (t.unsqueeze(0) / a_safe.unsqueeze(1))).sum(1) / total  # tau_eff / a_i
    return torch.where(stepped, (n / total) * ratio, torch.zeros_like(n))


@dataclass
class NovaClient:
    """The round's local SGD, then the normalised average's correction to FedAvg's mean (``NovaCorrection``)."""

    tau_eff: str = "steps"
    momentum: float = 0.0  # the clients' rho (``LocalSGD.momentum``), for the server's ``absorb``

    def __call__(self, work: ClientWork) -> Params:
        start, clients = work.start, work.clients
        trained = work.train(start)
        names = [n for n, _ in work.model.named_parameters() if work.shared(n)]
        n = work.split.sizes[clients].cpu().to(torch.float64)
        tau = steps_taken(work.plan)
        step = correction(start, trained, names, n, tau, work.local.momentum, self.tau_eff)
        work.state.extra[NovaCorrection.KEY] = NovaCorrection(step, {"tau": tau})
        return trained

    # -- what travels (``Exchange``): each client's tau_i up with its model; the server computes the correction ----
    def down(self, state: State) -> Params:
        return {}

    def receive(self, state: State, down: Params) -> None:
        pass

    def up(self, state: State) -> Params:
        return dict(NovaCorrection.of(state).tau)

    def like(self, state: State) -> Params:
        return {"tau": torch.zeros((), dtype=torch.float64)}

    def absorb(self, state: State, start: Params, uploads: Params, rows: Params, n_samples: torch.Tensor,
               params: list[str], n_clients: int) -> None:  # fmt: skip
        n, tau = n_samples.cpu().to(torch.float64), rows["tau"].cpu().to(torch.float64)
        step = correction(start, uploads, params, n, tau, self.momentum, self.tau_eff)
        state.extra[NovaCorrection.KEY] = NovaCorrection(step, {"tau": tau})


def nova_server(global_params: Params, mean: Params, state: State) -> Params:
    """theta^{t+1} = FedAvg's mean + sum_i (c_i - p_i)(theta_i - theta^t), per parameter."""
    step = NovaCorrection.of(state).step
    return {k: mean[k] + step[k] for k in global_params}


@register
@dataclass(frozen=True)
class FedNova(MethodOptions):
    NAME = "fednova"
    nova_tau_eff: str = option(
        "normalizer",
        choices=("normalizer", "steps"),
        doc="tau_eff: 'normalizer' sum_i p_i a_i (the paper's effective steps, its authors' optimiser: FedAvg exactly "
        "when every client takes the same steps) or 'steps' sum_i p_i tau_i; the same without momentum",
    )

    def build(self, cfg: RunSpec) -> Algorithm:
        client = NovaClient(self.nova_tau_eff, cfg.local.momentum)
        return dataclasses.replace(
            FedAvg().build(cfg), name=self.NAME, local_update=client, server_step=nova_server, exchange=client
        )
