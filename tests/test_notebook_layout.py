"""How the committed paper notebooks read: each opens with its result, its committed outputs hold no progress bar,
its markdown no raw superscript, and a grid over stored runs draws no bar at all.

A reader opening notebook 13 met a frozen "grid (0 to run, 126 stored): 0%" bar, then the settings and nine bullets
of choices, and reached the conclusion at 8,300 of 9,800 pixels; markdown showed `FedMCSA^-MCSA` raw.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedlib.config.run import RunConfig
from fedlib.runs import grids
from fedlib.runs.store import Store

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
PAPER = [p for p in NOTEBOOKS if p.name[0] in "123"]  # 00_quickstart is no paper's notebook
TINY = RunConfig(n_clients=4, clients_per_round=2, rounds=2, local_steps=2, model="mlr")
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def text(cell: dict) -> str:
    return "".join(cell["source"])


def reading(path: Path) -> str:
    """The Reading (a markdown cell opening with ``## Reading`` or ``**Reading.**``), or, for a notebook without
    one, every markdown cell but the Result."""
    md = [text(c) for c in cells(path) if c["cell_type"] == "markdown"]
    found = [s for s in md if s.lstrip().startswith(("## Reading", "**Reading.**"))]
    return "\n".join(found or [s for s in md if not s.startswith("## Result")])


@pytest.mark.parametrize("path", PAPER, ids=[p.stem for p in PAPER])
def test_paper_notebook_opens_with_its_result(path):
    """Title, then the Result (paper vs ours), then its figure where it has one, before the setting and any code."""
    nb = cells(path)
    assert nb[0]["cell_type"] == "markdown" and text(nb[0]).startswith("# ") and "\n" not in text(nb[0]).strip()
    assert nb[1]["cell_type"] == "markdown" and text(nb[1]).startswith("## Result\n"), path.name
    if nb[2]["cell_type"] == "code":  # the main figure, the committed one (the notebook draws it again below)
        (name,) = re.findall(r'"([\w.]+\.paper\.png)"', text(nb[2]))
        assert (ROOT / "figures" / name).is_file(), name
        assert [o["data"]["text/plain"] for o in nb[2]["outputs"]] == [["<IPython.core.display.Image object>"]]
        assert "image/png" in nb[2]["outputs"][0]["data"]
        setting = nb[3]
    else:
        setting = nb[2]
    assert setting["cell_type"] == "markdown" and text(setting).startswith("## Setting")
    # the result comes first: no code (but the figure) before the parameters cell
    params = next(i for i, c in enumerate(nb) if "parameters" in c["metadata"].get("tags", []))
    assert params == nb.index(setting) + 1, path.name


@pytest.mark.parametrize("path", PAPER, ids=[p.stem for p in PAPER])
def test_result_quotes_only_numbers_of_the_reading(path):
    """The Result is a short form of the Reading, whose numbers tests/test_quoted_numbers.py recomputes from the
    store: a number typed into the Result alone could drift from the store unseen."""
    # what the numbers quote, not what they name: "Figure 3", "Table 2's", "notebook 31"
    result = re.sub(r"\b(?:Figures?|Tables?|notebooks?|Sec\.) \d+", "", text(cells(path)[1]))
    stated = set(NUMBER.findall(reading(path)))
    assert not [n for n in NUMBER.findall(result) if n not in stated], path.name


def _bars(path: Path) -> list[str]:
    out = []
    for c in cells(path):
        for o in c.get("outputs", []):
            plain = "".join(o.get("data", {}).get("text/plain", "")) + "".join(o.get("text", ""))
            if re.search(r"\d+%\|", plain) or "it/s]" in plain:
                out.append(plain.strip()[:80])
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_outputs_hold_no_progress_bar(path):
    """A saved bar shows the state it was first drawn in (a widget's later updates are not in the file): every
    committed notebook showed "0%" for a grid that had finished loading."""
    assert not _bars(path)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_markdown_has_no_raw_superscripts_or_subscripts(path):
    """``FedMCSA^-MCSA`` and ``Σ_{t ≤ T*}`` render as typed outside math: markdown writes them
    ``FedMCSA<sup>−MCSA</sup>``, ``Σ<sub>t ≤ T*</sub>`` (or inside ``$...$``)."""
    for c in cells(path):
        if c["cell_type"] == "markdown":
            plain = re.sub(r"`[^`]*`|\$[^$]*\$", "", text(c))
            assert "^" not in plain and "_{" not in plain, (path.name, text(c)[:80])


def test_grid_draws_a_bar_only_while_runs_train(tmp_path, monkeypatch):
    """Over stored runs the grid only loads them: no bar (it would stay in a notebook's output as "0 to run: 0%");
    while runs train, a bar that is cleared when done."""
    made = []

    class Bar(list):
        def __init__(self, items, **kw):
            super().__init__(items)
            made.append(kw)

    monkeypatch.setattr(grids, "tqdm", Bar)
    store = Store(tmp_path)
    cfgs = [TINY, TINY.replace(seed=1)]
    grids.run_configs(cfgs, store, batch=1)
    assert made == [{"desc": "grid (2 to run, 0 stored)", "disable": False, "leave": False}]
    made.clear()
    grids.run_configs(cfgs, store, batch=1)
    assert made == [{"desc": "grid (0 to run, 2 stored)", "disable": True, "leave": False}]
    made.clear()
    grids.run_configs(cfgs, store, progress=False, batch=1)
    assert made[0]["disable"] is True
