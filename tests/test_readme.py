"""The README's Python examples run as printed (its first library example once failed: a grid switching FedProx to
FedAvg would have dropped its mu), and its claims table quotes the reproduction page's numbers."""

import re
from pathlib import Path

import pytest

import fedlib
from fedlib import Store

README = Path(__file__).resolve().parents[1] / "README.md"
REPRODUCTION = README.parent / "docs" / "reproduction.md"


def _blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)


def test_the_readme_has_its_examples():
    blocks = _blocks()
    assert len(blocks) == 3 and "fedlib.experiment(" in blocks[0] and "fedlib.run(cfg)" in blocks[1]
    assert "fedlib.register_model(" in blocks[2]


def test_the_library_example_runs(tmp_path, monkeypatch):
    """At 2 rounds instead of 100 (the same code paths), in a scratch store (``FEDLIB_RESULTS``)."""
    code = next(b for b in _blocks() if "fedlib.run(cfg)" in b)
    assert code.count("rounds=100") == 2
    scope: dict = {}
    exec(compile(code.replace("rounds=100", "rounds=2"), str(README), "exec"), scope)
    assert len(scope["table"]) == 6 and set(scope["table"].algorithm) == {"fedavg", "fedprox"}
    assert len(scope["result"].metrics) == 2 and len(Store().configs()) == 1 + 4 + 6 - 1  # one grid run is cfg's


def test_the_own_data_example_runs(tmp_path, monkeypatch):
    """The user's arrays and model as the example names them (``x``, ``y``, ``MyCNN``), at 5 rounds instead of 50, in
    a scratch store."""
    import numpy as np
    import torch
    from torch import nn

    from fedlib.data.own import unregister_dataset
    from fedlib.models.registry import unregister_model

    class MyCNN(nn.Module):
        def __init__(self, input_shape, n_classes, hidden):
            super().__init__()
            self.conv = nn.Conv2d(input_shape[0], hidden[0], 3, padding=1)
            self.head = nn.Linear(hidden[0] * input_shape[1] * input_shape[2], n_classes)

        def forward(self, x):
            return self.head(torch.relu(self.conv(x)).flatten(1))

    rng = np.random.default_rng(0)
    scope: dict = {"MyCNN": MyCNN, "y": rng.integers(0, 3, 600)}
    scope["x"] = rng.normal(size=(600, 1, 6, 6)).astype(np.float32) + scope["y"][:, None, None, None]
    code = next(b for b in _blocks() if "fedlib.register_model(" in b)
    assert code.count("rounds=50") == 1
    header = "import fedlib\nfrom fedlib import RunConfig\n"
    try:
        exec(compile(header + code.replace("rounds=50", "rounds=5"), str(README), "exec"), scope)
    finally:
        unregister_dataset("mydata")
        unregister_model("mycnn")
    table = scope["table"]
    assert len(table) == 12 and set(table.algorithm) == {"fedavg", "local", "fedmcsa"}
    assert table.best_acc.notna().all()


@pytest.mark.skipif(not (README.parent / "results").is_dir(), reason="no committed store beside the package")
def test_the_experiment_example_reads_the_committed_store(monkeypatch):
    """``fedlib.experiment(..., "paper", stored_only=True)`` over the committed runs: nothing trains."""
    monkeypatch.delenv("FEDLIB_RESULTS")
    code = next(b for b in _blocks() if "fedlib.experiment(" in b)
    scope = {"fedlib": fedlib}
    exec(compile(code, str(README), "exec"), scope)
    ex = scope["ex"]
    assert len(ex.table) > 0 and len(ex.table) + len(ex.missing_runs) == len(ex.configs)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def test_the_claims_table_quotes_the_reproduction_page():
    """The README's claims table is a short form of docs/reproduction.md's, whose numbers tests/test_quoted_numbers.py
    recomputes from the store: each README row names a claim of that table (its first cell, as written there), and
    every number of its finding is in that claim's finding there, so a number cannot drift in the README alone."""
    section = README.read_text().split("## What the papers claim and what we found\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][2:]  # header and its rule dropped
    assert len(rows) == 9
    page = REPRODUCTION.read_text().splitlines()
    for row in rows:
        claim, found, _ = _cells(row)
        theirs = [line for line in page if line.startswith(f"| {claim} | ")]
        assert len(theirs) == 1, f"{REPRODUCTION.name} has {len(theirs)} rows for the claim {claim!r}"
        full = set(re.findall(r"\d+(?:\.\d+)?", _cells(theirs[0])[1]))
        quoted = re.findall(r"\d+(?:\.\d+)?", found)
        assert quoted and not set(quoted) - full, (claim, sorted(set(quoted) - full))


def test_the_citation_block_matches_citation_cff():
    """The README's BibTeX and CITATION.cff name the same version (the package's), titles and authors."""
    cff = (README.parent / "CITATION.cff").read_text()
    bib = re.search(r"^```bibtex\n(.*?)^```", README.read_text(), re.S | re.M).group(1)
    version = re.search(r"^version: (\S+)$", cff, re.M).group(1)
    assert version == fedlib.__version__ and f"version = {{{version}}}" in bib
    flat = re.sub(r"[{}\s]+", " ", bib)
    for title in re.findall(r'^\s+title: "(.*)"$', cff, re.M)[1:]:  # the references' titles (the first is fedlib's)
        assert title in flat, title
    for family in re.findall(r"family-names: (.+)$", cff, re.M):
        assert f"{family}, " in bib, family
