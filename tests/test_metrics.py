import math

import numpy as np
import pytest
import torch
from helpers import small_synthetic

from fedlib.core import metrics as M
from fedlib.executors import evaluation as E
from fedlib.models.registry import build_model, linear_chain


def test_means_golden():
    acc = np.array([1.0, 0.5, 0.0])
    n = np.array([2, 2, 4])
    assert M.weighted_mean(acc, n) == 3 / 8  # (2 + 1 + 0) correct of 8
    assert M.unweighted_mean(acc, n) == 0.5  # (1 + 0.5 + 0) / 3
    assert M.unweighted_mean(np.array([1.0, np.nan]), np.array([3, 0])) == 1.0  # client without data ignored


def test_best_last_rounds_cost():
    s = [0.1, 0.5, 0.3, 0.9, 0.92, 0.91, 0.95, 0.96]
    assert M.best(s) == 0.96
    assert math.isclose(M.last_mean(s, 2), 0.955)
    # windows of 5: means are .544, .706, .796, .928 -> first above 0.9 ends at round 8
    assert M.rounds_to_target(s, 0.9) == 8
    assert M.rounds_to_target(s, 0.7) == 6
    assert M.rounds_to_target(s, 0.99) is None
    assert M.rounds_to_target(s[:4], 0.0) is None  # no full window yet
    assert M.communication_cost([10, 10, 20, 20]) == 60
    assert M.communication_cost([10, 10, 20, 20], upto=3) == 40


def test_evaluate_global_equals_per_client():
    data = small_synthetic(n_clients=4, rows=60)
    model = build_model("dnn", (60,), 10, (8,), seed=0, dtype=torch.float64)
    g = model.state_dict()
    c1, l1, n1 = E.evaluate(model, g, data.test, per_client=False, chunk=7)  # chunks cross client borders
    stacked = {k: v.unsqueeze(0).repeat(4, *[1] * v.dim()) for k, v in g.items()}
    c2, l2, n2 = E.evaluate(model, stacked, data.test, per_client=True)
    assert np.array_equal(c1, c2) and np.allclose(l1, l2) and np.array_equal(n1, n2)
    assert np.array_equal(n1, [15, 15, 15, 15])
    x, y = data.test.client(2)
    assert c1[2] == (model(x).argmax(1) == y).sum().item()


def _uneven(dtype=torch.float64, rows=(300, 7, 120, 0, 64, 1, 250)):
    """Clients of very different test sizes (and one without test rows): several blocks, padding in each."""
    from fedlib.data.federated import FederatedData

    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(n + 10, 60, generator=g).numpy() for n in rows]
    ys = [torch.randint(0, 10, (n + 10,), generator=g).numpy() for n in rows]
    tr = [np.arange(10) for _ in rows]
    te = [np.arange(10, n + 10) for n in rows]
    return FederatedData.from_clients("uneven", xs, ys, tr, te, 10).to("cpu", dtype)


def test_personal_evaluation_in_blocks_equals_each_client_alone():
    """``Split.blocks`` + ``personal_chain``: every client's own model on its own rows, padding ignored (float64: the
    per-client reference computed directly)."""
    data = _uneven()
    assert len(data.test.blocks) > 1 and sum(len(b.sizes) for b in data.test.blocks) == 6  # the empty one left out
    n = data.n_clients
    model = build_model("dnn", (60,), 10, (20,), seed=0, dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    params = {k: torch.randn(n, *v.shape, generator=g, dtype=torch.float64) for k, v in model.state_dict().items()}
    correct, loss, cnt = E.evaluate(model, params, data.test, per_client=True)
    for i in range(n):
        x, y = data.test.client(i)
        out = torch.func.functional_call(model, {k: v[i] for k, v in params.items()}, (x,))
        assert correct[i] == (out.argmax(1) == y).sum().item()
        assert math.isclose(loss[i], torch.nn.functional.cross_entropy(out, y, reduction="sum").item(), rel_tol=1e-12,
                            abs_tol=1e-12)  # fmt: skip
        assert cnt[i] == len(y)


def test_blocks_hold_each_clients_rows_feature_by_feature():
    """``Split.blocks``: client ``clients[j]``'s rows, flattened, are the first ``sizes[j]`` columns of
    ``features[j]`` (contiguous, feature-major: what ``chain_logits_by_class(..., by_feature=True)`` takes), zeros
    after them, and ``mask`` marks exactly those columns; ``block_clients`` lists every client with rows once, in
    block order. Image inputs (N, 1, 4, 4) are flattened to 16 features."""
    from fedlib.data.federated import FederatedData

    g = torch.Generator().manual_seed(2)
    rows = (9, 0, 3, 8, 1)
    xs = [torch.randn(n + 2, 1, 4, 4, generator=g).numpy() for n in rows]
    ys = [torch.randint(0, 10, (n + 2,), generator=g).numpy() for n in rows]
    data = FederatedData.from_clients("img", xs, ys, [np.arange(2)] * 5, [np.arange(2, n + 2) for n in rows], 10)
    split = data.test
    assert split.block_clients.tolist() == [i for blk in split.blocks for i in blk.clients.tolist()]
    assert sorted(split.block_clients.tolist()) == [0, 2, 3, 4]
    for blk in split.blocks:
        assert blk.features.is_contiguous() and blk.features.shape[:2] == (len(blk.sizes), 16)
        for j, (i, n) in enumerate(zip(blk.clients.tolist(), blk.sizes)):
            x, y = split.client(i)
            assert n == len(y)
            assert torch.equal(blk.features[j, :, :n], x.reshape(n, 16).T)
            assert not blk.features[j, :, n:].any() and torch.equal(blk.y[j, :n], y)
            assert blk.mask[j, :n].all() and not blk.mask[j, n:].any()


def test_personal_evaluation_without_test_rows_is_zero():
    """No client has test rows (no block): zero correct, zero loss, zero rows, for one run and for batched runs."""
    data = _uneven(rows=(0, 0, 0))
    model = build_model("dnn", (60,), 10, (20,), seed=0, dtype=torch.float64)
    params = {k: v.unsqueeze(0).repeat(3, *[1] * v.dim()) for k, v in model.state_dict().items()}
    assert data.test.blocks == []
    for out in E.evaluate(model, params, data.test, per_client=True):
        assert np.array_equal(out, np.zeros(3))
    c, lo = E.personal_chain(linear_chain(model), {k: v.unsqueeze(0).repeat(2, 1, *[1] * (v.dim() - 1))
                                                    for k, v in params.items()}, data.test)  # fmt: skip
    assert c.shape == lo.shape == (2, 3) and not c.any() and not lo.any()


def test_global_evaluation_in_chunks_equals_each_client_alone():
    """``global_chain``: one model on every client's rows, in chunks that cut through clients (float64 reference)."""
    data = _uneven()
    model = build_model("dnn", (60,), 10, (20,), seed=0, dtype=torch.float64)
    params = dict(model.state_dict())
    correct, loss, cnt = E.evaluate(model, params, data.test, per_client=False, chunk=50)
    for i in range(data.n_clients):
        x, y = data.test.client(i)
        out = model(x)
        assert correct[i] == (out.argmax(1) == y).sum().item() and cnt[i] == len(y)
        assert math.isclose(loss[i], torch.nn.functional.cross_entropy(out, y, reduction="sum").item(), rel_tol=1e-12,
                            abs_tol=1e-12)  # fmt: skip


def test_conv_global_evaluation_in_chunks_equals_each_client_alone():
    """A conv net's one model on every client's rows (``_global_sums``, as ``global_chain``), in chunks that cut
    through clients, one without rows (float64 reference)."""
    from fedlib.data.federated import FederatedData

    g = torch.Generator().manual_seed(0)
    rows = (70, 0, 30, 45)
    xs = [torch.randn(n + 4, 3, 28, 28, generator=g).numpy() for n in rows]
    ys = [torch.randint(0, 10, (n + 4,), generator=g).numpy() for n in rows]
    tests = [np.arange(4, n + 4) for n in rows]
    data = FederatedData.from_clients("conv", xs, ys, [np.arange(4)] * 4, tests, 10).to("cpu", torch.float64)
    model = build_model("lenet", (3, 28, 28), 10, seed=0, dtype=torch.float64, attention="se")
    correct, loss, cnt = E.evaluate(model, dict(model.state_dict()), data.test, per_client=False, chunk=40)
    assert list(cnt) == list(rows)
    model.eval()  # BatchNorm's running statistics, as evaluate uses them
    for i in range(4):
        x, y = data.test.client(i)
        out = model(x) if len(y) else torch.zeros(0, 10, dtype=torch.float64)
        assert correct[i] == (out.argmax(1) == y).sum().item()
        assert math.isclose(loss[i], torch.nn.functional.cross_entropy(out, y, reduction="sum").item(), rel_tol=1e-12,
                            abs_tol=1e-12)  # fmt: skip


def test_conv_evaluation_in_chunks_equals_one_pass(monkeypatch):
    """A conv net's clients are evaluated in chunks of ``CONV_ROWS`` rows: the same logits as one pass (float32, bit
    for bit), so the same accuracies and losses."""
    from fedlib.data.federated import FederatedData

    g = torch.Generator().manual_seed(0)
    rows = (700, 30, 300)
    xs = [torch.randn(n + 8, 3, 28, 28, generator=g).numpy() for n in rows]
    ys = [torch.randint(0, 10, (n + 8,), generator=g).numpy() for n in rows]
    data = FederatedData.from_clients("conv", xs, ys, [np.arange(8)] * 3, [np.arange(8, n + 8) for n in rows], 10)
    model = build_model("lenet", (3, 28, 28), 10, seed=0, attention="se")
    params = {k: v.unsqueeze(0).repeat(3, *[1] * v.dim()) for k, v in model.state_dict().items()}
    chunked = E.evaluate(model, params, data.test, per_client=True)
    monkeypatch.setattr(E, "CONV_ROWS", 10**9)
    whole = E.evaluate(model, params, data.test, per_client=True)
    assert E.CONV_ROWS == 10**9 and all(np.array_equal(a, b) for a, b in zip(chunked, whole))


def test_conv_evaluation_swaps_each_models_tensors_once(monkeypatch):
    """A conv net's client model (and a global one) is put in place once for all its chunks of rows, not once per
    chunk (a swap of LeNet-BN + SE's 34 tensors cost ~0.25 ms a chunk), the model's own tensors are untouched, and a
    global model goes in chunks of at most ``CONV_ROWS`` rows whatever ``chunk`` says (8,192-row chunks took 2.6-2.7x
    the time on the digits' test sets)."""
    from fedlib.data.federated import FederatedData

    g = torch.Generator().manual_seed(0)
    rows = (600, 30, 0, 300)
    xs = [torch.randn(n + 8, 3, 28, 28, generator=g).numpy() for n in rows]
    ys = [torch.randint(0, 10, (n + 8,), generator=g).numpy() for n in rows]
    data = FederatedData.from_clients("conv", xs, ys, [np.arange(8)] * 4, [np.arange(8, n + 8) for n in rows], 10)
    model = build_model("lenet", (3, 28, 28), 10, seed=0, attention="se")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = {k: v.unsqueeze(0).repeat(4, *[1] * v.dim()) for k, v in before.items()}
    swaps, batches = [], []
    real_call, real_forward = E.functional_call, model.forward
    monkeypatch.setattr(E, "functional_call", lambda *a, **k: swaps.append(1) or real_call(*a, **k))
    monkeypatch.setattr(model, "forward", lambda x: batches.append(len(x)) or real_forward(x))
    E.evaluate(model, params, data.test, per_client=True)
    assert len(swaps) == 3 and max(batches) == E.CONV_ROWS  # three clients with rows; 600 rows as 256 + 256 + 88
    swaps.clear()
    batches.clear()
    E.evaluate(model, before, data.test, per_client=False)
    assert len(swaps) == 1 and max(batches) == E.CONV_ROWS and sum(batches) == sum(rows)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_class_argmax_is_torch_argmax_ties_and_nans_included(dtype):
    """The first maximum wins a tie, a NaN counts as the maximum and the first NaN wins (torch's argmax), over an
    inner dimension (the classes of logits by class: (runs, clients, classes, rows))."""
    g = torch.Generator().manual_seed(0)
    z = torch.randint(0, 3, (2, 3, 10, 37), generator=g).to(dtype)  # small integers: many ties
    z[0, 0, 4, :5] = math.nan
    z[1, 2, 7, 3] = z[1, 2, 2, 3] = math.nan
    z[0, 1, :, 6] = math.inf
    z[1, 0, :, 8] = -math.inf  # a row of -inf only: the first class
    z[1, 1, 3:, 9] = -math.inf
    assert torch.equal(E.class_argmax(z, 2), z.argmax(2))
    assert torch.equal(E.class_argmax(z, -2), z.argmax(2))
    assert torch.equal(E.class_argmax(z[0, 0], 0), z[0, 0].argmax(0))


def test_logits_by_class_are_the_chains_logits():
    """``chain_logits_by_class`` (W h^T, features by rows) computes ``chain_forward``'s logits, transposed (float64)."""
    from fedlib.executors.chain import chain_forward, chain_logits_by_class

    model = build_model("dnn", (60,), 10, (20, 7), seed=0, dtype=torch.float64)
    layers = linear_chain(model)
    g = torch.Generator().manual_seed(1)
    params = {k: torch.randn(4, *v.shape, generator=g, dtype=torch.float64) for k, v in model.state_dict().items()}
    x = torch.randn(4, 33, 60, generator=g, dtype=torch.float64)
    by_class = chain_logits_by_class(layers, params, x)
    assert by_class.shape == (4, 10, 33)
    assert torch.allclose(by_class.transpose(1, 2), chain_forward(layers, params, x)[-1], rtol=1e-13, atol=1e-13)
