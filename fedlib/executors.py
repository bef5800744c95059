"""Local training of many clients: the stacked executor and the per-client loop executor.

Both take the clients' models as a state dict whose tensors carry a leading client axis
(``params[name]: (K, *shape)``), a ``BatchPlan`` (the rows of every client's mini-batch at
every step) and a ``LocalSGD`` (the local objective and optimiser), and return the trained
state dict. ``drift`` (optional, per client like the parameters) is a constant added to every
step's gradient: SCAFFOLD's correction c - c_i. Given the same plan they compute the same thing; ``tests/test_executors.py``
checks that in float64 to 1e-10.

- ``LoopExecutor``: one ``nn.Module`` and one ``torch.optim.SGD`` per client, a Python loop
  over clients and steps. Obviously right, slow; the reference and the fallback for any model.
- ``StackedExecutor``: all K clients take each step together. For Flatten/Linear/ReLU chains
  (MLR, DNN, MLP) the forward and backward passes are hand-written batched matmuls
  (``torch.baddbmm``) with the SGD update fused in place; other buffer-free models use
  ``torch.func.vmap(grad(...))`` over ``functional_call``. Clients are processed in groups
  whose parameters fit in cache, running all local steps of one group before the next
  (local steps of different clients never interact, so the order across clients is free).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .data.federated import BatchPlan, Split
from .models import linear_chain

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class LocalSGD:
    """Client objective f_i(w) + mu/2 ||w - anchor||^2, minimised by SGD.

    ``lr`` [eta], ``momentum`` (heavy ball, as ``torch.optim.SGD``), ``weight_decay`` (l2,
    e.g. the "l2-regularised" MLR), ``mu`` [FedProx mu, FedMCSA lambda]: strength of the
    proximal pull toward ``anchor`` (the model the client started from, or another model the
    algorithm names). ``mu = 0`` is plain local SGD.
    """
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    mu: float = 0.0


def _check(params: Params, plan: BatchPlan, anchor: Params | None, opt: LocalSGD) -> int:
    k = plan.index.shape[1]
    for name, t in params.items():
        if t.shape[0] != k:
            raise ValueError(f"params[{name!r}] has {t.shape[0]} clients but the plan has {k}")
    if opt.mu and anchor is None:
        raise ValueError(f"LocalSGD.mu={opt.mu} needs an anchor model")
    return k


class LoopExecutor:
    """Per-client reference: ``nn.Module`` + ``torch.optim.SGD``, one client after another."""
    name = "loop"

    def train(self, model: nn.Module, params: Params, plan: BatchPlan, data: Split, opt: LocalSGD,
              anchor: Params | None = None, drift: Params | None = None) -> Params:
        _check(params, plan, anchor, opt)

        def step_loss(module, trainable, s, i, keep):
            rows = plan.index[s, i] if keep is None else plan.index[s, i][keep]
            loss = F.cross_entropy(module(data.x[rows]), data.y[rows])
            if opt.mu:
                loss = loss + opt.mu / 2 * sum(((p - anchor[n][i]) ** 2).sum() for n, p in trainable.items())
            if drift is not None:  # <c, w>: adds the constant c to the gradient (SCAFFOLD's c - c_i)
                loss = loss + sum((p * drift[n][i]).sum() for n, p in trainable.items() if n in drift)
            return loss

        return self.each_client(model, params, plan, opt, step_loss)

    @staticmethod
    def each_client(model: nn.Module, params: Params, plan: BatchPlan, opt: LocalSGD, step_loss) -> Params:
        """The loop itself, shared with algorithms that bring their own loss (FedMix): client i loads its row of
        ``params`` into ``model`` and takes the plan's steps with ``torch.optim.SGD`` on
        ``step_loss(module, trainable, s, i, keep)``; ``keep`` masks the padded rows of step s (None: no padding)."""
        out = {n: t.clone() for n, t in params.items()}
        module = model.train()
        for i in range(plan.index.shape[1]):
            module.load_state_dict({n: t[i] for n, t in params.items()})
            trainable = dict(module.named_parameters())
            sgd = torch.optim.SGD(trainable.values(), lr=opt.lr, momentum=opt.momentum, weight_decay=opt.weight_decay)
            for s in range(plan.steps):
                if plan.active is not None and not bool(plan.active[s, i]):
                    continue  # this client has finished its epochs: it does not step
                keep = None if plan.weight is None else plan.weight[s, i] > 0
                loss = step_loss(module, trainable, s, i, keep)
                sgd.zero_grad(set_to_none=True)
                loss.backward()
                sgd.step()
            for n, t in module.state_dict().items():
                out[n][i] = t.detach()
        return out


def _sgd_update(p: torch.Tensor, g: torch.Tensor, buf: torch.Tensor | None, a: torch.Tensor | None,
                opt: LocalSGD, act: torch.Tensor | None, c: torch.Tensor | None = None) -> None:
    """In place: g += wd p + mu (p - a) + c; buf = m buf + g; p -= lr buf; clients with act=False unchanged.

    Same arithmetic as ``torch.optim.SGD`` (its first momentum step sets buf = g, which is
    m * 0 + g), with FedProx's gradient mu (p - a) and a constant drift correction c (SCAFFOLD's
    c - c_i) added to the loss gradient first.
    """
    if c is not None:
        g.add_(c)
    if opt.weight_decay:
        g.add_(p, alpha=opt.weight_decay)
    if opt.mu:
        g.add_(p - a, alpha=opt.mu)
    if act is not None:
        m = act.view(-1, *([1] * (p.dim() - 1)))
        if buf is not None:
            buf.copy_(torch.where(m, buf * opt.momentum + g, buf))
            g = buf
        p.sub_(torch.where(m, g, torch.zeros_like(g)), alpha=opt.lr)
        return
    if buf is not None:
        g = buf.mul_(opt.momentum).add_(g)
    p.sub_(g, alpha=opt.lr)


def _fused_weight_step(W: torch.Tensor, dzT: torch.Tensor, hin: torch.Tensor, buf: torch.Tensor | None,
                       a: torch.Tensor | None, opt: LocalSGD, c: torch.Tensor | None = None) -> None:
    """The SGD step of ``_sgd_update`` for a weight whose loss gradient is ``dzT @ hin``, with the
    batched matmul written straight into the momentum buffer or the weight (no gradient tensor):

        momentum: buf = m buf + dzT hin (+ wd W + mu (W - a));  W -= lr buf
        plain:    W = (1 - lr (wd + mu)) W + lr mu a - lr dzT hin

    The same arithmetic as ``torch.optim.SGD`` with FedProx's term, summed in another order
    (float64 results agree to ~1e-16; tested against the loop executor). Saves the passes over W
    that dominate on CPU for wide first layers (784 inputs).
    """
    if buf is not None:
        buf.baddbmm_(dzT, hin, beta=opt.momentum)
        if c is not None:
            buf.add_(c)
        if opt.weight_decay:
            buf.add_(W, alpha=opt.weight_decay)
        if opt.mu:
            buf.add_(W, alpha=opt.mu).sub_(a, alpha=opt.mu)
        W.sub_(buf, alpha=opt.lr)
        return
    shrink = opt.lr * (opt.weight_decay + opt.mu)
    if shrink:
        W.mul_(1 - shrink)
    if opt.mu:
        W.add_(a, alpha=opt.lr * opt.mu)
    if c is not None:
        W.sub_(c, alpha=opt.lr)
    W.baddbmm_(dzT, hin, alpha=-opt.lr)


# the cache one process's client groups may fill (2-core CPU: 32 MiB L3, half for parameters and buffers)
PROCESS_CACHE_BYTES = 16 << 20


class StackedExecutor:
    """All clients of a group take a step at once. ``group_bytes`` bounds a group's working set.

    On the 2-core CPU (2 x 1 MiB L2, 32 MiB L3) groups of about 16 MiB of parameters and
    update buffers ran fastest: smaller groups make the batched matmuls too thin, larger
    ones spill the shared L3 (measured with ``python -m fedlib.bench``: case (c), groups of
    10 MLPs 0.23 s/round, of 1 0.63 s, of 100 0.37 s). That budget is for one process.
    Processes training side by side share the L3, so a grid run with ``jobs`` worker
    processes gives each ``default_group_bytes / jobs`` (``runner._worker_setup``): AdaFL's
    MLP with momentum, 50 clients, 60 steps of batch 10, two single-threaded processes at
    once, took 1.02-1.04 s in groups of 7 (16 MiB) and 0.71-0.74 s in groups of 3 (8 MiB).
    The grouping changes no result: each client's matmuls have the same shapes in any group
    (on this CPU groups of 3 and of 7 gave bit-identical float32 parameters after 20 steps).
    """
    name = "stacked"
    default_group_bytes = PROCESS_CACHE_BYTES  # per process; see above

    def __init__(self, group_bytes: int | None = None, max_group: int | None = None):
        self.group_bytes = StackedExecutor.default_group_bytes if group_bytes is None else group_bytes
        self.max_group = max_group

    @staticmethod
    def supports(model: nn.Module) -> bool:
        return linear_chain(model) is not None or not any(True for _ in model.buffers())

    def group_size(self, model: nn.Module, k: int, plan: BatchPlan, opt: LocalSGD, device) -> int:
        if self.max_group is not None:
            return max(1, min(k, self.max_group))
        if torch.device(device).type != "cpu":
            return k  # on a GPU the bigger the batched matmul the better
        per_client = sum(p.numel() * p.element_size() for p in model.parameters())
        copies = 2 + (opt.momentum > 0) + (opt.mu > 0)  # params, grads/update, momentum, anchor
        g = max(1, min(k, self.group_bytes // max(1, per_client * copies)))
        n_groups = -(-k // g)
        return -(-k // n_groups)  # equal groups: 20 clients as 10 + 10, not 17 + 3 (a thin group is slow)

    def train(self, model: nn.Module, params: Params, plan: BatchPlan, data: Split, opt: LocalSGD,
              anchor: Params | None = None, drift: Params | None = None) -> Params:
        k = _check(params, plan, anchor, opt)
        out = {n: t.clone() for n, t in params.items()}
        layers = linear_chain(model)
        if layers is None and any(True for _ in model.buffers()):
            raise NotImplementedError(f"{type(model).__name__} has buffers (e.g. BatchNorm): use the loop executor")
        dev = next(iter(out.values())).device
        g = self.group_size(model, k, plan, opt, dev)
        for a in range(0, k, g):
            sl = slice(a, min(k, a + g))
            p = {n: t[sl] for n, t in out.items()}  # views: updates land in ``out``
            anc = None if anchor is None else {n: t[sl] for n, t in anchor.items()}
            dr = None if drift is None else {n: t[sl] for n, t in drift.items()}
            sub = plan.clients(sl)
            if layers is not None:
                self._chain(layers, p, sub, data, opt, anc, dr)
            else:
                self._vmap(model, p, sub, data, opt, anc, dr)
        return out

    # -- Flatten/Linear/ReLU chains: hand-written batched forward and backward -----------------
    def _chain(self, layers, p: Params, plan: BatchPlan, data: Split, opt: LocalSGD, anchor, drift=None) -> None:
        W = [p[f"{n}.weight"] for n in layers]  # (G, out, in)
        b = [p[f"{n}.bias"] for n in layers]    # (G, out)
        G, B = plan.index.shape[1], plan.index.shape[2]
        bufs = [(None, None)] * len(W)
        if opt.momentum:
            bufs = [(torch.zeros_like(w), torch.zeros_like(c)) for w, c in zip(W, b)]
        anchors = [(None, None)] * len(W)
        if opt.mu:
            anchors = [(anchor[f"{n}.weight"], anchor[f"{n}.bias"]) for n in layers]
        drifts = [(None, None)] * len(W)
        if drift is not None:
            drifts = [(drift.get(f"{n}.weight"), drift.get(f"{n}.bias")) for n in layers]
        xdim = W[0].shape[2]
        for s in range(plan.steps):
            rows = plan.index[s]
            h = data.x.index_select(0, rows.reshape(-1)).view(G, B, xdim).to(W[0].dtype)
            y = data.y.index_select(0, rows.reshape(-1)).view(G, B)
            hs = [h]
            for j in range(len(W)):
                z = torch.baddbmm(b[j].unsqueeze(1), hs[-1], W[j].transpose(1, 2))
                hs.append(z.relu_() if j < len(W) - 1 else z)
            # d(mean CE)/d logits = (softmax - onehot) / n, zero for padded rows
            dz = torch.softmax(hs.pop(), dim=2)
            dz.scatter_add_(2, y.unsqueeze(2), torch.full_like(y, -1, dtype=dz.dtype).unsqueeze(2))
            if plan.weight is None:
                dz.mul_(1.0 / B)
            else:
                w = plan.weight[s].to(dz.dtype)
                dz.mul_((w / w.sum(1, keepdim=True).clamp_min(1)).unsqueeze(2))
            act = None if plan.active is None else plan.active[s]
            for j in range(len(W) - 1, -1, -1):
                hin = hs[j]
                dh = torch.bmm(dz, W[j]) if j > 0 else None  # uses W before this step's update
                (bw, bb), (aw, ab), (cw, cb) = bufs[j], anchors[j], drifts[j]
                if act is None:
                    _fused_weight_step(W[j], dz.transpose(1, 2), hin, bw, aw, opt, cw)
                else:
                    _sgd_update(W[j], torch.bmm(dz.transpose(1, 2), hin), bw, aw, opt, act, cw)
                _sgd_update(b[j], dz.sum(1), bb, ab, opt, act, cb)
                if dh is not None:
                    # ReLU backward (hin is the previous layer's ReLU output, > 0 where it passed);
                    # aten's fused kernel is ~6x faster on CPU than dh.mul_(hin > 0)
                    dz = torch.ops.aten.threshold_backward(dh, hin, 0)

    # -- any buffer-free model: vmap over functional_call --------------------------------------
    def _vmap(self, model: nn.Module, p: Params, plan: BatchPlan, data: Split, opt: LocalSGD, anchor, drift=None) -> None:
        from torch.func import functional_call, grad, vmap

        names = [n for n, _ in model.named_parameters()]

        def loss(params, x, y, w):
            out = functional_call(model, params, (x,))
            return (F.cross_entropy(out, y, reduction="none") * w).sum() / w.sum().clamp_min(1)

        g_fn = vmap(grad(loss), randomness="different")  # dropout (FedMix CNN): independent masks per client
        G, B = plan.index.shape[1], plan.index.shape[2]
        bufs = {n: torch.zeros_like(p[n]) for n in names} if opt.momentum else None
        ones = torch.ones(G, B, dtype=p[names[0]].dtype, device=p[names[0]].device)
        for s in range(plan.steps):
            rows = plan.index[s]
            x = data.x.index_select(0, rows.reshape(-1)).view(G, B, *data.x.shape[1:]).to(p[names[0]].dtype)
            y = data.y.index_select(0, rows.reshape(-1)).view(G, B)
            w = ones if plan.weight is None else plan.weight[s].to(ones.dtype)
            grads = g_fn({n: p[n] for n in names}, x, y, w)
            act = None if plan.active is None else plan.active[s]
            for n in names:
                a = None if anchor is None or not opt.mu else anchor[n]
                _sgd_update(p[n], grads[n], None if bufs is None else bufs[n], a, opt, act,
                            None if drift is None else drift.get(n))


EXECUTORS = {"stacked": StackedExecutor, "loop": LoopExecutor}


def make_executor(name: str, model: nn.Module):
    """``auto`` picks the stacked executor when it covers the model, else the loop."""
    if name == "auto":
        name = "stacked" if StackedExecutor.supports(model) else "loop"
    if name not in EXECUTORS:
        raise ValueError(f"executor={name!r} is not one of: auto, {', '.join(EXECUTORS)}")
    ex = EXECUTORS[name]()
    if name == "stacked" and not StackedExecutor.supports(model):
        raise ValueError(f"executor='stacked' does not cover {type(model).__name__} (it has buffers); use 'loop' or 'auto'")
    return ex
