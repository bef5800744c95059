"""Bad configs refused before anything trains, naming the field and what is allowed (the config audit).

Each case here was seen going wrong on the code before: accepted by ``validate()`` and failing only when its data
loaded (a grid had trained the configs before it; the message named the partitioner's argument, ``k=11``), deep in
training (``lr=1e39``: a float32 overflow; ``local_steps=10**9``: an 80 GB plan), with a raw error (LeNet on
Synthetic: "not enough values to unpack"; ``RunConfig(data=5)``: "'int' object has no attribute 'check'"), or stored
silently wrong (``train_frac=1.0`` on Synthetic: all-NaN metrics).
"""

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlib import RunConfig, Store, run
from fedlib.config.options import METHODS
from fedlib.config.run import PARTITIONS, DataConfig, LocalConfig
from fedlib.data import partition
from fedlib.data.synthetic import synthetic
from fedlib.models.registry import MODELS, build_model
from fedlib.runs import feasibility, grids
from fedlib.runs import train as runner

TINY = RunConfig(n_clients=4, clients_per_round=2, rounds=2, local_steps=2, model="mlr")
MNIST = RunConfig(dataset="mnist", partition="labels", n_clients=4, clients_per_round=2, rounds=1, local_steps=1)
HUGE = 2**50  # a memory limit no estimate reaches: the data checks alone


@pytest.fixture
def no_data(monkeypatch):
    """Loading any data fails the test: what is refused must be refused before."""
    monkeypatch.setattr(runner, "load_federated", lambda *a, **k: pytest.fail("data loaded"))


# -- 1. what the data set cannot give ----------------------------------------------------------------------------
def test_a_grid_with_more_labels_per_client_than_classes_trains_nothing(tmp_path, no_data):
    """``run_grid(..., {"labels_per_client": [2, 11]})`` trained the first config, then failed on the second's data
    with ``k=11: must be in [1, 10]``."""
    with pytest.raises(ValueError, match=r"RunConfig.labels_per_client=11 must be in \[1, 10\]"):
        grids.run_grid(MNIST, {"labels_per_client": [2, 11]}, Store(tmp_path), progress=False, batch=1)
    MNIST.replace(labels_per_client=10).validate()


@pytest.mark.parametrize(
    "change, message",
    [
        # failed in partition.shards / partition.iid / partition.dirichlet once the data had loaded
        (dict(partition="shards", shard_size=10000), r"RunConfig.shard_size=10000 must be <= 7500 with n_clients=4"),
        (dict(partition="shards", n_clients=40000), r"RunConfig.n_clients=40000 must be <= 30000"),
        (dict(partition="iid", n_clients=65000), r"RunConfig.n_clients=65000 must be <= 60000: .*training samples"),
        (dict(partition="dirichlet", n_clients=6500), r"RunConfig.n_clients=6500 must be <= 6000: .* at least 10"),
        (dict(dataset="cifar10", partition="iid", n_clients=55000), r"n_clients=55000 must be <= 50000"),
        # "every client needs at least one training sample", when the data had loaded
        (dict(n_clients=500), r"RunConfig.n_clients=500 is too many for partition='labels'.* would hold no sample"),
        (dict(train_frac=0.0001), r"RunConfig.train_frac=0.0001 leaves client \d+ of its \d+ samples none to train"),
        (dict(partition="iid", n_clients=60000), r"train_frac=0.75 leaves client 0 of its 1 samples none to train"),
        (
            dict(dataset="synthetic", partition="natural", n_clients=100, train_frac=0.003),
            r"RunConfig.train_frac=0.003 leaves client \d+ of its 250 samples none .* at least 1/250",
        ),
    ],
)
def test_partitions_the_data_set_cannot_hold_are_refused_before_its_data_loads(change, message, tmp_path, no_data):
    cfg = MNIST.replace(**change).validate()
    with pytest.raises(ValueError, match=message):
        feasibility.check(cfg, limit=HUGE)
    with pytest.raises(ValueError, match=message):  # a grid refuses before training any of its runs
        grids.run_configs([TINY, cfg], Store(tmp_path), progress=False)
    assert not Store(tmp_path).has(TINY)


def test_the_limits_are_the_partitions_own():
    """One client more, one sample less, fails; the limit itself passes."""
    for ok, bad, message in [
        (dict(partition="shards", shard_size=7500), dict(partition="shards", shard_size=7501), "shard_size=7501"),
        (dict(partition="iid", n_clients=30000), dict(partition="iid", n_clients=60001), "n_clients=60001"),
        (dict(partition="iid", n_clients=30000), dict(partition="iid", n_clients=30001), "train_frac=0.75 leaves"),
        (dict(partition="dirichlet", n_clients=1000), dict(partition="dirichlet", n_clients=6001), "n_clients=6001"),
        (dict(n_clients=50), dict(n_clients=200), "n_clients=200 is too many for partition='labels'"),
    ]:
        cfg = MNIST.replace(**ok).validate()
        feasibility.check_data(cfg)
        feasibility.check_clients(cfg)
        cfg = MNIST.replace(**bad).validate()
        with pytest.raises(ValueError, match=message):
            feasibility.check_data(cfg)
            feasibility.check_clients(cfg)
    # the partitions with the data set's own test set take train_frac = 1 (AdaFL's MNIST runs)
    feasibility.check(MNIST.replace(partition="shards", train_frac=1.0).validate(), limit=HUGE)


@pytest.mark.parametrize(
    "dataset, part, n, seed, extra",
    [
        ("mnist", "labels", 20, 1, {}),  # FedMCSA's MNIST
        ("fmnist", "labels", 137, 0, dict(labels_per_client=3)),
        ("fmnist", "labels", 20, 1, dict(label_stride=2)),  # FedMCSA's own partition
        ("mnist", "labels", 300, 2, {}),  # some clients empty
        ("cifar10", "dirichlet", 50, 3, dict(dirichlet_alpha=0.1)),
        ("mnist", "iid", 7, 0, {}),
        ("mnist", "shards", 100, 0, {}),
    ],
)
def test_client_sizes_are_those_the_partition_draws(dataset, part, n, seed, extra):
    """``client_sizes`` draws from the class counts alone what the partitioner draws from the labels."""
    train, test = (np.repeat(np.arange(10), c) for c in feasibility.CLASS_COUNTS[dataset])
    cfg = RunConfig(dataset=dataset, partition=part, n_clients=n, clients_per_round=1, data_seed=seed, **extra)
    k, alpha = cfg.data.labels_per_client, cfg.data.dirichlet_alpha
    parts = {
        "labels": lambda: partition.labels_per_client(
            np.concatenate([train, test]), n, k, seed=seed, label_stride=cfg.data.label_stride
        ),
        "dirichlet": lambda: partition.dirichlet(train, n, alpha, seed=seed),
        "iid": lambda: partition.iid(len(train), n, seed=seed),
        "shards": lambda: partition.shards(train, n, 2, cfg.data.shard_size, seed=seed),
    }[part]()
    assert feasibility.client_sizes(cfg).tolist() == [len(p) for p in parts]


def test_synthetic_client_sizes_are_the_generators():
    for seed in (0, 1, 7):
        _, ys = synthetic(0.5, 0.5, 6, seed)
        assert feasibility.client_sizes(RunConfig(n_clients=6, clients_per_round=2, data_seed=seed)).tolist() == [
            len(y) for y in ys
        ]


def test_the_class_counts_are_the_data_sets():
    """The counts the checks draw from: 10 classes wherever partition='labels' applies (labels_per_client's bound),
    the totals ``DATA`` holds, and (where the files are here) the files' own counts and ``load_federated``'s clients."""
    le = next(f.metadata["le"] for f in dataclasses.fields(DataConfig) if f.name == "labels_per_client")
    for d, parts in PARTITIONS.items():
        if "labels" in parts or "iid" in parts:
            train, test = feasibility.CLASS_COUNTS[d]
            assert len(train) == len(test) == le and sum(train) + sum(test) == feasibility.DATA[d][1], d
    root = os.environ.get("FEDLIB_DATA")
    if not root or not (Path(root) / "MNIST" / "raw").exists():
        pytest.skip("MNIST is not here")
    from fedlib.data import load_federated, readers

    for d, load in (("mnist", readers.load_mnist), ("fmnist", readers.load_fashion_mnist)):
        if readers.missing([d]):
            continue
        counts = tuple(tuple(np.bincount(load(s, root=root)[1]).tolist()) for s in ("train", "test"))
        assert counts == feasibility.CLASS_COUNTS[d], d
    for cfg in (
        RunConfig(dataset="mnist", partition="labels", n_clients=20, clients_per_round=10, data_seed=1),
        RunConfig(dataset="mnist", partition="shards", n_clients=100, clients_per_round=10, train_frac=1.0),
    ):
        fd = load_federated(cfg, root)
        assert (fd.train.sizes + fd.test.sizes).tolist() == feasibility.client_sizes(cfg).tolist()


# -- 2. seeds ----------------------------------------------------------------------------------------------------
def test_seeds_are_bounded_by_what_their_generators_take(tmp_path):
    """``seed=2**64`` failed in torch ("Overflow when unpacking long long"), ``data_seed=2**32`` in numpy's
    RandomState ("Seed must be between 0 and 2**32 - 1"), each once the run had started."""
    for change, message in [
        (dict(seed=2**64), r"RunConfig.seed=18446744073709551616 must be in \[0, 9223372036854775808\)"),
        (dict(seed=2**63), r"RunConfig.seed=9223372036854775808 must be in \[0, 9223372036854775808\)"),
        (dict(data_seed=2**32), r"RunConfig.data_seed=4294967296 must be in \[0, 4294967296\)"),
    ]:
        with pytest.raises(ValueError, match=message):
            TINY.replace(**change).validate()
    res = run(TINY.replace(seed=2**63 - 1, data_seed=2**32 - 1, rounds=1), Store(tmp_path), progress=False)
    assert res.metrics.shape[0] == 1


# -- 3. values that failed once training ran ---------------------------------------------------------------------
def _unbounded_float_fields():
    """(flat name, context) of every float option without an upper bound, of every part and method."""
    base, out = RunConfig(), []
    for part in ("data", "model", "local", "selection"):
        for f in dataclasses.fields(getattr(base, part)):
            if "float" in str(f.type) and f.metadata.get("le") is None and f.metadata.get("lt") is None:
                if f.name != "domain_percent":  # its own check: None or in (0, 1]
                    applies = dict(dataset="mnist", partition="dirichlet") if f.name == "dirichlet_alpha" else {}
                    out.append((f.name, applies))
    for name, cls in METHODS.items():
        for f in dataclasses.fields(cls):
            if "float" in str(f.type) and f.metadata.get("le") is None and f.metadata.get("lt") is None:
                out.append((f.name, {"algorithm": name, "model": "lenet" if cls.LOCAL_GROUPS else "mlr"}))
    return out


@pytest.mark.parametrize("field, context", _unbounded_float_fields(), ids=lambda v: v if isinstance(v, str) else "")
def test_float_options_must_fit_the_runs_dtype(field, context):
    """``lr=1e39`` passed every check and failed in the first float32 step ("value cannot be converted to type float
    without overflow"); an int such as 10**400 overflows any float."""
    with pytest.raises(ValueError, match=rf"RunConfig.{field}=1e\+39 must be at most 3.402823e\+38 in magnitude"):
        RunConfig(**context, **{field: 1e39}).validate()
    RunConfig(**context, dtype="float64", **{field: 1e39}).validate()
    RunConfig(**context, **{field: 3e38}).validate()
    with pytest.raises(ValueError, match=rf"RunConfig.{field}=1000000.* must be at most 1.797693e\+308 in magnitude"):
        RunConfig(**context, dtype="float64", **{field: 10**400}).validate()


def test_an_option_annotated_with_the_type_itself_is_type_checked():
    """FedProx's module does not postpone annotations: ``mu: float`` was read as no kind, and ``mu='abc'`` passed."""
    with pytest.raises(ValueError, match=r"RunConfig.mu='abc' must be of type float, not str"):
        RunConfig(algorithm="fedprox", mu="abc").validate()


def test_lr_beyond_float32_is_refused_before_training(tmp_path, no_data):
    with pytest.raises(ValueError, match=r"RunConfig.lr=1e\+39 must be at most .* dtype='float32'"):
        run(TINY.replace(lr=1e39), Store(tmp_path), progress=False)


@pytest.mark.parametrize(
    "change",
    [
        dict(local_steps=10**9),  # an 80 GB plan (sample_steps), once training had started
        dict(local_steps=None, local_epochs=10**7),
        dict(algorithm="pfedme", inner_steps=10**9),  # 120 GB after 33 s of training
        dict(algorithm="perfedavg", local_steps=10**8),  # two batches a step
    ],
)
def test_the_memory_estimate_counts_the_step_plan(change, tmp_path, no_data):
    cfg = TINY.replace(**change).validate()
    message = r"would need about .* \(clients .*, training .*, data .*, plan .*B, records .*\).*inner_steps"
    with pytest.raises(ValueError, match=message):
        feasibility.check(cfg, limit=16 * 2**30)
    with pytest.raises(ValueError, match=message):
        grids.run_configs([TINY, cfg], Store(tmp_path), progress=False)
    assert not Store(tmp_path).has(TINY)


def test_the_plan_estimate_errs_high_but_not_by_orders():
    """What the plan tensors of a round take, against the estimate: above, within a factor of 8."""
    from fedlib.data.federated import Split, sample_epochs, sample_steps

    cfg = TINY.replace(n_clients=10, clients_per_round=10, local_steps=50, batch_size=16)
    layout = Split(torch.zeros(0), torch.zeros(0).long(), torch.arange(10) * 300, torch.full((10,), 300))
    gen = torch.Generator().manual_seed(0)
    steps = sample_steps(layout, torch.arange(10), 50, 16, gen).index.nbytes
    assert steps <= feasibility.plan(cfg) <= 8 * steps
    # pFedMe: its K inner steps of a local step repeat that step's batch (plan.at_steps) on top of the plan
    k = 1000
    inner = sample_steps(layout, torch.arange(10), 1, 16, gen).at_steps(torch.zeros(k, dtype=torch.long)).index.nbytes
    pf = cfg.replace(algorithm="pfedme", inner_steps=k, local_steps=1)
    assert inner <= feasibility.plan(pf) - feasibility.plan(pf.replace(inner_steps=1)) <= 8 * inner
    # epochs: E epochs of the largest client's rows, padded to batches
    ep = cfg.replace(local_steps=None, local_epochs=3, dataset="mnist", partition="shards", shard_size=150)
    plan = sample_epochs(layout, torch.arange(10), 3, 16, gen)
    held = plan.index.nbytes + plan.weight.nbytes + plan.active.nbytes
    assert held <= feasibility.plan(ep) <= 8 * held


def test_train_frac_1_is_refused_where_the_clients_splits_are_the_test_data():
    """Synthetic with ``train_frac=1.0`` was stored with every test metric NaN; AdaFL's MNIST shards keep the data
    set's test set and take 1."""
    for cfg, part in [(TINY, "natural"), (MNIST, "labels")]:
        with pytest.raises(ValueError, match=rf"RunConfig.train_frac=1.0 must be in \(0, 1\) for partition='{part}'"):
            cfg.replace(train_frac=1.0).validate()
    for part in ("shards", "iid", "dirichlet"):
        MNIST.replace(partition=part, train_frac=1.0).validate()


def test_train_frac_is_refused_on_feature_shift_data_whose_domains_bring_their_own_test_sets():
    """``train_frac=0.5`` on the digits was accepted and silently ignored (each domain's client keeps the domain's
    own train and test sets), so a grid over it trained the same run under several keys."""
    digits = RunConfig(dataset="digits", partition="domains", n_clients=5, clients_per_round=None, fraction=1.0)
    digits.validate()
    with pytest.raises(ValueError, match=r"RunConfig.train_frac=0.5 is set but applies only when the data set is not "
                       r"a feature-shift one \(those split by domain: digits, office31"):  # fmt: skip
        digits.replace(train_frac=0.5).validate()
    assert digits.key() == digits.replace(train_frac=0.75).key()  # the default is no change, and no new key


@pytest.mark.parametrize("cfg", [TINY, RunConfig(dataset="digits", n_clients=5, clients_per_round=None, fraction=1.0)])
def test_normalize_is_refused_where_the_data_is_not_read_as_pixels_to_scale(cfg):
    """``normalize='unit'`` on Synthetic or the digits was accepted and ignored (Synthetic is its generator's
    numbers, the feature-shift sets are normalised as FedBN does), a second key for the same run."""
    with pytest.raises(ValueError, match=r"RunConfig.normalize='unit' is set but applies only when the data set is "
                       r"mnist or fmnist or cifar10"):  # fmt: skip
        cfg.replace(normalize="unit").validate()
    MNIST.replace(normalize="unit").validate()


# -- 4. a model the data does not fit ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, message",
    [
        (dict(model="lenet"), r"model='lenet' is a conv net and needs \(C, H, W\) images, but dataset='synthetic'"),
        (dict(model="mobilenetv2"), r"model='mobilenetv2' is a conv net .*: mlr, dnn, mlp$"),
        (dict(model="alexnet"), r"model='alexnet' is a conv net and needs \(C, H, W\) images"),
        (dict(model="cnn"), r"model='cnn' is a conv net .*dataset='synthetic' has \(60,\) feature vectors"),
        (
            dict(model="alexnet", dataset="mnist", partition="iid"),
            r"model='alexnet' is a conv net and needs images of at least 63x63, but dataset='mnist' has 28x28 images; "
            r"models for dataset='mnist': mlr, dnn, mlp, cnn, lenet, mobilenetv2",
        ),
    ],
)
def test_a_model_that_does_not_take_the_data_is_refused_naming_both(change, message, tmp_path, no_data):
    cfg = TINY.replace(**change).validate()
    with pytest.raises(ValueError, match=message):
        feasibility.check(cfg, limit=HUGE)
    with pytest.raises(ValueError, match=message):
        run(cfg, Store(tmp_path), progress=False)
    with pytest.raises(ValueError, match=message):
        grids.run_configs([TINY, cfg], Store(tmp_path), progress=False)
    assert not Store(tmp_path).has(TINY)


def test_which_models_take_which_data_is_what_the_models_do():
    """``feasibility.takes`` against a forward pass of each model at each data set's input shape."""
    shapes = {feasibility.input_shape(d) for d in PARTITIONS}
    for name in MODELS:
        for shape in sorted(shapes):
            try:
                model = build_model(name, shape, 10, seed=0).eval()
                with torch.no_grad():
                    works = model(torch.zeros(1, *shape)).shape == (1, 10)
            except (ValueError, RuntimeError):
                works = False
            assert feasibility.takes(name, shape) == works, (name, shape)


# -- 5. a part of the wrong kind ---------------------------------------------------------------------------------
def test_a_part_of_the_wrong_type_is_named():
    """``RunConfig(data=5)`` and ``RunConfig(method="fedavg")`` were accepted, and ``validate()`` then failed with
    "'int' object has no attribute 'check'"."""
    for kw, message in [
        (dict(data=5), r"RunConfig.data=5 must be a DataConfig, not int; or set its fields by name \(dataset=..."),
        (dict(local={"lr": 0.1}), r"RunConfig.local=\{'lr': 0.1\} must be a LocalConfig, not dict"),
        (
            dict(method="fedavg"),
            r"RunConfig.method='fedavg' must be a method's options .*, not str; .*algorithm='fedavg'",
        ),
        (dict(method=METHODS["fedprox"]), r"RunConfig.method=<class .*FedProx'> must be a method's options"),
    ]:
        with pytest.raises(TypeError, match=message):
            RunConfig(**kw)
    with pytest.raises(TypeError, match="RunConfig.data=5 must be a DataConfig"):
        dataclasses.replace(TINY, data=5)
    cfg = RunConfig(data=DataConfig(n_clients=4), local=LocalConfig(lr=0.1), method=METHODS["fedprox"](mu=0.1))
    assert (cfg.n_clients, cfg.lr, cfg.mu) == (4, 0.1, 0.1)
