"""The two halves of a federated round, as a server and a client that exchange messages: what ``fedlib.flower``'s
Flower apps run, with no Flower in it (so it is tested on its own, and the apps only carry its messages).

``simulate`` (``fedlib.core.simulation.run_round``) runs a round on one machine with every client's state in one
``State``. Here the same stages of the same ``Algorithm`` (``build_algorithm(cfg)``) are split where the messages
go: the ``Server`` selects (``alg.select``, AdaFL's scores included), draws the round's mini-batch plan, sends each
training client what it starts from, aggregates the uploads (``alg.aggregate``, ``server_step``, the per-client
mixtures of FedMCSA and HeurFedAMP) and lets the selection stage observe; a ``Client`` holds its own rows of the
state (its model, the last personalised model it received, a method's per-client state such as Ditto's v_i) and
trains with the run's executor and the method's client procedure (``alg.local_update``). Parameters a method keeps
local (FedBN's ``bn``, pFedLA's ``attn``) live only in the client's state: they are in no message.

Choices that keep a Flower run equal to ``simulate`` (tested in float64 to 1e-10):

- the server draws every round's mini-batch plan from the run's stream (``Schedule.plan``, as ``simulate`` does)
  and sends each client its column, as row numbers into the client's own training rows; a real deployment may let
  clients draw their own batches (same method, other batches);
- the server learns the clients' training-set sizes first (``Client.sizes``): FedAvg's weights and AdaFL's initial
  scores need them;
- a method's state that travels beside the model (``Algorithm.exchange``: SCAFFOLD's c down and delta c_i up,
  FedNova's tau_i up) goes in the same messages (``Task.state``; the upload's ``state.*`` names), and the server
  updates its part of the state from the uploads with the function the simulation's client procedure calls;
- other clients' models a method's clients download (``Algorithm.peers``: FedFomo's) are chosen by the server from
  the run's random stream, after the selection as ``simulate`` draws them, and sent in the training message; the
  server keeps each client's last upload for them, and each client keeps the rows the method holds out of its
  training (``fedlib.flower.peers``);
- a personalised model W_i is sent when client i next trains (``bytes_down`` counts it then), as ``simulate``'s
  ``fresh`` flag says it arrives;
- evaluation: the server sends every client the global model's traveling tensors (and its mini-batches of the
  evaluation's stages: a ``before_eval``'s, a fine-tuning's, drawn from the run's streams) and each reports its test
  counts; the server evaluates what it holds (the data set's own test set, the held-out new clients) and makes the
  round's row of metrics as ``simulate``'s ``Evaluation`` does (``fedlib.flower.evaluation``). Evaluation messages
  are not counted in the bytes (they measure the method, they are not part of it).

- a selection stage that ``probes`` (Power-of-Choice) has the server send its candidates the global model (a probe
  message, counted in ``bytes_down`` as the simulation counts it: ``probe_bytes``) and rank the losses they report;
  a missing or non-finite loss is refused and the client is no candidate.
- data a method shares once (``Algorithm.share``: FedMix's batch means): the server gathers every client's offer
  before round 1 (``Server.gather``, in client order), sends every client the whole set, counts both in round 1 as
  the simulation does, and draws each round's draws against it (FedMix's pairing) from the whole round's plan,
  sending each client its column beside its mini-batches (``Task.drawn``).
- rows a client procedure draws from the run's mini-batch stream after the plan (``DrawnLocal``: FedALA's s%
  samples): the server, which holds the stream, draws them in the simulation's order for the round's training
  clients and sends each its own rows in the plan (``Task.local_draws``).

Not supported (refused when the server is built, naming why): probing for a method whose clients do not start from
the global model, ``before_eval`` stages that do not declare their draws apart (``DrawnBeforeEval``), the simulated
``dropout`` and ``stragglers``.
"""

from __future__ import annotations

import numpy as np

from fedlib.config.run import RunConfig
from fedlib.flower.client import Client, client_splits, one_client
from fedlib.flower.evaluation import Held, eval_plans
from fedlib.flower.messages import RefusedUpdate, Report, Task, setup
from fedlib.flower.peers import held_out
from fedlib.flower.server import Server

__all__ = ["Client", "RefusedUpdate", "Report", "Server", "Task", "client_splits", "drive", "make_clients", "setup"]


def make_clients(cfg: RunConfig, data) -> list[Client]:
    """A ``Client`` per client of ``data``, as ``drive`` makes them: each with its training and test rows, its
    validation rows and the rows ``cfg``'s method holds out of its training (``held_out``)."""
    return _clients(cfg, *held_out(cfg, data))


def _clients(cfg: RunConfig, data, held) -> list[Client]:
    """``make_clients`` of the data ``held_out`` left and the rows it held out."""
    out = []
    for i in range(data.n_clients):
        train, test, val = client_splits(data, i)
        out.append(Client(cfg, i, train, test, data.input_shape, data.n_classes, val=val, held=one_client(held, i)))
    return out


def drive(cfg: RunConfig, data, *, clients: list[Client] | None = None, state: dict | None = None,
          until: int | None = None) -> Server:  # fmt: skip
    """``cfg``'s rounds with a ``Server`` and a ``Client`` per client of ``data`` exchanging their messages in
    process, without Flower: the message protocol on its own (what the Flower apps carry, message for message).
    ``clients``: the clients (default: new ones, ``make_clients``); ``state``: a ``Server.state_dict()`` to resume
    from (its next round on); ``until``: the last round to run (default ``cfg.rounds``)."""
    data, held_rows = held_out(cfg, data)
    clients = clients if clients is not None else _clients(cfg, data, held_rows)
    sizes = np.array([c.sizes()[0] for c in clients])
    server = Server(cfg, sizes, data.input_shape, data.n_classes)
    server.test_sizes = np.array([c.sizes()[1] for c in clients])
    if state is not None:
        server.load_state_dict(state)
    held = Held(server, data)
    if server.alg.share is not None:  # the data a method shares, once: every client's offer up, the set down
        shared = server.gather({c.index: c.offer() for c in clients})
        for c in clients:
            c.receive(shared)
    for t in range(server.state.round + 1, (cfg.rounds if until is None else until) + 1):
        selected, tasks = server.begin(t, lambda t, cand, params: {i: clients[i].probe(params) for i in cand.tolist()})
        uploads = {}
        for task in tasks:
            up = clients[task.client].fit(task)
            if task.upload:
                uploads[task.client] = server.check(t, task.client, up)
        out = server.end(t, selected, uploads, sum(task.bytes_down() for task in tasks))
        if t % cfg.eval_every == 0 or t == cfg.rounds:
            params, plans = server.evaluation(), eval_plans(server, t)
            server.record(out, [c.evaluate(t, params, plans[c.index]) for c in clients], held.columns(t))
    return server
