"""``python -m fedlib.experiments.verify``: stored runs trained again and compared with the store."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from fedlib import RunConfig, Store, run
from fedlib.core.state import COLUMNS, RunResult
from fedlib.experiments import verify

TINY = RunConfig(n_clients=4, clients_per_round=2, rounds=6, local_steps=2, model="mlr")


def _result(acc, loss=None, uploads=None, diverged_at=None) -> RunResult:
    """A run of len(acc) rounds whose test accuracy is ``acc`` (fractions), for ``compare``'s golden numbers."""
    acc = np.asarray(acc, dtype=float)
    rounds = len(acc)
    m = pd.DataFrame({c: np.full(rounds, np.nan) for c in COLUMNS})
    m["round"] = np.arange(1, rounds + 1)
    m["test_acc"], m["test_acc_mean"] = acc, acc - 0.01
    m["test_loss"] = np.linspace(1.0, 0.5, rounds) if loss is None else loss
    m["uploads"] = np.arange(1, rounds + 1) * 2 if uploads is None else uploads
    m["seconds"] = np.arange(1, rounds + 1) * 0.1
    meta = {} if diverged_at is None else {"diverged_at": diverged_at}
    empty = np.zeros((rounds, 2))
    return RunResult(m, empty, empty, np.array([5, 5]), meta)


def test_compare_golden():
    """Hand-checkable: 12 rounds, the re-trained run 0.3 points lower in round 4 and 0.2 points higher in the last
    two; best moves by 0 (round 4 was not the best), final by +0.2, last-10 by (0.2 + 0.2 - 0.3) / 10 = +0.01."""
    acc = np.array([0.50, 0.60, 0.70, 0.75, 0.80, 0.82, 0.84, 0.86, 0.88, 0.90, 0.85, 0.86])
    again = acc.copy()
    again[3] -= 0.003
    again[-2:] += 0.002
    loss = np.linspace(1.0, 0.5, 12)
    row = verify.compare(_result(acc, loss), _result(again, loss * (1 + 1e-4)))
    assert row["rounds"] == "12" and row["diverged at"] is None and row["uploads"] == 24
    assert row["max |d acc|"] == pytest.approx(0.3)
    assert row["max rel d loss"] == pytest.approx(1e-4)
    assert row["d best"] == pytest.approx(0.0) and row["best"] == pytest.approx(90.0)
    assert row["d final"] == pytest.approx(0.2)
    assert row["d last-10"] == pytest.approx(0.01)
    assert row["agrees"] and not row["equal as stored"]
    same = verify.compare(_result(acc), _result(acc))
    assert same["equal as stored"] and same["agrees"] and same["max |d acc|"] == 0
    # the final accuracy 0.6 points off: agrees at tolerance 0.61, not at the default 0.5
    up = acc.copy()
    up[-1] += 0.006
    assert not verify.compare(_result(acc), _result(up))["agrees"]
    assert verify.compare(_result(acc), _result(up), tolerance=0.61)["agrees"]


@pytest.mark.parametrize(
    "change, column, says",
    [
        (dict(acc=np.full(10, 0.5)), "rounds", "12 stored, 10 now"),
        (dict(diverged_at=7), "diverged at", "None stored, 7 now"),
        (dict(uploads=np.arange(1, 13) * 3), "uploads", "24 stored, 36 now"),
    ],
)
def test_compare_rounds_divergence_and_uploads_must_be_the_same(change, column, says):
    """Summaries within the tolerance do not make a run agree if it evaluated other rounds, diverged elsewhere or
    uploaded a different number of models (AdaFL's communication cost)."""
    acc = np.full(12, 0.5)
    row = verify.compare(_result(acc), _result(**{"acc": acc, **change}))
    assert row[column] == says and not row["agrees"]


def test_adafl_runs_are_judged_on_the_global_models_accuracy():
    """AdaFL's clients hold no test data: its runs' ``test_acc`` is NaN throughout and its tables report the global
    model's accuracy on MNIST's test set. Judged on NaN summaries, every AdaFL run agreed whatever it held (a run
    trained again on another CPU did, with 2.25 points between two of its rounds)."""

    def adafl(global_acc):
        r = _result(np.full(len(global_acc), np.nan))
        r.metrics["test_acc_mean"] = np.nan
        r.metrics["global_test_acc"] = global_acc
        return r

    acc = np.linspace(0.80, 0.97, 12)
    late = acc.copy()
    late[-3:] -= 0.01
    row = verify.compare(adafl(acc), adafl(late))
    assert row["accuracy"] == "global_test_acc" and row["best"] == pytest.approx(97.0)
    assert row["d final"] == pytest.approx(-1.0) and row["d last-10"] == pytest.approx(-0.3)
    assert row["max |d acc|"] == pytest.approx(1.0) and not row["agrees"]
    assert verify.compare(adafl(acc), adafl(acc))["agrees"]
    assert verify.compare(_result(acc), _result(acc))["accuracy"] == "test_acc"


def test_same_clients_compares_the_selection_traces():
    acc = np.full(12, 0.5)
    a, b = _result(acc), _result(acc)
    assert verify.compare(a, b)["same clients"] is None  # no trace kept
    picks = np.zeros((12, 4), bool)
    picks[:, :2] = True
    other = picks.copy()
    other[7] = [False, True, True, False]
    a.traces["selected"], b.traces["selected"] = picks, picks.copy()
    assert verify.compare(a, b)["same clients"] is True
    b.traces["selected"] = other
    row = verify.compare(a, b)
    assert row["same clients"] is False and row["agrees"]  # reported, not required: as many uploads, same numbers


def test_a_nan_on_one_side_is_infinitely_far():
    acc = np.full(12, 0.5)
    nan = acc.copy()
    nan[5] = np.nan
    row = verify.compare(_result(acc), _result(nan))
    assert row["max |d acc|"] == np.inf and not row["equal as stored"]
    assert verify.compare(_result(nan), _result(nan))["equal as stored"]


def _shifted(result: RunResult, by: float) -> RunResult:
    """``result`` with every client's accuracy moved by ``by`` and the means recomputed from them, as the store
    checks them: a store edited consistently (it loads without complaint)."""
    acc = np.clip(result.client_acc + by, 0.0, 1.0)
    m = result.metrics.copy()
    m["test_acc"] = acc @ result.client_n / result.client_n.sum()
    m["test_acc_mean"] = acc.mean(1)
    return dataclasses.replace(result, metrics=m, client_acc=acc)


def test_a_run_trained_again_is_equal_as_stored_and_an_edited_store_is_caught(tmp_path):
    """On this machine a stored run trains again to the same numbers at the store's 6 digits. A store edited by
    hand, its digests rewritten (``Store.save``), loads as sound, and ``verify`` says it does not agree."""
    store = Store(tmp_path)
    run(TINY, store, progress=False)
    table = verify.verify([TINY], store, progress=False)
    row = table.iloc[0]
    assert row["key"] == TINY.key() and row["equal as stored"] and row["agrees"] and row["same clients"]
    assert row["max |d acc|"] == 0 and row["d best"] == 0
    store.save(TINY, _shifted(store.load(TINY), 0.02), replace=True)
    assert store.problem(TINY) is None  # the edit passes every check of the store
    row = verify.verify([TINY], store, progress=False).iloc[0]
    assert not row["agrees"] and not row["equal as stored"]
    assert row["d best"] == pytest.approx(-2.0, abs=0.01)


def test_a_run_not_stored_is_named():
    with pytest.raises(LookupError, match=TINY.key()):
        verify.verify([TINY], Store("/nonexistent-store"), progress=False)


def test_cli_exit_status_and_bad_arguments(tmp_path, monkeypatch, capsys):
    """0 when the runs agree, 1 when one does not; a usage error (2) naming the argument otherwise."""
    from fedlib.experiments import cli
    from fedlib.experiments import named as experiments

    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path))
    with pytest.raises(SystemExit) as stop:
        verify.main(["quickstart", "--profile", "smoke"])  # nothing stored yet
    assert stop.value.code == 2 and "no run of quickstart at profile smoke is stored" in capsys.readouterr().err
    assert cli.main(["quickstart", "--profile", "smoke", "--jobs", "1"]) == 0
    capsys.readouterr()
    assert verify.main(["quickstart", "--profile", "smoke", "--runs", "5"]) == 0
    out = capsys.readouterr().out
    assert "2 of the 2 stored runs of quickstart (smoke)" in out and "2 of 2 agree" in out
    store = Store(tmp_path)
    cfg = experiments.configs("quickstart", "smoke")[0][1]
    store.save(cfg, _shifted(store.load(cfg), -0.05), replace=True)
    assert verify.main(["quickstart", "--profile", "smoke", "--runs", "5"]) == 1
    assert "1 of 2 agree" in capsys.readouterr().out
    for args, says in [
        (["--runs", "0"], "--runs=0: must be at least 1"),
        (["--tolerance", "nan"], "--tolerance=nan: must be a number of points"),
        (["--where", "nonsense"], "--where='nonsense' must be FIELD=VALUE"),
        (["--where", "seed=99"], "matches none of the"),
    ]:
        with pytest.raises(SystemExit) as stop:
            verify.main(["quickstart", "--profile", "smoke", *args])
        assert stop.value.code == 2 and says in capsys.readouterr().err, args


def test_a_run_trains_again_on_as_many_threads_as_it_was_stored_with(monkeypatch):
    """The thread count decides how the CPU's matmuls sum: a grid's runs train on one thread each, and a run trained
    again on two would not repeat them bit for bit. The count is the stored one while training, restored after."""
    import torch

    from fedlib.runs import train as runner

    seen = []
    monkeypatch.setattr(runner, "train", lambda cfg, progress: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        for stored, expect in [(1, 1), (2, 2), (None, 2), ("1", 2)]:  # absent or not an int: left as it is
            verify._train_as_stored(TINY, {} if stored is None else {"threads": stored}, False)
            assert seen[-1] == expect and torch.get_num_threads() == 2, stored
    finally:
        torch.set_num_threads(before)


def test_cli_names_absent_data_and_a_bad_profile(tmp_path, monkeypatch, capsys):
    """Nothing to check because the data is absent: said so, not "nothing stored" alone; a bad FEDLIB_PROFILE is a
    usage error naming it, as for ``python -m fedlib.experiments``."""
    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path))
    monkeypatch.setenv("FEDLIB_DATA", str(tmp_path / "no-data"))
    with pytest.raises(SystemExit) as stop:
        verify.main(["pfedla_table1", "--profile", "smoke"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "(data absent under the data root: digits): nothing to check" in err, err
    monkeypatch.setenv("FEDLIB_PROFILE", "fast")
    with pytest.raises(SystemExit) as stop:
        verify.main(["quickstart"])
    assert stop.value.code == 2 and "FEDLIB_PROFILE" in capsys.readouterr().err


def _two_stored_runs_one_failing(tmp_path, monkeypatch, failing: RunConfig, error: BaseException) -> Store:
    """A store holding TINY and TINY at seed 1, with training ``failing`` again raising ``error``."""
    from fedlib.runs import train as runner

    store = Store(tmp_path)
    for cfg in (TINY, TINY.replace(seed=1)):
        run(cfg, store, progress=False)
    real = runner.train

    def train(cfg, progress):
        if cfg.key() == failing.key():
            raise error
        return real(cfg, progress)

    monkeypatch.setattr(runner, "train", train)
    return store


def test_a_run_that_cannot_train_again_is_reported_and_the_others_go_on(tmp_path, monkeypatch):
    """A stored run whose training now fails (here: a config refused) gets its error in its row and does not
    agree; the next run is still checked."""
    other = TINY.replace(seed=1)
    store = _two_stored_runs_one_failing(tmp_path, monkeypatch, TINY, ValueError("RunConfig.lr=... is refused today"))
    table = verify.verify([TINY, other], store, progress=False)
    assert table["key"].tolist() == [TINY.key(), other.key()]
    assert table["error"].iloc[0] == "ValueError: RunConfig.lr=... is refused today" and not table["agrees"].iloc[0]
    assert table["agrees"].iloc[1] and table["equal as stored"].iloc[1] and pd.isna(table["error"].iloc[1])


def test_cpu_name_says_the_model_and_the_widest_vector_instructions():
    """What a run's meta.json records as ``device_name`` on a CPU (``hardware.cpu_name``): enough to tell whether
    a run trained again can repeat its stored numbers to the last bit."""
    from fedlib.executors.hardware import cpu_name

    intel = (
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw\n"
    )
    amd = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx avx2 fma\nprocessor\t: 1\nmodel name\t: other\n"
    arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm sve\nCPU part\t: 0xd40\n"
    assert cpu_name(intel) == "Intel(R) Xeon(R) Processor, avx512"
    assert cpu_name(amd) == "AMD EPYC 7B13, avx2"  # the first processor's
    assert cpu_name(arm).endswith(", sve")
    assert cpu_name("") and ", " not in cpu_name("")  # no /proc/cpuinfo: platform's name alone


def test_ctrl_c_keeps_the_runs_checked_before_it(tmp_path, monkeypatch, capsys):
    """A long check (AdaFL's runs take half an hour each) stopped with Ctrl-C shows the runs checked so far, and the
    command exits with 130, as a shell reports an interrupted command."""
    other = TINY.replace(seed=1)
    store = _two_stored_runs_one_failing(tmp_path, monkeypatch, other, KeyboardInterrupt("stopped after round 3"))
    table = verify.verify([TINY, other], store, progress=False)
    assert table["key"].tolist() == [TINY.key()] and table.attrs["stopped"] and table["agrees"].all()
    assert "stopped: 1 of 2 runs checked" in capsys.readouterr().out


def test_cli_ctrl_c_exits_130(tmp_path, monkeypatch, capsys):
    from fedlib.experiments import cli
    from fedlib.runs import train as runner

    monkeypatch.setenv("FEDLIB_RESULTS", str(tmp_path))
    assert cli.main(["quickstart", "--profile", "smoke", "--jobs", "1"]) == 0
    real, calls = runner.train, []

    def train(cfg, progress):
        calls.append(cfg)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(cfg, progress)

    monkeypatch.setattr(runner, "train", train)
    assert verify.main(["quickstart", "--profile", "smoke", "--runs", "2"]) == 130  # one checked, then stopped
    assert "1 of 1 agree" in capsys.readouterr().out

    def stopped(cfg, progress):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "train", stopped)  # stopped before any run was checked
    assert verify.main(["quickstart", "--profile", "smoke"]) == 130
