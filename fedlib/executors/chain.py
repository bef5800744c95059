"""Flatten/Linear/ReLU chains (MLR, DNN, MLP): one forward pass for every user, and the stacked executor's
hand-written fast paths for the cross-entropy and the MAFL objectives (FedMix / NaiveMix).

``chain_forward`` is the chain's forward pass, used by both fast paths here; ``chain_logits_by_class`` is the one
``fedlib.executors.evaluation.evaluate`` uses (every layer by feature).
The fast paths run a client group's local steps as batched matmuls (``torch.baddbmm``) with the SGD update
fused in place; they compute what the loop executor computes on the same objective (float64, < 1e-10, tested).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedlib.data.federated import BatchPlan, gather_rows
from fedlib.executors.kernels import Group, register_fast_path
from fedlib.executors.objectives import CrossEntropy, FedMixObjective, MixupObjective, NaiveMixObjective
from fedlib.executors.sgd import LocalSGD, Params, RunsSGD, _fused_weight_step, _sgd_update
from fedlib.models.registry import linear_chain


def class_softmax(z: torch.Tensor, log: bool = False) -> torch.Tensor:
    """(Log-)softmax over the last dimension (the classes) of ``z``: the values of ``torch.softmax(z, -1)``.

    On the CPU it runs torch's kernel over the *first* dimension of a transposed copy, padded to a multiple of
    ``_LANES`` rows: that kernel vectorises across rows, where the last-dimension one spends a vector on each row of
    10 classes (over twice as slow; without this a large share of every personalised Synthetic round, ``python -m
    benchmarks --e2e``). The padding keeps every row
    in a full vector, away from the kernel's scalar tail (a different ``exp``), so a row's result never depends on
    its position or on the other rows: a batched run's evaluation (``fedlib.runs.batching``) equals its solo run's bit
    for bit. The classes are summed in another order than ``torch.softmax``'s, so results differ from it in the last
    bit; runs stored before this change were made with torch's last-dimension kernel. float64 (the precision the
    executors are checked against each other in, to 1e-10, through Per-FedAvg HF's finite differences, which magnify
    a last-bit difference to ~2e-10) and other devices keep torch's kernel.

    Used where the logits come rows first: FedMix's chain path and a conv net's evaluation. The cross-entropy chain
    path in float32 and the Linear chains' evaluation compute the logits by class instead, where torch's softmax over
    the classes already runs along the rows (``chain_forward(..., by_class=True)``)."""
    if z.device.type != "cpu" or z.dtype != torch.float32:
        return torch.log_softmax(z, -1) if log else torch.softmax(z, -1)
    n_classes, shape = z.shape[-1], z.shape
    rows = z.reshape(-1, n_classes)
    m = rows.shape[0]
    padded = z.new_empty(n_classes, -(-m // _LANES) * _LANES)
    padded[:, :m].copy_(rows.T)
    padded[:, m:].zero_()
    out = torch.log_softmax(padded, 0) if log else torch.softmax(padded, 0)
    return out[:, :m].T.view(shape)


_LANES = 64  # a multiple of every CPU vector width in float32 (AVX-512: 16 lanes)


def chain_forward(
    layers: list[str], params: Params, x: torch.Tensor, tangent: torch.Tensor | None = None, by_class: bool = False
) -> list[torch.Tensor]:
    """The forward pass of the chain ``layers`` (``linear_chain(model)``): [h_0, h_1, ..., logits], h_0 the
    flattened input, h_j the ReLU output of Linear layer j (the input of layer j + 1), the last one without ReLU.

    ``params[f"{name}.weight"]``: (out, in) with ``x`` (N, *input) (one model), or (G, out, in) with ``x``
    (G, N, *input) (a group of G models, batched matmuls).

    ``tangent`` (like ``x``): also run the forward-mode tangent of the chain along it (J v, the same layers without
    biases, through the primal pass's ReLU masks), as N more rows beside the primal ones: every h_j then has
    2N rows, the primal rows first. Both passes share the weights, so they cost one pass at twice the rows.

    ``by_class`` (no ``tangent``; a group of G models, as training has): the last layer's logits by class,
    (G, classes, N), as W h^T (evaluation takes every layer so: ``chain_logits_by_class``). The rows-first h W^T is
    a matmul as thin as the classes; by class it runs well faster for 10 classes at every training shape timed
    (never slower), and the softmax over the classes vectorises along the rows
    without a transposed copy (``chain_cross_entropy``).
    """
    W0 = params[f"{layers[0]}.weight"]
    h = x.flatten(W0.dim() - 1)
    n = h.shape[-2]
    if tangent is not None:
        h = torch.cat([h, tangent.flatten(W0.dim() - 1)], -2)
    hs = [h]
    last = len(layers) - 1
    for j, name in enumerate(layers):
        W, b = params[f"{name}.weight"], params[f"{name}.bias"]
        if tangent is not None:  # biases on the primal rows only: the tangent is linear
            z = torch.matmul(hs[-1], W.transpose(-1, -2))
            z[..., :n, :] += b.unsqueeze(-2)
            if j < last:
                z[..., n:, :].mul_(z[..., :n, :] > 0)  # the primal ReLU mask, for the tangent rows
                z[..., :n, :].relu_()
        elif by_class and j == last:
            z = torch.baddbmm(b.unsqueeze(2), W, hs[-1].transpose(1, 2))
        else:
            if W.dim() == 3:
                z = torch.baddbmm(b.unsqueeze(1), hs[-1], W.transpose(1, 2))
            else:
                z = torch.addmm(b, hs[-1], W.T)
            if j < last:
                z.relu_()
        hs.append(z)
    return hs


def chain_logits_by_class(layers: list[str], params: Params, x: torch.Tensor, by_feature: bool = False) -> torch.Tensor:
    """The logits of the chain ``layers``, by class: (G, classes, N) for a group of G models (``params`` (G, out, in)
    weights, ``x`` (G, N, *input), or (G, F, N) with ``by_feature``: the rows' flattened inputs feature by feature,
    as ``data.federated.Block.features`` keeps them), (classes, N) for one model (``params`` (out, in), ``x``
    (N, *input)). Each layer runs as W h^T, features by rows (evaluation: N in the thousands), where the rows-first
    x W^T of ``chain_forward`` is a thin matmul, as wide as the layer's outputs (about twice as slow on the CPU; the
    same logits, summed in another order).
    A group's layer is a matmul and then the bias added in place: ``baddbmm`` first copies the bias, broadcast along
    the rows, into its output (slower over a personalised evaluation's blocks). The logits are those of ``baddbmm``
    bit for bit over Synthetic's 60 features (one and two threads); over 784 (MNIST) they differ in the last bits, where the BLAS adds a preloaded bias part-way
    through a long sum (float32 evaluation of MNIST's Linear chains moves so; float64 logits of magnitude ~100 moved
    by ~1e-13)."""
    group = params[f"{layers[0]}.weight"].dim() == 3
    if by_feature:
        h = x
    else:
        h = x.flatten(2).transpose(1, 2) if group else x.flatten(1).T
    last = len(layers) - 1
    for j, name in enumerate(layers):
        W, b = params[f"{name}.weight"], params[f"{name}.bias"]
        h = torch.bmm(W, h).add_(b.unsqueeze(2)) if group else torch.addmm(b[:, None], W, h)
        if j < last:
            h.relu_()
    return h


# one layer's (weight, bias) pair of momentum buffers, anchors or drifts; None where the term is off
_Pair = tuple["torch.Tensor | None", "torch.Tensor | None"]
# a client group's chain: weights, biases, and per layer its buffers, anchors and drifts (``_group_state``)
_GroupState = tuple[list[torch.Tensor], list[torch.Tensor], list[_Pair], list[_Pair], list[_Pair]]


def _group_state(
    layers: list[str], p: Params, opt: LocalSGD | RunsSGD, anchor: Params | None, drift: Params | None
) -> _GroupState:
    """Per layer: weight and bias (views of the group's rows), their momentum buffers, anchors and drifts."""
    W = [p[f"{n}.weight"] for n in layers]  # (G, out, in)
    b = [p[f"{n}.bias"] for n in layers]  # (G, out)
    bufs: list[_Pair] = [(None, None)] * len(W)
    if opt.momentum:
        bufs = [(torch.zeros_like(w), torch.zeros_like(c)) for w, c in zip(W, b)]
    anchors: list[_Pair] = [(None, None)] * len(W)
    if opt.mu:
        assert anchor is not None  # ``_check``: a proximal term needs an anchor
        anchors = [(anchor[f"{n}.weight"], anchor[f"{n}.bias"]) for n in layers]
    drifts: list[_Pair] = [(None, None)] * len(W)
    if drift is not None:
        drifts = [(drift.get(f"{n}.weight"), drift.get(f"{n}.bias")) for n in layers]
    return W, b, bufs, anchors, drifts


def _leading(
    k: int,
    G: int,
    W: list[torch.Tensor],
    b: list[torch.Tensor],
    bufs: list[_Pair],
    anchors: list[_Pair],
    drifts: list[_Pair],
) -> _GroupState:
    """The group state of ``_group_state`` restricted to its first ``k`` clients (views; itself when k = G)."""
    if k == G:
        return W, b, bufs, anchors, drifts
    cut = lambda t: None if t is None else t[:k]
    pairs = lambda ts: [(cut(u), cut(v)) for u, v in ts]
    return [w[:k] for w in W], [c[:k] for c in b], pairs(bufs), pairs(anchors), pairs(drifts)


def _backward_step(
    hs: list[torch.Tensor],
    dz: torch.Tensor,
    W: list[torch.Tensor],
    b: list[torch.Tensor],
    bufs: list[_Pair],
    anchors: list[_Pair],
    drifts: list[_Pair],
    opt: LocalSGD | RunsSGD,
    act: torch.Tensor | None,
    n: int,
    tangent: bool,
    by_class: bool = False,
) -> None:
    """Back through the chain from the logits' gradient ``dz`` (mean over each client's rows already taken),
    updating every layer in place. ``by_class``: ``dz`` is (G, classes, N), as ``chain_forward(..., by_class=True)``
    gives the logits; else (G, N, classes). ``tangent``: ``dz`` and ``hs`` hold the primal rows then the tangent rows
    (``chain_forward(..., tangent=)``); the tangent's gradient reaches the weights, not the biases. Without ``act``
    (every client steps: lock-step plans without padding, ``ShrinkingPlan``) the weight's update is fused into its
    gradient's matmul (``_fused_weight_step``); with it (a padded plan's step), the gradient first, then
    ``_sgd_update``'s masked update."""
    for j in range(len(W) - 1, -1, -1):
        hin = hs[j]
        top_by_class = by_class and j == len(W) - 1  # the layers below get dh: rows first
        dzT = dz if top_by_class else dz.transpose(1, 2)  # (G, out, N)
        dh = torch.bmm(dzT.transpose(1, 2), W[j]) if j > 0 else None  # uses W before this step's update
        (bw, bb), (aw, ab), (cw, cb) = bufs[j], anchors[j], drifts[j]
        if act is None:
            _fused_weight_step(W[j], dzT, hin, bw, aw, opt, cw)
        else:
            _sgd_update(W[j], torch.bmm(dzT, hin), bw, aw, opt, act, cw)
        db = dz.sum(2) if top_by_class else (dz[:, :n] if tangent else dz).sum(1)
        _sgd_update(b[j], db, bb, ab, opt, act, cb)
        if dh is None:
            continue
        if tangent:  # both halves through the primal ReLU mask (hin's primal rows are > 0 where it passed)
            G, _, H = dh.shape
            dz = dh.view(G, 2, n, H).mul_((hin[:, :n] > 0).unsqueeze(1)).view(G, 2 * n, H)
        else:
            # ReLU backward (hin is the previous layer's ReLU output, > 0 where it passed);
            # aten's fused kernel is ~6x faster on CPU than dh.mul_(hin > 0)
            dz = torch.ops.aten.threshold_backward(dh, hin, 0)


def _row_scale(plan: BatchPlan, s: int, k: int, dtype, device):
    """(k, B, 1) weights of each row in its client's mean, and each client's rows that count: B or (k, 1, 1), for
    the first k clients of the group."""
    B = plan.index.shape[2]
    if plan.weight is None:
        return torch.full((k, B, 1), 1.0 / B, dtype=dtype, device=device), B
    w = plan.weight[s, :k].to(dtype)
    n_rows = w.sum(1, keepdim=True).clamp_min(1).unsqueeze(2)
    return w.unsqueeze(2) / n_rows, n_rows


def trains_by_class(W: torch.Tensor) -> bool:
    """Whether ``chain_cross_entropy`` computes the last layer by class (``chain_forward(..., by_class=True)``): in
    float32 on the CPU, where it is faster. float64, the precision the executors are checked against each other in
    (to 1e-10), keeps the rows-first path whose bits that check was set on: Per-FedAvg HF's finite differences
    magnify any change of a last bit (by class, its test loss moved from 1.1e-11 to 1.4e-10 off the loop's;
    Per-FedAvg's, FedAvg's, pFedMe's and FedMCSA's stayed below 2e-12). Other devices keep it too: the speed-up was
    measured on this CPU only.
    ``tests/test_executors.py`` forces it on in float64 to check it against the loop."""
    return W.dtype == torch.float32 and W.device.type == "cpu"


def _repeated_steps(plan: BatchPlan) -> list[bool]:
    """Per step s: whether its rows are step s - 1's, for every client. pFedMe's K inner steps repeat a local step's
    mini-batch (``BatchPlan.at_steps``), and gathering it once saves 4 of 5 gathers of rows read from memory (a gather is
    a tenth or more of a small model's training step on the CPU, ``python -m benchmarks --e2e``). On the CPU only:
    elsewhere the gather is cheap and the comparison's answer would be a device sync."""
    if plan.steps < 2 or plan.index.device.type != "cpu":
        return [False] * plan.steps
    return [False] + (plan.index[1:] == plan.index[:-1]).flatten(1).all(1).tolist()


@register_fast_path("chain", CrossEntropy)
def chain_cross_entropy(g: Group) -> None:
    """The mean cross-entropy: d/d logits = (softmax - onehot) / n, zero for padded rows."""
    model, p, plan, data, opt, anchor, drift, *_ = g
    layers = linear_chain(model)
    assert layers is not None  # the chain paths are registered for models whose kernel is "chain"
    W, b, bufs, anchors, drifts = _group_state(layers, p, opt, anchor, drift)
    G, B = plan.index.shape[1], plan.index.shape[2]
    xdim = W[0].shape[2]
    again, k_before = _repeated_steps(plan), None
    by_class = trains_by_class(W[0])
    for s in range(plan.steps):
        k = plan.live_at(s)  # the clients of this step: the group's first k (all G but in a shrinking plan)
        if not (again[s] and k == k_before):  # else this step's rows are the last step's: x and y as they are
            rows = plan.index[s, :k]
            x = gather_rows(data.x, rows).view(k, B, xdim).to(W[0].dtype)
            y = gather_rows(data.y, rows)
        k_before = k
        hs = chain_forward(layers, p if k == G else {n: t[:k] for n, t in p.items()}, x, by_class=by_class)
        if by_class:  # (k, classes, B): torch's softmax over a middle dimension vectorises along the rows, each
            # client's values independent of the other clients (a batched run's training equals its solo run's)
            dz = torch.softmax(hs.pop(), 1)
        else:
            dz = class_softmax(hs.pop()).contiguous().transpose(1, 2)  # (k, classes, B), a view
        dz.scatter_add_(1, y.unsqueeze(1), torch.full_like(y, -1, dtype=dz.dtype).unsqueeze(1))
        if plan.weight is None:
            dz.mul_(1.0 / B)
        else:
            w = plan.weight[s, :k].to(dz.dtype)
            dz.mul_((w / w.sum(1, keepdim=True).clamp_min(1)).unsqueeze(1))
        act = None if plan.active is None else plan.active[s]
        state = _leading(k, G, W, b, bufs, anchors, drifts)
        _backward_step(hs, dz, *state, opt, act, B, tangent=False, by_class=True)


@register_fast_path("chain", FedMixObjective, NaiveMixObjective)
def chain_mean_mixup(g: Group) -> None:
    """FedMix / NaiveMix (``objectives.FedMixObjective``, ``NaiveMixObjective``): batched matmuls, no nested ``grad``.

    With z = (1 - lam) x_i, logits u = f(z), p = softmax(u), e the one-hot y_i, FedMix's Taylor term is
    lam t <J^T (p - e), xbar_j> = lam t (p - e)^T v, where v = J xbar_j is the forward-mode tangent of the chain
    along xbar_j (``chain_forward(..., tangent=xbar)``; the ReLU masks' derivative is 0 almost everywhere).
    So, per sample,

        dL/du = p - ((1 - lam) e + lam ybar_j) + lam t (p * v - p (p . v))   (through p; diag(p) - p p^T)
        dL/dv = lam t (p - e)                                                (back through the tangent chain)

    and each weight's gradient is the primal part plus the tangent part: the cost of a plain step at twice the
    batch. NaiveMix is the primal pass alone, on (1 - lam) x_i + lam xbar_j with the soft label.
    """
    model, p, plan, data, opt, anchor, drift, objective, clients = g
    layers = linear_chain(model)
    assert layers is not None  # the chain paths are registered for models whose kernel is "chain"
    W, b, bufs, anchors, drifts = _group_state(layers, p, opt, anchor, drift)
    assert isinstance(objective, MixupObjective)  # registered for FedMixObjective and NaiveMixObjective only
    fedmix = objective if isinstance(objective, FedMixObjective) else None  # the Taylor term's objective
    lam, taylor = objective.lam, fedmix is not None
    G, B = plan.index.shape[1], plan.index.shape[2]
    dtype, xdim, dev = W[0].dtype, W[0].shape[2], W[0].device
    for s in range(plan.steps):
        k = plan.live_at(s)  # the clients of this step: the group's first k (all G but in a shrinking plan)
        rows = plan.index[s, :k]
        x = gather_rows(data.x, rows).view(k, B, xdim).to(dtype)
        y = gather_rows(data.y, rows)
        ctx = plan.context(objective, s, clients, k, dtype)
        xm, ym = ctx["xm"].reshape(k, B, xdim), ctx["ym"]
        ps = p if k == G else {n: t[:k] for n, t in p.items()}
        if taylor:
            hs = chain_forward(layers, ps, (1 - lam) * x, tangent=xm)
        else:
            hs = chain_forward(layers, ps, (1 - lam) * x + lam * xm)
        zl = hs.pop()
        pr = class_softmax(zl[:, :B])
        onehot = F.one_hot(y, pr.shape[2]).to(dtype)
        du = pr - (1 - lam) * onehot - lam * ym
        scale, n_rows = _row_scale(plan, s, k, dtype, dev)
        if fedmix is not None:  # taylor
            tl = lam * fedmix.tscale(n_rows)  # the Taylor term's factor: lam, or lam (1 - lam) / n_rows
            v = zl[:, B:]
            pv = pr * v
            du = du + tl * (pv - pr * pv.sum(2, keepdim=True))
            dz = torch.cat([du * scale, tl * (pr - onehot) * scale], 1)
        else:
            dz = du * scale
        act = None if plan.active is None else plan.active[s]
        state = _leading(k, G, W, b, bufs, anchors, drifts)
        _backward_step(hs, dz, *state, opt, act, B, tangent=taylor)
