"""FedMix and NaiveMix on the Flower path: the mean set is gathered once (each client's means of its own rows, in its
answer to the server's first query), broadcast to every client, and the round's pairing of samples with means is
drawn by the server from the whole round's plan. A Flower run and the message protocol equal the simulation in
float64 (``test_flower._same``: accuracies, per-client accuracies, selections, bytes), the shared set is the
simulation's, its bytes are counted in round 1 (by hand), and a malformed offer is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_flower import VECTORS, _same, _simulated, flower_apps, referenced
from test_flower_state import _unequal

from fedlib import RunConfig
from fedlib.algorithms.fedmix import MEANS_KEY, mean_dataset

# clients of 30, 45, 60, 75 and 90 training rows cut into means of 7: 5, 7, 9, 11 and 13 rows (45 in all), the last
# of each smaller; epochs, so the plans are padded (weight, active) and the clients' step counts differ
CASES = {
    "fedmix": {"algorithm": "fedmix", "mix_lam": 0.2, "mix_mean_size": 7, "local_steps": None, "local_epochs": 1},
    "fedmix-batch": {"algorithm": "fedmix", "mix_lam": 0.1, "mix_mean_size": 7, "mix_taylor_scale": "batch"},
    "naivemix": {"algorithm": "naivemix", "mix_lam": 0.2, "mix_mean_size": 7},
}


def _case(name, **kw):
    return RunConfig(executor="loop", dtype="float64", **{**VECTORS, **CASES[name], **kw}), _unequal()


_reference = referenced(_case)


@pytest.mark.parametrize("name", sorted(CASES))
def test_message_protocol_equals_simulation(name, monkeypatch):
    from fedlib.flower.rounds import drive

    cfg, data = _case(name)
    server = drive(cfg, data)
    _same(_reference(name, monkeypatch), server)
    mx, my = mean_dataset(data.train, data.n_classes, 7)  # the server's set is the simulation's, bit for bit
    got = server.state.extra[MEANS_KEY].means
    assert torch.equal(got["x"], mx) and torch.equal(got["y"], my) and len(my) == 45


@pytest.mark.parametrize("name", ["fedmix", "naivemix"])
def test_flower_apps_equal_simulation(name, monkeypatch):
    """Through Flower's wire form; each message rebuilds its client from ``context.state`` (the set included)."""
    cfg, data = _case(name)
    _same(_reference(name, monkeypatch), flower_apps(cfg, data))


def test_stacked_simulation_equals_message_protocol(monkeypatch):
    """The stacked executor's simulation (the chain fast path) against the loop clients of the message protocol."""
    from fedlib.flower.rounds import drive

    cfg, data = _case("fedmix")
    stacked = RunConfig(executor="stacked", dtype="float64", **{**VECTORS, **CASES["fedmix"]})
    _same(_simulated(stacked, data, monkeypatch), drive(cfg, data))


def test_shared_bytes_by_hand(monkeypatch):
    """The mean set travels once, counted in round 1: 45 means of 60 features and 10 label weights are 45 x 70 x 8 =
    25,200 bytes, up once in all (each client its rows) and down once to each of the 5 clients (126,000). The rest
    is FedAvg's: the DNN 60-100-10 (60 x 100 + 100 + 100 x 10 + 10 = 7,110 float64, 56,880 bytes) down to and up from
    the 3 selected clients a round."""
    from fedlib.flower.rounds import drive

    cfg, data = _case("fedmix-batch")
    ref = _reference("fedmix-batch", monkeypatch).metrics
    model, shared = (60 * 100 + 100 + 100 * 10 + 10) * 8, 45 * (60 + 10) * 8
    assert shared == 25_200
    rounds = np.arange(1, 4)
    assert list(ref.bytes_up) == list(3 * model * rounds + shared)
    assert list(ref.bytes_down) == list(3 * model * rounds + 5 * shared)
    server = drive(cfg, data)
    assert server.shared == (25_200, 126_000) and server.bytes_up == ref.bytes_up.iloc[-1]


def test_malformed_offer_refused():
    """Every client's part is needed, with the names, row shapes and dtype of the others, and finite."""
    from fedlib.flower.rounds import RefusedUpdate, Server, client_splits

    cfg, data = _case("fedmix")
    sizes = np.array([len(client_splits(data, i)[0].y) for i in range(5)])
    server = Server(cfg, sizes, data.input_shape, data.n_classes)
    ok = {i: {"x": torch.zeros(2, 60, dtype=torch.float64), "y": torch.zeros(2, 10, dtype=torch.float64)}
          for i in range(5)}  # fmt: skip
    with pytest.raises(RefusedUpdate, match="offers from clients"):
        server.gather({i: ok[i] for i in range(4)})
    with pytest.raises(RefusedUpdate, match="client 2's x is"):
        server.gather({**ok, 2: {"x": torch.zeros(2, 59, dtype=torch.float64), "y": ok[2]["y"]}})
    with pytest.raises(RefusedUpdate, match="client 3 offers"):
        server.gather({**ok, 3: {"x": ok[3]["x"], "y": torch.full((2, 10), float("nan"), dtype=torch.float64)}})
    assert len(server.gather(ok)["x"]) == 10 and server.shared == (10 * 70 * 8, 5 * 10 * 70 * 8)
