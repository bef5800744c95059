"""Synthetic generator, federated layout and the mini-batch samplers."""

import numpy as np
import pytest
import torch
from helpers import shared_data_root
from hypothesis import given, settings
from hypothesis import strategies as st

import fedlib
from fedlib.config.run import RunConfig
from fedlib.data import load_federated, partition_summary
from fedlib.data.federated import FederatedData, Split, gather_rows, sample_epochs, sample_steps
from fedlib.data.synthetic import synthetic


def test_synthetic_reproduces_pfedme_sizes():
    """seed 0 draws pFedMe's stream: client sizes 250..25810, 205,795 samples (FedMCSA Sec. 5.1)."""
    rs = np.random.RandomState(0)
    sizes = (rs.lognormal(4, 2, 100).astype(int) + 50) * 5
    assert sizes.min() == 250 and sizes.max() == 25810 and sizes.sum() == 205_795


def test_synthetic_small_is_deterministic_and_shaped():
    xs, ys = synthetic(0.5, 0.5, n_clients=3, seed=0)
    xs2, ys2 = synthetic(0.5, 0.5, n_clients=3, seed=0)
    assert [len(y) for y in ys] == [len(y) for y in ys2]
    assert all(np.array_equal(a, b) for a, b in zip(xs, xs2))
    assert all(x.shape == (len(y), 60) and x.dtype == np.float32 for x, y in zip(xs, ys))
    assert all(y.min() >= 0 and y.max() <= 9 for y in ys)
    xs3, _ = synthetic(0.5, 0.5, n_clients=3, seed=1)
    assert not np.array_equal(xs[0][:5], xs3[0][:5])
    with pytest.raises(ValueError, match="alpha=-1"):
        synthetic(-1, 0.5)


def test_synthetic_iid_shares_one_model():
    """Synthetic-IID: every client labels with the same W, b, so pooled data is separable by one MLR."""
    xs, ys = synthetic(0, 0, n_clients=4, seed=0, iid=True)
    assert len(set(len(y) for y in ys)) >= 1 and all(len(x) == len(y) for x, y in zip(xs, ys))


def _layout(sizes):
    sizes = torch.tensor(sizes)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)[:-1]])
    n = int(sizes.sum())
    return Split(torch.zeros(n, 1), torch.zeros(n, dtype=torch.long), offsets, sizes)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=6), st.integers(1, 9), st.integers(1, 5), st.integers(0, 99))
def test_sample_steps_rows_stay_in_own_client(sizes, batch, steps, seed):
    split = _layout(sizes)
    plan = sample_steps(split, torch.arange(len(sizes)), steps, batch, torch.Generator().manual_seed(seed))
    assert plan.index.shape == (steps, len(sizes), batch) and plan.weight is None
    lo = split.offsets[None, :, None]
    assert ((plan.index >= lo) & (plan.index < lo + split.sizes[None, :, None])).all()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=6), st.integers(1, 9), st.integers(1, 3), st.integers(0, 99))
def test_sample_epochs_visits_every_row_once_per_epoch(sizes, batch, epochs, seed):
    split = _layout(sizes)
    clients = torch.arange(len(sizes))
    plan = sample_epochs(split, clients, epochs, batch, torch.Generator().manual_seed(seed))
    steps_per_epoch = -(-max(sizes) // batch)
    assert plan.steps == epochs * steps_per_epoch
    if plan.weight is None:  # only when every batch is full
        assert all(n == steps_per_epoch * batch for n in sizes)
        plan.weight = torch.ones(plan.index.shape)
        plan.active = torch.ones(plan.index.shape[:2], dtype=torch.bool)
    for i, n in enumerate(sizes):
        for e in range(epochs):
            blk = slice(e * steps_per_epoch, (e + 1) * steps_per_epoch)
            w = plan.weight[blk, i] > 0
            rows = plan.index[blk, i][w]
            assert sorted(rows.tolist()) == list(range(int(split.offsets[i]), int(split.offsets[i]) + n))
            # a client's real steps come first, then only inactive padding steps
            act = plan.active[blk, i]
            assert act.sum() == -(-n // batch) and act[: -(-n // batch)].all()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=6), st.integers(1, 9), st.integers(1, 3), st.integers(0, 99))
def test_plans_sorted_through_numpy_are_torchs(sizes, batch, steps, seed):
    """``_sort_rows`` (numpy's sort on the CPU) draws the very plans torch's sort drew: a seed's mini-batches, and so
    the stored runs, do not depend on it."""
    from fedlib.data import federated

    split, clients = _layout(sizes), torch.arange(len(sizes))
    plans = []
    for sort in (federated._sort_rows, lambda rows: rows.sort(dim=-1).values):
        federated._sort_rows, saved = sort, federated._sort_rows
        try:
            plans.append([sample_steps(split, clients, steps, batch, torch.Generator().manual_seed(seed)),
                          sample_epochs(split, clients, steps, batch, torch.Generator().manual_seed(seed))])  # fmt: skip
        finally:
            federated._sort_rows = saved
    for a, b in zip(*plans):
        assert torch.equal(a.index, b.index) and a.index.dtype == b.index.dtype == torch.int64


def test_sample_steps_subset_of_clients():
    split = _layout([5, 100, 7])
    plan = sample_steps(split, torch.tensor([2, 0]), 3, 4, torch.Generator().manual_seed(0))
    assert ((plan.index[:, 0] >= 105) & (plan.index[:, 0] < 112)).all()
    assert (plan.index[:, 1] < 5).all()


def test_from_parts_layout():
    x = np.arange(10, dtype=np.float32)[:, None]
    y = np.arange(10) % 3
    fd = FederatedData.from_parts("t", x, y, [np.array([4, 2]), np.array([9])], [np.array([0]), np.array([5, 6])], 3)
    assert fd.train.x[:, 0].tolist() == [4, 2, 9] and fd.train.offsets.tolist() == [0, 2]
    cx, cy = fd.test.client(1)
    assert cx[:, 0].tolist() == [5, 6] and cy.tolist() == [2, 0]
    with pytest.raises(ValueError, match="at least one training sample"):
        FederatedData.from_parts("t", x, y, [np.array([], dtype=int)], [np.array([0])], 3)


def test_load_federated_synthetic_split_75_25():
    cfg = RunConfig(n_clients=5)
    fd = load_federated(cfg)
    total = fd.train.sizes + fd.test.sizes
    assert torch.equal(fd.train.sizes, (total.double() * 0.75).long())
    summ = partition_summary(cfg)
    assert list(summ.n_train) == fd.train.sizes.tolist() and list(summ.n_test) == fd.test.sizes.tolist()


requires_mnist = pytest.mark.skipif(
    shared_data_root() is None,
    reason="MNIST files not found under FEDLIB_DATA or ../shared/data",
)


@requires_mnist
def test_mnist_labels_partition_pfedme_recipe():
    """FedMCSA's MNIST: all 70,000 images, N = 20, 2 labels per client, 75/25 per client, standardised pixels."""
    cfg = RunConfig(dataset="mnist", partition="labels", n_clients=20, data_seed=1)
    fd = load_federated(cfg, root=shared_data_root())
    summ = partition_summary(cfg, root=shared_data_root())
    assert int(fd.train.sizes.sum() + fd.test.sizes.sum()) == 70_000
    assert fd.input_shape == (1, 28, 28) and fd.n_classes == 10 and fd.global_test is None  # one grey channel
    assert (summ.n_labels == 2).all()
    assert summ.labels.tolist()[:3] == ["0,1", "1,2", "2,3"]  # client u holds (u + j) mod 10
    assert abs(float(fd.train.x.mean())) < 0.05  # standardised over the pool


@requires_mnist
@pytest.mark.parametrize("model", ["lenet", "cnn", "mobilenetv2"])
def test_conv_nets_train_on_grey_images(model):
    """MNIST loaded as (n, 28, 28): LeNet passed the config's model check, which takes the data set's images as
    (1, 28, 28), then failed building the model ("not enough values to unpack"). Grey images get their channel."""
    cfg = RunConfig(dataset="mnist", partition="shards", model=model, n_clients=10, clients_per_round=2, rounds=1,
                    local_steps=1)  # fmt: skip
    res = fedlib.train(cfg.validate(), progress=False, data_root=shared_data_root())
    assert np.isfinite(res.metrics.test_acc.iloc[-1])


@requires_mnist
def test_label_stride_is_fedmcsas_partition():
    """``label_stride=2``: client u holds (2u + j) mod 10, as FedMCSA's copy of the pFedMe script cuts MNIST, so clients
    u, u + 5, u + 10, u + 15 share one label pair; every image is still used. The default (1) is pFedMe's partition,
    and its key is the key from before the option."""
    cfg = RunConfig(dataset="mnist", partition="labels", n_clients=20, data_seed=1)
    theirs = cfg.replace(label_stride=2)
    assert cfg.replace(label_stride=1).key() == cfg.key() != theirs.key()
    summ = partition_summary(theirs, root=shared_data_root())
    assert summ.labels.tolist() == ["0,1", "2,3", "4,5", "6,7", "8,9"] * 4
    assert int(summ.n_total.sum()) == 70_000
    assert summ.n_total.tolist() != partition_summary(cfg, root=shared_data_root()).n_total.tolist()
    with pytest.raises(ValueError, match="label_stride=2 is set but applies only when partition='labels'"):
        RunConfig(dataset="mnist", partition="shards", label_stride=2).validate()


@requires_mnist
def test_mnist_shards_partition_mcmahan():
    """AdaFL's MNIST: 60,000 training images in 200 shards of 300, 2 per client; official test set kept global."""
    cfg = RunConfig(dataset="mnist", partition="shards", n_clients=100, train_frac=1.0, normalize="unit")
    fd = load_federated(cfg, root=shared_data_root())
    assert fd.train.sizes.tolist() == [600] * 100 and int(fd.test.sizes.sum()) == 0
    gx, gy = fd.global_test
    assert gx.shape == (10_000, 1, 28, 28) and float(gx.max()) == 1.0
    summ = partition_summary(cfg, root=shared_data_root())
    assert (summ.n_labels <= 2).mean() > 0.9  # a shard rarely straddles two labels


def test_sample_epochs_full_batches_need_no_mask():
    plan = sample_epochs(_layout([30, 30]), torch.arange(2), 2, 10, torch.Generator().manual_seed(0))
    assert plan.weight is None and plan.active is None and plan.steps == 6
    assert sorted(plan.index[:3, 1].flatten().tolist()) == list(range(30, 60))


@pytest.mark.parametrize("shape", [(40,), (40, 7), (40, 3, 4, 5)])
def test_gather_rows_is_index_select_in_the_index_shape(shape):
    """A mini-batch's rows (``gather_rows``, through a 2-D view) are ``index_select``'s, shaped index.shape + the
    rows' shape, for labels (1-D), features (2-D) and images (4-D); repeats and any order of rows included."""
    t = torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape)
    index = torch.tensor([[3, 3, 0], [39, 1, 17]])
    got = gather_rows(t, index)
    assert got.shape == (2, 3, *shape[1:])
    assert torch.equal(got.reshape(6, *shape[1:]), t.index_select(0, index.reshape(-1)))
    assert torch.equal(got[1, 0], t[39])
