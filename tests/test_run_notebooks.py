"""The main job's runner: absent data skips a notebook (reported once, not crashed), partial data says so, -p grids
expand without overwriting figures, an explicit profile wins, failures count, exploratory results stay out of the
committed store."""

import importlib.util
import json
import re
from pathlib import Path

import nbformat
import pytest

# Ray and Jupyter kernels started the usual way bind TCP ports picked as free a moment before; two started side by
# side on two test workers once lost a reply and hung the test command. make test runs the tests marked ``ports`` in
# a pytest of their own, one at a time, beside the others.
pytestmark = pytest.mark.ports

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("run_notebooks", ROOT / "scripts" / "run_notebooks.py")
runner = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runner)
# tests/conftest.py by its path: ``import conftest`` finds notebooks/conftest.py in a session that collects both
_conftest_spec = importlib.util.spec_from_file_location("tests_conftest", ROOT / "tests" / "conftest.py")
conftest = importlib.util.module_from_spec(_conftest_spec)
_conftest_spec.loader.exec_module(conftest)


def _notebook(path, source, requires=(), experiments=()):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("PROFILE = None\nSTORED_ONLY = False\nX = 1", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(source),
    ]
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "fedlib": {"requires": list(requires), "experiments": list(experiments)},
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
    assert "SKIP 02_needs_cifar.ipynb: data absent (cifar10" in out
    assert "SKIP 02_needs_cifar.ipynb: skipped" not in out  # said once, not "SKIP ...: skipped: ..."
    # the cell (In [3]: after the parameters and the injected ones) and its error, not
    # "FAILED: PapermillExecutionError:" alone
    broken = tmp_path / "out" / "03_broken_X-1.smoke.ipynb"
    assert f"FAILED: cell [3] raised ValueError: boom (traceback in {broken})" in out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [  # nothing half-executed left behind
        "01_ok_X-1.smoke.ipynb",
        "01_ok_X-2.smoke.ipynb",
        "03_broken_X-1.smoke.ipynb",
        "03_broken_X-2.smoke.ipynb",
    ]


def test_partial_data_and_nothing_to_run_are_reported(tmp_path, monkeypatch, capsys):
    """Figure 3 at the paper profile without MNIST draws Synthetic only: 'partial: mnist absent'; AdaFL's Figure 3
    has no cell without MNIST: 'nothing to run: mnist absent'. Neither says 'ok'."""
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "10_fig3.ipynb", "pass", experiments=["fedmcsa_fig3"])
    _notebook(nbs / "21_adafl.ipynb", "pass", experiments=["adafl_fig3"])
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path / "empty-root"))
    code = runner.main(["--dir", str(nbs), "--out", str(tmp_path / "out"), "--profile", "paper", "--stored-only"])
    out = capsys.readouterr().out
    assert code == 0
    summary = out.split("summary:")[1]
    assert "10_fig3.ipynb" in summary and "partial: mnist absent" in summary.split("10_fig3.ipynb")[1].splitlines()[0]
    assert "nothing to run: mnist absent" in summary.split("21_adafl.ipynb")[1].splitlines()[0]
    assert " ok " not in summary
    assert "plan: 7 runs drawn, 7 to train" in out  # the count comes before anything runs


def test_explicit_profile_wins_and_grid_figures_carry_their_parameters(tmp_path, monkeypatch, capsys):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    figs = tmp_path / "figs"
    _notebook(
        nbs / "01_fig.ipynb",
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nfrom fedlib import plotting\n"
        "import fedlib\nopen('profile.txt', 'w').write(fedlib.resolve_profile(PROFILE))\n"
        "plotting.savefig(plt.figure(), '01_fig', PROFILE)",
    )
    monkeypatch.setenv("FEDLIB_FIGURES", str(figs))
    monkeypatch.setenv("FEDLIB_PROFILE", "quick")
    code = runner.main(["--dir", str(nbs), "--out", str(tmp_path / "out"), "--profile", "smoke", "-p", "X=1,2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "wins over FEDLIB_PROFILE='quick'" in out
    assert (nbs / "profile.txt").read_text() == "smoke"
    assert sorted(p.name for p in figs.iterdir()) == ["01_fig_X-1.smoke.png", "01_fig_X-2.smoke.png"]
    runner.main(["--dir", str(nbs), "--out", str(tmp_path / "out"), "--profile", "smoke"])
    assert "01_fig.smoke.png" in [p.name for p in figs.iterdir()]  # the default run keeps its name


def test_the_kernels_log_stays_out_of_the_job_output(tmp_path, capfd):
    """Every notebook printed "[IPKernelApp] WARNING | Kernel is running over TCP without encryption" (and some
    "ERROR | KeyboardInterrupt caught in kernel" at shutdown) among the job's lines; a cell's error still fails it."""
    nbs, out = tmp_path / "nbs", tmp_path / "out"
    nbs.mkdir()
    _notebook(nbs / "01_ok.ipynb", "print('fine')")
    _notebook(nbs / "02_bad.ipynb", "raise ValueError('boom')")
    assert runner.main(["--dir", str(nbs), "--out", str(out), "--profile", "smoke"]) == 1
    seen = capfd.readouterr()
    assert "IPKernelApp" not in seen.out + seen.err
    assert "raised ValueError: boom" in seen.out


def test_parameter_values_become_safe_file_names():
    """``-p`` with a "/" in a value put it into a file name and failed with FileNotFoundError."""
    said = runner.tag({"ROOT": "/data/x y", "SEEDS": [0, 1]})
    assert re.fullmatch(r"ROOT-data_x_y_SEEDS-0_1_h[0-9a-f]{12}", said)  # characters replaced: a hash says which
    assert runner.tag({"PROFILE": "quick", "STORED_ONLY": True, "BACKEND": "ray", "JOBS": 2}) == ""  # same results
    assert runner.tag({"DATA_SEED": 1, "X": "a", "Y": -0.5, "Z": None}) == "DATA_SEED-1_X-a_Y--0.5_Z-None"  # whole


def test_parameter_file_names_are_bounded_and_distinct(tmp_path):
    """A 300-character value failed with "File name too long"; "é" and "ü" (and "a/b" and "a b", the string "1" and
    the number 1) gave one file name, so one run's notebook and figures overwrote the other's."""
    values = ["a" * 300, "a" * 301, "é", "ü", "a/b", "a b", "a_b", "1", 1, 1.0, True, "True", [0, 1], "[0, 1]", "", "_"]
    tags = [runner.tag({"X": v}) for v in values]
    assert len(set(tags)) == len(values), tags
    assert max(map(len, tags)) <= runner.TAG_CHARS + 14
    for t in tags:  # a name the file system takes, of ASCII only
        assert t.isascii() and "/" not in t
        (tmp_path / f"12_fedmcsa_table1_{t}.paper.ipynb").write_text("{}")
    assert runner.tag({"X": 1}) == "X-1" and runner.tag({"X": "a" * 300}) == runner.tag({"X": "a" * 300})


def test_every_notebook_that_trains_takes_a_backend():
    """``-p BACKEND=ray`` runs a notebook's training grid on a Ray cluster: every experiment call takes it."""
    for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        nb = json.loads(path.read_text())
        code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
        calls = sum(src.count("fedlib.experiment(") for src in code)  # what trains (the figures only draw)
        if calls:
            params = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
            assert 'BACKEND = "local"' in "".join(params["source"]), path.name
            assert sum(src.count("backend=BACKEND") for src in code) == calls, path.name
            # and trains what it misses side by side (run_notebooks --jobs)
            assert "\nJOBS = None  #" in "".join(params["source"]), path.name
            assert sum(src.count("backend=BACKEND, jobs=JOBS") for src in code) == calls, path.name


def test_jobs_reaches_the_notebooks_and_the_plan(tmp_path, monkeypatch, capsys):
    """The notebooks train the runs they miss side by side (their ``JOBS = None``: one process per core);
    ``--jobs N`` passes ``JOBS=N`` (``auto``: None), leaves the file names alone, and the plan says how many
    processes will share the training."""
    nbs, out = tmp_path / "nbs", tmp_path / "out"
    nbs.mkdir()
    _notebook(nbs / "01_jobs.ipynb", "open('jobs.txt', 'w').write(repr(globals().get('JOBS', 'its own')))")
    for argv, expected in [([], "'its own'"), (["--jobs", "3"], "3"), (["--jobs", "auto"], "None")]:
        assert runner.main(["--dir", str(nbs), "--out", str(out), "--profile", "smoke", *argv]) == 0
        assert (nbs / "jobs.txt").read_text() == expected
    assert sorted(p.name for p in out.iterdir()) == ["01_jobs.smoke.ipynb"]
    with pytest.raises(SystemExit, match=r"--jobs=0 must be an integer >= 1 or auto \(one process per core\)"):
        runner.main(["--dir", str(nbs), "--out", str(out), "--profile", "smoke", "--jobs", "0"])
    plan = tmp_path / "plan"
    plan.mkdir()
    _notebook(plan / "10_fig3.ipynb", "pass", experiments=["fedmcsa_fig3"])
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path / "empty-root"))
    capsys.readouterr()
    for args, says in [
        (["--jobs", "3"], r"; 3 processes side by side, about [0-9.]+ (s|min|h)\)"),
        (["--jobs", "1"], r"one after another\)"),
        (["-p", "JOBS=None,2"], r"; 2 processes side by side, about [0-9.]+ (s|min|h)\)"),  # a grid over JOBS: its
    ]:  # largest (max() of None failed)
        assert runner.main(["--dir", str(plan), "--out", str(out), "--profile", "paper", "--plan", *args]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("plan: "))
        assert "to train (about " in line and re.search(says + "$", line), line
    # a parameter grid: the plan is the default parameters' (it said "4 to train" where -p DATA_SEED=0,1,2 trained 12)
    assert runner.main(["--dir", str(plan), "--out", str(out), "--profile", "paper", "--plan", "-p", "X=0,1,2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    note = lines[next(i for i, x in enumerate(lines) if x.startswith("plan: ")) + 1]
    assert note == "  (the plan is for the notebooks' default parameters: -p X runs each notebook 3 time(s), and each "\
        "may draw and train other runs)"  # fmt: skip


def test_with_several_processes_every_notebooks_missing_runs_train_first_as_one_grid(tmp_path, monkeypatch, capsys):
    """Two processes: the runs the notebooks miss train before the first notebook, as one grid, so the notebook
    finds them stored. Not with one process (nothing to gain), ``--no-train-first``, or a parameter that may change
    the configs (the plan reads them from the profiles alone)."""
    nbs, out = tmp_path / "nbs", tmp_path / "out"
    nbs.mkdir()
    src = (
        "import fedlib\nex = fedlib.experiment('fedmcsa_fig3', PROFILE, stored_only=True)\n"
        "open('missing.txt', 'w').write(f'{len(ex.missing_runs)} of {len(ex.configs)}')"
    )
    _notebook(nbs / "10_fig3.ipynb", src, experiments=["fedmcsa_fig3"])
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path / "empty-root"))  # Synthetic only
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path / "store"))
    common = ["--dir", str(nbs), "--out", str(out), "--profile", "smoke"]
    assert runner.main(common + ["--jobs", "2", "--plan"]) == 0  # the plan itself never trains
    for argv in ([], ["--jobs", "1"], ["--jobs", "2", "--no-train-first"], ["--jobs", "2", "-p", "X=2"]):
        if argv:  # the notebook reads the store and trains nothing: whatever is stored was trained first
            assert runner.main(common + argv) == 0
            assert (nbs / "missing.txt").read_text().split()[0] != "0"
        assert "TRAIN" not in capsys.readouterr().out
        assert not list((tmp_path / "store").glob("*/config.json"))
    assert runner.main(common + ["--jobs", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    n = int(next(x for x in lines if x.startswith("plan: ")).split(", ")[1].split()[0])
    assert n > 2
    train = lines.index(f"TRAIN {n} runs of every notebook first, as one grid on 2 processes")
    assert lines[train + 1].startswith(f"     {n}/{n} runs stored (")
    assert lines.index("RUN  10_fig3.ipynb") > train  # not "trains N run(s) first": nothing left to train
    assert (nbs / "missing.txt").read_text() == f"0 of {n}"
    assert not runner.pretrainable([{"JOBS": 2}, {"JOBS": 1}]) and runner.pretrainable([{}])
    assert not runner.pretrainable([{"SEEDS": [0]}]) and not runner.pretrainable([{"BACKEND": "ray"}])


@pytest.mark.parametrize("profile, where", [("smoke", "results/_explore"), ("paper", None)])
def test_exploratory_profiles_use_the_ignored_store(tmp_path, monkeypatch, profile, where):
    """An exploring job's kernels store in ``fedlib.runs.store.default_root`` of its profile (``FEDLIB_RESULTS``, so a
    cell's own ``fedlib.run(cfg)`` goes there too); a paper job's kernels find the committed store themselves."""
    from fedlib.runs import store

    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "01_env.ipynb", "import os\nopen('store.txt', 'w').write(os.environ.get('FEDLIB_RESULTS', ''))")
    monkeypatch.delenv("FEDLIB_RESULTS", raising=False)
    monkeypatch.setattr(store, "committed_root", lambda: tmp_path / "results")
    assert runner.main(["--dir", str(nbs), "--out", str(tmp_path / "out"), "--profile", profile]) == 0
    assert (nbs / "store.txt").read_text() == (str(tmp_path / where) if where else "")
    assert "results/_explore/" in (ROOT / ".gitignore").read_text()


@pytest.mark.parametrize("given, expected", [(None, "1"), ("2", "2")])
def test_kernels_train_on_one_thread_unless_told(tmp_path, monkeypatch, given, expected):
    """torch's default threads spun on a busy CPU (four pFedMe runs: 36-77 s against 4.4 s on one thread)."""
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "01_env.ipynb", "import torch\nopen('threads.txt', 'w').write(str(torch.get_num_threads()))")
    if given is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", given)
    assert runner.main(["--dir", str(nbs), "--out", str(tmp_path / "out"), "--profile", "smoke"]) == 0
    assert (nbs / "threads.txt").read_text() == expected


def test_every_notebook_takes_stored_only_and_names_its_experiments():
    import fedlib.experiments.profiles

    for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        nb = json.loads(path.read_text())
        params = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
        assert "STORED_ONLY" in "".join(params["source"]), path.name
        named = set()
        for entry in nb["metadata"]["fedlib"].get("experiments", []):
            name = entry if isinstance(entry, str) else entry["name"]
            assert name in fedlib.experiments.profiles.EXPERIMENTS, (path.name, name)
            named.add(name)
        # every experiment a cell draws is named there, so that the job's plan counts it and trains it first (notebook
        # 31's per-client attention ablation was not: the plan said 696 runs drawn where the notebooks drew 706)
        code = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
        called = set(re.findall(r"fedlib\.experiment\(\s*\"(\w+)\"", code))
        assert called <= named, (path.name, sorted(called - named))


def test_unit_tests_and_nbval_find_the_shared_data_the_same_way(tmp_path):
    """`make test` with ../shared/data beside the clone: the session sets FEDLIB_DATA (inherited by nbval's kernels),
    the notebooks' conftest takes the same hooks, and a data root already set is kept."""
    shared = tmp_path / "shared" / "data"
    (shared / "MNIST" / "raw").mkdir(parents=True)
    assert conftest.shared_data_env({}, shared) == {"FEDLIB_DATA": str(shared)}
    assert conftest.shared_data_env({"FEDLIB_DATA": "/elsewhere"}, shared) == {}
    assert conftest.shared_data_env({}, tmp_path / "none") == {}
    nb_conftest = (ROOT / "notebooks" / "conftest.py").read_text()
    assert "pytest_configure" in nb_conftest and "pytest_collection_modifyitems" in nb_conftest


def test_one_session_collects_the_unit_tests_and_the_notebooks():
    """``pytest tests notebooks --nbval`` once stopped at collection: both folders' conftest.py load as ``conftest``,
    and the unit tests' ``from conftest import small_synthetic`` found the notebooks' one. Their helpers now live in
    tests/helpers.py."""
    import subprocess
    import sys

    tests = sorted(p.name for p in (ROOT / "tests").glob("test_*.py") if "from helpers import" in p.read_text())
    assert tests, "no test imports tests/helpers.py"
    notebook = sorted((ROOT / "notebooks").glob("*.ipynb"))[0]
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", "--nbval"]
    cmd += [f"tests/{name}" for name in tests] + [str(notebook.relative_to(ROOT))]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert notebook.name in out.stdout and "test_fedavgm.py::" in out.stdout


def test_make_lab_allows_root_only_when_root(monkeypatch, tmp_path):
    """``make lab`` runs scripts/lab.py, whose JupyterLab passes --allow-root only when run as root, sets no token,
    opens the working copies and trains its kernels on one thread unless OMP_NUM_THREADS is set."""
    import os
    import subprocess
    import sys

    out = subprocess.run(["make", "-n", "lab"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "scripts/lab.py" in out and "ServerApp.token" not in out
    sys.path.insert(0, str(ROOT / "scripts"))
    import lab

    monkeypatch.setattr(lab, "LAB", tmp_path / "lab")
    monkeypatch.setattr(lab, "ROOT", tmp_path)
    started = []
    monkeypatch.setattr(lab.os, "execvpe", lambda file, cmd, env: started.append((cmd, env)))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    lab.main(["--port", "8891"])
    ((cmd, env),) = started
    assert ("--allow-root" in cmd) == (os.getuid() == 0) and not any("token" in c for c in cmd)
    assert f"--ServerApp.root_dir={tmp_path / 'lab'}" in cmd and env["OMP_NUM_THREADS"] == "1"


def test_nbval_skips_a_notebook_whose_outputs_need_absent_data(tmp_path, monkeypatch):
    """Notebook 10 runs without MNIST (Synthetic only) but its committed tables were drawn with MNIST: nbval must
    skip it there (``metadata.fedlib.outputs_need``), not report differing outputs."""
    nb = tmp_path / "10_x.ipynb"
    nb.write_text(json.dumps({"metadata": {"fedlib": {"requires": [], "outputs_need": ["mnist"]}}}))
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path / "empty-root"))

    class Item:
        path = nb

        def __init__(self):
            self.markers = []

        def add_marker(self, marker):
            self.markers.append(marker)

    item = Item()
    conftest.pytest_collection_modifyitems(None, [item])
    assert item.markers and "mnist" in item.markers[0].kwargs["reason"]


def test_only_and_parameters_that_match_nothing_are_errors(tmp_path, capsys):
    """``--only 99`` ran nothing and exited 0; ``-p NOPE=1`` (papermill injects any name) ran the defaults, silently."""
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    for name in ("01_a.ipynb", "02_b.ipynb"):
        _notebook(nbs / name, "pass")
    run = lambda *a: runner.main(["--dir", str(nbs), "--out", str(tmp_path / "out"), "--profile", "smoke", *a])
    with pytest.raises(SystemExit, match=rf"--only 99,7 matches no notebook in {nbs} \(they start 01, 02\)"):
        run("--only", "01,99,7", "--plan")
    with pytest.raises(SystemExit, match=r"-p NOPE, Y: not a parameter of any of these notebooks \(they take "
                       r"PROFILE, STORED_ONLY, X\)"):  # fmt: skip
        run("-p", "X=2", "-p", "NOPE=1", "-p", "Y=3", "--plan")
    with pytest.raises(SystemExit, match=r"-p NOPE: not a parameter of this notebook"):
        run("--only", "02", "-p", "NOPE=1", "--plan")
    assert run("-p", "X=2", "--jobs", "2", "--plan") == 0  # JOBS, which --jobs adds, is not the user's to name


def test_a_bad_malloc_setting_stops_the_job_before_any_notebook(tmp_path, monkeypatch):
    """Each notebook that trained failed on it with a traceback in its executed copy."""
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "01_a.ipynb", "pass")
    monkeypatch.setenv("FEDLIB_MALLOC", "bogus")
    with pytest.raises(SystemExit, match=r"^FEDLIB_MALLOC='bogus' is not one of: reuse, default"):
        runner.main(["--dir", str(nbs), "--out", str(tmp_path / "out"), "--profile", "smoke"])
    assert not (tmp_path / "out").exists()


def test_job_parameters_are_checked_before_any_kernel_starts(tmp_path, capsys):
    """``-p STORED_ONLY=maybe`` (a true string) drew every notebook from the store and failed on empty tables;
    ``-p BACKEND=slurm``, ``-p JOBS=0`` (or JOBS with BACKEND=ray) failed every notebook in its first cell (the
    checks are ``fedlib.experiment``'s own). ``-p STORED_ONLY=True`` went to the notebooks only: the job still
    planned, and trained, as if it would train."""
    nbs, out = tmp_path / "nbs", tmp_path / "out"
    nbs.mkdir()
    _notebook(nbs / "01_a.ipynb", "open('stored_only.txt', 'w').write(repr(STORED_ONLY))")
    run = lambda *a: runner.main(["--dir", str(nbs), "--out", str(out), "--profile", "smoke", *a])
    for args, says in [
        (["-p", "STORED_ONLY=maybe"], r"-p STORED_ONLY takes one value, True or False \(got 'maybe'\)"),
        (["-p", "STORED_ONLY=True,False"], "-p STORED_ONLY takes one value, True or False"),
        (["-p", "STORED_ONLY=1"], r"-p STORED_ONLY takes one value, True or False \(got 1\)"),
        (["--stored-only", "-p", "STORED_ONLY=False"], "--stored-only and -p STORED_ONLY=False disagree"),
        (
            ["-p", "BACKEND=slurm"],
            r"-p BACKEND=slurm: backend='slurm' must be 'local' \(this machine's processes\), 'ray'",
        ),
        (
            ["-p", "JOBS=0"],
            r"-p JOBS=0: jobs=0 must be an integer >= 1, or None \(one process per core: default_jobs\)",
        ),
        (["-p", "JOBS=auto"], r"-p JOBS=auto: jobs='auto' must be an integer >= 1, or None"),
        (["-p", "BACKEND=ray", "-p", "JOBS=2"], r"-p BACKEND=ray, -p JOBS=2: jobs=2 is for backend='local'; on Ray"),
    ]:
        with pytest.raises(SystemExit, match=says):
            run(*args)
        assert not out.exists()
    assert run("-p", "STORED_ONLY=True") == 0
    assert "(stored only: nothing trains)" in capsys.readouterr().out  # the job's own mode, not just the notebook's
    assert (nbs / "stored_only.txt").read_text() == "True"


def test_stored_only_skips_a_notebook_with_nothing_stored(tmp_path, monkeypatch, capsys):
    """Drawn from an empty store (``make notebooks STORED_ONLY=1 PROFILE=quick`` before training), 8 of the 19
    notebooks failed on empty tables (KeyError, AttributeError). Now they are skipped, saying why; one with a run
    stored is drawn; with a parameter that may change the configs (the plan reads the profiles' alone) the notebook
    runs and says it (``NothingStoredError``)."""
    nbs, out = tmp_path / "nbs", tmp_path / "out"
    nbs.mkdir()
    src = "import fedlib\nfedlib.experiment('quickstart', PROFILE, stored_only=STORED_ONLY).table"
    _notebook(nbs / "00_quick.ipynb", src, experiments=["quickstart"])
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path / "store"))
    run = lambda *a: runner.main(["--dir", str(nbs), "--out", str(out), "--profile", "smoke", "--stored-only", *a])
    assert run() == 0
    said = capsys.readouterr().out
    assert "SKIP 00_quick.ipynb: nothing stored at profile smoke (2 runs; without --stored-only they train)" in said
    assert not out.exists() or not list(out.iterdir())
    assert run("-p", "X=2") == 1
    said = capsys.readouterr().out
    assert "FAILED: cell [3] raised NothingStoredError: quickstart, profile smoke: none of its 2 runs is in " in said
    import fedlib

    ex = fedlib.experiment("quickstart", "smoke", stored_only=True)
    fedlib.run(ex.configs[0], progress=False)
    assert run() == 0 and re.search(r"\n  00_quick.ipynb +ok \(", capsys.readouterr().out)


def test_folders_and_the_progress_interval_are_checked(tmp_path, capsys):
    """``--dir`` naming no folder (or one without notebooks) ran nothing and exited 0; ``--out`` naming a file was a
    FileExistsError traceback; ``--every 0`` re-read the running notebook without pause."""
    nbs, afile = tmp_path / "nbs", tmp_path / "afile"
    nbs.mkdir()
    afile.write_text("")
    run = lambda *a: runner.main(["--profile", "smoke", "--plan", "--out", str(tmp_path / "out"), *a])
    for args, says in [
        (["--dir", str(tmp_path / "none")], f"--dir {tmp_path / 'none'}: no such folder"),
        (["--dir", str(nbs), "--out", str(afile)], f"--out {afile}: not a folder"),
        (["--dir", str(nbs), "--every", "0"], "--every=0: seconds between progress lines, more than 0"),
    ]:
        with pytest.raises(SystemExit) as stop:
            run(*args)
        assert stop.value.code == 2 and says in capsys.readouterr().err
    with pytest.raises(SystemExit, match=f"no numbered notebooks \\(00_name.ipynb, ...\\) in {nbs}"):
        run("--dir", str(nbs))
