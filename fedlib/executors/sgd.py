"""The optimiser every executor applies to any client objective, and the stacked paths' in-place SGD updates.

``LocalSGD`` holds the generic terms that are not part of a method's objective: SGD with heavy-ball momentum,
weight decay and FedProx's proximal pull ``mu`` toward an anchor model; the executors' ``drift`` (SCAFFOLD's
c - c_i) is the other generic term. ``RunsSGD`` is one ``LocalSGD`` per run for a call that trains several runs'
clients side by side (``fedlib.runs.batching``: a grid over lr, mu, lambda, momentum or weight decay). ``_sgd_update``
and ``_fused_weight_step`` are the stacked paths' update (private to this package: the loop executor uses
``torch.optim.SGD``, which they reproduce).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from fedlib.data.federated import BatchPlan

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class LocalSGD:
    """Client objective f_i(w) + mu/2 ||w - anchor||^2, minimised by SGD.

    ``lr`` [eta], ``momentum`` (heavy ball, as ``torch.optim.SGD``), ``weight_decay`` (l2,
    e.g. the "l2-regularised" MLR), ``mu`` [FedProx mu, FedMCSA lambda]: strength of the
    proximal pull toward ``anchor`` (the model the client started from, or another model the
    algorithm names). ``mu = 0`` is plain local SGD. f_i is the executor's ``objective``
    (default: the mean cross-entropy, ``objectives.CrossEntropy``).
    """

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    mu: float = 0.0


@dataclass(frozen=True, eq=False)
class RunsSGD:
    """A ``LocalSGD`` per run, for one ``executor.train`` call over several runs' clients side by side (per-run
    hyperparameters: a grid's runs batched as one call). ``parts``: ``(start, stop, LocalSGD)`` over the client axis, in order, covering
    it; client i of the call takes the ``LocalSGD`` of the part that holds it. Build it with ``RunsSGD.of``.

    The generic code asks ``momentum``, ``mu`` and ``weight_decay`` as "does any run need it" (momentum buffers and
    anchors are allocated for all clients then; the runs without the term do not use them); ``lr`` has no single
    value and is not an attribute. The updates apply it one of two ways:

    - per run (``per_row=False``, the CPU's way): each run's rows are a slice, and the update of ``LocalSGD`` runs on
      each slice with that run's numbers, so every run gets its solo run's arithmetic, float32 included (an
      element-wise operation on a run's slice computes what it computes on the run's own tensor). The forward, the
      softmax, the backward matmuls and the gathers are one call for all runs; the update is one call per run.
    - per row (``per_row=True``, other devices): each term a (clients, 1, ...) column of the runs' values, one
      operation for all runs. It adds in another order than the scalar update (``W.addcmul_(a, lr mu)`` rounds the
      product, where ``add_(alpha=)`` fuses it; the gradient matmul's ``-lr`` scales ``dz`` first), so float32
      results differ from the solo run's in the last bits (float64: < 1e-10, tested). On a GPU, where kernel
      launches bound small runs, it keeps one launch per term whatever the number of runs. On a CPU it is no faster
      than the slices, so the CPU keeps the per-run update and its solo-run arithmetic."""

    parts: tuple[tuple[int, int, LocalSGD], ...]
    per_row: bool = False
    _cache: dict = field(default_factory=dict, compare=False, repr=False)  # slices and columns, per call

    @staticmethod
    def of(counts: list[int], opts: list[LocalSGD], per_row: bool = False) -> "LocalSGD | RunsSGD":
        """Run r's ``counts[r]`` clients after run r-1's, run r training with ``opts[r]``; the one ``LocalSGD``
        itself when all runs have the same (the scalar path, unchanged)."""
        if len(set(opts)) == 1 or not sum(counts):
            return opts[0]
        return _segments([o for n, o in zip(counts, opts) for _ in range(n)], per_row)

    @property
    def momentum(self) -> float:
        return max(o.momentum for *_, o in self.parts)

    @property
    def mu(self) -> float:
        return max(o.mu for *_, o in self.parts)

    @property
    def weight_decay(self) -> float:
        return max(o.weight_decay for *_, o in self.parts)

    def clients(self) -> list[LocalSGD]:
        return [o for a, b, o in self.parts for _ in range(b - a)]

    def at(self, i: int) -> LocalSGD:
        """Client i's ``LocalSGD``."""
        return next(o for a, b, o in self.parts if a <= i < b)

    def slices(self, k: int) -> tuple[tuple[slice, LocalSGD], ...]:
        """Each run's slice among the first ``k`` clients, with its ``LocalSGD`` (cached: the updates ask per step)."""
        if k not in self._cache:
            self._cache[k] = tuple((slice(a, min(b, k)), o) for a, b, o in self.parts if a < k)
        return self._cache[k]

    def column(self, value: Callable[[LocalSGD], float], like: torch.Tensor) -> torch.Tensor:
        """``value(opt)`` of every client, as a (k, 1, ...) column broadcasting over ``like`` (k rows), of its dtype
        and device; cached per term, dtype and device."""
        key = (value, like.dtype, like.device)
        if key not in self._cache:
            rows = [float(value(o)) for o in self.clients()]
            self._cache[key] = torch.tensor(rows, dtype=like.dtype, device=like.device)
        return self._cache[key][: like.shape[0]].view(-1, *[1] * (like.dim() - 1))


def _segments(per_client: list[LocalSGD], per_row: bool) -> "LocalSGD | RunsSGD":
    """The ``RunsSGD`` of these clients' ``LocalSGD``, in order (one part per stretch of equal ones); the one
    ``LocalSGD`` when they all have it."""
    if not per_client:
        raise ValueError("RunsSGD: no clients")
    parts, a = [], 0
    for i in range(1, len(per_client) + 1):
        if i == len(per_client) or per_client[i] != per_client[a]:
            parts.append((a, i, per_client[a]))
            a = i
    return parts[0][2] if len(parts) == 1 else RunsSGD(tuple(parts), per_row)


def restrict(opt: LocalSGD | RunsSGD, clients: slice | torch.Tensor) -> LocalSGD | RunsSGD:
    """``opt`` for the clients ``clients`` (a slice or an index tensor) of its call, in that order: a group of the
    stacked executor, or its clients sorted by step count."""
    if isinstance(opt, LocalSGD):
        return opt
    per_client = opt.clients()
    picked = per_client[clients] if isinstance(clients, slice) else [per_client[int(i)] for i in clients]
    return _segments(picked, opt.per_row) if picked else opt


def client_opt(opt: "LocalSGD | RunsSGD", i: int) -> LocalSGD:
    """Client i's ``LocalSGD`` (the loop executor's)."""
    return opt if isinstance(opt, LocalSGD) else opt.at(i)


# the per-row columns' terms, module-level so that the column cache finds them
_NEG_LR = lambda o: -o.lr  # noqa: E731
_MOMENTUM = lambda o: o.momentum  # noqa: E731
_WD = lambda o: o.weight_decay  # noqa: E731
_MU = lambda o: o.mu  # noqa: E731
_LR_MU = lambda o: o.lr * o.mu  # noqa: E731
_KEEP = lambda o: 1 - o.lr * (o.weight_decay + o.mu)  # noqa: E731


def _cut(t: torch.Tensor | None, s: slice, use: float = True) -> torch.Tensor | None:
    """``t``'s rows ``s``; None where there is no ``t`` or its term is off (``use``: the term's coefficient)."""
    return None if t is None or not use else t[s]


def _check(params: Params, plan: BatchPlan, anchor: Params | None, opt: LocalSGD | RunsSGD) -> int:
    k = plan.index.shape[1]
    for name, t in params.items():
        if t.shape[0] != k:
            raise ValueError(f"params[{name!r}] has {t.shape[0]} clients but the plan has {k}")
    if opt.mu and anchor is None:
        raise ValueError(f"LocalSGD.mu={opt.mu} needs an anchor model")
    return k


def _sgd_update(
    p: torch.Tensor,
    g: torch.Tensor,
    buf: torch.Tensor | None,
    a: torch.Tensor | None,
    opt: LocalSGD | RunsSGD,
    act: torch.Tensor | None,
    c: torch.Tensor | None = None,
) -> None:
    """In place: g += wd p + mu (p - a) + c; buf = m buf + g; p -= lr buf; clients with act=False unchanged.

    Same arithmetic as ``torch.optim.SGD`` (its first momentum step sets buf = g, which is
    m * 0 + g), with FedProx's gradient mu (p - a) and a constant drift correction c (SCAFFOLD's
    c - c_i) added to the loss gradient first. ``opt`` a ``RunsSGD``: per run or per row.
    """
    if isinstance(opt, RunsSGD):
        if opt.per_row:
            return _sgd_update_rows(p, g, buf, a, opt, act, c)
        for s, o in opt.slices(p.shape[0]):
            _sgd_update(p[s], g[s], _cut(buf, s, o.momentum), _cut(a, s, o.mu), o, _cut(act, s), _cut(c, s))
        return
    if c is not None:
        g.add_(c)
    if opt.weight_decay:
        g.add_(p, alpha=opt.weight_decay)
    if opt.mu:
        assert a is not None  # ``_check``: a proximal term needs an anchor
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


def _fused_weight_step(
    W: torch.Tensor,
    dzT: torch.Tensor,
    hin: torch.Tensor,
    buf: torch.Tensor | None,
    a: torch.Tensor | None,
    opt: LocalSGD | RunsSGD,
    c: torch.Tensor | None = None,
) -> None:
    """The SGD step of ``_sgd_update`` for a weight whose loss gradient is ``dzT @ hin``, with the
    batched matmul written straight into the momentum buffer or the weight (no gradient tensor):

        momentum: buf = m buf + dzT hin (+ wd W + mu (W - a));  W -= lr buf
        plain:    W = (1 - lr (wd + mu)) W + lr mu a - lr dzT hin

    The same arithmetic as ``torch.optim.SGD`` with FedProx's term, summed in another order
    (float64 results agree to ~1e-16; tested against the loop executor). Saves the passes over W
    that dominate on CPU for wide first layers (784 inputs). ``opt`` a ``RunsSGD``: per run or per row.
    """
    if isinstance(opt, RunsSGD):
        if opt.per_row:
            return _fused_weight_step_rows(W, dzT, hin, buf, a, opt, c)
        for s, o in opt.slices(W.shape[0]):
            _fused_weight_step(W[s], dzT[s], hin[s], _cut(buf, s, o.momentum), _cut(a, s, o.mu), o, _cut(c, s))
        return
    if buf is not None:
        buf.baddbmm_(dzT, hin, beta=opt.momentum)
        if c is not None:
            buf.add_(c)
        if opt.weight_decay:
            buf.add_(W, alpha=opt.weight_decay)
        if opt.mu:
            assert a is not None  # ``_check``: a proximal term needs an anchor
            buf.add_(W, alpha=opt.mu).sub_(a, alpha=opt.mu)
        W.sub_(buf, alpha=opt.lr)
        return
    shrink = opt.lr * (opt.weight_decay + opt.mu)
    if shrink:
        W.mul_(1 - shrink)
    if opt.mu:
        assert a is not None  # ``_check``: a proximal term needs an anchor
        W.add_(a, alpha=opt.lr * opt.mu)
    if c is not None:
        W.sub_(c, alpha=opt.lr)
    W.baddbmm_(dzT, hin, alpha=-opt.lr)


def _generic_terms_rows(g, p, a, c, opt: RunsSGD, col) -> None:
    """g += c + wd p + mu (p - a), each run's wd and mu a column (``col``)."""
    if c is not None:
        g.add_(c)
    if opt.weight_decay:
        g.addcmul_(p, col(_WD))
    if opt.mu:
        g.addcmul_(p - a, col(_MU))


def _sgd_update_rows(p, g, buf, a, opt: RunsSGD, act, c) -> None:
    """``_sgd_update`` with each run's numbers as per-row columns (``RunsSGD``, ``per_row``). Runs without momentum
    take buf = 0 buf + g = g; runs without mu multiply p - a by 0."""
    col = lambda value: opt.column(value, p)
    _generic_terms_rows(g, p, a, c, opt, col)
    if act is not None:
        m = act.view(-1, *([1] * (p.dim() - 1)))
        if buf is not None:
            buf.copy_(torch.where(m, buf * col(_MOMENTUM) + g, buf))
            g = buf
        p.addcmul_(torch.where(m, g, torch.zeros_like(g)), col(_NEG_LR))
        return
    if buf is not None:
        g = buf.mul_(col(_MOMENTUM)).add_(g)
    p.addcmul_(g, col(_NEG_LR))


def _fused_weight_step_rows(W, dzT, hin, buf, a, opt: RunsSGD, c) -> None:
    """``_fused_weight_step`` with each run's numbers as per-row columns (``RunsSGD``, ``per_row``): the gradient
    matmul's -lr scales ``dzT`` (the smaller factor) per row."""
    col = lambda value: opt.column(value, W)
    if buf is not None:
        buf.mul_(col(_MOMENTUM)).baddbmm_(dzT, hin)
        _generic_terms_rows(buf, W, a, c, opt, col)
        W.addcmul_(buf, col(_NEG_LR))
        return
    if opt.weight_decay or opt.mu:
        W.mul_(col(_KEEP))
    if opt.mu:
        W.addcmul_(a, col(_LR_MU))
    if c is not None:
        W.addcmul_(c, col(_NEG_LR))
    W.baddbmm_(dzT * col(_NEG_LR), hin)
