"""Evaluation protocols (``fedlib.data.holdout``): a validation split per client and new clients that never train.
Hand-checked 3-client cases for which rows and clients are held out and for the metrics, then the protocols
through ``fedlib.run`` and the store, batched runs equal to solo ones, and a resumed run equal to one never
stopped."""

import math

import numpy as np
import pytest
import torch
from helpers import batched_and_solo, untimed_metrics

from fedlib import RunConfig, Store
from fedlib.core.callbacks import Callback
from fedlib.data import holdout
from fedlib.data.federated import FederatedData
from fedlib.runs.checkpoint import Checkpoint
from fedlib.runs.stored import DamagedRun
from fedlib.runs.train import run, train


def _three_clients() -> FederatedData:
    """3 clients with 5, 4 and 1 training rows (x = the row's index, so a row says where it came from)."""
    x = np.arange(16, dtype=np.float32)[:, None]
    y = np.arange(16) % 2
    train_parts = [np.arange(0, 5), np.arange(5, 9), np.arange(9, 10)]
    test_parts = [np.arange(10, 12), np.arange(12, 14), np.arange(14, 16)]
    return FederatedData.from_parts("three", x, y, train_parts, test_parts, n_classes=2)


def test_validation_takes_floor_frac_of_each_clients_rows_at_seeded_positions_and_leaves_one_to_train():
    fd = holdout.validation_split(_three_clients(), 0.5, seed=7)
    # by hand: floor(0.5 * 5) = 2, floor(0.5 * 4) = 2, floor(0.5 * 1) = 0 rows; positions from the data seed's
    # validation stream, one child per client
    kids = np.random.SeedSequence((7, holdout.VAL_STREAM)).spawn(3)
    pos = [np.sort(np.random.default_rng(kids[i]).permutation(n)[:k]) for i, (n, k) in enumerate([(5, 2), (4, 2)])]
    want_val = [pos[0], 5 + pos[1], np.zeros(0, int)]
    assert fd.val.sizes.tolist() == [2, 2, 0] and fd.train.sizes.tolist() == [3, 2, 1]
    for i in range(3):
        v, t = fd.val.client(i)[0][:, 0].numpy(), fd.train.client(i)[0][:, 0].numpy()
        assert v.tolist() == want_val[i].tolist()
        own = {0: range(0, 5), 1: range(5, 9), 2: range(9, 10)}[i]
        assert sorted([*v.tolist(), *t.tolist()]) == list(own)  # every row once, train or validation
    assert fd.test.sizes.tolist() == [2, 2, 2]  # the test split untouched
    # a 0.99 share still leaves one row to train on
    assert holdout.validation_split(_three_clients(), 0.99, 7).train.sizes.tolist() == [1, 1, 1]


def test_new_clients_are_drawn_from_the_data_seed_and_leave_the_federation():
    fd = holdout.hold_out_clients(_three_clients(), 1 / 3, seed=5)
    want = sorted(np.random.default_rng((5, holdout.NEW_STREAM)).choice(3, 1, replace=False).tolist())
    assert list(fd.new_ids) == want and fd.n_clients == 2 and fd.new_clients.n_clients == 1
    (j,) = want
    keep = [i for i in range(3) if i != j]
    base = _three_clients()
    for split in ("train", "test"):
        got = [getattr(fd, split).client(i)[0][:, 0].tolist() for i in range(2)]
        assert got == [getattr(base, split).client(i)[0][:, 0].tolist() for i in keep]
        assert (
            getattr(fd.new_clients, split).client(0)[0][:, 0].tolist()
            == getattr(base, split).client(j)[0][:, 0].tolist()
        )
    assert holdout.new_client_count(0.2, 10) == 2 and holdout.new_client_count(0.0, 10) == 0


def _cfg(**kw):
    base = dict(n_clients=6, clients_per_round=2, rounds=3, local_steps=2, batch_size=8, lr=0.1, val_frac=0.3,
                new_client_frac=0.34, new_client_finetune_epochs=2)  # fmt: skip
    return RunConfig(**{**base, **kw})


def _accuracy(w, b, x, y):
    return (x.double() @ w.double().T + b.double()).argmax(1).eq(y)


def test_val_and_new_client_metrics_equal_a_hand_computation(tmp_path):
    cfg = _cfg(dtype="float64")
    res = train(cfg, progress=False)
    from fedlib.data import load_federated

    data = load_federated(cfg)
    assert res.meta["new_clients"] == list(data.new_ids) and len(data.new_ids) == 2  # round(0.34 * 6)
    w, b = res.state.global_params["1.weight"], res.state.global_params["1.bias"]
    last = res.metrics.iloc[-1]
    hits = _accuracy(w, b, data.val.x.reshape(len(data.val.y), -1), data.val.y)
    assert last.val_acc == pytest.approx(hits.double().mean().item(), abs=1e-12)  # sample-weighted over clients
    new = data.new_clients
    hits = _accuracy(w, b, new.test.x.reshape(len(new.test.y), -1), new.test.y)
    assert last.new_test_acc == pytest.approx(hits.double().mean().item(), abs=1e-12)
    per = [hits[int(a) : int(a) + int(n)].double().mean().item() for a, n in zip(new.test.offsets, new.test.sizes)]
    assert last.new_test_acc_mean == pytest.approx(float(np.mean(per)), abs=1e-12)
    assert 0 <= last.new_ft_test_acc <= 1 and last.new_ft_test_acc != last.new_test_acc  # fine-tuning moved it
    # never trained, never selected: the run's clients are the other four
    assert res.traces["selected"].shape == (3, 4) and res.client_acc.shape == (3, 4)
    s = res.summary()
    assert s["test_acc_at_best_val"] == res.metrics.test_acc[res.metrics.val_acc.idxmax()]
    assert s["final_new_ft_acc"] == last.new_ft_test_acc


@pytest.mark.parametrize("algorithm", ["local", "fedmcsa", "pfedme", "scaffold"])
def test_every_kind_of_method_runs_the_protocols(algorithm):
    """Training every client (Local), personalised aggregation (FedMCSA), a personal model apart from the upload
    (pFedMe), a client procedure of its own (SCAFFOLD): none reaches the new clients."""
    res = train(_cfg(algorithm=algorithm), progress=False)
    assert res.client_acc.shape[1] == res.config.data.n_clients - len(res.meta["new_clients"]) == 4
    assert np.isfinite(res.metrics.new_ft_test_acc).all() and np.isfinite(res.metrics.val_acc).all()


def test_bad_protocol_options_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="val_frac"):
        RunConfig(val_frac=1.0).validate()
    with pytest.raises(ValueError, match="new_client_frac"):
        RunConfig(n_clients=4, new_client_frac=0.1).validate()  # round(0.4) = 0 clients
    with pytest.raises(ValueError, match="new_client_finetune_epochs"):
        RunConfig(new_client_finetune_epochs=3).validate()  # without new clients
    with pytest.raises(ValueError, match="clients_per_round=6 must be <= n_clients=6 less the 2"):
        _cfg(clients_per_round=6).validate()


def test_defaults_keep_the_key_and_the_protocols_change_it():
    assert RunConfig(val_frac=0.0, new_client_frac=0.0).key() == RunConfig().key()
    assert RunConfig(val_frac=0.1).key() != RunConfig().key()
    assert "val_frac" not in RunConfig().changed()


def test_protocols_round_trip_through_the_store_which_checks_their_columns(tmp_path):
    store = Store(tmp_path)
    cfg = _cfg()
    res = run(cfg, store, progress=False)
    back = store.load(cfg)
    cols = [c for c in res.metrics.columns if c != "seconds"]
    assert list(back.metrics.columns) == list(res.metrics.columns)
    assert np.allclose(back.metrics[cols].to_numpy(float), res.metrics[cols].to_numpy(float), rtol=1e-5, equal_nan=True)
    assert back.meta["new_clients"] == res.meta["new_clients"]
    folder = tmp_path / cfg.key()
    from fedlib.runs.stored import read_run

    (folder / "manifest.json").unlink()  # the structural check, not the checksum, is under test
    m = (folder / "metrics.csv").read_text().splitlines()
    head = m[0].split(",")
    i = head.index("val_acc")
    (folder / "metrics.csv").write_text("\n".join(",".join(x for j, x in enumerate(r.split(",")) if j != i) for r in m))
    with pytest.raises(DamagedRun, match="lacks columns val_acc"):
        read_run(folder, unsealed=True)


def test_batched_runs_equal_their_solo_runs(tmp_path):
    cfgs = [_cfg(seed=s) for s in (0, 1)] + [_cfg(seed=0, lr=0.05)]
    for x, y in batched_and_solo(cfgs, tmp_path):
        assert "new_ft_test_acc" in x.metrics.columns and untimed_metrics(x).equals(untimed_metrics(y))
        assert x.meta["batched"] == 3


class _Stop(Callback):
    def after_round(self, run, out):
        if out.t == 3:
            raise KeyboardInterrupt


def test_resumed_run_equals_uninterrupted(tmp_path):
    cfg = _cfg(rounds=5)
    whole = train(cfg, progress=False)
    ck = Checkpoint(tmp_path / "run.pt", every_seconds=0)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, progress=False, checkpoint=ck, callbacks=[_Stop()])
    resumed = train(cfg, progress=False, checkpoint=ck)
    assert resumed.meta["resumed"]
    cols = [k for k in whole.metrics.columns if k != "seconds"]
    assert whole.metrics[cols].equals(resumed.metrics[cols])
    assert math.isfinite(whole.metrics.new_ft_test_acc.iloc[-1])
    assert all(torch.equal(v, resumed.state.global_params[k]) for k, v in whole.state.global_params.items())
