"""Bad input to the command lines and to the experiment API: one clear line naming the argument (or what is absent)
and what it takes, no traceback, the exit codes the command line uses elsewhere (2: a usage error; 1: nothing to
train or show because the data is absent)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pandas as pd
import pytest
from test_bad_input import _cli  # python -m fedlib.experiments in a subprocess

import fedlib
from fedlib.experiments import cli
from fedlib.papers.report import paper_vs_ours
from fedlib.runs.store import Store

ROOT = Path(__file__).resolve().parents[1]


# -- python -m fedlib.experiments: Office grids with the Office data absent ------------------------------------------
OFFICE = {"pfedla_office_table3": "domainnet, office31, officehome", "pfedla_office_fig4": "office31"}


@pytest.mark.parametrize("profile", ["smoke", "paper"])
@pytest.mark.parametrize("dry", [False, True])
@pytest.mark.parametrize("name", sorted(OFFICE))
def test_cli_office_experiment_with_its_data_absent_says_so(name, dry, profile, tmp_path, monkeypatch, capsys):
    """Its grid has cells only for the data sets present, so it reported nothing absent, printed '0 configs' and
    failed with KeyError: "['key'] not found in axis" on the empty table. Now: as for any experiment whose every config
    needs absent data, the data sets it would run on are named and it stops (exit status 1) before training."""
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path / "no-data"))
    with pytest.raises(SystemExit) as stop:
        cli.main([name, "--profile", profile, *(["--dry-run"] if dry else [])])
    assert stop.value.code == (
        f"python -m fedlib.experiments: error: nothing to train or show: every config needs data absent under "
        f"{tmp_path / 'no-data'} ({OFFICE[name]}); put it there or set FEDLIB_DATA (see data/README.md)"
    )
    assert f"data absent, skipped: {OFFICE[name]}" in capsys.readouterr().out
    assert not list(Path(os.environ["FEDLIB_RESULTS"]).rglob("*.json"))  # nothing trained


def test_cli_office_experiment_beside_one_with_data_runs_the_other(tmp_path, monkeypatch, capsys):
    """In a queue with an experiment that has configs, the absent Office data is reported and the rest runs."""
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path / "no-data"))
    assert cli.main(["pfedla_office_fig4", "quickstart", "--profile", "smoke", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "data absent, skipped: office31" in out and "2 configs, 0 stored" in out


def test_cli_office_experiment_end_to_end_exit_status(tmp_path):
    out = _cli("pfedla_office_table3", "--profile", "smoke", env={"FEDLIB_DATA": str(tmp_path)})
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().startswith("python -m fedlib.experiments: error: nothing to train or show")


# -- python -m fedlib.experiments: a bad FEDLIB_PROFILE ----------------------------------------------------------
@pytest.mark.parametrize("args", [["quickstart", "--dry-run"], ["status"], ["quickstart"]])
def test_cli_bad_fedlib_profile_is_a_usage_error(args, monkeypatch, capsys):
    """It was an uncaught ValueError traceback (resolve_profile ran outside the argument checks)."""
    monkeypatch.setenv("FEDLIB_PROFILE", "bogus")
    with pytest.raises(SystemExit) as stop:
        cli.main(args)
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.strip().splitlines()[-1].endswith("error: FEDLIB_PROFILE='bogus' is not one of: smoke, quick, paper")


def test_cli_bad_fedlib_profile_end_to_end():
    out = _cli("quickstart", "--dry-run", env={"FEDLIB_PROFILE": "bogus"})
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "error: FEDLIB_PROFILE='bogus' is not one of: smoke, quick, paper" in out.stderr


# -- fedlib.experiment: inputs and available ------------------------------------------------------------------
WINNERS = "{'winners': the output of fedlib.papers.fedmcsa.tuning.table1_winners, a dict of RunConfigs} or None"
TAKES = f"experiment 'fedmcsa_table1' takes {WINNERS}"


@pytest.mark.parametrize(
    "inputs, says",
    [
        ({"winners": "x"}, f"inputs['winners']='x': {TAKES}"),
        ({"winners": [1, 2]}, f"inputs['winners']=[1, 2]: {TAKES}"),
        (
            {"winners": {("synthetic", "mlr", "FedAvg"): 0.1}},
            f"inputs['winners']={{('synthetic', 'mlr', 'FedAvg'): 0.1}}: {TAKES}",
        ),
        (
            {"winner": {}},
            f"inputs={{'winner': {{}}}}: experiment 'fedmcsa_table1' takes no 'winner'; it takes {WINNERS}",
        ),
        ("winners", f"inputs='winners': {TAKES}"),
    ],
)
def test_experiment_bad_inputs_name_the_argument(inputs, says, tmp_path):
    """A string of winners was AttributeError: 'str' object has no attribute 'values', from inside the grid."""
    store = Store(tmp_path / "store")
    with pytest.raises(ValueError) as err:
        fedlib.experiment("fedmcsa_table1", "smoke", inputs=inputs, progress=False, store=store)
    assert str(err.value) == says
    assert not list(tmp_path.rglob("*.json"))  # refused before the step's experiment trained anything


def test_experiment_inputs_for_an_experiment_without_a_step(tmp_path):
    with pytest.raises(ValueError) as err:
        fedlib.experiment("quickstart", "smoke", inputs={"winners": {}}, stored_only=True, store=Store(tmp_path))
    assert str(err.value) == (
        "inputs={'winners': {}}: experiment 'quickstart' takes no 'winners'; it takes None or {} (only an experiment "
        "with a step takes inputs: fedmcsa_table1 takes 'winners', fedmcsa_table1_partition takes 'winners', "
        "fedmcsa_table1_code_eval takes 'winners')"
    )


@pytest.mark.parametrize("available", [5, "mnist", {"mnist"}])
def test_experiment_bad_available_names_the_argument(available, tmp_path):
    """It was AttributeError: 'int' object has no attribute 'has', from profiles.available_cells."""
    with pytest.raises(ValueError) as err:
        fedlib.experiment("quickstart", "smoke", available=available, progress=False, store=Store(tmp_path))
    assert str(err.value) == (
        f"available={available!r}: must be a fedlib.experiments.profiles.Available (the data sets to count as present, e.g. "
        "fedlib.experiments.profiles.Available.scan()) or None (what is under the data root)"
    )
    assert not list(tmp_path.rglob("*.json"))


# -- report.paper_vs_ours: an unknown table -------------------------------------------------------------------------
def test_paper_vs_ours_unknown_table_names_the_tables_that_exist():
    """It gave an all-NaN paper column, silently."""
    table = pd.DataFrame(
        {"dataset": ["synthetic"], "model": ["mlr"], "algorithm": ["fedavg"], "best_acc": [0.7], "best_acc_mean": [0.5]}
    )
    with pytest.raises(ValueError) as err:
        paper_vs_ours(table, "fedmcsa", "table9")
    assert (
        str(err.value)
        == "which='table9': the stored numbers of paper='fedmcsa' have no such table; they have: table1, table2"
    )
    assert paper_vs_ours(table, "fedmcsa", "table2").paper.notna().all()


# -- scripts/run_notebooks.py --every -------------------------------------------------------------------------------
def _run_notebooks():
    spec = importlib.util.spec_from_file_location("run_notebooks_every", ROOT / "scripts" / "run_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("every", ["nan", "inf"])
def test_run_notebooks_every_must_be_finite_and_positive(every, tmp_path, capsys):
    """``--every nan`` passed the "<= 0" check (every comparison with nan is false); ``inf`` never printed."""
    with pytest.raises(SystemExit) as stop:
        _run_notebooks().main(["--plan", "--every", every, "--dir", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert f"error: --every={float(every):g}: seconds between progress lines, more than 0 (a finite number)" in err
