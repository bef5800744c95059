"""Tests for fedlib.data.partition (property tests + hand-checked goldens)."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fedlib.data import partition as P

FAST = settings(max_examples=30, deadline=None)
seeds = st.integers(0, 2**32 - 1)


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def assert_valid(parts, n):
    """int64 1-D arrays, indices in [0, n), pairwise disjoint."""
    for p in parts:
        assert isinstance(p, np.ndarray) and p.dtype == np.int64 and p.ndim == 1
        if p.size:
            assert p.min() >= 0 and p.max() < n
    allidx = np.concatenate(parts) if parts else np.empty(0, np.int64)
    assert len(np.unique(allidx)) == len(allidx), "parts overlap"


def union(parts):
    return np.sort(np.concatenate(parts))


def same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


@st.composite
def label_arrays(draw, min_classes=1, max_classes=6, min_count=1, max_count=30):
    """Labels over arbitrary (not 0..C-1) distinct int values, shuffled."""
    n_cls = draw(st.integers(min_classes, max_classes))
    values = draw(st.lists(st.integers(-5, 60), min_size=n_cls, max_size=n_cls, unique=True))
    counts = draw(st.lists(st.integers(min_count, max_count), min_size=n_cls, max_size=n_cls))
    y = np.repeat(np.array(values, dtype=np.int64), counts)
    return np.random.default_rng(draw(seeds)).permutation(y)


def held_values(labels, n_clients, k, stride):
    classes = np.unique(labels)
    C = len(classes)
    return [{int(classes[(stride * u + j) % C]) for j in range(k)} for u in range(n_clients)]


# --------------------------------------------------------------------------
# labels_per_client
# --------------------------------------------------------------------------
@FAST
@given(labels=label_arrays(), n_clients=st.integers(1, 12), k=st.integers(1, 6), stride=st.integers(1, 3), seed=seeds)
def test_labels_per_client_disjoint_and_covers_held_labels(labels, n_clients, k, stride, seed):
    C = len(np.unique(labels))
    assume(k <= C)
    parts = P.labels_per_client(labels, n_clients, k, seed, label_stride=stride)
    assert len(parts) == n_clients
    assert_valid(parts, len(labels))
    held = held_values(labels, n_clients, k, stride)
    # each client only sees its own labels
    for p, h in zip(parts, held):
        assert set(labels[p].tolist()) <= h
    # every sample of every held label is assigned (no pFedMe-script drop)
    all_held = set().union(*held)
    expected = np.flatnonzero(np.isin(labels, list(all_held)))
    assert np.array_equal(union(parts), expected)
    # stride 1: clients 0..N-1 hold labels 0..N+k-2 (mod C), so all are held
    # exactly when N + k - 1 >= C (note: N*k >= C is not enough, e.g. N=k=2, C=4)
    if stride == 1 and n_clients + k - 1 >= C:
        assert np.array_equal(union(parts), np.arange(len(labels)))


@FAST
@given(
    labels=label_arrays(min_count=230, max_count=260),
    n_clients=st.integers(1, 6),
    k=st.integers(1, 6),
    stride=st.integers(1, 3),
    seed=seeds,
)
def test_labels_per_client_exact_label_sets(labels, n_clients, k, stride, seed):
    # With >= (h+1)*2**(h-1) samples per label (h <= 6 holders) every share is
    # >= 1 sample, so each client holds exactly its k labels.
    assume(k <= len(np.unique(labels)))
    parts = P.labels_per_client(labels, n_clients, k, seed, label_stride=stride)
    for p, h in zip(parts, held_values(labels, n_clients, k, stride)):
        assert set(labels[p].tolist()) == h


def test_labels_per_client_share_sizes_follow_recipe():
    # 1 label, 3 holders (k = C = 1): shares are [a, b, 300-a-b] with
    # a in [300//4, 300//2) and b in [(300-a)//4, (300-a)//2).
    labels = np.zeros(300, dtype=np.int64)
    for seed in range(20):
        sizes = [len(p) for p in P.labels_per_client(labels, 3, 1, seed)]
        a, b, c = sizes
        assert 75 <= a < 150 and (300 - a) // 4 <= b < (300 - a) // 2 and a + b + c == 300


def test_labels_per_client_client_id_order_and_contents():
    # C=4, N=4, k=2: client u holds {u, u+1 mod 4}; label 0 held by clients 0 and 3.
    labels = np.repeat(np.arange(4), 100)
    parts = P.labels_per_client(labels, 4, 2, seed=5)
    assert [sorted(set(labels[p].tolist())) for p in parts] == [[0, 1], [1, 2], [2, 3], [0, 3]]
    # first holder of each label draws from [100//3, 100//2) = [33, 50)
    for label, first in [(0, 0), (1, 0), (2, 1), (3, 2)]:
        assert 33 <= np.sum(labels[parts[first]] == label) < 50


MNIST_LIKE = np.repeat(np.arange(10), 7000)  # 70,000 samples, 7,000 per class


def test_labels_per_client_pfedme_mnist_sizes():
    parts = P.labels_per_client(MNIST_LIKE, n_clients=20, k=2, seed=1)
    sizes = np.array([len(p) for p in parts])
    assert sizes.sum() == 70_000
    # Each of a label's 4 holders gets between 7000/8 (last, after three
    # maximal draws) and ~7000*(4/5)**3 (last, after three minimal draws).
    assert sizes.min() >= 2 * 875 and sizes.max() <= 2 * 3600
    for u, p in enumerate(parts):
        assert set(labels_of(p)) == {u % 10, (u + 1) % 10}


def labels_of(p):
    return MNIST_LIKE[p].tolist()


def test_labels_per_client_fedmcsa_size_range():
    # FedMCSA reports MNIST client sizes [1165, 3834]; those are the TRAIN
    # sizes int(0.75 * n).  As totals they are unreachable with this recipe ...
    with pytest.raises(ValueError, match="size_range"):
        P.labels_per_client(MNIST_LIKE, 20, 2, seed=1, size_range=(1165, 3834))
    # ... but the matching totals [ceil(1165/.75), max n with int(.75n) <= 3834]
    lo, hi = math.ceil(1165 / 0.75), 5113
    assert int(0.75 * lo) == 1165 and int(0.75 * hi) == 3834 and int(0.75 * (hi + 1)) > 3834
    for stride in (1, 2):  # 1: pFedMe assignment, 2: FedMCSA's (2u + j) % 10
        parts = P.labels_per_client(MNIST_LIKE, 20, 2, seed=1, size_range=(lo, hi), label_stride=stride)
        sizes = np.array([len(p) for p in parts])
        assert sizes.min() >= lo and sizes.max() <= hi and sizes.sum() == 70_000
        train, _ = P.split_train_test(parts, 0.75, seed=1)
        tsz = np.array([len(t) for t in train])
        assert tsz.min() >= 1165 and tsz.max() <= 3834


def test_labels_per_client_size_range_is_honoured():
    labels = np.repeat(np.arange(5), 200)
    parts = P.labels_per_client(labels, 5, 2, seed=3, size_range=(180, 220))
    assert all(180 <= len(p) <= 220 for p in parts)


# --------------------------------------------------------------------------
# shards
# --------------------------------------------------------------------------
@st.composite
def shard_setups(draw):
    n_clients = draw(st.integers(1, 8))
    spc = draw(st.integers(1, 3))
    shard_size = draw(st.integers(1, 10))
    n_cls = draw(st.integers(1, 5))
    n_shards = n_clients * spc
    # every class holds a whole number of shards -> no shard straddles labels
    shard_class = draw(st.lists(st.integers(0, n_cls - 1), min_size=n_shards, max_size=n_shards))
    y = np.repeat(np.array(shard_class, dtype=np.int64), shard_size)
    labels = np.random.default_rng(draw(seeds)).permutation(y)
    return labels, n_clients, spc, shard_size


@FAST
@given(setup=shard_setups(), seed=seeds)
def test_shards_exact_size_data(setup, seed):
    labels, n_clients, spc, shard_size = setup
    parts = P.shards(labels, n_clients, spc, shard_size, seed)
    assert len(parts) == n_clients
    assert_valid(parts, len(labels))
    assert np.array_equal(union(parts), np.arange(len(labels)))
    for p in parts:
        assert len(p) == spc * shard_size
        assert len(np.unique(labels[p])) <= spc


@FAST
@given(
    labels=label_arrays(), n_clients=st.integers(1, 5), spc=st.integers(1, 3), shard_size=st.integers(1, 6), seed=seeds
)
def test_shards_longer_data_spread_over_the_sorted_order(labels, n_clients, spc, shard_size, seed):
    n_shards = n_clients * spc
    assume(n_shards * shard_size <= len(labels))
    parts = P.shards(labels, n_clients, spc, shard_size, seed)
    assert_valid(parts, len(labels))
    order = np.argsort(labels, kind="stable")
    starts = [j * len(labels) // n_shards for j in range(n_shards)]  # shard j starts at floor(j n / n_shards)
    want = np.concatenate([order[a : a + shard_size] for a in starts])
    assert np.array_equal(union(parts), np.sort(want))


def test_small_shards_span_every_label():
    """A CI-sized split (10 clients of 2 x 30) of label-sorted data still covers all 10 labels."""
    labels = np.repeat(np.arange(10), 600)
    parts = P.shards(labels, 10, 2, 30, seed=0)
    assert set(np.unique(labels[np.concatenate(parts)])) == set(range(10))
    assert all(len(np.unique(labels[p])) <= 2 for p in parts)


def test_shards_mcmahan_mnist_defaults():
    labels = np.random.default_rng(0).integers(0, 10, 60_000)
    parts = P.shards(labels)
    assert len(parts) == 100 and all(len(p) == 600 for p in parts)
    assert np.array_equal(union(parts), np.arange(60_000))


# --------------------------------------------------------------------------
# iid
# --------------------------------------------------------------------------
@FAST
@given(n=st.integers(1, 500), n_clients=st.integers(1, 40), seed=seeds)
def test_iid_equal_split(n, n_clients, seed):
    assume(n_clients <= n)
    parts = P.iid(n, n_clients, seed)
    assert len(parts) == n_clients
    assert_valid(parts, n)
    assert np.array_equal(union(parts), np.arange(n))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@FAST
@given(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=10), extra=st.integers(0, 20), seed=seeds)
def test_iid_given_sizes(sizes, extra, seed):
    n = sum(sizes) + extra
    parts = P.iid(n, len(sizes), seed, sizes=sizes)
    assert_valid(parts, n)
    assert [len(p) for p in parts] == sizes


# --------------------------------------------------------------------------
# dirichlet
# --------------------------------------------------------------------------
@FAST
@given(labels=label_arrays(), n_clients=st.integers(1, 8), alpha=st.floats(0.05, 100.0), seed=seeds)
def test_dirichlet_covers_everything(labels, n_clients, alpha, seed):
    parts = P.dirichlet(labels, n_clients, alpha, seed, min_size=0)
    assert len(parts) == n_clients
    assert_valid(parts, len(labels))
    assert np.array_equal(union(parts), np.arange(len(labels)))


@FAST
@given(n_clients=st.integers(1, 10), min_size=st.integers(0, 20), seed=seeds)
def test_dirichlet_min_size(n_clients, min_size, seed):
    labels = np.repeat(np.arange(10), 100)
    parts = P.dirichlet(labels, n_clients, alpha=0.5, seed=seed, min_size=min_size)
    assert min(len(p) for p in parts) >= min_size
    assert np.array_equal(union(parts), np.arange(1000))


def test_dirichlet_small_alpha_is_skewed():
    labels = np.repeat(np.arange(10), 100)
    skew = P.dirichlet(labels, 10, alpha=0.05, seed=0, min_size=1)
    flat = P.dirichlet(labels, 10, alpha=1000.0, seed=0, min_size=1)
    n_lab = lambda parts: np.mean([len(np.unique(labels[p])) for p in parts])  # noqa: E731
    assert n_lab(skew) < 5 < n_lab(flat)


# --------------------------------------------------------------------------
# by_domain
# --------------------------------------------------------------------------
@FAST
@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=8))
def test_by_domain(sizes):
    parts = P.by_domain(sizes)
    n = sum(sizes)
    assert_valid(parts, n)
    assert np.array_equal(union(parts), np.arange(n))
    start = 0
    for p, s in zip(parts, sizes):
        assert np.array_equal(p, np.arange(start, start + s))
        start += s


# --------------------------------------------------------------------------
# determinism
# --------------------------------------------------------------------------
DATA = np.repeat(np.arange(5), 60)  # 300 samples, 5 labels


def _calls():
    return {
        "labels_per_client": lambda s: P.labels_per_client(DATA, 6, 2, s),
        "shards": lambda s: P.shards(DATA, 5, 2, 30, s),
        "iid": lambda s: P.iid(300, 7, s),
        "iid_sizes": lambda s: P.iid(300, 3, s, sizes=[10, 50, 100]),
        "dirichlet": lambda s: P.dirichlet(DATA, 6, 0.5, s, min_size=5),
        "split_train_test": lambda s: P.split_train_test([np.arange(50), np.arange(50, 90)], 0.5, s)[0],
    }


@pytest.mark.parametrize("name", list(_calls()))
@FAST
@given(s1=seeds, s2=seeds)
def test_determinism(name, s1, s2):
    f = _calls()[name]
    assert same(f(s1), f(s1))
    if s1 != s2:
        assert not same(f(s1), f(s2))


# --------------------------------------------------------------------------
# split_train_test
# --------------------------------------------------------------------------
@FAST
@given(sizes=st.lists(st.integers(0, 60), min_size=1, max_size=6), frac=st.floats(0.01, 1.0), seed=seeds)
def test_split_train_test(sizes, frac, seed):
    n = sum(sizes)
    parts = np.split(np.random.default_rng(seed).permutation(n), np.cumsum(sizes)[:-1])
    train, test = P.split_train_test(parts, frac, seed)
    assert len(train) == len(test) == len(parts)
    for p, tr, te in zip(parts, train, test):
        assert len(np.intersect1d(tr, te)) == 0
        assert np.array_equal(np.sort(np.concatenate([tr, te])), np.sort(p))
        assert len(tr) == int(frac * len(p))


def test_split_train_test_clients_independent_and_pfedme_rule():
    a, b, c = np.arange(0, 40), np.arange(40, 77), np.arange(77, 90)
    tr1, te1 = P.split_train_test([a, b], seed=3)
    tr2, te2 = P.split_train_test([a, c], seed=3)
    # client 0's split depends only on (seed, client id, its indices)
    assert np.array_equal(tr1[0], tr2[0]) and np.array_equal(te1[0], te2[0])
    assert [len(t) for t in tr1] == [30, 27]  # int(0.75*40), int(0.75*37)
    # ... and clients get different streams: equal-shaped parts split differently
    tr3, _ = P.split_train_test([np.arange(100), np.arange(100, 200)], seed=3)
    assert not np.array_equal(tr3[0], tr3[1] - 100)
    # frac = 1: everything is train
    tr, te = P.split_train_test([a], 1.0)
    assert np.array_equal(tr[0], a) and len(te[0]) == 0


# --------------------------------------------------------------------------
# summary / describe (hand-checked golden)
# --------------------------------------------------------------------------
GOLD_LABELS = np.array([0, 0, 0, 1, 1, 2, 2, 2, 3, 3])
GOLD_TRAIN = [np.array([0, 1, 3]), np.array([4, 5]), np.array([6, 7, 8])]
GOLD_TEST = [np.array([2]), np.array([], dtype=np.int64), np.array([9])]


def test_summary_golden():
    # client 0: train labels 0,0,1 + test 0 | client 1: train 1,2 | client 2: train 2,2,3 + test 3
    got = P.summary(GOLD_TRAIN, GOLD_LABELS, GOLD_TEST)
    expected = pd.DataFrame(
        {
            "client": [0, 1, 2],
            "n_train": [3, 2, 3],
            "n_test": [1, 0, 1],
            "n_total": [4, 2, 4],
            "n_labels": [2, 2, 2],
            "labels": ["0,1", "1,2", "2,3"],
            "label_0": [2, 0, 0],
            "label_1": [1, 1, 0],
            "label_2": [0, 1, 2],
            "label_3": [0, 0, 1],
        }
    )
    pd.testing.assert_frame_equal(got, expected)


def test_summary_without_test_and_label_set_from_train_and_test():
    got = P.summary(GOLD_TRAIN, GOLD_LABELS)
    assert got["n_test"].tolist() == [0, 0, 0]
    assert got["n_total"].tolist() == [3, 2, 3]
    # test sample 9 (label 3) only counts toward n_labels when test_parts given
    only_test = P.summary([np.array([8])], GOLD_LABELS, [np.array([0])])
    assert only_test.loc[0, "n_labels"] == 2 and only_test.loc[0, "labels"] == "0,3"
    assert only_test.loc[0, "label_0"] == 0 and only_test.loc[0, "label_3"] == 1


def test_summary_many_labels_has_no_per_label_columns():
    labels = np.arange(21)
    got = P.summary([np.arange(10), np.arange(10, 21)], labels)
    assert list(got.columns) == ["client", "n_train", "n_test", "n_total", "n_labels", "labels"]
    assert got["n_labels"].tolist() == [10, 11]
    twenty = P.summary([np.arange(20)], np.arange(20))
    assert "label_19" in twenty.columns


def test_describe_golden():
    d = P.describe(GOLD_TRAIN)  # sizes 3, 2, 3
    assert d == pytest.approx({"n_clients": 3, "min": 2, "max": 3, "mean": 8 / 3, "std": math.sqrt(2) / 3, "total": 8})


# --------------------------------------------------------------------------
# invalid arguments
# --------------------------------------------------------------------------
L = np.repeat(np.arange(4), 10)
BAD = [
    # labels_per_client
    ("labels", lambda: P.labels_per_client(L.astype(float))),
    ("labels", lambda: P.labels_per_client(L.reshape(4, 10))),
    ("labels", lambda: P.labels_per_client(np.array([], dtype=np.int64))),
    ("n_clients", lambda: P.labels_per_client(L, n_clients=0)),
    ("n_clients", lambda: P.labels_per_client(L, n_clients=2.0)),
    ("k", lambda: P.labels_per_client(L, k=0)),
    ("k", lambda: P.labels_per_client(L, k=5)),
    ("seed", lambda: P.labels_per_client(L, seed=-1)),
    ("seed", lambda: P.labels_per_client(L, seed=None)),
    ("max_tries", lambda: P.labels_per_client(L, max_tries=0)),
    ("label_stride", lambda: P.labels_per_client(L, label_stride=0)),
    ("size_range", lambda: P.labels_per_client(L, size_range=(5, 3))),
    ("size_range", lambda: P.labels_per_client(L, size_range=(-1, 3))),
    ("size_range", lambda: P.labels_per_client(L, size_range=5)),
    ("size_range", lambda: P.labels_per_client(L, 4, 2, size_range=(11, 20))),  # 44 > 40
    ("size_range", lambda: P.labels_per_client(L, 4, 2, size_range=(10, 10), max_tries=3)),
    # shards
    ("n_clients", lambda: P.shards(L, n_clients=0)),
    ("shards_per_client", lambda: P.shards(L, 2, shards_per_client=0)),
    ("shard_size", lambda: P.shards(L, 2, 2, shard_size=0)),
    ("shard_size", lambda: P.shards(L, 2, 2, shard_size=11)),  # 44 > 40
    ("seed", lambda: P.shards(L, 2, 2, 5, seed=-3)),
    ("labels", lambda: P.shards([0.5, 1.5], 1, 1, 1)),
    # iid
    ("n_samples", lambda: P.iid(0, 1)),
    ("n_clients", lambda: P.iid(10, 0)),
    ("n_clients", lambda: P.iid(3, 4)),
    ("seed", lambda: P.iid(10, 2, seed=1.5)),
    ("sizes", lambda: P.iid(10, 3, sizes=[1, 2])),
    ("sizes", lambda: P.iid(10, 2, sizes=[6, 5])),
    ("sizes[1]", lambda: P.iid(10, 2, sizes=[6, 0])),
    # dirichlet
    ("n_clients", lambda: P.dirichlet(L, 0)),
    ("alpha", lambda: P.dirichlet(L, 2, alpha=0)),
    ("alpha", lambda: P.dirichlet(L, 2, alpha=-1.0)),
    ("alpha", lambda: P.dirichlet(L, 2, alpha=float("nan"))),
    ("alpha", lambda: P.dirichlet(L, 2, alpha="0.5")),
    ("min_size", lambda: P.dirichlet(L, 2, min_size=-1)),
    ("min_size", lambda: P.dirichlet(L, 5, min_size=9)),  # 45 > 40
    ("min_size", lambda: P.dirichlet(L, 4, alpha=0.01, min_size=10, max_tries=2)),
    ("max_tries", lambda: P.dirichlet(L, 2, max_tries=0)),
    ("seed", lambda: P.dirichlet(L, 2, seed=-1)),
    ("labels", lambda: P.dirichlet(np.zeros((2, 2), dtype=int), 2)),
    # by_domain
    ("domain_sizes", lambda: P.by_domain([])),
    ("domain_sizes[1]", lambda: P.by_domain([3, 0])),
    ("domain_sizes[0]", lambda: P.by_domain([2.5])),
    # split_train_test
    ("train_frac", lambda: P.split_train_test([np.arange(4)], train_frac=0)),
    ("train_frac", lambda: P.split_train_test([np.arange(4)], train_frac=1.5)),
    ("seed", lambda: P.split_train_test([np.arange(4)], seed=-1)),
    ("parts[0]", lambda: P.split_train_test([np.array([0.5, 1.0])])),
    ("parts", lambda: P.split_train_test(np.arange(4))),
    # summary / describe
    ("labels", lambda: P.summary(GOLD_TRAIN, GOLD_LABELS.astype(float))),
    ("test_parts", lambda: P.summary(GOLD_TRAIN, GOLD_LABELS, GOLD_TEST[:2])),
    ("train_parts[0]", lambda: P.summary([np.array([10])], GOLD_LABELS)),
    ("test_parts[0]", lambda: P.summary([np.array([1])], GOLD_LABELS, [np.array([-1])])),
    ("parts", lambda: P.describe([])),
]


@pytest.mark.parametrize("param,call", BAD, ids=[f"{i}-{p}" for i, (p, _) in enumerate(BAD)])
def test_invalid_arguments_raise_valueerror_naming_parameter(param, call):
    with pytest.raises(ValueError) as err:
        call()
    msg = str(err.value)
    # "<param>=<value>: <allowed>": the parameter is named before the colon
    assert ":" in msg and param in msg.split(":")[0], msg
