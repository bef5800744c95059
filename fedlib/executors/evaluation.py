"""Evaluation of models on a split: per client, the correct predictions, the loss sum and the rows (``evaluate``),
with a fast path for linear chains that evaluates a stacked block of clients in one batched forward
(``personal_chain``, ``global_chain``) and conv nets evaluated in chunks of rows with one tensor swap per model.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedlib.data.federated import Split
from fedlib.executors.chain import chain_logits_by_class, class_softmax
from fedlib.models.registry import linear_chain

# rows per forward pass when a model is not a Linear chain, one client's model or one global model: a conv model's
# activations for a chunk of 256 rows stay in the CPU's caches, where a whole test set or chunks of 1,024 or of the
# chains' 8,192 rows spill them and run about twice as slow, with bit-identical logits (``python -m benchmarks --e2e``;
# docs/performance.md)
CONV_ROWS = 256


class _Reparametrized(nn.Module):
    """``fn(net)`` as ``forward``: ``functional_call`` of this module runs it with ``net``'s parameters and buffers
    swapped for the given tensors once for the whole call, where a ``functional_call`` per chunk of rows would swap
    them per chunk (a pFedLA model's dozens of tensors, every chunk: a visible share of a round's evaluation)."""

    def __init__(self, net: nn.Module, fn):
        super().__init__()
        self.net, self.fn = net, fn

    def forward(self):
        return self.fn(self.net)


def _with_tensors(model: nn.Module, tensors: dict[str, torch.Tensor], fn):
    """``fn(model)`` with ``tensors`` (names of ``model.state_dict()``) as the model's parameters and buffers; the
    model's own are untouched."""
    return functional_call(_Reparametrized(model, fn), {f"net.{n}": t for n, t in tensors.items()}, ())


@torch.no_grad()
def evaluate(
    model: nn.Module, params: dict[str, torch.Tensor], split: Split, per_client: bool, chunk: int = 8192
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(correct, loss_sum, n) per client of ``split``.

    ``per_client=False``: ``params`` is one model (no client axis) used for every client, so
    one pass over all rows suffices. ``per_client=True``: ``params[name]`` is (N, ...) and
    client i's rows go through model i.
    """
    n_clients = len(split.sizes)
    correct = torch.zeros(n_clients, dtype=torch.float64, device=split.x.device)
    loss = torch.zeros(n_clients, dtype=torch.float64, device=split.x.device)
    model = model.eval()
    dtype = next(iter(params.values())).dtype
    layers = linear_chain(model)
    if layers is not None:  # as one run of a batch (``fedlib.runs.batching`` evaluates R runs through the same code)
        one = {n: t.unsqueeze(0) for n, t in params.items()}
        c, lo = personal_chain(layers, one, split) if per_client else global_chain(layers, one, split, chunk)
        correct, loss = c[0], lo[0]
    elif not per_client:  # in chunks of at most CONV_ROWS rows (``chunk``'s default is the chains'): see CONV_ROWS
        rows = min(chunk, CONV_ROWS)
        c, lo = _with_tensors(
            model, params, lambda net: _global_sums(lambda x: net(x).T.unsqueeze(0), 1, split, rows, dtype)
        )
        correct, loss = c[0], lo[0]
    else:
        for i in range(n_clients):
            x, y = split.client(i)
            if len(y) == 0:
                continue
            # in chunks: a conv net's activations for a whole test set spill the caches (same logits, faster)
            out = _with_tensors(
                model,
                {n: t[i] for n, t in params.items()},
                lambda net: torch.cat([net(x[a : a + CONV_ROWS].to(dtype)) for a in range(0, len(y), CONV_ROWS)]),
            )
            correct[i] = (out.argmax(1) == y).sum()
            loss[i] = F.nll_loss(class_softmax(out, log=True), y, reduction="sum")
    model.train()
    return correct.cpu().numpy(), loss.cpu().numpy(), split.sizes.cpu().numpy().astype(np.float64)


def global_chain(
    layers: list[str], params: dict[str, torch.Tensor], split: Split, chunk: int = 8192
) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, loss_sum), each (R, N) float64: one Linear-chain model per run (``params[name]``: (R, ...); R = 1
    for one run) on every row of ``split``, in chunks of ``chunk`` rows: each run's forward over the chunk with every
    layer as W h^T (``chain_logits_by_class``, the personal evaluation's forward), then one softmax and loss for all
    runs (``_global_sums``). Against the rows-first layers with the last one by class: the same numbers bit for bit,
    a little faster for the DNNs and MLRs over MNIST's and Synthetic's test rows, a little slower for AdaFL's MLP."""
    first = next(iter(params.values()))
    runs, dtype = first.shape[0], first.dtype

    def logits(x):
        # run by run over the chunk's shared rows: a batched matmul over a run axis of expanded rows copies them R
        # times first (16 runs of MNIST: 411 MB a chunk) for the same time
        return _runs_stacked(
            [chain_logits_by_class(layers, {n: t[r] for n, t in params.items()}, x) for r in range(runs)]
        )

    return _global_sums(logits, runs, split, chunk, dtype)


def _runs_stacked(per_run: list[torch.Tensor]) -> torch.Tensor:
    """The runs' logits on a new first axis: a view for one run (``torch.stack`` copies even one tensor)."""
    return per_run[0].unsqueeze(0) if len(per_run) == 1 else torch.stack(per_run)


def _global_sums(logits, runs: int, split: Split, chunk: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, loss_sum), each (R, N) float64, of the R = ``runs`` models whose logits ``logits(x)`` gives by class,
    (R, classes, rows), for each chunk ``x`` of ``split``'s rows, summed per client. A row's logits and loss do not
    depend on R (the softmax over the classes vectorises along the rows, each run's the same way), and each client's
    sums add its rows in the same order whatever R is."""
    owner = torch.repeat_interleave(torch.arange(len(split.sizes), device=split.x.device), split.sizes)
    correct = torch.zeros(runs, len(split.sizes), dtype=torch.float64, device=split.x.device)
    loss = torch.zeros_like(correct)
    for a in range(0, len(split.y), chunk):
        x, y, o = split.x[a : a + chunk].to(dtype), split.y[a : a + chunk], owner[a : a + chunk]
        out = logits(x)
        correct.index_add_(1, o, (class_argmax(out, 1) == y).to(torch.float64))
        per = -torch.log_softmax(out, 1).gather(1, y.expand(runs, 1, -1)).squeeze(1)
        loss.index_add_(1, o, per.to(torch.float64))
    return correct, loss


def personal_chain(
    layers: list[str], params: dict[str, torch.Tensor], split: Split
) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, loss_sum), each (R, N) float64: every client's own Linear-chain model on its rows of ``split``, for
    R runs at once (``params[name]``: (R, N, ...); R = 1 for one run, more for runs batched as one model).

    Clients go in blocks of similar sizes (``Split.blocks``): one batched forward per block and run, the logits by
    class (``chain_logits_by_class``), instead of a few small operations per client (what bounded personalised
    Synthetic rounds). A client's logits depend only on its block (its padded width), never on R, so a batched run
    gets its solo run's numbers bit for bit; its loss is summed over its own rows by itself, in float64 (a sum over a
    block or over runs would add in another order)."""
    first = next(iter(params.values()))
    runs, dtype = first.shape[0], first.dtype
    correct = torch.zeros(runs, len(split.sizes), dtype=torch.float64, device=first.device)
    loss = torch.zeros_like(correct)
    if not split.blocks:  # no client has rows
        return correct, loss
    # the clients' models in block order, gathered once: each block's are then a slice (a gather per block and
    # tensor is a measurable share of a personalised evaluation); ``index_select``, as advanced indexing
    # (``t[:, order]``) takes over twice as long on the CPU
    ordered = {n: t.index_select(1, split.block_clients) for n, t in params.items()}
    start = 0
    for blk in split.blocks:
        g, width = blk.y.shape
        x = blk.features.to(dtype)
        # run by run through the block's shared rows: a run axis on the rows would copy them R times (12 runs of
        # Synthetic: 56 MB a block, 3x the matmuls' time); the logits, by class, are small beside them
        out = _runs_stacked(
            [chain_logits_by_class(layers, {n: t[r, start : start + g] for n, t in ordered.items()}, x, True)
             for r in range(runs)]
        )  # fmt: skip  # (R, G, classes, width)
        start += g
        correct[:, blk.clients] = ((class_argmax(out, 2) == blk.y) & blk.mask).sum(2).to(torch.float64)
        # each row's -log p(y), summed per (run, client) in float64 over the client's own rows (padding masked to
        # 0): one reduction for the block, where a loss call per client and run was what bounded batched
        # evaluation (12 runs x 100 clients: 2,400 calls a round)
        logp = torch.log_softmax(out, 2)  # over the classes, vectorised along the rows
        nll = -logp.gather(2, blk.y.expand(runs, g, width).unsqueeze(2)).squeeze(2)
        loss[:, blk.clients] = nll.masked_fill(~blk.mask, 0.0).to(torch.float64).sum(2)
    return correct, loss


def class_argmax(z: torch.Tensor, dim: int) -> torch.Tensor:
    """``z.argmax(dim)`` (the first maximum; a NaN counts as the maximum, the first NaN wins), as ``z.max(dim)``'s
    indices, which torch documents as the first maximal value's and computes with another kernel: over the inner
    dimension of logits by class, ``argmax`` is several times slower on the CPU than ``max`` (and than a comparison
    against the maximum) (``tests/test_metrics.py`` checks ties, NaNs and infinities against argmax)."""
    return z.max(dim).indices
