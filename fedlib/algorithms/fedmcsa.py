"""FedMCSA: Guo et al., "FedMCSA: Personalized Federated Learning via Model Components Self-Attention".

Algorithm 1, paper symbols -> ``RunConfig`` fields:
    N clients, S sampled per round       -> ``n_clients``, ``clients_per_round``
    R local steps, |D| batch, eta        -> ``local_steps``, ``batch_size``, ``lr``
    sigma (attention scale), lambda      -> ``sigma``, ``lam``
    T rounds                             -> ``rounds``

Every round the server runs model-components self-attention (``attention.mcsa_weights``,
Eq. 6-7) among the S sampled clients' models and sends each its personalised model W_i;
every client (all N) then takes R SGD steps on f_i(Theta) + lambda/2 ||Theta - W_local||^2,
starting from W_i if it just received one (else from its own Theta_i), where W_local is the
last W_i it received (lines 5-14). The personalised models Theta_i are evaluated.

Order of stages: the paper's round t attends over Theta^{t-1} and then trains; ours trains and
then attends over Theta^t, which is the same sequence shifted by half a round (the paper's
first attention acts on identical initial models and is the identity). It is also the order of
the authors' code (train all, select, evaluate personalised, aggregate).

Variants (Table 2 and the authors'-code switches), each registered under its own name:
- ``fedmcsa-mcsa`` (FedMCSA^{-MCSA}): attention replaced by averaging: every sampled client
  receives the equal-weight mean of the sampled models (what sigma = 0 gives; with lambda = 0
  and full participation this is FedAvg with equal weights, tested). Algorithm 1 evaluates the
  clients' trained models Theta_i, and so does this variant; ``report_mean=True`` also evaluates
  the mean the server sends (the ``gm_*`` columns, as pFedMe's global model), which is what
  Table 2's numbers for this row track (they sit at FedAvg's in every column; notebook 13).
- ``fedavg+mcsa`` (FedAvg^{+MCSA}): FedAvg's clients (only the sampled train, plain SGD) with
  the server's averaging replaced by the attention; each client keeps its personalised model.

Model component: the paper's text makes each layer a component ("we regard each layer in a model as a basic
unit", Sec. 3); the authors' code attends over each parameter tensor, a layer's weight and bias apart, and so do
these methods by default (``component='tensor'``: every stored run). ``component='layer'`` takes the paper's text:
one attention matrix per layer, from the cosine of its tensors concatenated (``attention.mcsa_weights``); notebook 16
runs it beside the default on Synthetic.

The authors' public code differs from the paper's equations in two more switches (notebook 16 runs
their 2x2 on Synthetic):
- proximal anchor: the paper's clients minimise f_i(Theta) + lambda/2 ||Theta - W_local||^2,
  pulled toward the last personalised model W_local they received; the code overwrites its
  anchor with the current weights at every step, so the term is zero and local training is
  plain SGD. Off alone: ``lam=0``.
- data-size reweighting: the code multiplies each attention row by the sampled clients'
  data-size shares n_k / sum_h n_h and renormalises the row (``attention.mcsa_weights``), so
  W_i = sum_k psi_ik n_k Theta_k / sum_k psi_ik n_k. On alone: ``by_data_size=True``.
- ``mcsa_code=True`` ("as in the authors' code") flips both on ``fedmcsa``: no effective prox
  and reweighted rows. ``by_data_size`` is then already on, so setting both is refused (two
  keys for one run). The authors' code also uses sigma = 1000 and lambda = 15 by default; set
  those explicitly.
- Two more differences need no switch. The code's attention can iterate (``at_num_of_iter``: the query replaced by
  the attended models, the last pass's weights applied); its default is one pass, which is Eqs. 6-7. And it keeps the
  personalised models by position in the sampled list; they reach the right clients because the next round sends
  them along that same list, and its blend with the old model at that position (another client's) is a copy at its
  beta = 1. docs/deviations.md lists every difference with its measured effect.
- On ``fedmcsa-mcsa``, ``mcsa_code=True`` drops the prox only (the mean stays equal-weight, as
  it always has for that variant: stored runs keep their meaning). ``by_data_size=True`` there
  makes the mean data-size weighted (uniform rows times the shares, renormalised: every
  sampled client receives sum_k n_k Theta_k / sum_k n_k), which is how the pFedMe code base the
  authors forked averages (``aggregate_parameters`` weights by ``train_samples``); the paper
  says only "average aggregation". The two combine: ``mcsa_code=True, by_data_size=True`` is
  FedMCSA^{-MCSA} with both of the code's switches.
- On ``fedavg+mcsa`` (and ``pfedme+mcsa``, ``fedlib.algorithms.pfedme``) "as in the authors' code" is the
  reweighting alone, ``by_data_size=True``: Table 2's +MCSA rows put FedMCSA's server (the code's one aggregation
  routine, which reweights every attention row by the data-size shares) behind another method's clients, and those
  clients have no anchor of FedMCSA's kind to drop (FedAvg's train by plain SGD; pFedMe's Moreau-envelope prox
  toward its own local w_i is pFedMe's method, which the code keeps). So these variants have no ``mcsa_code``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from fedlib.config.options import MethodOptions, option, register
from fedlib.core.attention import mcsa_weights
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Aggregate, Algorithm, Mixing, Params, local_sgd


@dataclass
class MCSAttention:
    """Aggregator: per-component attention among the uploads -> personalised models (``Mixing.to_personal``)."""

    sigma: float
    by_data_size: bool = False
    component: str = "tensor"  # or "layer" (``attention.mcsa_weights``' ``by_layer``)

    def __call__(self, uploads: Params, n_samples: torch.Tensor, clients: np.ndarray) -> Mixing:
        sizes = n_samples if self.by_data_size else None
        return Mixing(to_personal=mcsa_weights(uploads, self.sigma, sizes, by_layer=self.component == "layer"))


@dataclass
class UniformToPersonal:
    """Aggregator: every uploader receives the mean of the uploads (FedMCSA^{-MCSA}): equal-weight, or weighted by
    the uploaders' data sizes (``by_data_size``: the uniform rows reweighted as ``mcsa_weights`` reweights).
    ``as_global``: that mean is also the round's global model (``Mixing.to_global``), for ``report_mean``."""

    by_data_size: bool = False
    as_global: bool = False

    def __call__(self, uploads: Params, n_samples: torch.Tensor, clients: np.ndarray) -> Mixing:
        k = len(clients)
        if self.by_data_size:
            row = n_samples.to(torch.float64) / n_samples.sum()
        else:
            row = torch.full((k,), 1.0 / k, dtype=torch.float64)
        return Mixing(to_personal=row[None, :].expand(k, k).clone(), to_global=row if self.as_global else None)


def _fedmcsa_round(
    cfg: RunSpec, name: str, lam: float, mcsa_code: bool, aggregate: Aggregate, report_global: bool = False
) -> Algorithm:
    """Algorithm 1's round with a given server aggregation: all clients train, prox toward the last W_i
    (no effective prox "as in the authors' code"); ``report_global``: the aggregate's global model is evaluated too."""
    return Algorithm(
        name=name,
        local=local_sgd(cfg, mu=0.0 if mcsa_code else lam),
        aggregate=aggregate,
        trains="all",
        start="personal",
        anchor="received",
        evaluate="personal",
        report_global=report_global,
        traces=("attention",),
    )


_SIGMA: dict[str, Any] = dict(ge=0, doc="attention scale sigma (FedMCSA default 50)")
_LAM: dict[str, Any] = dict(ge=0, doc="client proximal strength lambda (FedMCSA default 5)")
_CODE: dict[str, Any] = dict(doc="as in the authors' code: no effective prox (and, on fedmcsa, data-size reweighting)")
_BY_SIZE: dict[str, Any] = dict(
    doc="weigh the sampled clients by their data-size shares (the authors' code's weighting), prox kept"
)
_PLUS_BY_SIZE: dict[str, Any] = dict(
    doc="as in the authors' code: attention rows reweighted by the sampled clients' data-size shares (no anchor to drop)"
)
_COMPONENT: dict[str, Any] = dict(
    choices=("tensor", "layer"),
    doc="the model component attended over: 'tensor' (a layer's weight and bias apart, as the authors' code and "
    "every stored run) or 'layer' (weight and bias together, as the paper's text: each layer is a component)",
)


def _one_switch(opts: FedMCSA) -> None:
    """On FedMCSA ``mcsa_code`` already reweights: both set would be two keys for one run."""
    if opts.mcsa_code and opts.by_data_size:
        raise ValueError(
            f"RunConfig: by_data_size=True is already part of mcsa_code=True for algorithm={opts.NAME!r} "
            "(set one: mcsa_code=True for both of the authors' code's switches, by_data_size=True for the "
            "reweighting with the proximal anchor kept)"
        )


@register
@dataclass(frozen=True)
class FedMCSA(MethodOptions):
    NAME = "fedmcsa"
    sigma: float = option(50.0, **_SIGMA)
    lam: float = option(5.0, **_LAM)
    mcsa_code: bool = option(False, **_CODE)
    by_data_size: bool = option(False, **_BY_SIZE)
    component: str = option("tensor", **_COMPONENT)

    def check(self, where: str | None = None, rename: Callable[[str], str] | None = None) -> None:
        super().check(where, rename)
        _one_switch(self)

    def build(self, cfg: RunSpec) -> Algorithm:
        reweight = self.mcsa_code or self.by_data_size
        attend = MCSAttention(self.sigma, reweight, self.component)
        return _fedmcsa_round(cfg, self.NAME, self.lam, self.mcsa_code, attend)


@register
@dataclass(frozen=True)
class FedMCSAMinusMCSA(MethodOptions):
    """FedMCSA^{-MCSA}: no attention, so no sigma; ``mcsa_code`` drops the prox only, ``by_data_size`` weights the
    mean by data size (module docstring)."""

    NAME = "fedmcsa-mcsa"
    lam: float = option(5.0, **_LAM)
    mcsa_code: bool = option(False, **_CODE)
    by_data_size: bool = option(False, doc="data-size weighted mean (the pFedMe code's averaging), not equal-weight")
    report_mean: bool = option(
        False,
        doc="also evaluate the mean the server sends (the gm_* columns, as pFedMe's GM), beside the clients' "
        "trained models; training is unchanged",
    )

    def build(self, cfg: RunSpec) -> Algorithm:
        mean = UniformToPersonal(self.by_data_size, as_global=self.report_mean)
        return _fedmcsa_round(cfg, self.NAME, self.lam, self.mcsa_code, mean, report_global=self.report_mean)


@register
@dataclass(frozen=True)
class FedAvgPlusMCSA(MethodOptions):
    """FedAvg^{+MCSA}: FedAvg's clients (plain SGD, only the sampled train), the server's attention;
    ``by_data_size``: the attention as in the authors' code (module docstring)."""

    NAME = "fedavg+mcsa"
    sigma: float = option(50.0, **_SIGMA)
    by_data_size: bool = option(False, **_PLUS_BY_SIZE)
    component: str = option("tensor", **_COMPONENT)

    def build(self, cfg: RunSpec) -> Algorithm:
        return Algorithm(
            name=self.NAME,
            local=local_sgd(cfg),
            aggregate=MCSAttention(self.sigma, self.by_data_size, self.component),
            trains="selected",
            start="personal",
            evaluate="personal",
            traces=("attention",),
        )
