import os
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlib.data.federated import FederatedData
from fedlib.data.synthetic import synthetic

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _isolated_results(tmp_path, monkeypatch):
    """Every test writes results into its own folder, never into the project's results/."""
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("FEDLIB_CACHE", str(tmp_path / "cache"))


def small_synthetic(n_clients=6, rows=120, dtype=torch.float64) -> FederatedData:
    """A few Synthetic(0.5, 0.5) clients cut to ``rows`` rows each, split 75/25."""
    xs, ys = synthetic(n_clients=n_clients, seed=0)
    xs, ys = [x[:rows] for x in xs], [y[:rows] for y in ys]
    tr = [np.arange(int(0.75 * len(y))) for y in ys]
    te = [np.arange(int(0.75 * len(y)), len(y)) for y in ys]
    return FederatedData.from_clients("small", xs, ys, tr, te, 10).to("cpu", dtype)


def shared_data_env(environ, shared: Path = SHARED) -> dict:
    """The environment the test session adds: ``FEDLIB_DATA`` pointing at a ``../shared/data``-style folder beside
    the clone when that holds the data and no data root is set. Set in ``pytest_configure``, before any worker or
    notebook kernel starts, so unit tests and nbval (whose kernels inherit the environment) find the same data."""
    if environ.get("FEDLIB_DATA") or not (shared / "MNIST" / "raw").exists():
        return {}
    return {"FEDLIB_DATA": str(shared)}


def pytest_configure(config):
    os.environ.update(shared_data_env(os.environ))


def shared_data_root():
    root = Path(os.environ.get("FEDLIB_DATA", SHARED))
    return root if (root / "MNIST" / "raw").exists() else None


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
