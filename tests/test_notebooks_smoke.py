"""Every notebook's code end to end at the smoke profile (papermill, a scratch store and figure folder): the
training paths the committed notebooks do not take (they draw the paper-profile store, checked by nbval)."""

import json
from pathlib import Path

import pytest
from kernels import IPCKernelManager

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
# the kernels talk over Unix sockets (``IPCKernelManager``), not TCP ports, so these tests run on both test workers
# at once (each smoke-profile run is a unit of its own: ``pytest_xdist_make_scheduler`` in conftest.py)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_at_smoke_profile(path, tmp_path, monkeypatch):
    import papermill as pm

    from fedlib.data import readers

    needs = json.loads(path.read_text()).get("metadata", {}).get("fedlib", {}).get("requires", [])
    if readers.missing(needs):
        pytest.skip(f"data absent: {', '.join(readers.missing(needs))}")
    monkeypatch.setenv("FEDLIB_PROFILE", "smoke")
    monkeypatch.setenv("FEDLIB_FIGURES", str(tmp_path / "figures"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    pm.execute_notebook(
        str(path),
        str(tmp_path / path.name),
        parameters={"PROFILE": "smoke", "STORED_ONLY": False},
        cwd=str(path.parent),
        kernel_name="python3",
        kernel_manager_class=IPCKernelManager,
        progress_bar=False,
        # a smoke cell takes seconds: a cell still running after 10 minutes is a hung kernel connection (seen once on
        # the shared machine), which must fail the test, not stall the test command
        execution_timeout=600,
        start_timeout=120,
    )


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Two smoke stores: an empty one, and one holding every other config of every experiment (the second, fourth,
    ...), as while a long grid is still running."""
    import fedlib
    from fedlib.experiments import profiles
    from fedlib.runs import grids

    partial = tmp_path_factory.mktemp("partial-store")
    for name in profiles.EXPERIMENTS:  # in registry order: a step reads the stage before it
        ex = fedlib.experiment(name, "smoke", stored_only=True, progress=False, store=partial)
        grids.run_configs(ex.configs[1::2], ex.store, progress=False)
    return {"empty": tmp_path_factory.mktemp("empty-store"), "partial": partial}


@pytest.mark.parametrize("state", ["empty", "partial"])
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_stored_only_trains_nothing_and_draws_what_is_stored(path, state, stores, tmp_path, monkeypatch):
    """``STORED_ONLY = True`` over an empty or a partly filled store: the notebook trains nothing (15 trained the run
    it did not find) and draws what is there, or stops at the first table of an experiment with nothing stored,
    saying so (``NothingStoredError``; 8 notebooks failed on empty tables, 16 and 24 on a run missing from one)."""
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    from fedlib.data import readers

    meta = json.loads(path.read_text()).get("metadata", {}).get("fedlib", {})
    if not meta.get("experiments"):
        pytest.skip("draws no stored run")
    if readers.missing(meta.get("requires", [])):
        pytest.skip(f"data absent: {', '.join(readers.missing(meta['requires']))}")
    store = stores[state]
    for k, v in {"FEDLIB_PROFILE": "smoke", "FEDLIB_RESULTS": str(store), "OMP_NUM_THREADS": "1"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("FEDLIB_FIGURES", str(tmp_path / "figures"))
    before = sorted(p.name for p in store.iterdir())
    try:
        pm.execute_notebook(
            str(path), str(tmp_path / path.name), parameters={"PROFILE": "smoke", "STORED_ONLY": True},
            cwd=str(path.parent), kernel_name="python3", kernel_manager_class=IPCKernelManager, progress_bar=False,
            execution_timeout=600, start_timeout=120,
        )  # fmt: skip
    except PapermillExecutionError as e:
        assert e.ename == "NothingStoredError", f"{e.ename}: {e.evalue}"
    assert sorted(p.name for p in store.iterdir()) == before  # nothing trained, nothing snapshotted
