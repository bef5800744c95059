"""What the tests share besides pytest's hooks: small data sets and the shared data root. A module of its own, not
``conftest``, because ``pytest tests notebooks --nbval`` loads both folders' conftest.py under the one name
``conftest``, and ``from conftest import ...`` then finds the notebooks' one."""

import os
from pathlib import Path

import numpy as np
import torch

from fedlib.data.federated import FederatedData
from fedlib.data.synthetic import synthetic

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"  # as in conftest.py, which cannot import this


def small_synthetic(n_clients=6, rows=120, dtype=torch.float64) -> FederatedData:
    """A few Synthetic(0.5, 0.5) clients cut to ``rows`` rows each, split 75/25."""
    xs, ys = synthetic(n_clients=n_clients, seed=0)
    xs, ys = [x[:rows] for x in xs], [y[:rows] for y in ys]
    tr = [np.arange(int(0.75 * len(y))) for y in ys]
    te = [np.arange(int(0.75 * len(y)), len(y)) for y in ys]
    return FederatedData.from_clients("small", xs, ys, tr, te, 10).to("cpu", dtype)


def shared_data_root():
    root = Path(os.environ.get("FEDLIB_DATA", SHARED))
    return root if (root / "MNIST" / "raw").exists() else None


def simulate_with(alg, data, model, executor, rounds, *, local_steps=20, local_epochs=None, batch_size=20, seed=0,
                  eval_every=1, eval_train=False, progress=True, desc="", on_round=None, lr_decay=1.0,
                  checkpoint=None, stop=None, client_init=None, failures=None):  # fmt: skip
    """``simulate`` with the callbacks ``fedlib.runs.train`` hands a run (``run_callbacks``: snapshots, the per-round
    ``on_round``, the evaluation, the progress bar and Ctrl-C), its schedule from the keywords (``failures``: a
    ``fedlib.core.failures.Failures``, None for none)."""
    from fedlib.core.simulation import simulate
    from fedlib.core.state import Schedule
    from fedlib.runs.train import run_callbacks

    with run_callbacks(rounds, checkpoint=checkpoint, stop=stop, on_round=on_round, eval_every=eval_every,
                       eval_train=eval_train, progress=progress, desc=desc) as callbacks:  # fmt: skip
        schedule = Schedule(local_steps, local_epochs, batch_size, lr_decay)
        if failures is not None:
            schedule = Schedule(local_steps, local_epochs, batch_size, lr_decay, failures)
        return simulate(alg, data, model, executor, schedule, rounds=rounds, seed=seed, callbacks=callbacks,
                        client_init=client_init)  # fmt: skip


def stop_in_round(cfg, store, t_stop: int, monkeypatch, left: bool = True):
    """``cfg`` run in ``store``, snapshotting every round, and stopped by a Ctrl-C in round ``t_stop``: its snapshot
    (of round ``t_stop - 1``) is left (``left=False``: where the test keeps it from being written). Returns the
    run's ``Checkpoint``."""
    import pytest

    from fedlib.core import callbacks
    from fedlib.runs.store import Store
    from fedlib.runs.train import run

    real = callbacks._evaluate_round

    def evaluate(alg, state, data, model, t, *rest):
        if t == t_stop:
            raise KeyboardInterrupt
        return real(alg, state, data, model, t, *rest)

    with monkeypatch.context() as m:
        m.setattr(Store, "checkpoint_seconds", 0.0)
        m.setattr(callbacks, "_evaluate_round", evaluate)
        with pytest.raises(KeyboardInterrupt):
            run(cfg, store, progress=False)
    checkpoint = store.checkpoint(cfg)
    if left:
        assert checkpoint.info()["round"] == t_stop - 1
    return checkpoint


def batched_and_solo(cfgs, root):
    """Each config's stored result trained batched (``run_configs``' default) and one at a time (``batch=1``), in two
    stores under ``root``, as pairs: a batched run must store its solo run's numbers. Compare their metrics but the
    wall time (``untimed_metrics``)."""
    from fedlib.runs import grids
    from fedlib.runs.store import Store

    batched, solo = Store(root / "b"), Store(root / "s")
    grids.run_configs(cfgs, batched, progress=False)
    grids.run_configs(cfgs, solo, progress=False, batch=1)
    return [(batched.load(c), solo.load(c)) for c in cfgs]


def untimed_metrics(res):
    """A result's per-round metrics without the wall-time column, the one a batched run may not share."""
    return res.metrics[[k for k in res.metrics.columns if k != "seconds"]]
