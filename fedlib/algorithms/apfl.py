"""APFL: Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning", arXiv:2003.13461 (2020).

Each client i keeps, beside its copy w_i of the global model, a local model v_i and a mixing weight alpha_i in
[0, 1]; its personalised model is vbar_i = alpha_i v_i + (1 - alpha_i) w_i. Every local step (Algorithm 1, with the
paper's adaptive update of alpha), on one mini-batch xi shared by the three updates, from the values before the step:
    w_i     <- w_i - eta grad f_i(w_i; xi)
    v_i     <- v_i - eta grad_v f_i(vbar_i; xi)  =  v_i - eta alpha_i grad f_i(vbar_i; xi)
    alpha_i <- clip(alpha_i - eta_alpha <v_i - w_i, grad f_i(vbar_i; xi)>, 0, 1)
(<v - w, grad f(vbar)> is d f(alpha v + (1 - alpha) w) / d alpha). The selected clients upload w_i; the server
averages them as FedAvg (sample-weighted).
Paper symbols -> ``RunConfig`` / state:
    w (global model), w_i                 -> the global model; each selected client trains it from the global one
    v_i, alpha_i                          -> ``APFLState.v`` (N, ...), ``APFLState.alpha`` (N,)
    alpha_i at the start                  -> ``apfl_alpha``
    eta                                   -> ``lr`` (the round's, scheduled), for w_i and v_i
    the step size of alpha                -> ``apfl_alpha_lr``: None (default) is the round's eta, as the paper's
                                             update; 0 keeps alpha fixed at ``apfl_alpha`` (APFL with a fixed alpha)
    tau (synchronisation gap)             -> ``local_steps`` (or ``local_epochs``), B -> ``batch_size``
Evaluated (``test_acc``): each client's vbar_i = alpha_i v_i + (1 - alpha_i) w with w the current global model
(the model a client holds once it has received the round's average); the global model beside it (``gm_*``
columns).

Choices, against the authors' code (FedTorch, ``train_and_validate_federated_apfl``):
- vbar_i mixes the *parameters*, as the paper defines it; the code mixes the two models' outputs,
  alpha f(x; v) + (1 - alpha) f(x; w), which is the same model only where the logits are linear in the parameters
  (MLR).
- alpha_i steps every local step, by the paper's update; the code steps it once a round (at the first batch) and adds
  0.02 alpha to its gradient, a penalty the paper does not have.
- The start value is the code's default (``fed_personal_alpha = 0.5``; by default the code also keeps alpha fixed,
  ``fed_adaptive_alpha`` off, which is ``apfl_alpha_lr=0`` here). The value the paper's adaptive runs start from
  could not be checked against its text here; set ``apfl_alpha`` to compare.
- v_i starts at the initial model (every client's, as the code copies its model) and only the selected clients
  update v_i and alpha_i (the code's online clients).
- A gradient at p on a batch is p - SGD(p, lr=1) on that batch, one step of ``executor.train`` (as Per-FedAvg), so
  both executors and batched runs run it; so each step is its own call, and SGD momentum, which would carry over
  steps, and weight decay are refused (``SGD_EXTRAS = False``: the paper's steps are plain gradient steps).
- Buffers (BatchNorm statistics) are mixed into vbar_i like the parameters; v_i keeps the statistics its forward
  passes on vbar_i leave, and alpha's gradient is taken over the parameters only. Parameters the engine keeps local
  (FedBN's BN, pFedLA's attention) are the client's own in w_i, as in every method.
- A client past the end of its epochs (``local_epochs`` on unequal clients) takes no step: its gradient probe does
  not move, so v_i and alpha_i stay too.
alpha = 0 with ``apfl_alpha_lr=0`` trains FedAvg's models exactly, and its personal models are the global one
(tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedlib.config.options import MethodOptions, option, register
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm, ClientWork, MethodState, Params, WeightedMean, local_sgd
from fedlib.executors import LocalSGD

_PROBE = LocalSGD(lr=1.0)  # one plain step at lr 1: p - step(p) is the batch gradient at p


def _col(a: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Per-client scalars ``a`` (K,) as a column broadcasting over ``t`` (K, ...)."""
    return a.to(t.dtype).view(-1, *([1] * (t.dim() - 1)))


def mixture(v: Params, w: Params, alpha: torch.Tensor) -> Params:
    """vbar = alpha v + (1 - alpha) w per client (``torch.lerp(w, v, alpha)``: exactly w at alpha = 0 and v at 1);
    tensors that are not floating point (BatchNorm's batch counts) are v's."""
    return {n: torch.lerp(w[n], t, _col(alpha, t)) if t.is_floating_point() else t.clone() for n, t in v.items()}


@dataclass(eq=False)
class APFLState(MethodState):
    """APFL's v_i (N, ...) and alpha_i (``alpha["alpha"]``: (N,)) of every client."""

    KEY = "apfl"
    v: Params
    alpha: Params

    def personal(self) -> Params:
        raise NotImplementedError("APFL's personal models mix v_i with the global model: personal_given(global)")

    def personal_given(self, global_view: Params) -> Params:
        return mixture(self.v, global_view, self.alpha["alpha"])


@dataclass
class APFLClient:
    """The three updates of every local step; alpha's step size is the round's lr unless ``alpha_lr`` is set."""

    alpha0: float
    alpha_lr: float | None

    def __call__(self, work: ClientWork) -> Params:
        plan, state, clients = work.plan, work.state, work.clients

        def init() -> APFLState:
            some = next(iter(state.client_params.values()))
            n, dtype = some.shape[0], next(t for t in state.client_params.values() if t.is_floating_point()).dtype
            alpha = torch.full((n,), self.alpha0, dtype=dtype, device=some.device)
            return APFLState({k: t.clone() for k, t in state.client_params.items()}, {"alpha": alpha})

        st = APFLState.of(state, init)
        params = {n for n, _ in work.model.named_parameters()}
        w = {n: t.clone() for n, t in work.start.items()}
        v = {n: t[clients] for n, t in st.v.items()}
        a = st.alpha["alpha"][clients]
        eta = work.local.lr
        a_lr = eta if self.alpha_lr is None else self.alpha_lr
        for r in range(plan.steps):
            one = plan.at_steps(slice(r, r + 1))
            vbar = mixture(v, w, a)
            probed = work.train(vbar, one, _PROBE)
            g = {n: vbar[n] - probed[n] for n in vbar if n in params}  # grad f_i(vbar_i; xi)
            if a_lr:  # d f(vbar) / d alpha = <v - w, grad f(vbar)>, from the values before the step
                da = torch.zeros_like(a)
                for n in g:
                    da = da + ((v[n] - w[n]) * g[n]).reshape(len(a), -1).sum(1).to(a.dtype)
                a_next = (a - a_lr * da).clamp(0.0, 1.0)
            else:
                a_next = a
            moved = None if plan.active is None else plan.active[r]
            for n, t in v.items():
                if n in g:  # grad_v f(vbar) = alpha grad f(vbar)
                    v[n] = t - eta * _col(a, t) * g[n]
                elif moved is None:  # buffers: the statistics the forward on vbar left
                    v[n] = probed[n]
                else:
                    v[n] = torch.where(moved.view(-1, *([1] * (t.dim() - 1))), probed[n], t)
            w = work.train(w, one)  # the round's optimiser, the global objective
            a = a_next
        for n, t in v.items():
            st.v[n][clients] = t
        st.alpha["alpha"][clients] = a
        return w


@register
@dataclass(frozen=True)
class APFL(MethodOptions):
    NAME = "apfl"
    SGD_EXTRAS = False  # plain gradient steps, one executor call each: no momentum to carry, no weight decay
    apfl_alpha: float = option(0.5, ge=0, le=1, doc="alpha_i at the start: the weight of v_i in the personal model")
    apfl_alpha_lr: float | None = option(
        None, ge=0, doc="step size of alpha (None: the round's lr, the paper's; 0: alpha stays at apfl_alpha)"
    )

    def build(self, cfg: RunSpec) -> Algorithm:
        """FedAvg's server mean over the w_i, APFL's client procedure, the mixtures evaluated and the global model
        reported."""
        return Algorithm(
            name=self.NAME,
            local=local_sgd(cfg),
            aggregate=WeightedMean("samples"),
            local_update=APFLClient(self.apfl_alpha, self.apfl_alpha_lr),
            evaluate="personal",
            personal=APFLState,
            report_global=True,
        )
