"""The federated round loop: select -> start models -> local update -> aggregate -> evaluate.

``simulate`` runs rounds of an ``Algorithm`` (a composition of stages, ``fedlib.core.stages``) over a
``FederatedData`` with the collaborators its caller hands it: the ``Executor`` that computes local training, the
``Schedule`` of local work and learning rates, and the callbacks (evaluation, snapshots, progress, timing). The
loop itself keeps no files, clocks or signal handlers: those are callbacks of the layer that runs it
(``fedlib.runs``).
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from fedlib.core.callbacks import Callback, Evaluation, declared_traces
from fedlib.core.failures import NONE, RoundFailures, truncate
from fedlib.core.protocols import Executor
from fedlib.core.stages import Algorithm, ClientWork, Mixing, Params, keep_local, mix
from fedlib.core.state import (
    Round,
    Run,
    RunResult,
    Schedule,
    bytes_down,
    moved,
    payload_bytes,
    probe_bytes,
    start_models,
    traveling,
)
from fedlib.data import holdout
from fedlib.data.federated import BatchPlan, FederatedData, Split, gather_rows
from fedlib.models.groups import param_groups


def run_round(run: Run, t: int) -> Round:
    """Round t: select -> start models -> local training -> aggregate -> let the selection stage observe.

    Failures (``run.schedule.failures``, ``fedlib.core.failures``): the selected clients that drop out do no work (no
    training, no upload); the others' uploads are aggregated and observed; the stragglers train on their cut plan.

    The lr schedule is applied here and only here: every client procedure receives the round's optimiser
    (``local``, with eta_t = eta * lr_decay^(t-1)) and steps with its lr."""
    run.lap("round")
    alg, state, data, dev, n = run.alg, run.state, run.data, run.data.train.x.device, run.data.n_clients
    select, unscheduled, aggregate = alg.select, alg.local, alg.aggregate
    if select is None or unscheduled is None:  # ``build_algorithm`` sets both; a hand-built Algorithm must too
        raise ValueError(f"Algorithm {alg.name!r} needs a select and a local stage to run a round")
    assert aggregate is not None  # Algorithm.__post_init__ refuses an Algorithm without one
    state.round = t
    scale = run.schedule.lr_scale(t)
    local = unscheduled if scale == 1 else dataclasses.replace(unscheduled, lr=unscheduled.lr * scale)
    probed = 0  # bytes of the probe messages: the global model to each candidate asked (``probe_bytes``)
    if select.probes:  # Power-of-Choice: the candidates' losses on the models they would start from

        def losses(c: np.ndarray) -> np.ndarray:
            nonlocal probed
            probed += probe_bytes(alg, state, len(c))
            return start_losses(run, c)

        sel = np.asarray(select.select(t, n, run.rng, losses=losses))  # type: ignore[call-arg]
    else:
        sel = np.asarray(select.select(t, n, run.rng))
    run.lap("selection")
    failures = run.schedule.failures
    fail = failures.draw(run.seed, t, sel) if failures.on else NONE
    trainers = drawn_for = sel if alg.trains == "selected" else np.arange(n)
    uploaders = sel
    if len(fail.dropped):  # a dropped client does no work at all: it neither trains nor uploads
        trainers, uploaders = trainers[~np.isin(trainers, fail.dropped)], sel[~np.isin(sel, fail.dropped)]
    tr = torch.as_tensor(trainers, device=dev)
    down = probed + bytes_down(alg, state, tr)  # before training clears ``fresh``
    if alg.exchange is not None:  # the server state every training client reads (SCAFFOLD's c)
        down += len(trainers) * payload_bytes(alg.exchange.down(state))
    shared_up = 0  # a method's shared data (``Share``): the clients' offers up and the set down to each, in round 1
    if alg.share is not None and t == 1:
        shared = alg.share.offer(data.train, data.n_classes)
        alg.share.receive(state, shared)
        shared_up = payload_bytes(shared)
        down += n * shared_up
    peers = None
    if alg.peers is not None and len(trainers):  # other clients' models to download: chosen after the selection
        picks = alg.peers.choose(state, trainers, run.rng)
        peers = (picks, state.client_params)
        one = payload_bytes({k: state.client_params[k][0] for k in traveling(alg, state.client_params)})
        down += one * int((picks >= 0).sum())
    start, anchor = start_models(alg, state, tr)
    run.lap("start")
    plan = run.schedule.plan(run.layout, torch.as_tensor(drawn_for), alg.batches_per_step, run.gen)
    if fail is not NONE:  # drawn for every selected client as without failures, so the others' batches stay theirs
        plan = _failed(plan, drawn_for, trainers, fail, failures.work, alg.batches_per_step)
    plan = _to(plan, dev)
    run.lap("plan")
    trained: Params = {}  # stays empty where every selected client dropped out of a method that trains only them
    if len(trainers):
        if alg.local_update is None:
            trained = run.executor.train(run.model, start, plan, data.train, local, anchor=anchor if local.mu else None)
        else:  # a method's own client procedure (pFedMe, SCAFFOLD, ...), built from executor.train calls
            work = ClientWork(
                run.executor,
                run.model,
                start,
                anchor,
                plan,
                data.train,
                state,
                tr,
                local,
                run.val,
                run.rng,
                alg.shared,
                run.gen,
                peers=peers,
            )
            trained = alg.local_update(work)
    for name, v in trained.items():
        state.client_params[name][tr] = v
    state.fresh[tr] = False
    run.lap("training")
    pos = torch.as_tensor(np.searchsorted(trainers, uploaders), device=dev)  # the uploaders' rows of ``trained``:
    up = {k: v[pos] for k, v in trained.items() if alg.shared(k) and v.is_floating_point()}  # shared tensors only
    rows = (
        {k: v[pos.to(v.device)] for k, v in alg.exchange.up(state).items()}
        if alg.exchange is not None and len(pos)
        else {}
    )
    if peers is not None and len(pos):  # the rows the uploaders report on their downloads (FedFomo's weights)
        reported = {k: v[pos.to(v.device)] for k, v in alg.peers.report(state).items()}  # type: ignore[union-attr]
        alg.peers.absorb(state, uploaders, peers[0][pos.cpu().numpy()], reported)  # type: ignore[union-attr]
        rows = {**rows, **{"peers." + k: v for k, v in reported.items()}}
    # no upload (every selected client dropped): the server does nothing, the global model stays
    mixing = aggregate(up, run.n_train[torch.as_tensor(uploaders)], uploaders) if len(uploaders) else Mixing()
    if mixing.to_global is not None:  # w <- (1 - beta) w + beta sum_k p_k w_k   (beta = 1: FedAvg; pFedMe's beta)
        mean = {k: v[0] for k, v in mix(mixing.to_global.to(dev).unsqueeze(0), up).items()}
        if alg.server_step is not None:  # a server optimiser (FedAvgM, FedAdam) steps on parameters only
            mean.update(alg.server_step(*_stepped(run.model, state.global_params, mean), state))
        for k, v in mean.items():
            state.global_params[k] = v if mixing.beta == 1 else torch.lerp(state.global_params[k], v, mixing.beta)
    sel_t = torch.as_tensor(uploaders, device=dev)
    if mixing.to_personal is not None:
        for k, v in mix(moved(mixing.to_personal, dev), up).items():
            state.sent[k][sel_t] = v
        state.fresh[sel_t] = True
    if select.observes and len(uploaders):  # AdaFL: d_i = ||w^(t+1) - w_i^(t)|| against what the server made of them
        ref = {k: state.sent[k][sel_t] if mixing.to_personal is not None else state.global_params[k] for k in up}
        select.observe(uploaders, up, ref)
    run.lap("aggregation")
    up_bytes = payload_bytes(up) + payload_bytes(rows) + shared_up
    return Round(t, uploaders, mixing, up, fail.dropped, fail.stragglers, up_bytes, down)


def start_losses(run: Run, clients: np.ndarray) -> np.ndarray:
    """Each of ``clients``' mean training loss on the model it would start the round from (``start_models``: the
    global model, with the client's own local parameters where the method keeps some; the personalised model the
    server sent it for methods that start from one): what a Power-of-Choice candidate computes and reports."""
    train, dev = run.data.train, run.data.train.x.device
    c = torch.as_tensor(np.asarray(clients), device=dev)
    sizes, offsets = train.sizes[c], train.offsets[c]
    rows = torch.cat([torch.arange(int(a), int(a) + int(k), device=dev) for a, k in zip(offsets, sizes)])
    part = Split(gather_rows(train.x, rows), train.y[rows], torch.cumsum(sizes, 0) - sizes, sizes)
    alg, state = run.alg, run.state
    if alg.start == "global" and all(alg.shared(k) for k in state.client_params):
        _, loss, n = run.executor.evaluate(run.model, state.global_params, part, False)
    else:
        _, loss, n = run.executor.evaluate(run.model, start_models(alg, state, c)[0], part, True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return loss / n


def _stepped(model: nn.Module, global_params: Params, mean: Params) -> tuple[Params, Params]:
    """(global, mean) of the model's parameters, without its buffers: a server optimiser treats w_t - mean as a
    gradient (FedAvgM: Hsu et al. 2019; FedAdam: Reddi et al. 2021), which a BatchNorm running statistic is not, so
    the statistics take the uploads' mean as under FedAvg. Heavy-ball momentum on them overshoots: FedAvgM drove
    LeNet's running variances below zero within five rounds, and the model to NaN."""
    buffers = {n for n, _ in model.named_buffers()}
    keys = [k for k in mean if k not in buffers]
    return {k: global_params[k] for k in keys}, {k: mean[k] for k in keys}


def simulate(
    alg: Algorithm,
    data: FederatedData,
    model: nn.Module,
    executor: Executor,
    schedule: Schedule,
    *,
    rounds: int,
    seed: int = 0,
    callbacks: Sequence[Callback] = (),
    client_init: Params | None = None,
) -> RunResult:
    """Run ``rounds`` rounds of ``alg``; ``model`` holds the initial weights (on the data's device and dtype).

    After each round (``run_round``) the callbacks run in order: first the traces the method and model declare
    (``declared_traces``), then ``callbacks`` as given. Among them an ``Evaluation`` gives the per-round metrics
    (one evaluating every round is added after the others when ``callbacks`` holds none). A callback's
    ``on_start`` may move the run on (a snapshot's ``Checkpointing`` restores the state and sets ``run.done``);
    the loop continues from round ``run.done + 1``. A callback that raises (Ctrl-C's ``StopOnRequest``) ends the run;
    every callback's ``on_end`` runs either way.

    Divergence: the first round whose uploads or global model hold a NaN or inf, or whose evaluated test loss
    is not finite, is evaluated (its accuracies recorded as NaN: a non-finite model predicts nothing) and the
    run stops there; ``meta['diverged_at']`` names that round. So no best or final accuracy of a diverged run
    comes from a NaN model (a model whose weights overflowed can still score above chance: argmax of NaN logits is
    class 0).

    ``client_init``: name -> (N, ...) each client's own initial value of these parameters (local ones: pFedLA's
    per-client attention, ``fedlib.models.local_attention.per_client_attention``), in place of ``model``'s.
    """
    if alg.local_groups:  # declared groups (FedBN's bn, pFedLA's attn) -> which parameters stay on the clients
        alg.shared = keep_local(param_groups(model), tuple(alg.local_groups))
    given = list(callbacks)
    evaluation = next((cb for cb in given if isinstance(cb, Evaluation)), None)
    if evaluation is None:
        evaluation = Evaluation()
        given.append(evaluation)
    data, held = method_validation(alg, data)
    run = Run(alg, data, model, executor, rounds, seed, schedule, val=data.val if data.val is not None else held)
    run.callbacks = [*declared_traces(alg, model, data.n_clients, rounds, schedule.failures), *given]
    for name, v in (client_init or {}).items():
        if alg.shared(name):  # the server would overwrite it: a shared parameter has one initial value
            raise ValueError(f"client_init names {name!r}, a parameter the clients share; only local ones may differ")
        run.state.client_params[name].copy_(v)
        run.state.sent[name].copy_(v)
    try:
        for cb in run.callbacks:
            cb.on_start(run)
        for t in range(run.done + 1, rounds + 1):
            out = run_round(run, t)
            if not finite(out.uploads, run.state.global_params):
                run.diverged_at = t  # evaluation records this round (accuracies NaN), then the run stops
            for cb in run.callbacks:
                cb.after_round(run, out)
            if run.diverged_at is not None:
                break
    finally:
        for cb in run.callbacks:
            cb.on_end(run)
    traces = {k: v for cb in run.callbacks for k, v in cb.traces(run).items()}
    meta = {k: v for cb in run.callbacks for k, v in cb.meta().items()}
    if run.diverged_at is not None:
        meta["diverged_at"] = run.diverged_at
    accs, losses = np.array(evaluation.accs), np.array(evaluation.losses)
    return RunResult(evaluation.frame(), accs, losses, data.test.sizes.cpu().numpy(), state=run.state, traces=traces,
                     meta=meta)  # fmt: skip


def method_validation(alg: Algorithm, data: FederatedData) -> tuple[FederatedData, Split | None]:
    """(data, held): where the method's client procedure needs validation rows (``Algorithm.validation`` > 0) and
    the data holds none out (``val_frac`` = 0), each client's ``floor(validation * n_i)`` training rows (at most
    n_i - 1) leave ``data.train`` and are returned as ``held``; otherwise ``data`` as it is and None.

    The rows are drawn as ``holdout.validation_split`` draws a validation split, from a fixed seed
    (``HELD_SEED``), not the run's: every run on the same data holds out the same rows, so the runs of a seed grid
    compare on one validation set, and runs batched together (``fedlib.runs.batching``) share one training split
    and merge their training calls (the split is made once per data object and fraction: a copy of the training
    rows beside the caller's data, while that lives). They are the method's rows, not the data config's protocol:
    no ``val_*`` columns evaluate them."""
    if alg.validation <= 0 or data.val is not None:
        return data, None
    key = (id(data), alg.validation)
    with _HELD_LOCK:
        if key not in _HELD or _HELD[key][0]() is not data:
            cut, dev = holdout.validation_split(data, alg.validation, HELD_SEED), data.train.x.device
            assert cut.val is not None  # validation > 0
            _HELD[key] = (
                weakref.ref(data),
                dataclasses.replace(cut, train=cut.train.to(dev), val=None),
                cut.val.to(dev),
            )
            weakref.finalize(data, _HELD.pop, key, None)  # the split goes when its data does
        _, kept, held = _HELD[key]
    return kept, held


HELD_SEED = 0  # the seed of the rows ``method_validation`` holds out (``holdout.validation_split``'s draw)
# (data, fraction) -> the split made for it, while the data object lives
_HELD: dict[tuple[int, float], tuple[weakref.ref, FederatedData, Split]] = {}
_HELD_LOCK = threading.Lock()


def finite(*params: Params) -> bool:
    """Whether every floating tensor of ``params`` is finite (one device sync).

    From each tensor's ``amax`` and ``amin``: a NaN makes both NaN (torch's max and min reductions propagate it) and
    an infinity is one of them, so both are finite exactly when every value is. ``torch.isfinite(v).all()`` would
    write a bool tensor of every value first, several times slower on a CPU."""
    ends = [e for p in params for v in p.values() if v.is_floating_point() and v.numel() for e in (v.amax(), v.amin())]
    return bool(torch.isfinite(torch.stack(ends)).all()) if ends else True


def _failed(
    plan: BatchPlan, drawn_for: np.ndarray, trainers: np.ndarray, fail: RoundFailures, work: float, per: int
) -> BatchPlan:
    """The round's plan (drawn for ``drawn_for``) for its ``trainers``: the dropped clients' columns set aside, the
    stragglers' steps cut to their share ``work`` (``failures.truncate``; ``per``: mini-batches a local step takes)."""
    keep = ~np.isin(drawn_for, fail.dropped)
    if not keep.all():
        plan = plan.clients(torch.as_tensor(np.flatnonzero(keep)))
    return truncate(plan, np.flatnonzero(np.isin(trainers, fail.stragglers)), work, per)


def _to(plan: BatchPlan, dev: torch.device) -> BatchPlan:
    f = lambda t: None if t is None else t.to(dev)
    return BatchPlan(plan.index.to(dev), f(plan.weight), f(plan.active))
