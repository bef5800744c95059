"""No unchecked reads: a stored run without its manifest is *unsealed* and left out of tables unless the user opts
in, every metric that comes from a stored array is recomputed from it on read, and ``verify`` checks more than the
first stored run. Before, deleting a run's manifest turned its checksum off: an AdaFL Fig. 3 run whose
``global_test_acc`` was raised by 50 points was drawn, status "ok", and an edited test loss or upload count (AdaFL's
communication cost) was read as stored."""

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedlib import RunConfig, Store, experiment, run
from fedlib.experiments import verify
from fedlib.experiments.named import status
from fedlib.runs.stored import LEGACY_KEYS, DamagedRun, DamagedRunWarning, UnsealedRun, read_run

RESULTS = Path(__file__).resolve().parents[1] / "results"
needs_results = pytest.mark.skipif(not RESULTS.is_dir(), reason="no results/ beside the package")
TINY = RunConfig(n_clients=4, clients_per_round=2, rounds=4, local_steps=2, model="mlr")


def _edit(folder: Path, column: str, change) -> None:
    m = pd.read_csv(folder / "metrics.csv")
    m[column] = change(m[column])
    m.to_csv(folder / "metrics.csv", index=False, float_format="%.6g")  # as Store.save writes it


def _unseal(folder: Path) -> Path:
    (folder / "manifest.json").unlink()
    return folder


@pytest.fixture
def fig3(tmp_path, monkeypatch):
    """AdaFL Fig. 3's committed runs copied into a store of their own (the legacy run among them)."""
    monkeypatch.delenv("FEDLIB_READ_UNSEALED", raising=False)
    ex = experiment("adafl_fig3", "paper", stored_only=True, progress=False, store=RESULTS)
    if not ex.runs:
        pytest.skip("AdaFL Fig. 3 is not stored here")
    for cfg in ex.runs:
        shutil.copytree(ex.store.path(cfg), tmp_path / ex.store.path(cfg).name)
    return ex.runs, tmp_path


# -- a run without its manifest ------------------------------------------------------------------------------------
@needs_results
def test_an_edited_run_without_its_manifest_is_unsealed_and_left_out(fig3, monkeypatch, capsys):
    """The attack as reported: the manifest deleted, every global_test_acc raised by 50 points (no array holds what
    it comes from, so no check can recompute it). It read as a sound run and was drawn; now it is unsealed: left out
    of the experiment, counted by status and named in the summary, read only when the user opts in."""
    runs, root = fig3
    cfg = runs[0]
    folder = _unseal(root / cfg.key())
    stored = read_run(RESULTS / cfg.key()).metrics["global_test_acc"]
    _edit(folder, "global_test_acc", lambda v: np.minimum(v + 0.5, 1.0))
    store = Store(root)
    assert not store.has(cfg) and store.state(cfg) == "unsealed"
    with pytest.warns(DamagedRunWarning, match=f"{folder} \\(key {cfg.key()}\\) is unsealed: it has no manifest"):
        assert store.load(cfg) is None
    with pytest.raises(UnsealedRun, match="is unsealed"):
        read_run(folder)
    ex = experiment("adafl_fig3", "paper", stored_only=True, progress=False, store=root)
    assert cfg not in ex.runs and len(ex.runs) == len(runs) - 1 and ex.damaged == []
    assert len(ex.unsealed) == 1 and "unsealed, left out (1; FEDLIB_READ_UNSEALED=1 reads them)" in str(ex)
    assert ex.summary()["key"].tolist() == [c.key() for c in runs[1:]]
    row = status("paper", store=root).set_index("experiment").loc["adafl_fig3"]
    assert (row["stored"], row["unsealed"], row["damaged"]) == (len(runs) - 1, 1, 0)
    # the user's choice: read as it is, marked unsealed (and the edit shows)
    monkeypatch.setenv("FEDLIB_READ_UNSEALED", "1")
    opted = Store(root)
    assert opted.has(cfg) and opted.state(cfg) == "stored"
    res = opted.load(cfg)
    assert res.meta["unsealed"] is True
    assert (res.metrics["global_test_acc"] - stored).max() == pytest.approx(0.5, abs=1e-6)
    assert cfg in experiment("adafl_fig3", "paper", stored_only=True, progress=False, store=root).runs


def test_an_unsealed_run_is_retrained_and_kept_aside(tmp_path, monkeypatch):
    """Left out, it counts as missing: the next run of its config trains it again and keeps the unsealed folder under
    _damaged/ for inspection, as a damaged one."""
    monkeypatch.delenv("FEDLIB_READ_UNSEALED", raising=False)
    store = Store(tmp_path)
    first = run(TINY, store, progress=False)
    _unseal(store.path(TINY))
    assert store.state(TINY) == "unsealed" and not store.has(TINY)
    with pytest.warns(DamagedRunWarning, match="moved to"):
        again = run(TINY, store, progress=False)
    assert store.state(TINY) == "stored" and (store.path(TINY) / "manifest.json").exists()
    assert again.metrics["test_loss"].equals(first.metrics["test_loss"])
    assert [p.name.split("-")[0] for p in (tmp_path / "_damaged").iterdir()] == [TINY.key()]


def test_reseal_is_the_users_word_and_is_recorded(tmp_path, monkeypatch):
    monkeypatch.delenv("FEDLIB_READ_UNSEALED", raising=False)
    store = Store(tmp_path)
    run(TINY, store, progress=False)
    folder = _unseal(store.path(TINY))
    assert store.reseal(TINY) == folder
    manifest = json.loads((folder / "manifest.json").read_text())
    assert "resealed" in manifest and store.state(TINY) == "stored" and store.load(TINY) is not None
    with pytest.raises(ValueError, match="already has its manifest.json"):
        store.reseal(TINY)
    with pytest.raises(ValueError, match=f"no stored run of key {TINY.replace(seed=1).key()}"):
        store.reseal(TINY.replace(seed=1))
    _unseal(folder)
    _edit(folder, "test_loss", lambda v: v * 1.01)  # no word of the user makes an inconsistent run sound
    with pytest.raises(DamagedRun, match="test_loss"):
        store.reseal(TINY)
    assert not (folder / "manifest.json").exists()


@pytest.mark.parametrize("value", ["yes", "true", "2"])
def test_a_bad_read_unsealed_setting_names_itself(value, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDLIB_READ_UNSEALED", value)
    with pytest.raises(ValueError, match=f"FEDLIB_READ_UNSEALED='{value}': 1 .* or 0 / unset"):
        Store(tmp_path)
    monkeypatch.delenv("FEDLIB_READ_UNSEALED")
    with pytest.raises(TypeError, match="read_unsealed='1' must be True, False or None"):
        Store(tmp_path, read_unsealed="1")


# -- every derived metric recomputed --------------------------------------------------------------------------------
def _all_selected_in_round_1(folder: Path) -> None:
    with np.load(folder / "clients.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["trace_selected"][0] = True  # every one of the 4 clients uploaded in round 1, where 2 did
    np.savez_compressed(folder / "clients.npz", **arrays)


DERIVED = {  # what was edited -> (the edit, what the error names)
    "test_loss x 1.01": (lambda f: _edit(f, "test_loss", lambda v: v * 1.01), "test_loss in round 1 is"),
    "test_loss -0.01": (lambda f: _edit(f, "test_loss", lambda v: v - 0.01), "test_loss in round 1 is"),
    "selected + 1": (lambda f: _edit(f, "selected", lambda v: v + 1), "selected in round 1 is 3, its selection trace"),
    "uploads / 2": (lambda f: _edit(f, "uploads", lambda v: v // 2), "uploads in round 1 is 1, its selection trace"),
    "trace edited": (_all_selected_in_round_1, "selected in round 1 is 2, its selection trace gives 4"),
}


@pytest.mark.parametrize("edit", list(DERIVED))
def test_edited_derived_metrics_are_caught_without_the_manifest(edit, tmp_path, monkeypatch):
    """test_loss is the test-size-weighted mean of the per-client losses, selected and uploads the clients the
    selection trace marks: an edit of one without the other was read as stored."""
    monkeypatch.delenv("FEDLIB_READ_UNSEALED", raising=False)
    store = Store(tmp_path)
    run(TINY, store, progress=False)
    folder = _unseal(store.path(TINY))
    read_run(folder, unsealed=True)  # sound before the edit
    change, says = DERIVED[edit]
    change(folder)
    with pytest.raises(DamagedRun, match=f"{folder} \\(key {TINY.key()}\\) is damaged: metrics.csv {says}"):
        read_run(folder, unsealed=True)
    assert store.state(TINY) == "damaged" and not Store(tmp_path, read_unsealed=True).has(TINY)


@needs_results
def test_a_test_loss_where_no_client_has_test_data_is_caught(fig3):
    """AdaFL's clients hold no test split: their test loss is 0 in every round, and another number is made up."""
    runs, root = fig3
    folder = _unseal(root / runs[0].key())
    _edit(folder, "test_loss", lambda v: v + 0.3)
    with pytest.raises(DamagedRun, match="test_loss in round 1 is 0.3, 0 \\(no client has test data\\) gives 0"):
        read_run(folder, unsealed=True)


@needs_results
def test_every_committed_run_reads_sealed_and_sound_with_every_check():
    """The recomputations' tolerances never turn a genuine run into a damaged one: every committed run (the legacy
    one, stored under an older schema, among them) is sealed and passes them."""
    store = Store(RESULTS, read_unsealed=False)
    assert store.damaged() == []
    fig3 = experiment("adafl_fig3", "paper", stored_only=True, progress=False, store=store)
    assert set(LEGACY_KEYS) <= {c.key() for c in fig3.runs}  # read by the key its grid gives it
    assert {store.state(c) for c in fig3.configs} == {"stored"}


# -- verify checks more than the first run --------------------------------------------------------------------------
def test_verify_samples_at_random_and_in_order():
    cfgs = [TINY.replace(seed=s) for s in range(12)]
    picks = [verify.sample(cfgs, 5, seed) for seed in range(20)]
    assert all(len(p) == 5 and p == sorted(p, key=cfgs.index) for p in picks)
    assert verify.sample(cfgs, 5, 3) == verify.sample(cfgs, 5, 3)  # --sample-seed repeats a check
    assert {c.seed for p in picks for c in p} == set(range(12))  # no run is always skipped
    assert verify.sample(cfgs, None, 0) == cfgs and verify.sample(cfgs[:3], 5, 0) == cfgs[:3]


def test_verify_checks_more_than_the_first_stored_run_by_default(tmp_path, monkeypatch, capsys):
    from fedlib.experiments import cli
    from fedlib.runs import train as runner

    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path))
    assert cli.main(["quickstart", "--profile", "smoke", "--jobs", "1"]) == 0
    trained = []
    real = runner.train
    monkeypatch.setattr(runner, "train", lambda cfg, progress: trained.append(cfg) or real(cfg, progress))
    capsys.readouterr()
    assert verify.main(["quickstart", "--profile", "smoke"]) == 0
    out = capsys.readouterr().out
    assert len(trained) == 2 and "2 of the 2 stored runs of quickstart (smoke) (all)" in out, out
    assert verify.main(["quickstart", "--profile", "smoke", "--runs", "1", "--sample-seed", "7"]) == 0
    assert "1 of the 2 stored runs" in (out := capsys.readouterr().out) and "--sample-seed 7" in out, out
    assert verify.main(["quickstart", "--profile", "smoke", "--runs", "all"]) == 0
    with pytest.raises(SystemExit) as stop:
        verify.main(["quickstart", "--profile", "smoke", "--runs", "some"])
    assert stop.value.code == 2 and "--runs=some: must be at least 1, or 'all'" in capsys.readouterr().err
