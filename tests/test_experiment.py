"""The one entry point (``fedlib.experiment``) and the registry behind it (``fedlib.experiments.profiles``): grids are pure
functions of (profile, available data), never of the store; dotted names work in ``where`` and in grid cells."""

import pytest

import fedlib
from fedlib.config.run import flat_field_names
from fedlib.experiments import cli, profiles
from fedlib.experiments import named as experiments
from fedlib.runs.store import Store


@pytest.fixture(autouse=True)
def _no_forced_profile(monkeypatch):
    monkeypatch.delenv("FEDLIB_PROFILE", raising=False)  # `make test` forces smoke


def test_no_grid_reads_the_store(monkeypatch):
    """Every experiment at every profile is built without touching the store (a step's output is an argument)."""

    def refuse(*a, **k):
        raise AssertionError("a grid read the store")

    for name in ("has", "load", "stored", "meta", "configs"):
        monkeypatch.setattr(Store, name, refuse)
    av = profiles.Available(
        frozenset({"synthetic", "mnist", "fmnist", "cifar10"}), (("digits", ("mnist", "usps", "mnist_m")),)
    )
    for name in profiles.EXPERIMENTS:
        for p in fedlib.PROFILES:
            inputs = {profiles.STEPS[name][1]: {}} if name in profiles.STEPS else {}
            base, grid = profiles.get(name, p, av, **inputs)
            assert isinstance(grid, list) and base.validate()


def test_experiment_trains_then_reads_and_stored_only_trains_nothing(tmp_path):
    store = Store(tmp_path)
    dry = fedlib.experiment("quickstart", "smoke", stored_only=True, progress=False, store=store)
    assert dry.profile == "smoke" and len(dry.configs) == 2 and dry.runs == [] and dry.missing_runs == dry.configs
    with pytest.raises(experiments.NothingStoredError):  # nothing to tabulate (see the test below)
        dry.table
    assert not any(tmp_path.iterdir())  # nothing trained
    assert "2 configs, 0 with results (stored only" in str(dry) and "not in the store (2)" in str(dry)
    ex = fedlib.experiment("quickstart", "smoke", progress=False, store=store)
    assert ex.runs == ex.configs and not ex.missing_runs and ex.absent == []
    assert ex.base.get("rounds") == 5 and ex.grid == [{"algorithm": "fedavg"}, {"algorithm": "fedprox", "mu": 0.1}]
    assert list(ex.table.algorithm) == ["fedavg", "fedprox"] and {"best_acc", "mu", "key"} <= set(ex.table)
    assert sorted(ex.frame["round"].unique()) == [1, 2, 3, 4, 5] and set(ex.frame.key) == set(ex.table.key)
    again = fedlib.experiment("quickstart", "smoke", stored_only=True, progress=False, store=store)
    assert list(again.table.key) == list(ex.table.key)  # read back, not retrained (metrics stored at 6 digits)
    assert (again.table.best_acc - ex.table.best_acc).abs().max() < 1e-5
    # seeds replace every cell's; where keeps the matching configs (a list: any of its values)
    two = fedlib.experiment("quickstart", "smoke", seeds=[0, 1], stored_only=True, progress=False, store=store)
    assert [c.get("seed") for c in two.configs] == [0, 1, 0, 1] and len(two.missing_runs) == 2
    one = fedlib.experiment("quickstart", "smoke", where={"algorithm": ["fedprox"]}, stored_only=True, store=store)
    assert [c.get("algorithm") for c in one.configs] == ["fedprox"]


def test_absent_data_is_reported_not_run(monkeypatch, tmp_path):
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path / "no-data"))
    ex = fedlib.experiment("fedmcsa_table2", "paper", stored_only=True, progress=False, store=Store(tmp_path))
    assert ex.absent == ["cifar10", "fmnist", "mnist"] and {c.get("dataset") for c in ex.configs} == {"synthetic"}
    assert len(ex.configs) == 2 * 7 * 3


def test_a_stored_only_experiment_with_nothing_stored_says_so_when_its_results_are_read(monkeypatch, tmp_path):
    """Its ``table`` was an empty frame without columns: notebooks failed a cell later with a KeyError or an
    AttributeError ('DataFrame' object has no attribute 'algorithm'). One run stored: read as usual; no configs (its
    data absent): an empty table, as before."""
    store = Store(tmp_path)
    ex = fedlib.experiment("quickstart", "smoke", stored_only=True, progress=False, store=store)
    says = (
        f"quickstart, profile smoke: none of its 2 runs is in the store {tmp_path} (stored only: nothing trains); "
        "train them with STORED_ONLY = False in the notebook, or python -m fedlib.experiments quickstart --profile smoke"
    )
    for read in (lambda: ex.table, lambda: ex.frame, ex.stored_runs):
        with pytest.raises(experiments.NothingStoredError) as err:
            read()
        assert str(err.value) == says
    fedlib.run(ex.configs[1], store, progress=False)
    ex = fedlib.experiment("quickstart", "smoke", stored_only=True, progress=False, store=store)
    assert ex.table.algorithm.tolist() == [ex.configs[1].get("algorithm")] and len(ex.frame)
    assert ex.stored_runs() == ex.runs == [ex.configs[1]]
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path / "no-data"))
    none = fedlib.experiment("adafl_fig3", "smoke", stored_only=True, progress=False, store=store)
    assert none.configs == [] and none.table.empty


def test_dotted_names_in_where_and_in_grids(tmp_path):
    store = Store(tmp_path)
    flat = fedlib.experiment("fedmcsa_sigma", "smoke", where={"sigma": 0.0}, stored_only=True, store=store)
    dotted = fedlib.experiment("fedmcsa_sigma", "smoke", where={"method.sigma": 0.0}, stored_only=True, store=store)
    assert [c.key() for c in dotted.configs] == [c.key() for c in flat.configs] and len(flat.configs) == 2
    assert profiles.flat_cells([{"local.lr": [0.01, 0.02], "method.mu": 0.1, "seed": 0}]) == [
        {"lr": [0.01, 0.02], "mu": 0.1, "seed": 0}
    ]
    for bad in ({"method.sigmaa": 1}, {"sigmaa": 1}):
        with pytest.raises(ValueError, match="is not a config field") as err:
            fedlib.experiment("fedmcsa_sigma", "smoke", where=bad, stored_only=True, store=store)
        assert ", ".join(sorted(flat_field_names())) in str(err.value)
    with pytest.raises(ValueError, match="'mu' twice"):
        profiles.flat_cells([{"mu": 0.1, "method.mu": 0.2}])


def test_cli_dotted_where_and_the_winners_step(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path))
    assert cli.main(["fedmcsa_sigma", "--profile", "smoke", "--dry-run", "--where", "method.sigma=0.0"]) == 0
    assert "2 configs, 0 stored" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["fedmcsa_sigma", "--profile", "smoke", "--dry-run", "--where", "method.nope=1"])
    err = capsys.readouterr().err
    assert "--where='method.nope=1' must be FIELD=VALUE" in err and "sigma, " in err
    # Table 1: the grid first (queued by name even when not asked for), then the winners step, then stage 2
    assert cli.main(["fedmcsa_table1", "--profile", "smoke", "--dry-run"]) == 0
    out = capsys.readouterr().out
    grid_line = out.index("24 configs, 0 stored")
    step_line = out.index("step table1_winners: 0 winners from 0 of 24 fedmcsa_table1_grid runs stored")
    assert grid_line < step_line


def test_cli_says_when_where_matches_nothing(capsys):
    """A --where that keeps no config is an error listing the values present (not "0 configs" and
    exit status 0)."""
    from fedlib.experiments.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["fedmcsa_fig3", "--profile", "smoke", "--where", "model.name=dnn", "--dry-run"])
    assert stop.value.code == 2
    assert "where={'model': 'dnn'} matches none of the" in capsys.readouterr().err


def test_exploring_profiles_store_apart_from_the_committed_runs(tmp_path, monkeypatch, capsys):
    """Without ``FEDLIB_RESULTS``, the paper profile's runs go to the committed results/ and the exploring profiles'
    to results/_explore/ (git-ignored) wherever the profile is known: a notebook opened in JupyterLab at the quick
    profile stored its runs among the committed paper runs, where ``make notebooks PROFILE=quick`` kept them apart.
    ``FEDLIB_RESULTS`` and a ``store`` argument win; a config run on its own has no profile: results/_explore/,
    reading the committed runs too."""
    from fedlib.runs import store as store_module

    committed, explore = tmp_path / "results", tmp_path / "results" / "_explore"
    monkeypatch.delenv("FEDLIB_RESULTS")
    monkeypatch.setattr(store_module, "committed_root", lambda: committed)
    assert store_module.default_root("paper") == committed
    assert store_module.default_root() == store_module.default_root("quick") == store_module.default_root("smoke")
    assert store_module.default_root() == explore
    assert Store.of(None, "paper").root == committed and Store.of(None, "quick").root == explore
    assert Store.of(None).reads == (committed,) and Store.of(None, "paper").reads == Store.of(None, "quick").reads == ()
    assert Store.of(str(tmp_path / "mine"), "quick").root == tmp_path / "mine"

    def root(profile=None, **kw):
        return fedlib.experiment("quickstart", profile, stored_only=True, progress=False, **kw).store.root

    assert root("paper") == committed and root("quick") == explore and root("smoke") == explore
    # a setting outside the grid (notebook 00's panel) goes to the exploring store, the grid's own to the experiment's
    paper = fedlib.experiment("quickstart", "paper", stored_only=True, progress=False)
    own, other = paper.configs[0], paper.configs[0].replace(lr=0.123)
    assert paper.store_for(own).root == committed and paper.store_for(other).root == explore
    quick = fedlib.experiment("quickstart", "quick", stored_only=True, progress=False)
    assert quick.store_for(quick.configs[0]).root == quick.store_for(other).root == explore
    given = fedlib.experiment("quickstart", "paper", stored_only=True, progress=False, store=tmp_path / "mine")
    assert given.store_for(own).root == given.store_for(other).root == tmp_path / "mine"  # a store given: it alone
    monkeypatch.setenv("FEDLIB_PROFILE", "quick")
    assert root() == explore  # the profile from the environment
    assert root(store=tmp_path / "mine") == tmp_path / "mine"
    monkeypatch.delenv("FEDLIB_PROFILE")
    # a step's prior experiment reads the same store (FedMCSA Table 1: the grid, then its winners)
    table1 = fedlib.experiment("fedmcsa_table1", "smoke", stored_only=True, progress=False)
    assert table1.store.root == table1.after.store.root == explore
    # the CLI: its queue and 'status'
    assert cli.main(["quickstart", "--profile", "smoke", "--dry-run"]) == 0
    assert f"results in {explore}" in capsys.readouterr().out
    seen = []
    monkeypatch.setattr(Store, "has", lambda self, cfg: seen.append(self.root) or False)
    experiments.status("smoke")
    assert set(seen) == {explore}
    assert cli.main(["status", "--profile", "smoke"]) == 0
    assert capsys.readouterr().out.startswith(f"profile smoke, results in {explore}\n")
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path / "env"))
    assert root("quick") == root("paper") == tmp_path / "env"


READERS = {"frame", "curves", "grid_frame", "select", "table1_runs", "table1_winners", "results_frame", "run",
           "run_grid", "run_configs"}  # fmt: skip


def test_notebooks_read_the_store_their_experiments_use():
    """Every store read or run in a notebook names its experiment's store: a reader left to its default
    (``Store()``, then results/) drew the committed paper runs under a quick-profile experiment, whose runs are in
    results/_explore/. Checked in the notebooks' code (``fedlib``'s readers and runs on ``adafl``, ``pfedla``,
    ``fedmcsa``, ``fedlib``); a notebook without an experiment (01) names the store it chose (``Store.of``)."""
    import ast
    import json
    from pathlib import Path

    notebooks = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9]*.ipynb"))
    checked, bad = 0, []
    for path in notebooks:
        named = set()  # names the notebook binds to a store it chose (``store = fedlib.Store.of(None, "quick")``)
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "".join(cell["source"])
            code = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines())
            for node in ast.walk(ast.parse(code)):
                if isinstance(node, ast.Assign) and "Store.of(" in ast.unparse(node.value):
                    named |= {t.id for t in node.targets if isinstance(t, ast.Name)}
                    continue
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                    continue
                owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
                if node.func.attr == "Store" or (owner in ("adafl", "pfedla", "fedmcsa", "fedlib")
                                                 and node.func.attr in READERS):  # fmt: skip
                    checked += 1
                    given = [ast.unparse(a) for a in [*node.args[1:], *(k.value for k in node.keywords)]]
                    if node.func.attr == "Store" or not any(".store" in g or g in named for g in given):  # ex.store
                        bad.append(f"{path.name}: {ast.unparse(node)}")
    assert checked >= 15 and not bad, bad
