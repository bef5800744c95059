import os
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _isolated_results(tmp_path, monkeypatch):
    """Every test writes results into its own folder, never into the project's results/."""
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("FEDLIB_CACHE", str(tmp_path / "cache"))


def shared_data_env(environ, shared: Path = SHARED) -> dict:
    """The environment the test session adds: ``FEDLIB_DATA`` pointing at a ``../shared/data``-style folder beside
    the clone when that holds the data and no data root is set. Set in ``pytest_configure``, before any worker or
    notebook kernel starts, so unit tests and nbval (whose kernels inherit the environment) find the same data."""
    if environ.get("FEDLIB_DATA") or not (shared / "MNIST" / "raw").exists():
        return {}
    return {"FEDLIB_DATA": str(shared)}


def pytest_configure(config):
    os.environ.update(shared_data_env(os.environ))


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (what ``make test`` runs), except that each notebook's smoke-profile run
    (``test_notebooks_smoke.py::test_notebook_runs_at_smoke_profile``) is a unit of its own: that file holds a third of
    the suite's work, and as one unit it would keep one worker busy while the other idles."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path, _, name = nodeid.partition("::")
            return nodeid if name.startswith("test_notebook_runs_at_smoke_profile[") else path

    return Scheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """nbval: a notebook whose data sets are absent under the data root is skipped instead of failing on a machine
    without that data: those it needs to run at all (``metadata.fedlib.requires``, as the main job skips it) and
    those its committed paper-profile outputs were drawn with (``metadata.fedlib.outputs_need``: without MNIST,
    notebook 10 runs, on Synthetic only, and its tables differ). ``tests/test_notebooks_smoke.py`` still runs it.
    A session-wide hook, so it sees the notebooks' items too."""
    import json

    from fedlib.data import readers

    missing = {}
    for item in items:
        path = item.path
        if path.suffix != ".ipynb":
            continue
        if path not in missing:
            meta = json.loads(path.read_text()).get("metadata", {}).get("fedlib", {})
            missing[path] = readers.missing(meta.get("requires", []) + meta.get("outputs_need", []))
        if missing[path]:
            item.add_marker(
                pytest.mark.skip(
                    reason=f"data absent: {', '.join(missing[path])}: the committed outputs were made with it "
                    "(see data/README.md)"
                )
            )
