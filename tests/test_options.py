"""Typed config parts: what a method accepts follows from its options class; bounds live with each field.
Each case below was seen passing silently (or failing) on the flat config before the engine redesign."""

import dataclasses
import math
import pickle

import pytest

from fedlib.config.options import METHODS
from fedlib.config.run import LEGACY, DataConfig, LocalConfig, RunConfig, from_dict


@pytest.mark.parametrize(
    "change, message",
    [
        # options a method does not have (the flat config accepted them and gave a second key for the same run)
        (dict(algorithm="fedmcsa-mcsa", sigma=7.0), "sigma set but algorithm='fedmcsa-mcsa' does not use it"),
        (dict(algorithm="pfedme+mcsa", beta=0.5), "beta set but algorithm='pfedme\\+mcsa' does not use it"),
        (dict(algorithm="perfedavg", hf_delta=1e-4), "hf_delta set but algorithm='perfedavg' does not use it"),
        (dict(algorithm="naivemix", mix_taylor_scale="batch"), "mix_taylor_scale set but algorithm='naivemix'"),
        # another method's option newer than the flat schema was called "unknown" (beside a list that named it)
        (dict(algorithm="fedavg", server_momentum=0.5), "server_momentum set but algorithm='fedavg' does not use it"),
        (dict(algorithm="fedprox", by_data_size=True), "by_data_size set but algorithm='fedprox' does not use it"),
        # a hidden tuple of the wrong length was truncated to the model's layers
        (dict(model="dnn", hidden=(20, 30)), "hidden=\\(20, 30\\) has 2 widths but model='dnn' has 1 hidden layer"),
        (dict(model="mlr", hidden=(20,)), "model='mlr' has 0 hidden layer"),
        # wrong types and non-finite numbers
        (dict(algorithm="fedmcsa", mcsa_code="no"), "mcsa_code='no' must be of type bool"),
        (dict(lr=math.nan), "RunConfig.lr=nan must be a finite number"),
        (dict(synthetic_alpha=math.nan), "synthetic_alpha=nan must be a finite number"),
        (dict(algorithm="fedprox", mu=math.inf), "mu=inf must be a finite number"),
        (dict(algorithm="pfedme", momentum=0.5), "momentum set but algorithm='pfedme' takes plain gradient steps"),
        # options that apply only to some data, partitions, selections
        (dict(dataset="mnist", partition="iid", synthetic_beta=1.0), "synthetic_beta=1.0 is set but applies only when"),
        (
            dict(dataset="mnist", partition="iid", dirichlet_alpha=0.1),
            "dirichlet_alpha=0.1 is set but applies only when",
        ),
        (dict(algorithm="local", selection="attention"), "algorithm='local' selects no clients"),
        (dict(bogus=1), "unknown RunConfig field\\(s\\): bogus"),
        (dict(**{"local.bogus": 1}), "unknown RunConfig field 'local.bogus'"),
    ],
)
def test_refused_before_training(change, message):
    with pytest.raises(ValueError, match=message):
        RunConfig(**change).validate()


def test_dotted_and_flat_names_are_one_config():
    a = RunConfig(algorithm="fedprox", mu=0.1, lr=0.05, dataset="mnist", partition="iid", model="dnn")
    b = RunConfig(
        **{
            "method.name": "fedprox",
            "method.mu": 0.1,
            "local.lr": 0.05,
            "data.dataset": "mnist",
            "data.partition": "iid",
            "model.name": "dnn",
        }
    )
    assert a == b and a.key() == b.key()
    assert a.method.mu == a.get("method.mu") == a.get("mu") == a.mu == 0.1 and a.local.lr == 0.05
    assert a.model == "dnn" and a.model.name == "dnn" and a.selection == "uniform"
    c = RunConfig(
        local=LocalConfig(lr=0.05),
        data=DataConfig(dataset="mnist", partition="iid"),
        algorithm="fedprox",
        mu=0.1,
        model="dnn",
    )
    assert c == a
    assert pickle.loads(pickle.dumps(a)) == a  # worker processes receive configs pickled


def test_switching_method_keeps_shared_options_and_refuses_to_drop_others():
    a = RunConfig(algorithm="fedmcsa", lam=15.0)
    assert a.replace(algorithm="pfedme").method.lam == 15.0  # lambda means the same pull in both
    with pytest.raises(ValueError, match="would drop lam=15.0"):
        a.replace(algorithm="fedavg")
    # an option the method lacks, at its schema-1 default, is a no-op (old config.json files list every field)
    assert RunConfig(algorithm="fedavg", mu=0.0, sigma=50.0) == RunConfig()


def test_every_method_option_defaults_to_the_schema1_value():
    """A flat name shared with the schema-1 config must keep its default there, or stored keys would change."""
    for name, cls in METHODS.items():
        for f in dataclasses.fields(cls):
            if f.name in LEGACY:
                assert f.default == LEGACY[f.name], (name, f.name)
        RunConfig(algorithm=name, model="lenet" if cls.LOCAL_GROUPS else "dnn").validate()


def test_flat_view_is_the_schema1_config():
    cfg = RunConfig(algorithm="fedprox", mu=0.1, model="dnn", hidden=(20,))
    flat = cfg.flat()
    assert list(flat)[: len(LEGACY)] == list(LEGACY)
    assert flat["sigma"] == 50.0 and flat["mu"] == 0.1 and flat["model"] == "dnn" and flat["algorithm"] == "fedprox"
    assert from_dict(cfg.to_dict()) == cfg


def test_grids_take_dotted_names():
    from fedlib.runs.grids import expand

    cfgs = expand(RunConfig(algorithm="fedprox"), {"method.mu": [0.01, 0.1], "local.lr": [0.01, 0.02]})
    assert sorted((c.method.mu, c.local.lr) for c in cfgs) == [(0.01, 0.01), (0.01, 0.02), (0.1, 0.01), (0.1, 0.02)]
    assert cfgs[0] == RunConfig(algorithm="fedprox", mu=cfgs[0].mu, lr=cfgs[0].lr)
    with pytest.raises(ValueError, match="sigma set but algorithm='fedprox' does not use it"):
        expand(RunConfig(algorithm="fedprox"), {"method.sigma": [1.0]})


def test_flat_name_resolves_every_dotted_spelling_by_its_part():
    """Grid cells and --where filters: ``model.name`` and ``method.name`` were refused, and ``local.mu`` taken as
    FedProx's mu, when the last component alone was looked up."""
    from fedlib.config.run import flat_name

    assert [flat_name(n) for n in ("lr", "local.lr", "model.name", "selection.rule", "method.name", "method.mu",
                                   "data.dataset", "model.hidden")] == [
        "lr", "lr", "model", "selection", "algorithm", "mu", "dataset", "hidden"]  # fmt: skip
    for bad in ("local.mu", "method.lr", "data.bogus", "bogus"):
        with pytest.raises(ValueError, match="is not a config field"):
            flat_name(bad)
