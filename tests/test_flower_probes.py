"""Power-of-Choice selection on the Flower path (``fedlib.flower``): the server's probe step sends the candidates the
global model and ranks the losses they report, so a Flower run and ``rounds.drive`` select the same clients, reach
the same accuracies (float64, within 1e-10) and count the same bytes as the simulation, the probe's model download
included; a candidate that answers a non-finite loss is refused and not selected."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import small_synthetic
from test_flower import VECTORS, _same, _simulated

from fedlib.config.run import RunConfig
from fedlib.core.state import payload_bytes

pytest.importorskip("flwr")

POC = dict(VECTORS, selection="power_of_choice", poc_candidates=4)


def _poc():
    return RunConfig(executor="loop", dtype="float64", **POC), small_synthetic(n_clients=5, rows=80)


@pytest.mark.parametrize("how", ["drive", "apps"])
def test_power_of_choice_matches_the_simulation(how, monkeypatch):
    from fedlib.flower import apps, rounds

    cfg, data = _poc()
    ref = _simulated(cfg, data, monkeypatch)
    server = rounds.drive(cfg, data) if how == "drive" else apps.simulate(cfg, data, engine="local")
    _same(ref, server)
    assert server.refused == []


def test_probe_download_is_counted_in_both():
    """bytes_down per round: the global model to the d = 4 candidates (the probe) plus to the m = 3 selected (their
    training messages): 7 models a round, in the simulation and on the Flower path."""
    from fedlib.flower import rounds

    cfg, data = _poc()
    server = rounds.drive(cfg, data)
    one = payload_bytes(server.evaluation())
    assert [r["bytes_down"] for r in server.rows] == [7 * one * t for t in (1, 2, 3)]


def test_a_nan_probe_answer_is_refused_and_not_selected():
    """A client mod makes client 0's probe answer NaN (which the selection would rank highest): the server refuses it,
    logs it, and client 0 is never selected while it is a candidate."""
    from flwr.app import Message, MetricRecord, RecordDict

    from fedlib.flower import apps

    def nan_probe(msg, context, call_next):
        reply = call_next(msg, context)
        if msg.metadata.message_type == "query.probe" and int(context.node_config["partition-id"]) == 0:
            return Message(RecordDict({"loss": MetricRecord({"loss": float("nan")})}), reply_to=msg)
        return reply

    cfg, data = _poc()
    server = apps.simulate(cfg, data, engine="local", mods=[nan_probe])
    probed = [r for r in server.refused if r[1] == 0]
    assert probed and all("not finite" in r[2] for r in probed)
    assert not server.selected[:, 0].any()
    assert all(r[1] == 0 for r in server.refused)


def test_probing_a_method_that_starts_from_personal_models_is_refused():
    from fedlib.flower.rounds import Server

    cfg = RunConfig(executor="loop", dtype="float64", **dict(POC, algorithm="fedmcsa"))
    with pytest.raises(ValueError, match="start from the global model"):
        Server(cfg, np.full(5, 60), (10,), 2)
