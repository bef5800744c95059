"""What an evaluation runs on the Flower path besides each client testing the model it holds, as the simulation's
``Evaluation`` (``fedlib.core.callbacks``) runs it; generic over the ``Algorithm``'s declared stages:

- a method's per-client state before its client first trains (``initial_state``): the simulation makes it for every
  client when the first client trains in round 1, from the initial model; a client here makes its own row the same
  way when it is built (its client procedure on no mini-batches), so a client evaluated before it ever trains is
  evaluated as the simulation evaluates it (APFL's mixture of its initial v_i, FedRoD's initial personal head);
- a ``before_eval`` stage (``DrawnBeforeEval``: Per-FedAvg's adaptation) and evaluation by fine-tuning
  (``Algorithm.finetune``: FedBABU): their mini-batches come from run-wide streams, so the server draws them
  (``eval_plans``: the evaluation stream ``seed + 2`` in the simulation's order, the fine-tuning stream of
  (seed, t)) and sends each client its column in the evaluate message (``adapt.*``, ``tune.*``: row numbers into the
  client's own rows); the client runs the stage on them (``prepare``);
- what the server evaluates itself (``Held``): the data set's own test set (``global_test_acc``, the global model's,
  as Flower's centralised evaluation) and the held-out new clients (``new_client_frac``: they never train, so the
  server stands in for them: the global model and its fine-tuning by each, ``fedlib.core.callbacks.new_clients``).

Evaluation messages are not counted in the bytes (as the simulation counts them).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from fedlib.config.run import RunConfig
from fedlib.core.callbacks import FINETUNE_STREAM, fine_tune_plan, new_clients, tuned
from fedlib.core.stages import ClientWork, DrawnBeforeEval, Params
from fedlib.core.state import evaluation_params, start_models
from fedlib.data import holdout
from fedlib.data.federated import BatchPlan, FederatedData, Split
from fedlib.executors import make_executor


def training_clients(cfg: RunConfig) -> int:
    """The clients that train (the nodes of a run): ``n_clients`` less those ``new_client_frac`` holds out."""
    d = cfg.data
    return d.n_clients - holdout.new_client_count(d.new_client_frac, d.n_clients)


def refuse_unplanned(alg: Any, name: str) -> None:
    """A ``before_eval`` stage the server cannot draw for (not a ``DrawnBeforeEval``) is refused, naming why."""
    if alg.before_eval is not None and not isinstance(alg.before_eval, DrawnBeforeEval):
        raise ValueError(
            f"fedlib.flower: algorithm={name!r} has a before_eval stage that does not declare its draws apart "
            "(fedlib.core.stages.DrawnBeforeEval: draw, apply), so its clients cannot run it apart"
        )


# -- the client's side ----------------------------------------------------------------------------------------------
def initial_state(client: Any) -> None:
    """The client's rows of the method's state as the simulation makes them in round 1 (from the initial model):
    its client procedure run once on no mini-batches, its result dropped. Only for methods that evaluate a method
    state (``Algorithm.personal``) made by their own client procedure."""
    alg, state = client.alg, client.state
    if alg.personal is None or alg.local_update is None or alg.personal.KEY in state.extra:
        return
    tr = torch.zeros(1, dtype=torch.int64)
    start, anchor = start_models(alg, state, tr)
    plan = BatchPlan(torch.zeros(0, 1, client.schedule.batch_size, dtype=torch.int64))
    assert alg.local is not None
    work = ClientWork(client.executor, client.model, start, anchor, plan, client.train_split, state, tr, alg.local,
                      shared=alg.shared)  # fmt: skip
    alg.local_update(work)


def _plan(d: Params, prefix: str) -> BatchPlan:
    col = lambda k: None if f"{prefix}{k}" not in d else d[f"{prefix}{k}"][:, None]
    index = col("index")
    assert index is not None, f"the evaluate message holds no {prefix}index"
    return BatchPlan(index, col("weight"), col("active"))


def prepare(client: Any, t: int, plan: Params) -> Params | None:
    """Before the client's evaluation in round t, what the simulation's ``Evaluation`` runs for it: the
    ``before_eval`` stage on its rows of ``plan`` (``adapt.*``), and with ``Algorithm.finetune``, its fine-tuning of
    the global model (``tune.*``), returned (the models it is evaluated with); else None."""
    alg, state = client.alg, client.state
    if alg.before_eval is not None:
        one = FederatedData("client", client.train_split, client.test, client.n_classes, client.model_shape)
        alg.before_eval.apply(client.executor, client.model, state, one, _plan(plan, "adapt."))
    if alg.finetune is None:
        return None
    params, per_client = evaluation_params(alg, state, "global")
    start = {k: (v if per_client else v.unsqueeze(0)).clone() for k, v in params.items()}
    ft = alg.finetune
    objective = None if ft.objective is None else ft.objective(client.model)
    return tuned(alg, client.executor, client.model, client.schedule, t, start, _plan(plan, "tune."),
                 client.train_split, objective)  # fmt: skip


# -- the server's side ----------------------------------------------------------------------------------------------
def _columns(plan: BatchPlan, prefix: str, offsets: torch.Tensor | None = None) -> dict[int, Params]:
    out: dict[int, Params] = {}
    for i in range(plan.index.shape[1]):
        d = {f"{prefix}index": plan.index[:, i] - (0 if offsets is None else offsets[i])}
        if plan.weight is not None:
            d[f"{prefix}weight"] = plan.weight[:, i]
        if plan.active is not None:
            d[f"{prefix}active"] = plan.active[:, i]
        out[i] = d
    return out


def _layout(sizes: np.ndarray) -> Split:
    s = torch.as_tensor(np.asarray(sizes), dtype=torch.int64)
    return Split(torch.zeros(0), torch.zeros(0, dtype=torch.int64), torch.cumsum(s, 0) - s, s)


def eval_plans(server: Any, t: int) -> dict[int, Params]:
    """Client -> the mini-batches its evaluation in round t needs (empty where none), drawn from the run's streams
    as the simulation draws them: the ``before_eval`` stage's from the evaluation stream (``server.eval_gen``), the
    fine-tuning's from (seed, t)'s."""
    alg, cfg = server.alg, server.cfg
    out: dict[int, Params] = {i: {} for i in range(server.n)}
    if alg.before_eval is not None:
        sizes = FederatedData("layout", server.layout, _layout(server.test_sizes), 0, ())
        for i, d in _columns(alg.before_eval.draw(sizes, server.eval_gen), "adapt.").items():
            out[i].update(d)
    if alg.finetune is not None:
        plan = fine_tune_plan(
            cfg.seed, t, FINETUNE_STREAM, server.layout, alg.finetune.epochs, server.schedule.batch_size
        )
        for i, d in _columns(plan, "tune.", server.layout.offsets).items():
            out[i].update(d)
    return out


class Held:
    """What the server evaluates itself, from ``data``: its global test set (``global_test_acc``, where the method
    evaluates the global model, as the simulation's ``_evaluate_round``) and its new clients (``NEW_COLUMNS``).
    Built with the server, before any training (the new clients' local parameters are the model's initial ones)."""

    def __init__(self, server: Any, data: FederatedData | None) -> None:
        self.server = server
        self.split = None if data is None else data.global_split
        self.new = None if data is None else data.new_clients
        self.executor = make_executor(server.cfg.executor, server.model)
        self.init = {n: v.detach().clone() for n, v in server.model.state_dict().items()}

    def columns(self, t: int) -> dict[str, float]:
        s = self.server
        alg, state = s.alg, s.state
        out: dict[str, float] = {}
        if self.split is not None and alg.finetune is None and alg.evaluate == "global":
            if all(alg.shared(n) for n in state.global_params):
                c, _, k = self.executor.evaluate(s.model, state.global_params, self.split, False)
                out["global_test_acc"] = float(c.sum() / k.sum())
        if self.new is not None:
            run = SimpleNamespace(alg=alg, state=state, data=SimpleNamespace(new_clients=self.new, train=self.new.train),
                                  model=s.model, executor=self.executor, seed=s.cfg.seed, schedule=s.schedule)  # fmt: skip
            out.update(new_clients(run, t, self.init, s.cfg.data.new_client_finetune_epochs))  # type: ignore[arg-type]
        return out
