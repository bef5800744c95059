"""FedMix and NaiveMix: Yoon, Shin, Hwang and Yang, "FedMix: Approximation of Mixup under Mean Augmented
Federated Learning", ICLR 2021 (OpenReview Ogga20D2HO-; arXiv 2107.00233). AdaFL (../shared/papers/adafl.md,
Tables 3-4) compares against it ("FedMix-0.1", "FedMix-0.5": FedMix at a fixed fraction of 0.1 / 0.5).

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
(the same for every client), eta -> ``lr`` (times ``lr_decay``^(t-1) via ``state.lr_scale``), E / B ->
``local_epochs`` / ``batch_size``; SGD ``momentum`` and ``weight_decay`` as in ``LocalSGD``.

Sources and what could be checked. The paper's full text was not reachable from here (only its
abstract and introduction, in the ICLR 2021 text dump, pages corpus, Ogga20D2HO-.txt); the authors
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
  M_k >= n_k gives one mean per client. Held in ``state.extra['mafl_means']`` = {'x', 'y'}.
- Masked epochs (``sample_epochs``): padding rows do not count; a client past the end of its
  epochs does not step (no momentum, no weight decay), as in the executors.

Two implementations of the client procedure, which agree in float64 to < 1e-10 (tested):
- ``train_loop``: the reference, one ``nn.Module`` + ``torch.optim.SGD`` per client with
  ``torch.autograd.grad(..., create_graph=True)`` for the input gradient. Used with the
  ``LoopExecutor`` (and any executor that is not a ``StackedExecutor``).
- ``train_vmap``: all clients of a group at once, ``torch.func.vmap`` over a per-client loss whose
  FedMix term is a ``torch.func.grad`` w.r.t. the input inside ``grad`` w.r.t. the parameters
  (second order), followed by the executors' SGD update. Used when the executor is a
  ``StackedExecutor``, in its client groups, for any model other than a Linear/ReLU chain.
- ``train_chain``: Linear/ReLU chains (the MLP of AdaFL's MNIST tables), the FedMix term as a
  forward-mode tangent pass run beside the primal one, all by hand-written batched matmuls.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..data.federated import BatchPlan, Split
from ..executors import LocalSGD, LoopExecutor, StackedExecutor, _fused_weight_step, _sgd_update
from ..models import linear_chain
from ..options import MethodOptions, option, register
from ..stages import Algorithm, WeightedMean, local_sgd

MEANS_KEY = "mafl_means"

Params = dict[str, torch.Tensor]


def mean_dataset(split: Split, n_classes: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global mean set (X_g, Y_g) of MAFL: every client's training rows, in stored order, cut into
    chunks of ``size`` (M_k; a client's last chunk may be smaller) and averaged, inputs and one-hot labels.

    Returns X_g (J, *input_shape) and Y_g (J, n_classes), clients in order, J = sum_k ceil(n_k / M_k).
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
    return torch.stack(xs), torch.stack(ys)


def pairing(round_: int, plan: BatchPlan, n_means: int) -> torch.Tensor:
    """(steps, K, B) indices into the mean set: the mean each sample of each step is paired with.

    Uniform draws from a CPU ``torch.Generator`` seeded from the round and the plan (the plan
    itself comes from the run's seed), so the result is a pure function of (round, plan).
    """
    first = plan.index[0].reshape(-1)[:64].cpu().to(torch.float64)
    mix = int((first * torch.arange(1, len(first) + 1, dtype=torch.float64)).sum().item())
    seed = (round_ * 1_000_003 + mix * 7_919 + plan.steps) % (2 ** 62)
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(n_means, tuple(plan.index.shape), generator=gen).to(plan.index.device)


def _soft_ce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy with a soft label: -sum_c target_c log softmax_c."""
    return -(target * F.log_softmax(logits, dim=-1)).sum(-1)


@dataclass
class MixClient:
    """FedMix's (``taylor=True``) or NaiveMix's local objective, minimised by SGD over the round's plan."""
    opt: LocalSGD
    lam: float
    mean_size: int
    taylor: bool = True
    taylor_scale: str = "sample"  # "batch": the Taylor term times (1 - lam) / B (B = the client's real rows that step)

    def _tscale(self, n_rows):
        """Factor on the Taylor term: 1 (the equation, per sample) or (1 - lam) / n_rows (the public codes take the
        input gradient of the batch-mean loss (1 - lam) CE, see the module docstring)."""
        if self.taylor_scale == "sample":
            return 1.0
        return (1 - self.lam) / n_rows

    # -- the engine's hook --------------------------------------------------------------------
    def __call__(self, executor, model, start, anchor, plan: BatchPlan, split: Split, state, clients):
        mx, my = self.means(model, start, split, state)
        pair = pairing(int(state.round), plan, len(my))
        opt = dataclasses.replace(self.opt, lr=self.opt.lr * float(getattr(state, "lr_scale", 1.0)))
        if isinstance(executor, StackedExecutor):
            if linear_chain(model) is not None:
                return self.train_chain(model, start, plan, split, mx, my, pair, opt, executor)
            return self.train_vmap(model, start, plan, split, mx, my, pair, opt, executor)
        return self.train_loop(model, start, plan, split, mx, my, pair, opt)

    def means(self, model, start, split, state) -> tuple[torch.Tensor, torch.Tensor]:
        """The global mean set, computed once (the clients send their means before training)."""
        if MEANS_KEY not in state.extra:
            with torch.no_grad():  # number of classes = the model's output width
                probe = {n: t[0] for n, t in start.items()}
                out = torch.func.functional_call(model.eval(), probe, (split.x[:1].to(next(iter(probe.values())).dtype),))
                model.train()
            mx, my = mean_dataset(split, out.shape[-1], self.mean_size)
            state.extra[MEANS_KEY] = {"x": mx, "y": my}
        m = state.extra[MEANS_KEY]
        return m["x"], m["y"]

    # -- per-sample losses (shared by both implementations) ----------------------------------
    def _fedmix_terms(self, out, gz, y, xm, ym, tscale=1.0):
        lam = self.lam
        taylor = (gz * xm).reshape(gz.shape[0], -1).sum(1)
        return (1 - lam) * F.cross_entropy(out, y, reduction="none") + lam * _soft_ce(out, ym) + lam * tscale * taylor

    def _naive_terms(self, out, y, ym):
        lam = self.lam
        return (1 - lam) * F.cross_entropy(out, y, reduction="none") + lam * _soft_ce(out, ym)

    # -- reference: one nn.Module and torch.optim.SGD per client -----------------------------
    def train_loop(self, model: nn.Module, params: Params, plan: BatchPlan, split: Split, mx, my, pair,
                   opt: LocalSGD) -> Params:
        lam = self.lam
        dtype = next(model.parameters()).dtype  # load_state_dict copies into these tensors: their dtype stays

        def step_loss(module, trainable, s, i, keep):
            rows, j = plan.index[s, i], pair[s, i]
            if keep is not None:
                rows, j = rows[keep], j[keep]
            x, y = split.x[rows].to(dtype), split.y[rows]
            xm, ym = mx[j].to(dtype), my[j].to(dtype)
            if self.taylor:
                z = ((1 - lam) * x).requires_grad_(True)
                logits = module(z)
                ce_sum = F.cross_entropy(logits, y, reduction="sum")  # per-sample input gradients
                gz, = torch.autograd.grad(ce_sum, z, create_graph=True)
                return self._fedmix_terms(logits, gz, y, xm, ym, self._tscale(len(y))).mean()
            return self._naive_terms(module((1 - lam) * x + lam * xm), y, ym).mean()

        return LoopExecutor.each_client(model, params, plan, opt, step_loss)

    # -- vectorised over clients: vmap over functional_call, second order via nested grad -----
    def train_vmap(self, model: nn.Module, params: Params, plan: BatchPlan, split: Split, mx, my, pair,
                   opt: LocalSGD, executor: StackedExecutor | None = None) -> Params:
        from torch.func import functional_call, grad, vmap

        out = {n: t.clone() for n, t in params.items()}
        names = [n for n, _ in model.named_parameters()]
        lam, taylor = self.lam, self.taylor
        model.train()

        def per_sample(p, x, y, xm, ym, tscale):
            if taylor:
                def ce_sum(z):
                    logits = functional_call(model, p, (z,))
                    return F.cross_entropy(logits, y, reduction="sum"), logits
                gz, logits = grad(ce_sum, has_aux=True)((1 - lam) * x)
                return self._fedmix_terms(logits, gz, y, xm, ym, tscale)
            return self._naive_terms(functional_call(model, p, ((1 - lam) * x + lam * xm,)), y, ym)

        def loss(p, x, y, w, xm, ym):
            n = w.sum().clamp_min(1)
            return (per_sample(p, x, y, xm, ym, self._tscale(n)) * w).sum() / n

        g_fn = vmap(grad(loss), randomness="different")  # 'different': dropout masks differ across clients
        k = plan.index.shape[1]
        dev = out[names[0]].device
        g = k if executor is None else executor.group_size(model, k, plan, opt, dev)
        for a in range(0, k, g):
            sl = slice(a, min(k, a + g))
            p = {n: out[n][sl] for n in names}  # views: updates land in ``out``
            sub, sub_pair = plan.clients(sl), pair[:, sl]
            G, B = sub.index.shape[1], sub.index.shape[2]
            dtype = p[names[0]].dtype
            ones = torch.ones(G, B, dtype=dtype, device=dev)
            bufs = {n: torch.zeros_like(p[n]) for n in names} if opt.momentum else None
            for s in range(sub.steps):
                rows, j = sub.index[s].reshape(-1), sub_pair[s].reshape(-1)
                x = split.x.index_select(0, rows).view(G, B, *split.x.shape[1:]).to(dtype)
                y = split.y.index_select(0, rows).view(G, B)
                xm = mx.index_select(0, j).view(G, B, *mx.shape[1:]).to(dtype)
                ym = my.index_select(0, j).view(G, B, my.shape[1]).to(dtype)
                w = ones if sub.weight is None else sub.weight[s].to(dtype)
                grads = g_fn(p, x, y, w, xm, ym)
                act = None if sub.active is None else sub.active[s]
                for n in names:
                    _sgd_update(p[n], grads[n], None if bufs is None else bufs[n], None, opt, act)
        return out


    # -- Flatten/Linear/ReLU chains (AdaFL's MLP): hand-written forward, tangent and backward passes ---------
    def train_chain(self, model: nn.Module, params: Params, plan: BatchPlan, split: Split, mx, my, pair,
                    opt: LocalSGD, executor: StackedExecutor | None = None) -> Params:
        """``train_vmap``'s result for a Linear/ReLU chain, with batched matmuls instead of nested ``grad``.

        With z = (1 - lam) x_i, logits u = f(z), p = softmax(u), e the one-hot y_i, the FedMix term is
        lam <J^T (p - e), xbar_j> = lam (p - e)^T v, where v = J xbar_j is the forward-mode tangent of the chain
        along xbar_j (the same layers without biases, through the primal pass's ReLU masks, whose derivative
        is 0 almost everywhere). So, per sample,

            dL/du = p - ((1 - lam) e + lam ybar_j) + lam (p * v - p (p . v))   (through p; diag(p) - p p^T)
            dL/dv = lam (p - e)                                                (back through the tangent chain)

        and each weight's gradient is the primal part plus the tangent part. Both passes share the weights, so
        they run as one chain on 2B rows (the primal rows, then the tangent rows): the cost of a plain step at
        twice the batch. NaiveMix is the primal pass alone, on (1 - lam) x_i + lam xbar_j with the soft label.
        Agrees with ``train_loop`` in float64 to < 1e-10 (tested, masked and unmasked plans).
        """
        layers = linear_chain(model)
        if layers is None:
            raise ValueError(f"train_chain needs a Flatten/Linear/ReLU chain, not {type(model).__name__}")
        out = {n: t.clone() for n, t in params.items()}
        lam, taylor = self.lam, self.taylor
        k = plan.index.shape[1]
        dev = out[f"{layers[0]}.weight"].device
        g = k if executor is None else executor.group_size(model, k, plan, opt, dev)
        for a in range(0, k, g):
            sl = slice(a, min(k, a + g))
            W = [out[f"{n}.weight"][sl] for n in layers]  # views: updates land in ``out``
            b = [out[f"{n}.bias"][sl] for n in layers]
            sub, sub_pair = plan.clients(sl), pair[:, sl]
            G, B = sub.index.shape[1], sub.index.shape[2]
            dtype, xdim = W[0].dtype, W[0].shape[2]
            bufs = [(torch.zeros_like(w), torch.zeros_like(c)) for w, c in zip(W, b)] if opt.momentum \
                else [(None, None)] * len(W)
            for s in range(sub.steps):
                rows, j = sub.index[s].reshape(-1), sub_pair[s].reshape(-1)
                x = split.x.index_select(0, rows).view(G, B, xdim).to(dtype)
                y = split.y.index_select(0, rows).view(G, B)
                xm = mx.index_select(0, j).view(G, B, xdim).to(dtype)
                ym = my.index_select(0, j).view(G, B, my.shape[1]).to(dtype)
                h = torch.cat([(1 - lam) * x, xm], 1) if taylor else (1 - lam) * x + lam * xm
                hs, masks = [h], []
                for li in range(len(W)):
                    z = torch.bmm(hs[-1], W[li].transpose(1, 2))
                    z[:, :B] += b[li].unsqueeze(1)  # biases on the primal rows only: the tangent is linear
                    if li < len(W) - 1:
                        keep = z[:, :B] > 0  # the primal ReLU mask, for both passes
                        masks.append(keep.repeat(1, 2, 1) if taylor else keep)
                        z = z * masks[-1]
                    hs.append(z)
                zl = hs.pop()
                p = torch.softmax(zl[:, :B], dim=2)
                onehot = F.one_hot(y, p.shape[2]).to(dtype)
                du = p - (1 - lam) * onehot - lam * ym
                if sub.weight is None:
                    n_rows = B
                    scale = torch.full((G, B, 1), 1.0 / B, dtype=dtype, device=dev)
                else:
                    w = sub.weight[s].to(dtype)
                    n_rows = w.sum(1, keepdim=True).clamp_min(1).unsqueeze(2)  # (G, 1, 1): each client's real rows
                    scale = w.unsqueeze(2) / n_rows
                if taylor:
                    tl = lam * self._tscale(n_rows)  # the Taylor term's factor: lam, or lam (1 - lam) / n_rows
                    v = zl[:, B:]
                    pv = p * v
                    du = du + tl * (pv - p * pv.sum(2, keepdim=True))
                    dz = torch.cat([du * scale, tl * (p - onehot) * scale], 1)
                else:
                    dz = du * scale
                act = None if sub.active is None else sub.active[s]
                for li in range(len(W) - 1, -1, -1):
                    hin = hs[li]
                    dh = torch.bmm(dz, W[li]) if li > 0 else None  # uses W before this step's update
                    bw, bb = bufs[li]
                    if act is None:
                        _fused_weight_step(W[li], dz.transpose(1, 2), hin, bw, None, opt)
                    else:
                        _sgd_update(W[li], torch.bmm(dz.transpose(1, 2), hin), bw, None, opt, act)
                    _sgd_update(b[li], dz[:, :B].sum(1), bb, None, opt, act)
                    if dh is not None:
                        dz = dh * masks[li - 1]
        return out


def _build(cfg, name: str, lam: float, mean_size: int, taylor: bool, taylor_scale: str = "sample") -> Algorithm:
    opt = local_sgd(cfg)
    return Algorithm(name=name, local=opt, aggregate=WeightedMean("samples"),
                     local_update=MixClient(opt, lam, mean_size, taylor, taylor_scale))


_LAM = dict(ge=0, le=1, doc="mixing ratio lambda")
_M = dict(ge=1, doc="M_k: samples per shared mean data point")


@register
@dataclass(frozen=True)
class FedMix(MethodOptions):
    NAME = "fedmix"
    mix_lam: float = option(0.05, **_LAM)
    mix_mean_size: int = option(10, **_M)
    mix_taylor_scale: str = option("sample", choices=("sample", "batch"),
                                   doc="Taylor term per sample (the equation) or x (1 - lam) / B (public codes)")

    def build(self, cfg) -> Algorithm:
        return _build(cfg, self.NAME, self.mix_lam, self.mix_mean_size, True, self.mix_taylor_scale)


@register
@dataclass(frozen=True)
class NaiveMix(MethodOptions):
    """NaiveMix has no Taylor term, so no ``mix_taylor_scale``."""
    NAME = "naivemix"
    mix_lam: float = option(0.05, **_LAM)
    mix_mean_size: int = option(10, **_M)

    def build(self, cfg) -> Algorithm:
        return _build(cfg, self.NAME, self.mix_lam, self.mix_mean_size, False)
