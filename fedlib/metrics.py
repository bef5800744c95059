"""Evaluation and the papers' summary metrics.

Per round we evaluate every client's model on its own test split and keep per-client
accuracy and loss. Two means of client accuracies, because the papers differ:
- ``weighted``: sum(correct) / sum(samples) over clients, as the pFedMe-lineage code that
  FedMCSA forks computes its "mean test accuracy";
- ``unweighted``: the plain average of per-client accuracies, as FedMCSA's text defines it.
Summary metrics: best mean accuracy over rounds (FedMCSA's BMTA, AdaFL's "best"), the
average of the last l rounds (AdaFL, l = 10), rounds to reach a target (AdaFL: the first
round at which the mean of the last 5 rounds exceeds the target), communication cost
(AdaFL: model uploads, sum over rounds of gamma^(t) M).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from .data.federated import Split
from .executors.chain import chain_forward, class_softmax
from .models import linear_chain

# rows per forward pass when a client's model is not a Linear chain: on the 2-core CPU, LeNet-BN + SE over the digits'
# test sets (10,000 / 2,007 / 9,001 rows) took 6.6 s in chunks of 1,024 against 12.8 s whole (loaded machine), with
# bit-identical logits (``python -m fedlib.bench --e2e``, W5, evaluation)
CONV_ROWS = 1024


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
    if not per_client:
        owner = torch.repeat_interleave(torch.arange(n_clients, device=split.x.device), split.sizes)
        for a in range(0, len(split.y), chunk):
            x, y = split.x[a : a + chunk].to(dtype), split.y[a : a + chunk]
            out = functional_call(model, params, (x,))
            correct.index_add_(0, owner[a : a + chunk], (out.argmax(1) == y).to(torch.float64))
            per = F.nll_loss(class_softmax(out, log=True), y, reduction="none")
            loss.index_add_(0, owner[a : a + chunk], per.to(torch.float64))
    else:
        layers = linear_chain(model)
        for i in range(n_clients):
            x, y = split.client(i)
            if len(y) == 0:
                continue
            if layers is not None:  # plain addmm: functional_call's per-call overhead dominated personalised runs
                out = chain_forward(layers, {n: t[i] for n, t in params.items()}, x.to(dtype))[-1]
            else:  # in chunks: a conv net's activations for a whole test set spill the caches (same logits, faster)
                p = {n: t[i] for n, t in params.items()}
                out = torch.cat(
                    [functional_call(model, p, (x[a : a + CONV_ROWS].to(dtype),)) for a in range(0, len(y), CONV_ROWS)]
                )
            correct[i] = (out.argmax(1) == y).sum()
            loss[i] = F.nll_loss(class_softmax(out, log=True), y, reduction="sum")
    model.train()
    return correct.cpu().numpy(), loss.cpu().numpy(), split.sizes.cpu().numpy().astype(np.float64)


def weighted_mean(values: np.ndarray, n: np.ndarray) -> float:
    """sum(values * n) / sum(n): for accuracies, sum(correct) / sum(samples) (pFedMe code)."""
    n = np.asarray(n, dtype=float)
    return float(np.nansum(np.asarray(values) * n) / n[n > 0].sum()) if (n > 0).any() else math.nan


def unweighted_mean(values: np.ndarray, n: np.ndarray | None = None) -> float:
    """The plain average of per-client values over clients that have data (FedMCSA's text)."""
    values = np.asarray(values, dtype=float)
    keep = np.ones(len(values), bool) if n is None else np.asarray(n) > 0
    return float(values[keep].mean()) if keep.any() else math.nan


def best(series) -> float:
    """Highest value over rounds: FedMCSA's BMTA when ``series`` is mean test accuracy."""
    s = np.asarray(series, dtype=float)
    return float(np.nanmax(s)) if s.size and not np.isnan(s).all() else math.nan


def last_mean(series, last: int = 10) -> float:
    """Average of the last ``last`` values (AdaFL Tables 1-4, l = 10)."""
    s = np.asarray(series, dtype=float)
    return float(s[-last:].mean()) if s.size else math.nan


def rounds_to_target(series, target: float, window: int = 5) -> int | None:
    """First round (1-based) at which the mean of the last ``window`` rounds exceeds ``target``; None if never.

    AdaFL's stopping rule. Before ``window`` rounds exist there is no full window, so the
    earliest possible answer is round ``window``.
    """
    s = np.asarray(series, dtype=float)
    if s.size < window:
        return None
    means = np.convolve(s, np.ones(window) / window, mode="valid")  # means[j] covers rounds j..j+window-1
    hit = np.nonzero(means > target)[0]
    return int(hit[0] + window) if hit.size else None


def communication_cost(uploads_per_round, upto: int | None = None) -> int:
    """Model uploads summed over rounds 1..``upto`` (all when None): AdaFL's sum_t gamma^(t) M."""
    u = np.asarray(uploads_per_round)
    return int(u[:upto].sum() if upto is not None else u.sum())
