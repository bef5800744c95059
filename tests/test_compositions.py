"""The papers' parts compose: presets expand to their fields, every combination of selection rule x method x local
module x model kind (x a paper's local settings) either trains or is refused at ``validate``, and the table in
docs/compositions.md says which (``fedlib.config.compositions``).

Every cell that runs trains on tiny data (a few clients of 16 samples; 8x8 images for the CNN, 16x16 for LeNet):
``load_federated`` is replaced by a generator, so what is under test is the config -> method -> model -> executor
path, not the readers. Two rounds, five for AdaFL's schedule (its F = 5 steps need T >= 5)."""

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from fedlib.config import compositions as C
from fedlib.config import presets
from fedlib.config.run import RunConfig
from fedlib.data.federated import FederatedData
from fedlib.models.registry import MODELS
from fedlib.runs import train as train_module

DOC = Path(__file__).resolve().parents[1] / "docs" / "compositions.md"
BEGIN, END = "<!-- compositions:begin -->", "<!-- compositions:end -->"
SHAPES = {"chain": (60,), "head": (60,), "conv": (1, 8, 8), "bn": (1, 16, 16)}
HIDDEN = {"chain": (8,), "head": (), "conv": (8, 8), "bn": (8, 8)}
PAIRS = C.pair_outcomes()
GRID = [c for c in C.cells() if c.local is None]  # the local settings: their own test (cheapest kind)
RUNS = [c for c in GRID if not C.factored(c, PAIRS)]
REFUSED = [c for c in GRID if C.factored(c, PAIRS)]


def _tiny(cfg, data_root=None) -> FederatedData:
    """Clients of 16 standard-normal samples of the kind's shape (12 to train, 4 to test), random labels."""
    g = np.random.default_rng(cfg.seed)
    n, rows = cfg.data.n_clients, 16
    shape = SHAPES[C.kind_of(cfg.model.name)]
    xs = [g.normal(size=(rows, *shape)).astype(np.float32) for _ in range(n)]
    ys = [g.integers(0, 10, rows) for _ in range(n)]
    return FederatedData.from_clients("tiny", xs, ys, [np.arange(12)] * n, [np.arange(12, rows)] * n, 10)


def _train(cell: C.Cell, monkeypatch):
    cfg = cell.config().replace(hidden=HIDDEN[cell.kind], rounds=5 if cell.selection == "adafl" else 2)
    monkeypatch.setattr(train_module, "load_federated", _tiny)
    result = train_module.train(cfg, progress=False)
    m = result.metrics
    assert len(m) == cfg.rounds, cell  # no divergence stopped it early
    for col in ("test_acc", "test_loss"):
        assert np.isfinite(m[col].to_numpy()).all(), (cell, col, m[col].tolist())
    return cfg, result


# -- presets -----------------------------------------------------------------------------------------------------
def test_adafl_selection_is_its_fields_under_one_key():
    explicit = RunConfig(
        algorithm="fedmcsa", selection="attention", fraction_schedule=(0.1, 0.5, 5), clients_per_round=None
    )
    named = RunConfig(algorithm="fedmcsa", selection="adafl")
    assert named == explicit and named.key() == explicit.key()
    assert named.changed() == {
        "algorithm": "fedmcsa", "clients_per_round": None, "fraction_schedule": (0.1, 0.5, 5), "selection": "attention"
    }  # fmt: skip
    assert RunConfig(clients_per_round=5, fraction=None).replace(selection="adafl") == named.replace(algorithm="fedavg")
    assert RunConfig(**{"selection.rule": "adafl"}) == RunConfig(selection="adafl")
    assert presets.presets_of(named)["selection"] == "adafl"
    assert "selection" not in presets.presets_of(RunConfig(selection="attention"))


def test_adafl_local_settings_are_visible_and_never_implied():
    cfg = RunConfig(algorithm="fedprox", mu=0.01, local="adafl")
    want = {"lr": 0.01, "momentum": 0.5, "local_epochs": 5, "local_steps": None, "batch_size": 10}
    assert {k: cfg.changed()[k] for k in want} == want
    assert all(f"{k}={v!r}" in repr(cfg.local) for k, v in want.items())
    # AdaFL's selection does not bring AdaFL's optimiser with it
    sel = RunConfig(algorithm="fedprox", selection="adafl")
    assert sel.local == RunConfig().local and not set(want) & set(sel.changed())
    assert presets.presets_of(cfg)["local"] == "adafl" and presets.presets_of(sel)["local"] == "fedmcsa"


def test_fields_beside_a_preset_win():
    cfg = RunConfig(selection="adafl", attn_decay=0.8, local="adafl", lr=0.05)
    assert cfg.selection.attn_decay == 0.8 and cfg.selection.fraction_schedule == (0.1, 0.5, 5)
    assert cfg.local.lr == 0.05 and cfg.local.momentum == 0.5
    assert RunConfig(selection="adafl", **{"selection.rule": "uniform"}).selection.rule == "uniform"


def test_unknown_preset_names_the_presets():
    with pytest.raises(ValueError, match=r"RunConfig.local='adafI' must be a LocalConfig or .* 'adafl' \(lr=0.01"):
        RunConfig(local="adafI")
    with pytest.raises(
        ValueError, match=r"RunConfig.selection='adafI' is not one of: uniform, attention, power_of_choice, or a preset"
    ):
        RunConfig(selection="adafI").validate()
    with pytest.raises(TypeError, match="RunConfig.local=5 must be a LocalConfig"):
        RunConfig(local=5)


def test_a_conflicting_field_beside_a_preset_is_refused_at_validate():
    cfg = RunConfig(selection="adafl", clients_per_round=10)  # the user's S beside AdaFL's schedule
    with pytest.raises(ValueError, match="fraction_schedule replaces clients_per_round and fraction"):
        cfg.validate()
    with pytest.raises(ValueError, match=r"horizon T=3 must be an integer >= F=5"):  # AdaFL's F = 5 steps need T >= 5
        RunConfig(selection="adafl", rounds=3).validate()


# -- the table ---------------------------------------------------------------------------------------------------
def test_doc_table_is_generated():
    text = DOC.read_text()
    block = text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"
    assert block == C.markdown(), "docs/compositions.md is stale: run python scripts/compositions.py"


def test_the_script_rewrites_only_the_block(tmp_path):
    sys.path.insert(0, str(DOC.parents[1] / "scripts"))
    import compositions as script

    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\nprose\n\n{BEGIN}\n| stale | table |\n{END}\n\nmore prose\n")
    script.main(["--doc", str(page)])
    assert page.read_text() == f"# Title\n\nprose\n\n{BEGIN}\n{C.markdown()}{END}\n\nmore prose\n"
    page.write_text("no markers")
    with pytest.raises(SystemExit, match="no <!-- compositions:begin -->"):
        script.main(["--doc", str(page)])


def test_the_pairs_decide_every_cell():
    """A cell runs iff all its pairs run, and is refused with one of its pairs' messages: so the doc's pair tables
    say what happens to every cell of the grid."""
    wrong = []
    for cell in C.cells():
        why, pairs = C.refusal(cell.config()), C.factored(cell, PAIRS)
        if (why is None) != (not pairs) or (why is not None and why not in pairs):
            wrong.append((cell.name(), why, pairs))
    assert wrong == []


def test_the_grid_has_both_outcomes():
    """The teeth of the grid: it holds refused cells (Local with a selection rule, FedBN without BatchNorm, a local
    module without slots), so a refusal that stopped refusing would move a cell into ``RUNS`` and train it."""
    names = {c.name() for c in REFUSED}
    assert {"local-adafl-none-chain", "local-power_of_choice-none-chain", "fedbn-uniform-none-chain"} <= names
    assert "fedavg-uniform-se-conv" in names
    assert {"fedmcsa-adafl-hybrid-bn", "fedbn-attention-ca-bn", "scaffold-adafl-none-conv"} <= {c.name() for c in RUNS}


@pytest.mark.parametrize("model", list(MODELS))
def test_every_model_behaves_as_its_kind(model):
    """The table's kinds stand for every registered model: each one's outcomes are its representative's."""
    kind = C.kind_of(model)
    for cell in (c for c in GRID if c.kind == kind):
        mine, theirs = C.refusal(cell.config(model=model)), C.refusal(cell.config())
        assert (mine is None) == (theirs is None), (model, cell)


# -- every cell ----------------------------------------------------------------------------------------------------
# what a refusal of each pair must name: the field, and the method where the method is one of the two
NAMES = {
    ("method", "selection"): ("algorithm=", "selection"),
    ("method", "kind"): ("algorithm=", "model="),
    ("method", "module"): ("algorithm=", "attention="),
    ("method", "local"): ("algorithm=", "momentum"),
    ("module", "kind"): ("attention=", "model="),
}


@pytest.mark.parametrize("cell", REFUSED, ids=C.Cell.name)
def test_refused_cell_is_refused_before_training(cell, monkeypatch):
    cfg = cell.config().replace(hidden=HIDDEN[cell.kind])
    with pytest.raises(ValueError) as e:
        cfg.validate()
    pair = next(p for p, outcomes in PAIRS.items() if outcomes.get(_values(cell, p)) == str(e.value))
    assert all(n in str(e.value) for n in NAMES[pair]), (pair, str(e.value))
    loaded = []
    monkeypatch.setattr(train_module, "load_federated", lambda *a, **k: loaded.append(1))
    with pytest.raises(ValueError, match=re.escape(str(e.value))):  # train refuses it the same way, before any data
        train_module.train(cfg, progress=False)
    assert loaded == []


def _values(cell: C.Cell, pair):
    return tuple(getattr(cell, axis) for axis in pair)


@pytest.mark.parametrize("cell", RUNS, ids=C.Cell.name)
def test_cell_trains(cell, monkeypatch):
    _train(cell, monkeypatch)


LOCALS = [
    C.Cell("uniform", m, "none", C.cheapest_kind(m), p) for m in C.METHODS for p in C.LOCAL_PRESETS if p is not None
]


@pytest.mark.parametrize("cell", LOCALS, ids=C.Cell.name)
def test_local_settings_train_or_are_refused(cell, monkeypatch):
    """A paper's local settings under every method: they train on the method's cheapest kind, or (AdaFL's momentum
    under a method of plain gradient steps) are refused at validate, naming momentum."""
    why = PAIRS["method", "local"][cell.method, cell.local]
    if why is not None:
        with pytest.raises(ValueError, match="momentum set but algorithm="):
            cell.config().validate()
        cell.config().replace(momentum=0.0).validate()  # the way out the message implies
        return
    cfg, _ = _train(cell, monkeypatch)
    assert all(cfg.flat()[k] == v for k, v in presets.LOCAL[cell.local].items())


@pytest.mark.parametrize("method", ["fedavgm", "fedadam"])
def test_server_optimisers_leave_bn_statistics_to_the_mean(method, monkeypatch):
    """FedAvgM's heavy-ball step on LeNet's BatchNorm running variances (statistics, not parameters) drove them below
    zero by round 6 and the model to NaN (found by this grid's AdaFL cells); the server step now takes parameters
    only, so the statistics are the uploads' mean, as under FedAvg, and stay positive."""
    monkeypatch.setattr(train_module, "load_federated", _tiny)
    cfg = C.Cell("uniform", method, "none", "bn").config().replace(hidden=HIDDEN["bn"], rounds=8)
    result = train_module.train(cfg, progress=False)
    assert len(result.metrics) == 8 and np.isfinite(result.metrics.test_loss).all()
    variances = {k: v for k, v in result.state.global_params.items() if k.endswith("running_var")}
    assert variances and all(bool((v > 0).all()) for v in variances.values())
