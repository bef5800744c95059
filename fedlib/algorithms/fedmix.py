"""FedMix and NaiveMix: Yoon, Shin, Hwang and Yang, "FedMix: Approximation of Mixup under Mean Augmented
Federated Learning", ICLR 2021 (OpenReview Ogga20D2HO-; arXiv 2107.00233). AdaFL (Chen, Chong and Quek,
2021, Tables 3-4) compares against it ("FedMix-0.1", "FedMix-0.5": FedMix at a fixed fraction of 0.1 / 0.5).

Mean Augmented FL (MAFL). Before training, every client k cuts its local data into batches of M_k
samples and sends the mean of each batch, inputs and one-hot labels averaged, (xbar, ybar), to the
server, once; the server broadcasts the union of all clients' means, the global mean set
(X_g, Y_g). The rest is FedAvg (uniform selection, sample-weighted mean of the uploads); only the
client's local loss changes.

Global Mixup (mixing a local sample with a raw sample x_j of another client) would use

    l(f((1 - lam) x_i + lam x_j), (1 - lam) y_i + lam y_j)
      = (1 - lam) l(f((1 - lam) x_i + lam x_j), y_i) + lam l(f((1 - lam) x_i + lam x_j), y_j)

(cross-entropy is linear in the label). FedMix expands both terms to first order around the
scaled local input (1 - lam) x_i and drops the O(lam^2) terms, which leaves an expression linear
in (x_j, y_j); averaging it over the M_k samples j of one batch of another client therefore only
needs that batch's mean (xbar_j, ybar_j). The FedMix local loss of sample i paired with mean j:

    l_FedMix = (1 - lam) l(f((1 - lam) x_i), y_i) + lam l(f((1 - lam) x_i), ybar_j)
               + lam < dl/dx , xbar_j >,

    dl/dx = d/dz l(f(z), y_i) at z = (1 - lam) x_i       (the input gradient, with the local label y_i)

NaiveMix (the paper's baseline under MAFL) is plain Mixup with a received mean:

    l_NaiveMix = (1 - lam) l(f((1 - lam) x_i + lam xbar_j), y_i) + lam l(f((1 - lam) x_i + lam xbar_j), ybar_j)

l is the cross-entropy; l(., ybar) with a soft label is -sum_c ybar_c log softmax_c. lam = 0 is
FedAvg exactly (tested). Paper symbols -> ``RunConfig``: lam -> ``mix_lam``, M_k -> ``mix_mean_size``
(the same for every client), eta -> ``lr`` (times ``lr_decay``^(t-1): the round's optimiser), E / B ->
``local_epochs`` / ``batch_size``; SGD ``momentum`` and ``weight_decay`` as in ``LocalSGD``.

Sources and what could be checked. The paper's full text could not be consulted (only its
abstract and introduction, OpenReview Ogga20D2HO-); the authors
published no code (a survey of ICLR 2021 FL papers records "Code: None provided"). The loss above
is the paper's Taylor-approximation result as transcribed by a reading note on the paper (the
averaged form "(1 - lam) l(f((1 - lam) x_i), y_i) + lam l(f((1 - lam) x_i), ybar_j) + lam dl/dx . xbar_j")
and as implemented by the Flower baseline of the paper (adap/flower, baselines/fedmix/fedmix/client.py:
FedMixClient and NaiveMixClient) and by smduan/FedMix (fedavg/client.py); the derivation
(first-order expansion in lam x_j around (1 - lam) x_i) gives the same three terms and fixes the
derivative as the one of l(f(z), y_i) at z = (1 - lam) x_i, since the y_j-part of the expansion
is O(lam^2). Hyperparameters, from the Flower baseline's README (its table "as mentioned in the
paper"): CIFAR-10 lam = 0.05 (FedMix) and 0.1 (NaiveMix); CIFAR-100 0.1 / 0.1; FEMNIST 0.2 / 0.2;
local lr 0.01 decayed by 0.999 per round, B = 10, E = 2 (CIFAR-10; 10 for CIFAR-100 and FEMNIST),
60 clients with 2 classes each and 15 per round (CIFAR-10), 500 rounds; M_k = "all" (each client
sends one mean of all its data). ``mix_lam`` = 0.05 is the CIFAR-10 FedMix value; ``mix_mean_size``
stays 10 (a value of at least the largest client size gives the "all" setting: one mean per client).

Choices, where the sources leave it open or disagree:
- Pairing: each sample of each local step draws its own mean j uniformly from the whole global
  mean set (all clients' means, the client's own included, as in the Flower baseline). The two
  codes above draw one mean per mini-batch instead; both are unbiased estimates of the same
  objective, because l_FedMix and l_NaiveMix's label term are linear in (xbar_j, ybar_j)
  (per-sample draws have lower variance). The draws come from a ``torch.Generator`` seeded from the
  round and the round's batch plan (``pairing``), so both implementations below see the same pairs.
- Scale of the Taylor term, ``RunConfig.mix_taylor_scale``: "sample" (default) takes it per sample, as in
  the equation (the input gradient of each sample's own loss); "batch" does what both codes above do:
  they take the gradient of the *batch-mean* loss (1 - lam) l_1, which scales the term by (1 - lam) / B
  (B = the client's real rows that step), B / (1 - lam) times smaller than the equation's. Why both: in
  AdaFL's MNIST setting the per-sample form trains fastest for ~250 rounds and then collapses (AdaFL+FedMix
  and FedMix-0.1, seed 0: best 96.5 / 95.9, last-10 65 / 73, notebook 23), where the paper's FedMix
  curves are steady; the term is linear in the input gradient, so once the cross-entropy is small the
  model can keep lowering the loss by growing its input sensitivity against the mean images. At the
  batch scale FedMix-0.1 holds (best 97.85, last-10 97.19, never below 94.7 in its last 100 rounds), so
  the AdaFL Table 3 profile takes "batch"; the default stays the equation's form, and the two per-sample
  runs are kept as the ablation ``adafl_fedmix_scale``.
- Mean set: computed once, deterministically, from the training split: each client's rows in
  stored order (its dataset indices ascending, not sorted by label), cut into consecutive chunks
  of M_k; the last chunk of a client may be smaller (its mean is over the rows it has), so
  M_k >= n_k gives one mean per client. Held as the method's state ``MeanSet``. It travels once
  (``Algorithm.share``, ``MeanShare``): the engine builds it before round 1's training and counts it in
  round 1's bytes, each client's means up once (X_g and Y_g in all) and the whole set down to each of
  the N training clients once; ``fedlib.flower``'s server gathers the clients' means from their answers
  to its first query, concatenates them in client order and broadcasts the set. The pairing draws
  index the whole set and are drawn from the whole round's plan, so there the server draws them and
  sends each client its column beside its mini-batches.
- Masked epochs (``sample_epochs``): padding rows do not count; a client past the end of its
  epochs does not step (no momentum, no weight decay), as in the executors.

The client procedure is an objective (``MixClient.objective``: ``executors.FedMixObjective`` /
``NaiveMixObjective``), which every executor trains; the executors' three ways of running it agree in float64
to < 1e-10 (tested, masked and unmasked plans):
- ``LoopExecutor``: the reference, one ``nn.Module`` + ``torch.optim.SGD`` per client, with
  ``torch.autograd.grad(..., create_graph=True)`` for the input gradient.
- ``StackedExecutor``, generic vmap path (any buffer-free model): ``torch.func.vmap`` over the per-client loss,
  whose FedMix term is a ``torch.func.grad`` w.r.t. the input inside ``grad`` w.r.t. the parameters (second
  order), in the executor's client groups.
- ``StackedExecutor``, chain fast path (Linear/ReLU chains: the MLP of AdaFL's MNIST tables,
  ``executors.chain``): the FedMix term as a forward-mode tangent pass run beside the primal one, all by
  hand-written batched matmuls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedlib.config.options import MethodOptions, option, register
from fedlib.core.protocols import RunSpec
from fedlib.core.stages import Algorithm, ClientWork, MethodState, Params, WeightedMean, local_sgd
from fedlib.core.state import State
from fedlib.data.federated import BatchPlan, Split
from fedlib.executors import FedMixObjective, LocalSGD, NaiveMixObjective, Objective


@dataclass(eq=False)
class MeanSet(MethodState):
    """MAFL's global mean set, ``means = {"x": X_g, "y": Y_g}``: computed once, before the first round's training."""

    KEY = "mafl_means"
    means: Params


MEANS_KEY = MeanSet.KEY


def mean_dataset(split: Split, n_classes: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global mean set (X_g, Y_g) of MAFL: every client's training rows, in stored order, cut into
    chunks of ``size`` (M_k; a client's last chunk may be smaller) and averaged, inputs and one-hot labels.

    Returns X_g (J, *input_shape) and Y_g (J, n_classes), clients in order, J = sum_k ceil(n_k / M_k) (J = 0: no
    rows). Each client's rows depend on its own data only, so the set of all clients is the concatenation of each
    client's set, in client order (what ``fedlib.flower``'s server gathers).
    """
    if size < 1:
        raise ValueError(f"mix_mean_size={size!r} must be >= 1")
    dtype = split.x.dtype if split.x.is_floating_point() else torch.get_default_dtype()
    xs, ys = [], []
    for i in range(len(split.sizes)):
        x, y = split.client(i)
        if len(y) == 0:
            continue
        oh = F.one_hot(y, n_classes).to(dtype)
        xs += [c.to(dtype).mean(0) for c in x.split(size)]
        ys += [c.mean(0) for c in oh.split(size)]
    if not xs:
        return torch.zeros(0, *split.x.shape[1:], dtype=dtype), torch.zeros(0, n_classes, dtype=dtype)
    return torch.stack(xs), torch.stack(ys)


def pairing(round_: int, plan: BatchPlan, n_means: int) -> torch.Tensor:
    """(steps, K, B) indices into the mean set: the mean each sample of each step is paired with.

    Uniform draws from a CPU ``torch.Generator`` seeded from the round and the plan (the plan
    itself comes from the run's seed), so the result is a pure function of (round, plan).
    """
    first = plan.index[0].reshape(-1)[:64].cpu().to(torch.float64)
    mix = int((first * torch.arange(1, len(first) + 1, dtype=torch.float64)).sum().item())
    seed = (round_ * 1_000_003 + mix * 7_919 + plan.steps) % (2**62)
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(n_means, tuple(plan.index.shape), generator=gen).to(plan.index.device)


@dataclass(frozen=True)
class MeanShare:
    """MAFL's one-time exchange (``fedlib.core.stages.Share``): each client offers the means of its own batches of
    ``mean_size`` rows (``mean_dataset``), every client receives the whole set; the round's pairing of samples with
    means (``pairing``) is drawn from the whole round's plan. Bytes (round 1): X_g and Y_g up once in all (each
    client its rows) and down once to each of the N training clients."""

    mean_size: int

    def offer(self, split: Split, n_classes: int) -> Params:
        mx, my = mean_dataset(split, n_classes, self.mean_size)
        return {"x": mx, "y": my}

    def receive(self, state: State, shared: Params) -> None:
        state.extra[MeanSet.KEY] = MeanSet({"x": shared["x"], "y": shared["y"]})

    def draw(self, state: State, plan: BatchPlan) -> Params:
        return {"pair": pairing(int(state.round), plan, len(MeanSet.of(state).means["y"]))}


@dataclass
class MixClient:
    """FedMix's (``taylor=True``) or NaiveMix's local objective, minimised by SGD over the round's plan."""

    opt: LocalSGD
    lam: float
    mean_size: int
    taylor: bool = True
    taylor_scale: str = "sample"  # "batch": the Taylor term times (1 - lam) / B (B = the client's real rows that step)

    def objective(self, means_x: torch.Tensor, means_y: torch.Tensor, pair: torch.Tensor) -> Objective:
        """The client objective of a round: FedMix's (Taylor) or NaiveMix's loss with sample i of step s of client
        k paired with mean ``pair[s, k, i]`` of the mean set (``means_x``, ``means_y``); any executor trains it."""
        if self.taylor:
            return FedMixObjective(self.lam, means_x, means_y, pair, self.taylor_scale)
        return NaiveMixObjective(self.lam, means_x, means_y, pair)

    # -- the engine's hook --------------------------------------------------------------------
    def __call__(self, work: ClientWork) -> Params:
        mx, my = self.means(work.model, work.start, work.split, work.state)
        pair = pairing(int(work.state.round), work.plan, len(my)) if work.drawn is None else work.drawn["pair"]
        return work.train(work.start, objective=self.objective(mx, my, pair))

    def means(self, model: nn.Module, start: Params, split: Split, state: State) -> tuple[torch.Tensor, torch.Tensor]:
        """The global mean set: the one the engine shared before round 1 (``MeanShare``), else computed here once
        from ``split`` (a caller that builds the work by hand), the same set."""

        def compute() -> MeanSet:
            with torch.no_grad():  # number of classes = the model's output width
                probe = {n: t[0] for n, t in start.items()}
                out = torch.func.functional_call(
                    model.eval(), probe, (split.x[:1].to(next(iter(probe.values())).dtype),)
                )
                model.train()
            mx, my = mean_dataset(split, out.shape[-1], self.mean_size)
            return MeanSet({"x": mx, "y": my})

        m = MeanSet.of(state, compute).means
        return m["x"], m["y"]


def _build(
    cfg: RunSpec, name: str, lam: float, mean_size: int, taylor: bool, taylor_scale: str = "sample"
) -> Algorithm:
    opt = local_sgd(cfg)
    return Algorithm(
        name=name,
        local=opt,
        aggregate=WeightedMean("samples"),
        local_update=MixClient(opt, lam, mean_size, taylor, taylor_scale),
        share=MeanShare(mean_size),
    )


_LAM: dict[str, Any] = dict(ge=0, le=1, doc="mixing ratio lambda")
_M: dict[str, Any] = dict(ge=1, doc="M_k: samples per shared mean data point")


@register
@dataclass(frozen=True)
class FedMix(MethodOptions):
    NAME = "fedmix"
    mix_lam: float = option(0.05, **_LAM)
    mix_mean_size: int = option(10, **_M)
    mix_taylor_scale: str = option(
        "sample",
        choices=("sample", "batch"),
        doc="Taylor term per sample (the equation) or x (1 - lam) / B (public codes)",
    )

    def build(self, cfg: RunSpec) -> Algorithm:
        return _build(cfg, self.NAME, self.mix_lam, self.mix_mean_size, True, self.mix_taylor_scale)


@register
@dataclass(frozen=True)
class NaiveMix(MethodOptions):
    """NaiveMix has no Taylor term, so no ``mix_taylor_scale``. ``mix_lam`` defaults to FedMix's 0.05, so that the two
    differ by the Taylor term alone; the Flower baseline's CIFAR-10 value for NaiveMix is 0.1 (module docstring)."""

    NAME = "naivemix"
    mix_lam: float = option(0.05, **_LAM)
    mix_mean_size: int = option(10, **_M)

    def build(self, cfg: RunSpec) -> Algorithm:
        return _build(cfg, self.NAME, self.mix_lam, self.mix_mean_size, False)
