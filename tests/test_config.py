"""Configs are validated before any training, with errors naming the field and the allowed values."""

import pytest

from fedlib.config.run import RunConfig, from_dict, resolve_profile


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(dataset="cifar100"), "RunConfig.dataset='cifar100' is not one of: synthetic, mnist, fmnist, cifar10"),
        (dict(partition="shards"), "RunConfig.partition='shards' is not one of: natural"),
        (
            dict(dataset="mnist", partition="natural"),
            "RunConfig.partition='natural' is not one of: labels, shards, iid, dirichlet",
        ),
        (dict(model="resnet"), "RunConfig.model='resnet' is not one of: mlr, dnn, mlp"),  # the registry's first entries
        (
            dict(algorithm="fedsgd"),
            "RunConfig.algorithm=.fedsgd. is not one of: fedavg, fedprox, fedmcsa, fedmcsa-mcsa, fedavg\\+mcsa, heurfedamp, local, pfedme, pfedme\\+mcsa, perfedavg, perfedavg-hf",
        ),
        (dict(executor="gpu"), "RunConfig.executor='gpu' is not one of: auto, stacked, loop"),
        (dict(dtype="float16"), "RunConfig.dtype='float16' is not one of: float32, float64"),
        (dict(rounds=0), "RunConfig.rounds=0 must be a number >= 1"),
        (dict(rounds=2.5), "RunConfig.rounds=2.5 must be an integer"),
        (dict(lr=0.0), "RunConfig.lr=0.0 must be > 0"),
        (dict(momentum=1.0), "RunConfig.momentum=1.0 must be in \\[0, 1\\)"),
        (dict(train_frac=0.0), "RunConfig.train_frac=0.0 must be in \\(0, 1\\]"),
        (dict(fraction=0.1), "give clients_per_round or fraction, not both"),
        (dict(local_steps=None), "local_steps or local_epochs must be set"),
        (
            dict(local_epochs=2),
            "give local_steps or local_epochs, not both .* local_epochs=2 would override local_steps=20",
        ),
        (dict(mu=0.1), "mu set but algorithm='fedavg' does not use it"),
        (dict(hidden=[20]), "RunConfig.hidden=\\[20\\] must be None or a tuple of positive ints"),
        (dict(clients_per_round=0), "RunConfig.clients_per_round=0 must be a number >= 1"),
    ],
)
def test_validation_messages(change, message):
    with pytest.raises(ValueError, match=message):
        RunConfig().replace(**change).validate()


def test_defaults_are_valid_and_fedmcsa_like():
    cfg = RunConfig().validate()
    assert (cfg.lr, cfg.batch_size, cfg.local_steps, cfg.clients_per_round, cfg.train_frac) == (0.02, 20, 20, 20, 0.75)


def test_key_is_stable_and_ignores_defaults():
    a = RunConfig(rounds=5)
    assert a.key() == RunConfig(rounds=5, lr=0.02).key()  # spelling out a default does not change the key
    assert a.key() != RunConfig(rounds=6).key()
    # golden: stored results are found by key, so a change here orphans every stored run (bump SCHEMA on purpose)
    assert RunConfig().key() == "7c68ff863f437620"
    assert from_dict(a.to_dict()) == a
    assert from_dict(RunConfig(hidden=(20,)).to_dict()).hidden == (20,)
    with pytest.raises(ValueError, match="unknown RunConfig field\\(s\\): bogus"):
        from_dict({"bogus": 1})


def test_profile_resolution(monkeypatch):
    monkeypatch.delenv("FEDLIB_PROFILE", raising=False)
    assert resolve_profile() == "quick"
    assert resolve_profile("paper") == "paper"
    monkeypatch.setenv("FEDLIB_PROFILE", "smoke")
    assert resolve_profile() == "smoke"  # CI forces smoke where nothing is named
    # an explicit profile beats the environment, and says so (not silently)
    with pytest.warns(UserWarning, match="profile='paper' given explicitly wins over FEDLIB_PROFILE='smoke'"):
        assert resolve_profile("paper") == "paper"
    monkeypatch.setenv("FEDLIB_PROFILE", "huge")
    with pytest.raises(ValueError, match="FEDLIB_PROFILE='huge' is not one of: smoke, quick, paper"):
        resolve_profile()
    with pytest.raises(ValueError, match="profile='bogus' is not one of: smoke, quick, paper"):
        resolve_profile("bogus")


# the packages that read configs through the typed parts only (the others follow once they do)
TYPED_READERS = ("config", "core", "algorithms", "data", "runs", "experiments")
CONFIG_NAMES = ("cfg", "config", "base", "first", "c")  # what the library calls a RunConfig


def test_library_reads_configs_through_the_typed_parts():
    """Inside these packages a RunConfig's fields are read as ``cfg.local.lr``, ``cfg.data.dataset``,
    ``cfg.method.NAME``, not by flat name (``cfg.lr``, ``cfg.get("dataset")``, ``cfg.algorithm``): the flat names are
    for users and stored ``config.json`` files (``fedlib.config.legacy``). A ``get`` of a top-level field
    (``rounds``) stays: it reads a RunConfig and a stored run's flat dict alike (``fedlib.runs.estimates``)."""
    import ast
    from pathlib import Path

    from fedlib.config.parts import PARTS, TOP
    from fedlib.config.run import flat_field_names

    flat_only = (set(flat_field_names()) | {"algorithm"}) - set(TOP) - set(PARTS)
    root = Path(__file__).resolve().parents[1] / "fedlib"
    found = []
    for package in TYPED_READERS:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
                    continue
                if node.value.id not in CONFIG_NAMES:
                    continue
                if node.attr in flat_only:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.value.id}.{node.attr}")
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get"
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id in CONFIG_NAMES
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value in flat_only
                ):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.func.value.id}.get(...)")
    assert not found, "flat names read inside the library (use the typed parts):\n" + "\n".join(found)
