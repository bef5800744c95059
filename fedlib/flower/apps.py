"""fedlib's methods as Flower apps: a ``ServerApp`` and a ``ClientApp`` (flwr's Message API) that carry the messages
of ``fedlib.flower.rounds`` (the server's and the client's halves of the same ``Algorithm``) between the server
and the clients; ``simulate`` runs them in Flower's simulation engine, in process.

The messages, one exchange each:

- ``query`` (to every node, once): the client answers its index in the federation and its data's shape
  (training and test rows, input shape, classes), and ``offer``, its part of the data a method shares
  (``Algorithm.share``: FedMix's means of its own rows); the server builds its half from them;
- ``query.share`` (once, for a method that shares data): ``shared``, the whole set (``Server.gather``);
- ``train`` (round t, to each training client): ``params`` (the global model's traveling tensors) and/or ``personal``
  (its personalised model W_i), ``plan`` (its mini-batches), ``config`` (round, whether it uploads); the reply
  holds ``upload`` (its trained traveling tensors, where it uploads);
- ``query.probe`` (round t, before the selection, to each candidate of a selection stage that ``probes``:
  Power-of-Choice): ``params`` (the global model's traveling tensors, counted in ``bytes_down``); the reply holds
  ``loss`` (its mean training loss on the model it would start from; a missing or non-finite one is refused);
- ``evaluate`` (every evaluated round, to every node): ``params``, and ``plan`` where the evaluation has stages with
  mini-batches (a ``before_eval``, a fine-tuning: ``fedlib.flower.evaluation``); the reply holds the client's test
  counts. The server evaluates what it holds itself (``held``: a global test set, the new clients).

A client's own state between rounds (its model, local groups included: FedBN's BN, pFedLA's attention; the W_i it
received; a method's per-client state such as Ditto's v_i) is kept in its ``context.state`` under ``fedlib``, never
sent. An upload the server refuses (``Server.check``: wrong names, shapes or dtype, or NaN/inf) is logged and left
out of the round's aggregation; a client that does not answer within ``round_timeout`` is left out the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedlib.config.run import RunConfig
from fedlib.core.stages import Params
from fedlib.flower.checkpoint import Snapshots
from fedlib.flower.client import one_client
from fedlib.flower.evaluation import Held, eval_plans, training_clients
from fedlib.flower.peers import held_out
from fedlib.flower.rounds import Client, RefusedUpdate, Report, Server, Task, client_splits

log = logging.getLogger("fedlib.flower")
DRAWN = "drawn."  # the plan record's names of a method's round draws (``Task.drawn``), beside its mini-batches


# -- tensors in records --------------------------------------------------------------------------------------------
def to_record(params: Params) -> ArrayRecord:
    rec = ArrayRecord()
    for k, v in params.items():
        a = v.detach().cpu().numpy()  # ``ascontiguousarray`` makes a 0-d array 1-d: reshaped back
        rec[k] = Array.from_numpy_ndarray(np.ascontiguousarray(a).reshape(a.shape))
    return rec


def from_record(rec: ArrayRecord | None) -> Params:
    if rec is None:
        return {}
    return {k: torch.from_numpy(np.array(a.numpy(), copy=True)) for k, a in rec.items()}


def _plan_record(task: Task) -> ArrayRecord:
    assert task.index is not None
    parts = {
        "index": task.index,
        **{
            k: v
            for k, v in (("weight", task.weight), ("active", task.active), ("local_draws", task.local_draws))
            if v is not None
        },
        **{DRAWN + k: v for k, v in task.drawn.items()},
    }
    return to_record(parts)


# -- the client ----------------------------------------------------------------------------------------------------
def client_app(cfg: RunConfig, data=None, partition: int | None = None, mods: list | None = None) -> ClientApp:
    """The ``ClientApp`` of ``cfg``: client ``partition`` of ``data`` (a ``FederatedData``, default
    ``load_federated(cfg)`` in the client's process), or, where ``partition`` is None, the node's
    ``node_config['partition-id']`` (Flower's simulation engine numbers its nodes so). ``mods``: Flower client mods
    around the app's functions."""
    app = ClientApp(mods=mods)
    cache: dict[int, Client] = {}
    sources: list = []

    def build(i: int) -> Client:
        if not sources:
            source = data
            if source is None:
                from fedlib.data import load_federated

                source = load_federated(cfg).to("cpu", getattr(torch, cfg.dtype))
            sources.append(held_out(cfg, source))  # less the rows the method holds out of training (FedFomo's)
        source, held = sources[0]
        train, test, val = client_splits(source, i)
        return Client(cfg, i, train, test, source.input_shape, source.n_classes, val=val, held=one_client(held, i))

    def client(context: Context) -> Client:
        i = int(context.node_config["partition-id"]) if partition is None else partition
        if "fedlib" not in context.state:  # this node's first message: its initial state
            cache[i] = build(i)
        else:  # its own state, as its last message left it
            if i not in cache:
                cache[i] = build(i)
            cache[i].load_state_dict(from_record(context.state["fedlib"]))  # type: ignore[arg-type]
        return cache[i]

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        c = client(context)
        n_train, n_test = c.sizes()
        info = ConfigRecord({"client": c.index, "n_train": n_train, "n_test": n_test,
                             "input_shape": list(c.model_shape), "n_classes": c.n_classes,
                             "round": c.state.round})  # fmt: skip
        context.state["fedlib"] = to_record(c.state_dict())
        offer = {"offer": to_record(c.offer())} if c.alg.share is not None else {}
        return Message(RecordDict({"info": info, **offer}), reply_to=msg)

    @app.query("share")
    def share(msg: Message, context: Context) -> Message:
        c = client(context)
        c.receive(from_record(msg.content["shared"]))  # type: ignore[arg-type]
        context.state["fedlib"] = to_record(c.state_dict())
        return Message(RecordDict(), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        c = client(context)
        conf = msg.content["config"]
        plan = from_record(msg.content["plan"])  # type: ignore[arg-type]
        task = Task(int(conf["t"]), c.index, bool(conf["upload"]), from_record(msg.content.get("params")),  # type: ignore[arg-type]
                    from_record(msg.content.get("personal")), plan["index"], plan.get("weight"), plan.get("active"),  # type: ignore[arg-type]
                    state=from_record(msg.content.get("state")),  # type: ignore[arg-type]
                    drawn={k[len(DRAWN):]: v for k, v in plan.items() if k.startswith(DRAWN)},
                    peers=from_record(msg.content.get("peers")),  # type: ignore[arg-type]
                    local_draws=plan.get("local_draws"))  # fmt: skip
        up = c.fit(task)
        context.state["fedlib"] = to_record(c.state_dict())
        return Message(RecordDict({"upload": to_record(up)}), reply_to=msg)

    @app.query("probe")
    def probe(msg: Message, context: Context) -> Message:
        c = client(context)
        loss = c.probe(from_record(msg.content["params"]))  # type: ignore[arg-type]
        context.state["fedlib"] = to_record(c.state_dict())
        return Message(RecordDict({"loss": MetricRecord({"loss": loss})}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        c = client(context)
        rep = c.evaluate(
            int(msg.content["config"]["t"]),
            from_record(msg.content["params"]),  # type: ignore[arg-type]
            from_record(msg.content.get("plan")),
        )  # type: ignore[arg-type]
        context.state["fedlib"] = to_record(c.state_dict())
        counts: dict[str, Any] = {"client": rep.client, "correct": rep.correct, "loss": rep.loss, "rows": rep.rows}
        if not np.isnan(rep.gm_rows):
            counts.update(gm_correct=rep.gm_correct, gm_rows=rep.gm_rows)
        if rep.val is not None:
            counts["val"] = list(rep.val)
        return Message(RecordDict({"counts": MetricRecord(counts)}), reply_to=msg)

    return app


# -- the server ----------------------------------------------------------------------------------------------------
def server_app(cfg: RunConfig, done: Callable[[Server], None] | None = None, *, round_timeout: float | None = None,
               wait_nodes: float = 60.0, held=None, snapshot=None) -> ServerApp:  # fmt: skip
    """The ``ServerApp`` of ``cfg``: queries the training clients' nodes, runs ``cfg.rounds`` rounds and hands the
    finished ``Server`` (its metrics rows, per-client accuracies, refused uploads) to ``done``. ``round_timeout``:
    seconds a round waits for its clients' replies (None: for all of them); ``wait_nodes``: seconds to wait for the
    nodes to connect; ``held``: the ``FederatedData`` whose global test set and new clients the server evaluates
    itself (``fedlib.flower.evaluation.Held``; None: neither); ``snapshot``: the file the server is snapshotted to after
    every round and resumed from when it starts (``fedlib.flower.checkpoint.Snapshots``; None: no snapshots)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        import time

        n = training_clients(cfg)
        deadline = time.monotonic() + wait_nodes
        nodes = list(grid.get_node_ids())
        while len(nodes) < n and time.monotonic() < deadline:
            time.sleep(0.5)
            nodes = list(grid.get_node_ids())
        if len(nodes) < n:
            raise RuntimeError(
                f"fedlib.flower: {len(nodes)} of the {n} training clients' nodes connected within {wait_nodes} s"
            )
        # the query waits for every node (a node's first ClientApp may take a while to start)
        replies = grid.send_and_receive([Message(RecordDict(), node, "query") for node in nodes])
        node_of: dict[int, int] = {}
        info: dict[int, Any] = {}
        for r in replies:
            if r.has_error():
                raise RuntimeError(
                    f"fedlib.flower: node {r.metadata.src_node_id} failed to answer the query: {r.error}"
                )
            rec = r.content["info"]
            node_of[int(rec["client"])] = r.metadata.src_node_id
            info[int(rec["client"])] = rec
        if sorted(node_of) != list(range(n)):
            raise RuntimeError(f"fedlib.flower: the nodes are clients {sorted(node_of)}, expected 0..{n - 1}")
        first = info[0]
        sizes = np.array([int(info[i]["n_train"]) for i in range(n)])
        server = Server(cfg, sizes, tuple(int(s) for s in first["input_shape"]), int(first["n_classes"]))
        server.test_sizes = np.array([int(info[i]["n_test"]) for i in range(n)])
        kept = Held(server, held)
        if server.alg.share is not None:  # the data a method shares: every client's offer (in its query answer) ...
            shared = to_record(server.gather({i: from_record(r.content["offer"]) for r in replies  # type: ignore[arg-type]
                                              for i in [int(r.content["info"]["client"])]}))  # type: ignore[arg-type]  # fmt: skip
            for r in grid.send_and_receive([Message(RecordDict({"shared": shared}), node_of[i], "query.share")
                                            for i in range(n)]):  # fmt: skip
                if r.has_error():  # ... and the whole set to every client: one that lacks it cannot train
                    raise RuntimeError(f"fedlib.flower: node {r.metadata.src_node_id} failed to receive the shared "
                                       f"data: {r.error}")  # fmt: skip
        snaps = Snapshots(snapshot, cfg)
        start = snaps.resume(server, {i: int(info[i].get("round", 0)) for i in range(n)})  # type: ignore[arg-type]

        def probe(t: int, candidates: np.ndarray, params: Params) -> dict[int, float]:
            rec = to_record(params)
            msgs = [Message(RecordDict({"params": rec}), node_of[i], "query.probe", group_id=str(t))
                    for i in candidates.tolist()]  # fmt: skip
            replies = list(grid.send_and_receive(msgs, timeout=round_timeout))
            whose = {m.metadata.message_id: i for i, m in zip(candidates.tolist(), msgs)}  # ids set when sent
            got = {}
            for r in replies:
                i = whose.get(r.metadata.reply_to_message_id, -1)
                if r.has_error() or "loss" not in r.content:
                    log.warning("round %d: client %d failed to answer the probe", t, i)
                    continue
                got[i] = float(r.content["loss"]["loss"])  # type: ignore[arg-type]
            return got

        for t in range(start, cfg.rounds + 1):
            selected, tasks = server.begin(t, probe)
            msgs, by_id = [], {}
            for task in tasks:
                content = RecordDict(
                    {"config": ConfigRecord({"t": t, "upload": task.upload}), "plan": _plan_record(task)}
                )
                if task.params:
                    content["params"] = to_record(task.params)
                if task.personal:
                    content["personal"] = to_record(task.personal)
                if task.state:
                    content["state"] = to_record(task.state)
                if task.peers:
                    content["peers"] = to_record(task.peers)
                msgs.append(Message(content, node_of[task.client], "train", group_id=str(t)))
                by_id[node_of[task.client]] = task
            uploads: dict[int, Params] = {}
            answered = set()
            replies = list(grid.send_and_receive(msgs, timeout=round_timeout))
            by_msg = {m.metadata.message_id: by_id[m.metadata.dst_node_id] for m in msgs}
            for r in replies:
                # by the message it answers: the SuperLink itself answers for a node it holds unavailable
                task = by_msg.get(r.metadata.reply_to_message_id) or by_id[r.metadata.src_node_id]
                answered.add(task.client)
                if r.has_error():
                    log.warning("round %d: client %d failed: %s", t, task.client, r.error)
                    server.refused.append((t, task.client, f"failed: {r.error.reason}"))
                    continue
                if not task.upload:
                    continue
                try:
                    uploads[task.client] = server.check(t, task.client, from_record(r.content["upload"]))  # type: ignore[arg-type]
                except RefusedUpdate as e:
                    log.warning("refused: %s", e)
                    server.refused.append((t, task.client, str(e)))
            for task in tasks:
                if task.client not in answered:
                    log.warning("round %d: client %d did not answer", t, task.client)
                    server.refused.append((t, task.client, "no answer"))
            out = server.end(t, selected, uploads, sum(task.bytes_down() for task in tasks))
            if t % cfg.eval_every and t != cfg.rounds:
                snaps.save(server)
                continue
            params, plans = to_record(server.evaluation()), eval_plans(server, t)
            evals = [Message(RecordDict({"config": ConfigRecord({"t": t}), "params": params,
                                         **({"plan": to_record(plans[i])} if plans[i] else {})}),
                             node_of[i], "evaluate", group_id=str(t)) for i in range(n)]  # fmt: skip
            reports = []
            replies = list(grid.send_and_receive(evals, timeout=round_timeout))
            whose = {m.metadata.message_id: i for i, m in enumerate(evals)}
            for r in replies:
                if r.has_error():
                    i = whose.get(r.metadata.reply_to_message_id, -1)
                    log.warning("round %d: client %d failed to evaluate: %s", t, i, r.error)
                    continue
                c = r.content["counts"]
                val = tuple(c["val"]) if "val" in c else None
                reports.append(Report(int(c["client"]), float(c["correct"]), float(c["loss"]), float(c["rows"]),
                                      float(c.get("gm_correct", np.nan)), float(c.get("gm_rows", np.nan)), val))  # type: ignore[arg-type]  # fmt: skip
            server.record(out, reports, kept.columns(t))
            snaps.save(server)
        if done is not None:
            done(server)

    return app


class LocalGrid(Grid):
    """A ``Grid`` whose nodes are ``n`` ClientApp instances in this process: each message is serialised to Flower's
    wire form and back (``Message.deflate`` / ``inflate``, as a SuperLink stores it) and handed to ``client`` with its
    node's own ``Context`` (``node_config['partition-id']``, a persistent ``state``). A ClientApp that raises answers
    with an error reply, as a SuperNode does. Flower's simulation engine does the same through Ray actors: this grid
    is that engine without the Ray cluster (which takes seconds to start and its own processes), for tests."""

    def __init__(self, client: ClientApp, n: int, run_id: int = 1) -> None:
        self.app, self.run_id = client, run_id
        self.contexts = {
            node: Context(
                run_id=run_id,
                node_id=node,
                node_config={"partition-id": i, "num-partitions": n},
                state=RecordDict(),
                run_config={},
            )  # fmt: skip
            for i, node in enumerate(range(1001, 1001 + n))
        }
        self.replies: dict[str, Message] = {}

    def set_run(self, run: Any) -> None:  # one run per grid
        return None

    @property
    def run(self) -> Any:
        from flwr.common.typing import Run

        return Run.create_empty(self.run_id)

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:  # fmt: skip
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def push_messages(self, messages: Any) -> list[str]:
        import uuid

        from flwr.app import Error

        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = mid = str(uuid.uuid4())
            msg.metadata.__dict__["_run_id"] = self.run_id
            wire = _wire(msg)
            try:
                reply = self.app(wire, self.contexts[msg.metadata.dst_node_id])
            except Exception as e:  # noqa: BLE001  (a failing client answers with an error, as a SuperNode does)
                reply = Message(Error(code=1, reason=f"{type(e).__name__}: {e}"), reply_to=wire)
            self.replies[mid] = reply if reply.has_error() else _wire(reply)
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Any) -> list[Message]:
        return [self.replies.pop(m) for m in list(message_ids) if m in self.replies]

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Message]:
        return self.pull_messages(self.push_messages(messages))


def _wire(msg: Message) -> Message:
    """``msg`` serialised and read back: its content as Flower sends it (the arrays' bytes), its metadata kept."""
    out = Message(_reinflated(msg.content), msg.metadata.dst_node_id, msg.metadata.message_type)
    out.metadata.__dict__.update(msg.metadata.__dict__)
    return out


def _reinflated(obj: Any) -> Any:
    """``obj`` (an ``InflatableObject``) rebuilt from its bytes and its children's, as a receiver rebuilds it."""
    children = {oid: _reinflated(child) for oid, child in (obj.children or {}).items()}
    return type(obj).inflate(obj.deflate(), children)


def simulate(cfg: RunConfig, data=None, *, engine: str = "local", cpus: int = 1, round_timeout: float | None = None,
             mods: list | None = None, snapshot=None) -> Server:  # fmt: skip
    """``cfg`` run as Flower apps in this process: the ``ServerApp`` and ``ClientApp`` above over the training clients
    nodes, with ``engine='local'`` (``LocalGrid``: the clients in this process, every message through Flower's wire
    form) or ``'ray'`` (Flower's simulation engine, ``flwr.simulation.run_simulation``: the clients in Ray actors,
    ``cpus`` of them). ``data``: the ``FederatedData`` (default ``load_federated(cfg)``); ``mods``: Flower client mods
    (``mod(msg, context, call_next)``) around the ClientApp; ``snapshot``: the server's snapshot file (``server_app``).
    Returns the finished ``Server``."""
    if engine not in ("local", "ray"):
        raise ValueError(f"simulate: engine={engine!r} is not one of: local, ray")
    if data is None:
        from fedlib.data import load_federated

        data = load_federated(cfg).to("cpu", getattr(torch, cfg.dtype))
    result: list[Server] = []
    if engine == "local":
        from flwr.supercore.task_identity import TaskIdentity

        grid = LocalGrid(client_app(cfg, data, mods=mods), training_clients(cfg))
        # who the messages the ServerApp makes come from (the SuperLink, node 1), as a ServerApp process sets it
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, grid.run_id, 1
        server_app(cfg, result.append, round_timeout=round_timeout, held=data, snapshot=snapshot)(
            grid, Context(1, 0, {}, RecordDict(), {})
        )
        return result[0]
    from flwr.simulation import run_simulation

    backend = {"init_args": {"num_cpus": cpus, "include_dashboard": False, "log_to_driver": False},
               "client_resources": {"num_cpus": 1, "num_gpus": 0.0}}  # fmt: skip
    run_simulation(server_app(cfg, result.append, round_timeout=round_timeout, held=data, snapshot=snapshot),
                   client_app(cfg, data, mods=mods),
                   num_supernodes=training_clients(cfg), backend_config=backend)  # type: ignore[arg-type]  # fmt: skip
    if not result:
        raise RuntimeError("fedlib.flower: the Flower simulation ended without finishing the run (see its log)")
    return result[0]
