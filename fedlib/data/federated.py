"""All clients' data back to back, and mini-batch plans drawn for every client at once.

The stacked executor trains every client of a round as one model with a leading client
axis, so a local step needs an equal-size mini-batch for every client at the same time.
``FederatedData`` keeps each split as one tensor with per-client ``offsets``/``sizes``;
a ``BatchPlan`` holds, for every local step, the row indices (into that tensor) of every
client's mini-batch. Both executors consume the same plan, which is what makes the
stacked executor testable against the per-client loop.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Split:
    """One split (train or test) of all clients: rows of client i are ``x[offsets[i]:offsets[i]+sizes[i]]``."""

    x: torch.Tensor
    y: torch.Tensor
    offsets: torch.Tensor  # (N,) int64
    sizes: torch.Tensor  # (N,) int64

    def client(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        a, n = int(self.offsets[i]), int(self.sizes[i])
        return self.x[a : a + n], self.y[a : a + n]

    def to(self, device=None, dtype=None) -> "Split":
        x = self.x.to(device=device, dtype=dtype if self.x.is_floating_point() else None)
        return Split(x, self.y.to(device), self.offsets.to(device), self.sizes.to(device))

    def layout(self) -> "Split":
        """Sizes and offsets only, on the CPU: what the samplers need. Plans are drawn on the CPU,
        so a seed gives the same mini-batches whatever device holds the data."""
        empty = torch.zeros(0)
        return Split(empty, empty.long(), self.offsets.cpu(), self.sizes.cpu())

    @functools.cached_property
    def blocks(self) -> list["Block"]:
        """The clients with rows, in blocks of similar sizes, each padded to its largest client (built once): what
        evaluating every client's own model batches over (``metrics.evaluate``). Clients are taken largest first;
        a block grows while its padding stays within ``PAD_WASTE`` of its rows (Synthetic's sizes span 50 to 5,000+:
        one block for all would be mostly padding)."""
        sizes = self.sizes.cpu().tolist()
        order = sorted((i for i, n in enumerate(sizes) if n > 0), key=lambda i: -sizes[i])
        out, start = [], 0
        while start < len(order):
            end, rows = start + 1, sizes[order[start]]
            while end < len(order) and sizes[order[start]] * (end + 1 - start) <= PAD_WASTE * (
                rows + sizes[order[end]]
            ):
                rows += sizes[order[end]]
                end += 1
            members = order[start:end]
            width = sizes[members[0]]
            flat = self.x.reshape(len(self.x), -1)
            x = flat.new_zeros((len(members), flat.shape[1], width))
            y = self.y.new_zeros((len(members), width))
            for j, i in enumerate(members):
                a, n = int(self.offsets[i]), sizes[i]
                x[j, :, :n], y[j, :n] = flat[a : a + n].T, self.y[a : a + n]
            mask = (
                torch.arange(width, device=self.x.device)[None, :]
                < torch.tensor([sizes[i] for i in members], device=self.x.device)[:, None]
            )
            out.append(Block(torch.tensor(members, device=self.x.device), [sizes[i] for i in members], x, y, mask))
            start = end
        return out

    @functools.cached_property
    def block_clients(self) -> torch.Tensor:
        """The clients of ``blocks``, block after block (built once)."""
        return torch.cat([blk.clients for blk in self.blocks]) if self.blocks else self.sizes.new_zeros(0)


def gather_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t``'s rows at ``index`` (any shape), as ``index.shape + t.shape[1:]``: a mini-batch's inputs. Through a 2-D
    view of ``t``: torch's CPU ``index_select`` copies a row of a (60000, 28, 28) tensor element by element but a row
    of a 2-D one as a block, and mini-batch gathers run every local step (``python -m benchmarks --e2e`` measures
    them). The same values either way."""
    flat = t.reshape(t.shape[0], -1) if t.dim() > 2 else t
    return flat.index_select(0, index.reshape(-1)).view(*index.shape, *t.shape[1:])


PAD_WASTE = 1.25  # a block's padded rows at most 1.25 x its real rows


@dataclass(eq=False)
class Block:
    """Clients of a ``Split`` side by side, padded: ``features`` (G, F, width), ``y`` (G, width), ``mask`` (G, width)
    True on real rows; client ``clients[j]``'s ``sizes[j]`` rows are the first ``sizes[j]`` columns of
    ``features[j]`` (its rows' inputs flattened to F features, feature by feature), padding (zeros) after them.
    Feature-major and contiguous because the Linear chains' evaluation computes every layer as W h^T
    (``metrics.chain_logits_by_class``), which reads these directly, where a transposed view of row-major inputs
    would be slower (``python -m benchmarks --e2e`` measures it); the logits are the same bit for bit over 60
    features (see ``chain_logits_by_class`` for 784)."""

    clients: torch.Tensor
    sizes: list
    features: torch.Tensor
    y: torch.Tensor
    mask: torch.Tensor


def _stack(x: np.ndarray, y: np.ndarray, parts: list[np.ndarray]) -> Split:
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    idx = np.concatenate(parts) if len(parts) else np.zeros(0, dtype=np.int64)
    return Split(
        torch.from_numpy(np.ascontiguousarray(x[idx])),
        torch.from_numpy(np.asarray(y[idx], dtype=np.int64)),
        torch.from_numpy(offsets),
        torch.from_numpy(sizes),
    )


@dataclass
class FederatedData:
    """A federated data set: ``train`` and ``test`` splits of N clients plus an optional global test set.

    ``name`` says what it is (e.g. "synthetic(0.5,0.5)"); ``n_classes`` and ``input_shape``
    let the model registry build matching models. The evaluation protocols (``fedlib.data.holdout``) add ``val``,
    each client's validation rows taken from its training data, and ``new_clients``, the clients held out of
    training (their indices among the data set's clients in ``new_ids``).
    """

    name: str
    train: Split
    test: Split
    n_classes: int
    input_shape: tuple[int, ...]
    global_test: tuple[torch.Tensor, torch.Tensor] | None = None
    val: Split | None = None
    new_clients: FederatedData | None = None
    new_ids: tuple[int, ...] = ()

    @property
    def n_clients(self) -> int:
        return len(self.train.sizes)

    @functools.cached_property
    def global_split(self) -> Split | None:
        """The global test set as a one-client ``Split`` (made once, so that batched runs sharing this data merge
        its evaluations: ``fedlib.runs.batching``); None without one."""
        if self.global_test is None:
            return None
        gx, gy = self.global_test
        return Split(
            gx, gy, torch.zeros(1, dtype=torch.long, device=gx.device), torch.tensor([len(gy)], device=gx.device)
        )

    @classmethod
    def from_parts(
        cls,
        name: str,
        x: np.ndarray,
        y: np.ndarray,
        train_parts: list[np.ndarray],
        test_parts: list[np.ndarray],
        n_classes: int | None = None,
        global_test=None,
    ) -> "FederatedData":
        """Gather per-client index arrays into one pool ``(x, y)`` into contiguous per-client blocks."""
        if len(train_parts) != len(test_parts):
            raise ValueError(f"train_parts has {len(train_parts)} clients but test_parts has {len(test_parts)}")
        if any(len(p) == 0 for p in train_parts):
            raise ValueError("every client needs at least one training sample")
        n_classes = int(n_classes if n_classes is not None else int(np.max(y)) + 1)
        gt = None
        if global_test is not None:
            # copies: reader arrays are read-only
            gt = (
                torch.from_numpy(np.array(global_test[0])),
                torch.from_numpy(np.array(global_test[1], dtype=np.int64)),
            )
        return cls(name, _stack(x, y, train_parts), _stack(x, y, test_parts), n_classes, tuple(x.shape[1:]), gt)

    @classmethod
    def from_clients(
        cls,
        name: str,
        xs: list[np.ndarray],
        ys: list[np.ndarray],
        train_parts,
        test_parts,
        n_classes: int | None = None,
    ) -> "FederatedData":
        """Same as ``from_parts`` for data that comes per client (Synthetic): parts index each client's own arrays."""
        sizes = np.array([len(v) for v in ys])
        base = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        shift = lambda parts: [np.asarray(p, dtype=np.int64) + base[i] for i, p in enumerate(parts)]
        return cls.from_parts(
            name, np.concatenate(xs), np.concatenate(ys), shift(train_parts), shift(test_parts), n_classes
        )

    def to(self, device=None, dtype=None) -> "FederatedData":
        gt = None
        if self.global_test is not None:
            gx, gy = self.global_test
            gt = (gx.to(device=device, dtype=dtype if gx.is_floating_point() else None), gy.to(device))
        return FederatedData(
            self.name, self.train.to(device, dtype), self.test.to(device, dtype), self.n_classes, self.input_shape, gt,
            None if self.val is None else self.val.to(device, dtype),
            None if self.new_clients is None else self.new_clients.to(device, dtype), self.new_ids,
        )  # fmt: skip


@dataclass
class BatchPlan:
    """Mini-batch row indices for ``steps`` local steps of ``K`` clients.

    ``index``: (steps, K, B) rows of ``FederatedData.train``. ``weight``: None when every
    batch is full, else (steps, K, B) 1.0 for a real sample and 0.0 for padding (epoch-based
    training: the last batch of an epoch is smaller, and small clients finish their epochs
    before large ones). ``active`` (steps, K) says whether a client takes that step at all;
    a client with an all-padding batch must not move (no momentum, no weight decay).
    """

    index: torch.Tensor
    weight: torch.Tensor | None = None
    active: torch.Tensor | None = None

    @property
    def steps(self) -> int:
        return self.index.shape[0]

    def clients(self, sel) -> "BatchPlan":
        """The plan restricted to a subset (slice or index) of its K clients."""
        pick = lambda t: None if t is None else t[:, sel]
        return BatchPlan(self.index[:, sel], pick(self.weight), pick(self.active))

    def at_steps(self, idx) -> "BatchPlan":
        """The plan made of the steps ``idx`` (a slice, or indices that may repeat a step)."""
        pick = lambda t: None if t is None else t[idx]
        return BatchPlan(self.index[idx], pick(self.weight), pick(self.active))

    # -- what the stacked executor's paths ask of a plan at step s (a ``ShrinkingPlan`` answers differently) --
    def live_at(self, s: int) -> int:
        """How many clients step at step s, as the group's leading rows: all of them here."""
        return self.index.shape[1]

    def context(self, objective, s: int, clients, k: int, dtype) -> dict:
        """``objective.context`` of step s for the leading ``k`` of ``clients`` (the group's positions in the
        round's plan): here all of them, at plan step s."""
        return objective.context(s, clients, dtype)


@dataclass
class ShrinkingPlan(BatchPlan):
    """A group's plan with each client's active steps moved to the front and clients sorted by their number of
    steps, largest first (``StackedExecutor``; built from a plan with ``active``): at step s the first ``live[s]``
    clients step, the others have finished. ``src[s, i]``: the step of the original plan that step s of client i
    is (for per-step objective context such as FedMix's pairs). It has no ``active``: every client of a step
    steps, so the stacked paths take the update fused into the weight-gradient matmul (``_fused_weight_step``),
    which is cheaper than the lock-step plan's masked update (``python -m benchmarks --e2e`` measures both). The
    fused update rounds differently, so float32 results of epoch runs of unequal clients may differ from the
    lock-step plan's in the last bits."""

    live: tuple = ()
    src: torch.Tensor | None = None

    def live_at(self, s: int) -> int:
        return self.live[s]

    def context(self, objective, s: int, clients, k: int, dtype) -> dict:
        return objective.context(self.src[s, :k], clients[:k], dtype)


def _sort_rows(rows: torch.Tensor) -> torch.Tensor:
    """``rows.sort(dim=-1).values``: integers, so the same values whatever the algorithm; through numpy on the CPU
    (where plans are drawn), whose sort of a plan's many short batches is faster than torch's
    (``python -m benchmarks --e2e`` measures it)."""
    if rows.device.type != "cpu":
        return rows.sort(dim=-1).values
    return torch.from_numpy(np.sort(rows.numpy(), axis=-1))


def sample_steps(
    split: Split, clients: torch.Tensor, steps: int, batch_size: int, generator: torch.Generator
) -> BatchPlan:
    """Fixed-step local training: every step draws B rows per client uniformly *with* replacement.

    This is the FedMCSA/pFedMe setting (R local steps of |D| = 20 samples) and keeps every
    client's batch full, so no masking is needed.
    """
    sizes = split.sizes[clients].to(torch.float64)
    u = torch.rand((steps, len(clients), batch_size), generator=generator, dtype=torch.float64)
    rows = (u * sizes[None, :, None]).long().clamp_max_((sizes - 1).long()[None, :, None])
    # A mini-batch is a set: its order does not change the gradient, and ascending rows make the
    # gather faster on the CPU (hardware prefetch, fewer TLB misses).
    return BatchPlan(_sort_rows(rows) + split.offsets[clients][None, :, None])


def sample_epochs(
    split: Split, clients: torch.Tensor, epochs: int, batch_size: int, generator: torch.Generator
) -> BatchPlan:
    """Epoch-based local training: each epoch visits every row of a client once, in a fresh random order.

    Client i takes ceil(n_i / B) steps per epoch (the last batch holds n_i mod B rows); the
    plan runs ceil(max n / B) steps per epoch, padding shorter clients with inactive steps, so
    all clients still step in lock-step. Epochs are concatenated: a client finishes epoch e
    before it starts e + 1, exactly as a per-client DataLoader with shuffle=True would.
    """
    sizes = split.sizes[clients]
    n_max = int(sizes.max())
    spe = math.ceil(n_max / batch_size)  # steps per epoch in the plan
    width = spe * batch_size
    pos = torch.arange(width)
    idx, wts, act = [], [], []
    for _ in range(epochs):
        keys = torch.rand((len(clients), width), generator=generator, dtype=torch.float64)
        keys[pos[None, :] >= sizes[:, None]] = 2.0  # padding sorts last; argsort of uniform keys = random permutation
        perm = torch.argsort(keys, dim=1)
        # real rows of client i: positions 0..n_i-1, packed so its own steps come first
        valid = pos[None, :] < sizes[:, None]
        rows = torch.where(valid, perm, torch.zeros_like(perm)).view(len(clients), spe, batch_size)
        w = valid.view(len(clients), spe, batch_size)
        # ascending rows within a batch (faster gather, see sample_steps); padding keeps the last slots
        rows = _sort_rows(torch.where(w, rows, torch.full_like(rows, width)))
        rows = torch.where(w, rows, torch.zeros_like(rows)) + split.offsets[clients][:, None, None]
        idx.append(rows.transpose(0, 1))
        wts.append(w.transpose(0, 1))
        act.append(w.any(dim=2).transpose(0, 1))
    index, weight = torch.cat(idx), torch.cat(wts)
    if bool(weight.all()):  # equal sizes, multiples of B (e.g. McMahan shards): full batches, no masking needed
        return BatchPlan(index)
    return BatchPlan(index, weight.to(torch.float32), torch.cat(act))
