"""FedAvgM: Hsu, Qi and Brown, "Measuring the Effects of Non-Identical Data Distribution for Federated Visual
Classification", arXiv:1909.06335, 2019 (Sec. 3, "server momentum").

FedAvg's clients and selection; the server treats the change the uploads propose as a gradient and takes a
heavy-ball step on it:

    Delta_t = w_t - sum_k (n_k / n) w_k^{t+1}      (the FedAvg mean's step, negated)
    v_t     = beta v_{t-1} + Delta_t               (v_0 = 0)
    w_{t+1} = w_t - eta v_t

Paper symbols -> options: beta -> ``server_momentum``, eta -> ``server_lr`` (the paper fixes eta = 1 and
tunes the client lr; we keep eta so the same options serve the FedOpt family). With beta = 0 and eta = 1
FedAvgM is FedAvg exactly (tested). The velocity v is per parameter, the method's state ``Velocity``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from fedlib.algorithms.fedavg import FedAvg
from fedlib.config.options import MethodOptions, option, register
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm, MethodState, Params
from fedlib.core.state import State


@dataclass(eq=False)
class Velocity(MethodState):
    """The server's heavy-ball velocity v, per parameter (no client axis), starting at 0."""

    KEY = "fedavgm"
    v: Params


@dataclass
class ServerMomentum:
    lr: float
    momentum: float

    def __call__(self, global_params: Params, mean: Params, state: State) -> Params:
        v = Velocity.of(state, lambda: Velocity({k: torch.zeros_like(t) for k, t in global_params.items()})).v
        out = {}
        for k, w in global_params.items():
            v[k].mul_(self.momentum).add_(w - mean[k])  # v = beta v + Delta
            out[k] = w - self.lr * v[k]
        return out


@register
@dataclass(frozen=True)
class FedAvgM(MethodOptions):
    NAME = "fedavgm"
    server_lr: float = option(1.0, gt=0, doc="server step size eta")
    server_momentum: float = option(0.9, ge=0, lt=1, doc="server momentum beta")

    def build(self, cfg: RunSpec) -> Algorithm:
        return dataclasses.replace(
            FedAvg().build(cfg), name=self.NAME, server_step=ServerMomentum(self.server_lr, self.server_momentum)
        )
