"""FedAdam: Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar and McMahan, "Adaptive Federated Optimization",
ICLR 2021 (Algorithm 2, the FedAdam variant of FedOpt).

FedAvg's clients and selection; the server applies Adam, without bias correction, to the average update:

    Delta_t = sum_k (n_k / n) w_k^{t+1} - x_t          (the paper's mean of client deltas, sample-weighted as FedAvg)
    m_t     = beta1 m_{t-1} + (1 - beta1) Delta_t
    v_t     = beta2 v_{t-1} + (1 - beta2) Delta_t^2
    x_{t+1} = x_t + eta m_t / (sqrt(v_t) + tau)

Paper symbols -> options: eta -> ``adam_lr``, beta1 -> ``adam_beta1``, beta2 -> ``adam_beta2``, tau (the
degree of adaptivity) -> ``adam_tau``. Defaults are the paper's: beta1 = 0.9, beta2 = 0.99, tau = 1e-3; eta
= 0.01 from its tuned range (it tunes eta per task). Choices: m_0 = 0 and v_0 = tau^2 (the algorithm asks
v_{-1} >= tau^2); the mean is sample-weighted like every FedAvg-family server here (the paper's is uniform
over the sampled clients; equal when clients hold equal data, as in AdaFL's MNIST setting). State (m, v) is
per parameter, the method's state ``Moments``.
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
class Moments(MethodState):
    """The server's first and second moments m, v per parameter (no client axis): m_0 = 0, v_0 = tau^2."""

    KEY = "fedadam"
    m: Params
    v: Params


@dataclass
class ServerAdam:
    lr: float
    beta1: float
    beta2: float
    tau: float

    def __call__(self, global_params: Params, mean: Params, state: State) -> Params:
        g = global_params
        st = Moments.of(
            state,
            lambda: Moments(
                {k: torch.zeros_like(t) for k, t in g.items()},
                {k: torch.full_like(t, self.tau**2) for k, t in g.items()},
            ),
        )
        out = {}
        for k, x in global_params.items():
            delta = mean[k] - x
            m, v = st.m[k], st.v[k]
            m.mul_(self.beta1).add_(delta, alpha=1 - self.beta1)
            v.mul_(self.beta2).addcmul_(delta, delta, value=1 - self.beta2)
            out[k] = x + self.lr * m / (v.sqrt() + self.tau)
        return out


@register
@dataclass(frozen=True)
class FedAdam(MethodOptions):
    NAME = "fedadam"
    adam_lr: float = option(0.01, gt=0, doc="server step size eta")
    adam_beta1: float = option(0.9, ge=0, lt=1, doc="first-moment decay beta1")
    adam_beta2: float = option(0.99, ge=0, lt=1, doc="second-moment decay beta2")
    adam_tau: float = option(1e-3, ge=0, doc="degree of adaptivity tau")

    def build(self, cfg: RunSpec) -> Algorithm:
        return dataclasses.replace(
            FedAvg().build(cfg),
            name=self.NAME,
            server_step=ServerAdam(self.adam_lr, self.adam_beta1, self.adam_beta2, self.adam_tau),
        )
