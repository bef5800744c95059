"""FedALA on the Flower path: its clients' s% samples (the adaptive local aggregation's rows) come from the run's
mini-batch stream right after the round's plan; the server draws them from its copy of the stream
(``DrawnLocal.draw_local``) in the simulation's order and sends each client its rows in the train message
(``Task.local_draws``). A Flower run and the message protocol equal the simulation in float64 (``test_flower._same``), on a
model without buffers and on one with BatchNorm (whose samples drop a last batch of one row), and the simulation's
numbers are those the engine computed before the draw was split from the work."""

from __future__ import annotations

import pytest
import torch
from helpers import small_synthetic
from test_flower import IMAGES, VECTORS, _images, _same, flower_apps, referenced

from fedlib import RunConfig

CASES = {
    # 3 of 5 clients a round for 4 rounds: clients run no ALA, the start phase and one epoch, in the same rounds
    "vectors": dict(VECTORS, rounds=4, algorithm="fedala", ala_rand_percent=50.0),
    "images": dict(IMAGES, rounds=4, algorithm="fedala", ala_max_epochs=5),  # LeNet: BatchNorm buffers
}
# test_loss of CASES' simulations as the engine computed them before ``draw_local`` (float.hex: bit for bit)
BEFORE = {
    "vectors": ["0x1.ab365ba3ab5b1p+0", "0x1.013b52a4b5fddp+0", "0x1.a78ce74928038p-1", "0x1.b784bb10a7fc5p-1"],
    "images": ["0x1.29ad26e9cf2d7p+1", "0x1.35c1bd93437f0p+1", "0x1.35b1c6c65c859p+1", "0x1.46af91becaaa1p+1"],
}


def _case(name):
    data = small_synthetic(n_clients=5, rows=80) if name == "vectors" else _images()
    return RunConfig(executor="loop", dtype="float64", **CASES[name]), data


_reference = referenced(_case)


@pytest.mark.parametrize("name", sorted(CASES))
def test_simulation_is_unchanged(name, monkeypatch):
    """The simulation draws through ``draw_local`` too: its numbers are the ones drawn inside the W learning gave,
    and ALA ran (W moved off its initial ones)."""
    ref = _reference(name, monkeypatch)
    assert [float(x).hex() for x in ref.metrics.test_loss] == BEFORE[name]
    W = ref.state.extra["fedala"].W
    assert any(bool((w != 1).any()) for w in W.values())


@pytest.mark.parametrize("name", sorted(CASES))
def test_message_protocol_equals_simulation(name, monkeypatch):
    from fedlib.flower.rounds import drive

    cfg, data = _case(name)
    _same(_reference(name, monkeypatch), drive(cfg, data))


@pytest.mark.parametrize("name", sorted(CASES))
def test_flower_apps_equal_simulation(name, monkeypatch):
    """Through Flower's wire form (the rows in the train message's plan record); each message rebuilds its client
    from ``context.state``."""
    cfg, data = _case(name)
    _same(_reference(name, monkeypatch), flower_apps(cfg, data))


def test_server_sends_the_samples_of_clients_that_trained_before():
    """A client's first training task carries no rows; a later one its s% sample (floor(0.5 n_i) distinct rows of
    its own training data); the server's stream advances past them as the simulation's does."""
    from fedlib.flower.rounds import Server

    cfg, data = _case("vectors")
    sizes = data.train.sizes.numpy()
    server = Server(cfg, sizes, data.input_shape, data.n_classes)
    seen: set[int] = set()
    for t in range(1, 4):
        _, tasks = server.begin(t)
        for task in tasks:
            if task.client in seen:
                n = int(sizes[task.client])
                assert task.local_draws is not None and len(task.local_draws) == n // 2
                assert (
                    len(set(task.local_draws.tolist())) == n // 2
                    and 0 <= int(task.local_draws.min()) <= int(task.local_draws.max()) < n
                )
            else:
                assert task.local_draws is None
            seen.add(task.client)
        assert task.bytes_down() == sum(v.numel() * v.element_size() for v in task.params.values())  # rows: uncounted


def test_a_client_refuses_rows_that_do_not_fit_it():
    """A client that has trained before and is given no sample (or one given a sample on its first training) says so
    rather than learning W on nothing."""
    from fedlib.flower.rounds import Client, Server, client_splits

    cfg, data = _case("vectors")
    server = Server(cfg, data.train.sizes.numpy(), data.input_shape, data.n_classes)
    clients = [Client(cfg, i, *client_splits(data, i)[:2], data.input_shape, data.n_classes) for i in range(5)]
    _, tasks = server.begin(1)
    task = tasks[0]
    task.local_draws = torch.arange(3)
    with pytest.raises(ValueError, match=r"local_draws\[0\] is 3 rows.*trained 0 rounds before"):
        clients[task.client].fit(task)
    task.local_draws = None
    clients[task.client].fit(task)
    again = server.begin(2)[1][0]
    again.client, again.local_draws = task.client, None
    with pytest.raises(ValueError, match=r"local_draws\[0\] is None.*trained 1 rounds before"):
        clients[task.client].fit(again)
