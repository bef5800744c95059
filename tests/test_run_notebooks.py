"""The main job's runner: absent data skips a notebook (reported, not crashed), -p grids expand, failures count."""

import importlib.util
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("run_notebooks", ROOT / "scripts" / "run_notebooks.py")
runner = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runner)


def _notebook(path, source, requires=()):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("PROFILE = None\nX = 1", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(source),
    ]
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "fedlib": {"requires": list(requires)},
    }
    nbformat.write(nb, path)


def test_grid_expansion():
    assert runner._grid([]) == [{}]
    assert runner._grid(["A=1,2", "B=x"]) == [{"A": 1, "B": "x"}, {"A": 2, "B": "x"}]
    assert runner._grid(["L=[1, 2]"]) == [{"L": [1, 2]}]
    with pytest.raises(SystemExit, match="expected NAME=VALUE"):
        runner._grid(["oops"])


def test_runner_skips_absent_data_runs_the_rest_and_reports_failures(tmp_path, monkeypatch, capsys):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "01_ok.ipynb", "open('out_%s_%s.txt' % (PROFILE, X), 'w').write('done')")
    _notebook(nbs / "02_needs_cifar.ipynb", "raise RuntimeError('must not run')", requires=["cifar10"])
    _notebook(nbs / "03_broken.ipynb", "raise ValueError('boom')")
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path / "empty-root"))
    monkeypatch.delenv("FEDLIB_PROFILE", raising=False)
    code = runner.main(["--dir", str(nbs), "--out", str(tmp_path / "out"), "--profile", "smoke", "-p", "X=1,2"])
    out = capsys.readouterr().out
    assert code == 1  # the broken notebook fails the job
    assert (nbs / "out_smoke_1.txt").exists() and (nbs / "out_smoke_2.txt").exists()  # grid over X
    assert "SKIP 02_needs_cifar.ipynb: skipped: data absent (cifar10" in out
    assert "FAILED: PapermillExecutionError" in out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "01_ok_X-1.smoke.ipynb",
        "01_ok_X-2.smoke.ipynb",
        "03_broken_X-1.smoke.ipynb",
        "03_broken_X-2.smoke.ipynb",
    ]
