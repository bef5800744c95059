"""The README's Python examples run as printed (its first library example once failed: a grid switching FedProx to
FedAvg would have dropped its mu)."""

import re
from pathlib import Path

import pytest

import fedlib
from fedlib import Store

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)


def test_the_readme_has_its_examples():
    blocks = _blocks()
    assert len(blocks) == 2 and "fedlib.experiment(" in blocks[0] and "fedlib.run(cfg)" in blocks[1]


def test_the_library_example_runs(tmp_path, monkeypatch):
    """At 2 rounds instead of 100 (the same code paths), in a scratch store (``FEDLIB_RESULTS``)."""
    code = next(b for b in _blocks() if "fedlib.run(cfg)" in b)
    assert code.count("rounds=100") == 2
    scope: dict = {}
    exec(compile(code.replace("rounds=100", "rounds=2"), str(README), "exec"), scope)
    assert len(scope["table"]) == 6 and set(scope["table"].algorithm) == {"fedavg", "fedprox"}
    assert len(scope["result"].metrics) == 2 and len(Store().configs()) == 1 + 4 + 6 - 1  # one grid run is cfg's


@pytest.mark.skipif(not (README.parent / "results").is_dir(), reason="no committed store beside the package")
def test_the_experiment_example_reads_the_committed_store(monkeypatch):
    """``fedlib.experiment(..., "paper", stored_only=True)`` over the committed runs: nothing trains."""
    monkeypatch.delenv("FEDLIB_RESULTS")
    code = next(b for b in _blocks() if "fedlib.experiment(" in b)
    scope = {"fedlib": fedlib}
    exec(compile(code, str(README), "exec"), scope)
    ex = scope["ex"]
    assert len(ex.table) > 0 and len(ex.table) + len(ex.missing_runs) == len(ex.configs)
