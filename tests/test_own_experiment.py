"""An experiment of the user's own: a model (``fedlib.register_model``), a data set (``fedlib.register_dataset``,
``fedlib.data.from_tensors``) and a method (``fedlib.register_method``, defined here as a user would) through
``fedlib.run``, ``fedlib.run_grid`` (batched) and a resume after an interruption; their store keys; and every bad input
refused before training with a message naming the argument."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from torch import nn

import fedlib
from fedlib import RunConfig, Store
from fedlib.config.options import METHODS, MethodOptions, option
from fedlib.core import callbacks
from fedlib.core.stages import Algorithm, WeightedMean, local_sgd
from fedlib.data import from_tensors, from_torch
from fedlib.data.own import USER_DATASETS, unregister_dataset
from fedlib.models.registry import MODELS, unregister_model
from fedlib.runs import grids
from fedlib.runs import train as runner


@dataclass(frozen=True)
class EqualMean(MethodOptions):
    """FedAvg whose server weighs every upload equally (not by its client's samples): a method from user code,
    registered by the ``own`` fixture (``fedlib.register_method(EqualMean)``, what ``@fedlib.register_method`` does)
    so that it is in the registry during these tests only: the other test modules' contract tests go over every
    registered method."""

    NAME = "test-equal-mean"
    lr_scale: float = option(1.0, gt=0, doc="a bounded option of the user's method (multiplies nothing here)")

    def build(self, cfg):
        return Algorithm(name=self.NAME, local=local_sgd(cfg), aggregate=WeightedMean("uniform"))


class TinyConv(nn.Module):
    """A conv net of the user's: one 3x3 conv, ReLU, a linear head."""

    def __init__(self, input_shape, n_classes, hidden):
        super().__init__()
        c, h, w = input_shape
        self.conv = nn.Conv2d(c, hidden[0], 3)
        self.head = nn.Linear(hidden[0] * (h - 2) * (w - 2), n_classes)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).flatten(1))


def _pool(n=240, seed=0, classes=3):
    """Images (n, 1, 6, 6) whose label is which of the first ``classes`` pixels is largest: learnable."""
    x = np.random.default_rng(seed).normal(size=(n, 1, 6, 6)).astype(np.float32)
    return x, x.reshape(n, -1)[:, :classes].argmax(1).astype(np.int64)


@pytest.fixture(autouse=True)
def own():
    """Registers the user's model and data sets for a test and removes them after it (nothing leaks into others)."""
    x, y = _pool()
    fedlib.register_method(EqualMean)
    fedlib.register_model("test-tinyconv", TinyConv, default_hidden=(4,))
    fedlib.register_dataset("test-pool", lambda: (x, y))
    fedlib.register_dataset("test-fixed", from_tensors(x, y, n_clients=4, partition="dirichlet", seed=1))
    yield x, y
    for name in [n for n in MODELS if n.startswith("test-")]:
        unregister_model(name)
    for name in [n for n in USER_DATASETS if n.startswith("test-")]:
        unregister_dataset(name)
    METHODS.pop(EqualMean.NAME)


def own_config(**changes) -> RunConfig:
    """The user's experiment (its names resolve while the ``own`` fixture has registered them)."""
    cfg = RunConfig(dataset="test-pool", partition="iid", n_clients=4, clients_per_round=2, rounds=3, local_steps=2,
                    model="test-tinyconv", algorithm="test-equal-mean", lr=0.1)  # fmt: skip
    return cfg.replace(**changes) if changes else cfg


def test_own_model_data_and_method_through_run(tmp_path, monkeypatch):
    """``fedlib.run`` trains the user's model on the user's data with the user's method, stores it, and reads it back
    without training; the config's clients are what the data was cut into."""
    store = Store(tmp_path)
    res = fedlib.run(own_config(), store, progress=False)
    assert len(res.metrics) == 3 and np.isfinite(res.metrics.test_loss).all()
    assert res.meta["executor"] in ("stacked", "loop") and store.has(own_config())
    fixed = fedlib.run(own_config(dataset="test-fixed", partition="natural"), store, progress=False)
    assert len(fixed.metrics) == 3
    monkeypatch.setattr(runner, "train", lambda *a, **k: pytest.fail("a stored run was trained again"))
    again = fedlib.run(own_config(), store, progress=False)
    assert np.allclose(again.metrics.test_loss, res.metrics.test_loss, rtol=1e-5, atol=0)  # stored: 6 digits
    assert len(store.configs()) == 2


def test_grid_trains_batched_and_equals_solo_runs(tmp_path):
    """``run_grid`` trains the grid's runs that share data and model together (``batch``), each stored under its
    own key with its solo run's numbers."""
    base = own_config(dtype="float64")
    table = fedlib.run_grid(base, {"seed": [0, 1, 2]}, Store(tmp_path / "grid"), progress=False, batch=8)
    assert len(set(table.key)) == 3
    store = Store(tmp_path / "grid")
    assert [store.meta(base.replace(seed=s))["batched"] for s in range(3)] == [3, 3, 3]
    fedlib.run(base.replace(seed=1), Store(tmp_path / "solo"), progress=False)
    solo = Store(tmp_path / "solo").load(base.replace(seed=1))
    assert np.array_equal(store.load(base.replace(seed=1)).metrics.test_loss, solo.metrics.test_loss)


def test_interrupted_run_resumes_with_the_uninterrupted_numbers(tmp_path, monkeypatch):
    """Killed in round 3, the run continues from its round-2 snapshot and stores what an uninterrupted run stores."""
    cfg = own_config(rounds=4)
    reference = fedlib.run(cfg, Store(tmp_path / "ref"), progress=False)
    store = Store(tmp_path / "r")
    monkeypatch.setattr(Store, "checkpoint_seconds", 0.0)
    real, calls = callbacks._evaluate_round, []

    def evaluate(alg, state, data, model, t, *rest):
        calls.append(t)
        if t == 3 and calls.count(3) == 1:
            raise KeyboardInterrupt
        return real(alg, state, data, model, t, *rest)

    monkeypatch.setattr(callbacks, "_evaluate_round", evaluate)
    with pytest.raises(KeyboardInterrupt):
        fedlib.run(cfg, store, progress=False)
    assert store.checkpoint(cfg).info()["round"] == 2
    res = fedlib.run(cfg, store, progress=False)
    assert calls == [1, 2, 3, 3, 4]
    assert np.array_equal(res.metrics.test_loss, reference.metrics.test_loss)
    assert [r["round"] for r in store.load(cfg).meta["resumed"]] == [2]


# -- store keys ------------------------------------------------------------------------------------------------------
def test_keys_follow_the_data_content_and_the_model_version(own):
    x, y = own
    key = own_config().key()
    fedlib.register_dataset("test-pool", lambda: (x.copy(), y.copy()), replace=True)  # the same arrays
    assert own_config().key() == key
    x2 = x.copy()
    x2[0, 0, 0, 0] += 1.0  # one value changed: no stale result may be read
    fedlib.register_dataset("test-pool", lambda: (x2, y), replace=True)
    assert own_config().key() != key
    fedlib.register_dataset("test-pool", lambda: (x, y), replace=True)
    assert own_config().key() == key
    fedlib.register_model("test-tinyconv", TinyConv, default_hidden=(4,), version=2, replace=True)
    assert own_config().key() != key


def test_changed_data_is_trained_again(tmp_path, own):
    x, y = own
    store = Store(tmp_path)
    fedlib.run(own_config(), store, progress=False)
    fedlib.register_dataset("test-pool", lambda: (x[::-1].copy(), y[::-1].copy()), replace=True)
    assert not store.has(own_config())
    fedlib.run(own_config(), store, progress=False)
    assert len(store.configs()) == 2


def test_built_in_keys_do_not_move():
    """Registrations add nothing to a built-in config's key (tests/test_store_keys.py checks every stored one)."""
    assert RunConfig().key() == "7c68ff863f437620"
    assert RunConfig(model="dnn", hidden=(20,), algorithm="fedmcsa").key() == "6a697f7192bececd"
    assert RunConfig(dataset="mnist", partition="shards", model="cnn").key() == "01026d3c6818458b"


# -- bad input -------------------------------------------------------------------------------------------------------
X, Y = _pool(40)
BAD_TENSORS = [
    ({"x": X, "y": Y[:-1]}, "x has 40 samples but y has 39 labels"),
    ({"x": X, "y": Y[:, None]}, r"y has shape \(40, 1\): must be 1-D"),
    ({"x": X, "y": Y.astype(np.float32)}, "y has dtype float32: labels must be integers"),
    ({"x": X, "y": Y - 1}, r"y has labels in \[-1, 1\]: must lie in \[0"),
    ({"x": X, "y": Y, "n_classes": 2}, r"y has labels in \[0, 2\]: must lie in \[0, n_classes - 1 = 1\]"),
    ({"x": np.where(np.arange(40)[:, None, None, None] == 3, np.nan, X), "y": Y}, "x has NaN or infinite values in 1"),
    ({"x": X, "y": Y, "n_clients": 41}, "n_clients=41 is more than the 40 samples of x"),
    ({"x": X, "y": Y, "n_clients": 0}, "n_clients=0 must be an integer >= 1"),
    ({"x": X, "y": Y, "partition": "domains"}, "partition='domains' is not one of: iid, dirichlet, shards, labels"),
    ({"x": X, "y": Y, "train_frac": 1.0}, "train_frac=1.0 with no test set leaves the run nothing to test on"),
    ({"x": X, "y": Y, "train_frac": 0.0}, r"train_frac=0.0 must be a number in \(0, 1\]"),
    ({"x": X, "y": Y, "test": (X[:, :, :3], Y)}, r"test\[0\] \(x\) has samples of shape \(1, 3, 6\) but x has"),
    ({"x": X, "y": Y, "test": (X, Y[:3])}, r"test\[0\] \(x\) has 40 samples but test\[1\] \(y\) has 3 labels"),
    ({"x": X[:, 0, 0, 0], "y": Y}, r"x has shape \(40,\): must be \(n_samples, \*features\)"),
    ({"x": X, "y": Y, "n_clients": 30, "train_frac": 0.5}, "train_frac=0.5 leaves client"),
]


@pytest.mark.parametrize("kwargs,message", BAD_TENSORS, ids=[m[:30] for _, m in BAD_TENSORS])
def test_from_tensors_refuses_bad_input_naming_the_argument(kwargs, message):
    kw = dict(kwargs)
    with pytest.raises(ValueError, match=message):
        from_tensors(kw.pop("x"), kw.pop("y"), **kw)


def test_from_tensors_uses_the_library_partitioners():
    x, y = _pool(400)
    fd = from_tensors(x, y, partition="labels", n_clients=3, labels_per_client=1, seed=0)
    assert fd.n_clients == 3 and fd.n_classes == 3 and fd.input_shape == (1, 6, 6)
    assert [len(set(fd.train.client(i)[1].tolist())) for i in range(3)] == [1, 1, 1]  # one label a client
    shards = from_tensors(x, y, partition="shards", n_clients=4, test=(x[:50], y[:50]))
    assert shards.train.sizes.tolist() == [100] * 4 and len(shards.global_test[1]) == 50  # all train: a test set given
    iid = from_tensors(torch.from_numpy(x), torch.from_numpy(y), n_clients=4, seed=3)  # tensors are accepted
    assert iid.train.sizes.tolist() == [75] * 4 and iid.test.sizes.tolist() == [25] * 4
    assert from_tensors(x, y, n_clients=4, seed=3).train.x.equal(iid.train.x)


def test_from_torch_reads_a_dataset():
    x, y = _pool(60)
    ds = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
    fd = from_torch(ds, n_clients=3, seed=0)
    assert fd.train.x.equal(from_tensors(x, y, n_clients=3, seed=0).train.x)
    with pytest.raises(ValueError, match=r"dataset\[0\] is a Tensor: items must be \(input, label\) pairs"):
        from_torch([torch.zeros(3)], n_clients=1)


def test_registered_dataset_checks_the_config():
    with pytest.raises(ValueError, match="n_clients=5 but data set 'test-fixed' has 4 clients"):
        own_config(dataset="test-fixed", partition="natural", n_clients=5).validate()
    with pytest.raises(ValueError, match="partition='iid' is not one of: natural"):
        own_config(dataset="test-fixed").validate()
    with pytest.raises(ValueError, match="train_frac=0.5 is set but data set 'test-fixed' comes cut"):
        own_config(dataset="test-fixed", partition="natural", train_frac=0.5).validate()
    with pytest.raises(ValueError, match="n_clients=241 exceeds the 240 samples of data set 'test-pool'"):
        own_config(n_clients=241, clients_per_round=2).validate()
    with pytest.raises(ValueError, match="train_frac=1.0 must be below 1: data set 'test-pool' has no test set"):
        own_config(train_frac=1.0).validate()
    with pytest.raises(ValueError, match="labels_per_client=4 exceeds the 3 classes"):
        own_config(partition="labels", labels_per_client=4).validate()
    fedlib.register_dataset("test-only-iid", lambda: _pool(), partitions=("iid",))
    with pytest.raises(ValueError, match="partition='dirichlet' is not one of: iid"):
        own_config(dataset="test-only-iid", partition="dirichlet").validate()
    with pytest.raises(ValueError, match="dataset='nope' is not one of: synthetic, .*test-pool"):
        RunConfig(dataset="nope").validate()


def test_registering_a_dataset_refuses_bad_input():
    with pytest.raises(ValueError, match="data set 'test-pool' is already registered"):
        fedlib.register_dataset("test-pool", _pool)
    with pytest.raises(ValueError, match="name='mnist' is a built-in data set"):
        fedlib.register_dataset("mnist", _pool, replace=True)
    with pytest.raises(ValueError, match="partitions=\\('natural',\\) must be a non-empty tuple of"):
        fedlib.register_dataset("test-x", _pool, partitions=("natural",))
    fedlib.register_dataset("test-bad", lambda: (X, Y[:-1]))
    with pytest.raises(ValueError, match="the loader of data set 'test-bad' returned bad arrays: x has 40 samples"):
        own_config(dataset="test-bad").validate()
    fedlib.register_dataset("test-worse", lambda: [1, 2, 3])
    with pytest.raises(TypeError, match="must return a FederatedData, \\(x, y\\) or \\(x, y, x_test, y_test\\)"):
        own_config(dataset="test-worse").validate()


def test_registering_a_model_refuses_bad_input():
    with pytest.raises(ValueError, match="model 'test-tinyconv' is already registered \\(replace=True"):
        fedlib.register_model("test-tinyconv", TinyConv, default_hidden=(4,))
    with pytest.raises(ValueError, match="name='cnn' is a built-in model"):
        fedlib.register_model("cnn", TinyConv, replace=True)
    with pytest.raises(TypeError, match="returned int, not an nn.Module"):
        fedlib.register_model("test-int", lambda s, c: 3)
    with pytest.raises(ValueError, match="builds for none of example_shapes"):
        fedlib.register_model("test-conv-only", TinyConv, default_hidden=(4,), example_shapes=((60,),))
    with pytest.raises(ValueError, match="declares kernel 'chain' but is not a Flatten/Linear/ReLU chain"):
        fedlib.register_model("test-liar", TinyConv, default_hidden=(4,), kernel="chain", example_shapes=((1, 6, 6),))
    with pytest.raises(ValueError, match="declares groups=\\('bn',\\) but has no BatchNorm layer"):
        fedlib.register_model("test-nobn", lambda s, c: nn.Sequential(nn.Flatten(), nn.Linear(60, c)), groups=("bn",))
    with pytest.raises(ValueError, match="version=0 must be an integer >= 1"):
        fedlib.register_model("test-v0", TinyConv, version=0)
    # a two-parameter builder, kernel read off the model: a Linear chain runs on the stacked kernel
    spec = fedlib.register_model("test-softmax", lambda s, c: nn.Sequential(nn.Flatten(), nn.Linear(36, c)),
                                 example_shapes=((1, 6, 6),))  # fmt: skip
    assert spec.kernel == "chain" and spec.version == 1 and MODELS["test-tinyconv"].kernel == "vmap"


@pytest.mark.parametrize("entry", [fedlib.run, lambda c, s, **k: fedlib.run_grid(c, {"seed": [0, 1]}, s, **k)])
def test_a_model_of_the_wrong_width_is_refused_before_training(tmp_path, monkeypatch, entry):
    """A model whose output is not one logit per class of the data, refused naming the model and both widths."""
    fedlib.register_model("test-ten", lambda s, c: nn.Sequential(nn.Flatten(), nn.Linear(36, 10)),
                          example_shapes=((1, 6, 6),))  # fmt: skip
    monkeypatch.setattr(runner, "simulate", lambda *a, **k: pytest.fail("training started"))
    with pytest.raises(ValueError, match="model='test-ten' outputs 10 logits per sample .* the data has 3 classes"):
        entry(own_config(model="test-ten"), Store(tmp_path), progress=False)
    with pytest.raises(ValueError, match=r"model='test-tinyconv' does not run on inputs of shape \(60,\)"):
        entry(RunConfig(model="test-tinyconv", rounds=2), Store(tmp_path), progress=False)
    assert not (tmp_path / "_partial").exists() and not list(tmp_path.glob("*/config.json"))
    with pytest.raises(ValueError, match="model='test-ten' outputs 10 logits per sample"):  # own data: validate knows
        own_config(model="test-ten").validate()


def test_a_method_defined_in_user_code(tmp_path):
    assert METHODS["test-equal-mean"] is EqualMean
    with pytest.raises(ValueError, match="lr_scale=0.0 must be > 0"):
        own_config(lr_scale=0.0).validate()

    @dataclass(frozen=True)
    class Other(MethodOptions):
        NAME = "test-equal-mean"

    with pytest.raises(ValueError, match="method 'test-equal-mean' is registered twice .* or @register\\(replace=True"):
        fedlib.register_method(Other)
    try:
        assert fedlib.register_method(replace=True)(Other) is Other and METHODS["test-equal-mean"] is Other
    finally:
        METHODS["test-equal-mean"] = EqualMean

    @dataclass(frozen=True)
    class MyFedAvg(MethodOptions):
        NAME = "fedavg"

    with pytest.raises(ValueError, match="method 'fedavg' is registered twice .*: pick another NAME$"):
        fedlib.register_method(replace=True)(MyFedAvg)


@pytest.mark.parametrize("how", [{"jobs": 2}, {"backend": "ray"}])
def test_worker_processes_would_not_see_the_registration(tmp_path, how):
    """Worker processes and Ray tasks start fresh: refused naming the registration, before any run trains (and
    before Ray is asked for: this needs no Ray); ``jobs=None`` trains here."""
    with pytest.raises(ValueError, match="uses dataset='test-pool', model='test-tinyconv', registered in this process"):
        fedlib.run_grid(own_config(), {"seed": [0, 1]}, Store(tmp_path), progress=False, **how)
    assert not list(tmp_path.glob("*/config.json"))
    table = fedlib.run_grid(own_config(), {"seed": [0, 1]}, Store(tmp_path), progress=False, jobs=None)
    assert len(table) == 2


def test_grids_without_registrations_keep_their_jobs(monkeypatch):
    assert grids._in_process_only([RunConfig()], 2, "local") is False


def test_from_hf_reads_a_datasets_dataset():
    datasets = pytest.importorskip("datasets")
    x, y = _pool(60)
    images = (np.clip(x[:, 0] * 40 + 128, 0, 255)).astype(np.uint8)  # (n, 6, 6) grey pixels
    ds = datasets.Dataset.from_dict({"img": [im for im in images], "digit": y.tolist()})
    fd = fedlib.data.from_hf(ds, image="img", label="digit", n_clients=3, seed=0)
    assert fd.input_shape == (1, 6, 6) and fd.n_classes == 3
    assert fd.train.x.equal(from_tensors(images[:, None] / np.float32(255), y, n_clients=3, seed=0).train.x)
    with pytest.raises(ValueError, match="image='image' is not a column of the dataset \\(its columns: img, digit\\)"):
        fedlib.data.from_hf(ds, label="digit")
    split = datasets.DatasetDict({"train": ds, "test": ds.select(range(10))})
    with_test = fedlib.data.from_hf(split, image="img", label="digit", test_split="test", n_clients=3)
    assert len(with_test.global_test[1]) == 10 and int(with_test.test.sizes.sum()) == 0
    partitioners = pytest.importorskip("flwr_datasets.partitioner")
    by_flower = fedlib.data.from_hf(ds, image="img", label="digit", partitioner=partitioners.IidPartitioner(4))
    assert by_flower.n_clients == 4 and int(by_flower.train.sizes.sum() + by_flower.test.sizes.sum()) == 60
    with pytest.raises(ValueError, match="train_frac=1.0 with no test set leaves the run nothing to test on"):
        fedlib.data.from_hf(ds, image="img", label="digit", partitioner=partitioners.IidPartitioner(4), train_frac=1.0)
    with pytest.raises(ValueError, match="n_clients given with a partitioner, which decides the clients itself"):
        fedlib.data.from_hf(ds, image="img", label="digit", partitioner=partitioners.IidPartitioner(4), n_clients=2)


def test_a_stored_run_of_a_registration_this_process_lacks_says_so(tmp_path):
    """Read without its registration (a new session that has not registered it again), a user's stored run is
    reported as such, not as a run whose files were tampered with; registered again, it reads."""
    store = Store(tmp_path)
    fedlib.run(own_config(), store, progress=False)
    unregister_dataset("test-pool")
    [problem] = store.damaged()
    assert "config.json names dataset='test-pool', which this process has not registered" in problem
    x, y = _pool()
    fedlib.register_dataset("test-pool", lambda: (x, y))
    assert store.damaged() == [] and store.has(own_config())
