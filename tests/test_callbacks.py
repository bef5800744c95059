"""The round loop's callbacks: the caller's own callback is snapshotted by its key and restored on resume; the traces
a run records are the ones its method and model declare; the hooks run in their order, ``on_end`` also when a
callback stops the run."""

import numpy as np
import pytest
import torch
from helpers import small_synthetic

from fedlib import RunConfig
from fedlib.algorithms import ALGORITHMS, build_algorithm
from fedlib.core.callbacks import AttentionTrace, Callback, Evaluation, HybridWeights, declared_traces
from fedlib.core.simulation import simulate
from fedlib.core.state import Schedule
from fedlib.executors import LoopExecutor, StackedExecutor
from fedlib.models.registry import build_model
from fedlib.runs.checkpoint import Checkpoint, Checkpointing


class Counter(Callback):
    """Counts the rounds it has seen and the sum of their numbers: state a snapshot must carry."""

    key = "counter"

    def __init__(self, stop_after: int | None = None):
        self.rounds, self.total, self.stop_after, self.events = 0, 0, stop_after, []

    def on_start(self, run):
        self.events.append("start")

    def after_round(self, run, out):
        self.rounds, self.total = self.rounds + 1, self.total + out.t
        if out.t == self.stop_after:
            raise KeyboardInterrupt

    def on_end(self, run):
        self.events.append("end")

    def state_dict(self):
        return {"rounds": self.rounds, "total": self.total}

    def load_state_dict(self, d):
        self.rounds, self.total = d.get("rounds", 0), d.get("total", 0)


def _run(cfg, data, callbacks, model_name="dnn", attention="none"):
    shape = data.input_shape
    model = build_model(model_name, shape, 10, (8,) if model_name == "dnn" else None, seed=0, dtype=torch.float64,
                        attention=attention)  # fmt: skip
    alg = build_algorithm(cfg, n_samples=data.train.sizes.numpy())
    executor = StackedExecutor() if StackedExecutor.supports(model) else LoopExecutor()
    schedule = Schedule(local_steps=cfg.local_steps, batch_size=cfg.batch_size)
    return simulate(alg, data, model, executor, schedule, rounds=cfg.rounds, seed=cfg.seed, callbacks=callbacks), alg


def test_a_callers_callback_is_snapshotted_by_its_key_and_restored(tmp_path):
    """The counter stops the run in round 3, before Checkpointing (which comes after the callbacks whose state it
    saves) snapshots that round: the snapshot is round 2's. Resumed, the counter continues from its snapshot, so it
    has seen rounds 1-5 once each, and the metrics are the uninterrupted run's."""
    data = small_synthetic(n_clients=4, rows=60)
    cfg = RunConfig(n_clients=4, clients_per_round=2, rounds=5, local_steps=2, batch_size=8, model="dnn")
    whole_counter = Counter()
    whole, _ = _run(cfg, data, [Evaluation(), whole_counter])
    ck = Checkpoint(tmp_path / "run.pt", every_seconds=0)
    first = Counter(stop_after=3)
    with pytest.raises(KeyboardInterrupt):
        _run(cfg, data, [Evaluation(), first, Checkpointing(ck)])
    assert first.events == ["start", "end"]  # on_end ran although the run stopped
    assert ck.info()["round"] == 2 and (first.rounds, first.total) == (3, 6)
    again = Counter()
    resumed, _ = _run(cfg, data, [Evaluation(), again, Checkpointing(ck)])
    assert (again.rounds, again.total) == (whole_counter.rounds, whole_counter.total) == (5, 15)
    cols = [c for c in whole.metrics.columns if c != "seconds"]
    assert whole.metrics[cols].equals(resumed.metrics[cols])
    assert [r["round"] for r in resumed.meta["resumed"]] == [2]


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_run_records_the_traces_its_method_declares(name):
    """Every run has 'selected'; the attention trace is recorded (its callback made at all) exactly where the method
    declares it (``Algorithm.traces``), and then it holds weights; AdaFL's scores only with the attention selection."""
    data = small_synthetic(n_clients=4, rows=60)
    cfg = RunConfig(n_clients=4, clients_per_round=2, rounds=2, local_steps=1, batch_size=8, model="dnn",
                    algorithm=name)  # fmt: skip
    res, alg = _run(cfg, data, [])
    model = build_model("dnn", data.input_shape, 10, (8,), seed=0, dtype=torch.float64)
    made = {type(cb) for cb in declared_traces(alg, model, 4, 2)}
    assert (AttentionTrace in made) == ("attention" in alg.traces) and HybridWeights not in made, name
    assert res.traces["selected"].shape == (2, 4)
    assert ("attention" in res.traces) == ("attention" in alg.traces), name
    if "attention" in alg.traces:
        assert np.isfinite(res.traces["attention"]).any()
    assert "selection_scores" not in res.traces and "hybrid_weights" not in res.traces
    if name == "fedavg":
        adafl = cfg.replace(selection="attention")
        res, _ = _run(adafl, data, [])
        assert res.traces["selection_scores"].shape == (2, 4)


def test_the_hybrid_weights_are_recorded_for_hybrid_models_only():
    from fedlib.data.federated import FederatedData

    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((24, 3, 28, 28)).astype(np.float64) for _ in range(2)]
    ys = [rng.integers(0, 10, 24) for _ in range(2)]
    tr, te = [np.arange(16)] * 2, [np.arange(16, 24)] * 2
    data = FederatedData.from_clients("tiny-images", xs, ys, tr, te, 10).to("cpu", torch.float64)
    cfg = RunConfig(n_clients=2, rounds=1, local_steps=1, batch_size=4, model="lenet", algorithm="fedbn")
    hybrid, _ = _run(cfg, data, [], model_name="lenet", attention="hybrid")
    plain, _ = _run(cfg, data, [], model_name="lenet", attention="se")
    assert hybrid.traces["hybrid_weights"].shape[0] == 2 and np.allclose(hybrid.traces["hybrid_weights"].sum(-1), 1)
    assert "hybrid_weights" not in plain.traces
