"""A client's half of a round (``Client``): its own rows and its rows of the run's state, trained with the run's
executor and the method's client procedure (see ``fedlib.flower.rounds``)."""

from __future__ import annotations

import dataclasses

import torch

from fedlib.config.run import RunConfig
from fedlib.core.stages import ClientWork, DrawnLocal, Params
from fedlib.core.state import evaluation_params, init_state, start_models, traveling
from fedlib.data.federated import BatchPlan, Split
from fedlib.executors import make_executor
from fedlib.flower.evaluation import initial_state, prepare
from fedlib.flower.messages import STATE, Report, Task, _sizes_for, setup
from fedlib.flower.peers import PEERS, received
from fedlib.models.local_attention import per_client_attention
from fedlib.models.registry import build_model


class Client:
    """Client ``index``'s half: its own training and test rows (``train``, ``test``, ``val``: ``Split``s of one
    client) and its rows of the run's state, kept between rounds (``state_dict`` / ``load_state_dict``: what a
    Flower ClientApp keeps in ``context.state``)."""

    def __init__(self, cfg: RunConfig, index: int, train: Split, test: Split, input_shape: tuple[int, ...],
                 n_classes: int, val: Split | None = None, held: Split | None = None) -> None:  # fmt: skip
        self.cfg, self.index, self.train_split, self.test, self.val = cfg, index, train, test, val
        self.held = held  # the rows the method holds out of its training for its procedure (``peers.held_out``)
        self.model_shape, self.n_classes = tuple(input_shape), n_classes
        self.alg, self.model, self.schedule = setup(cfg, input_shape, n_classes, _sizes_for(cfg))
        self.executor = make_executor(cfg.executor, self.model)
        self.state = init_state(self.model, 1)
        if cfg.model.attention_init == "per_client":  # pFedLA Algorithm 1, line 9: this client's own draw
            m, dtype = cfg.model, getattr(torch, cfg.dtype)

            def drawn(seed):
                return build_model(
                    m.name, input_shape, n_classes, m.hidden, seed=seed, dtype=dtype, attention=m.attention
                )

            for k, v in per_client_attention(drawn, cfg.data.n_clients, cfg.seed).items():
                self.state.client_params[k][0] = v[index]
                self.state.sent[k][0] = v[index]
        self.names = traveling(self.alg, self.state.global_params)
        initial_state(self)  # the method's state as the simulation's first round makes it

    def sizes(self) -> tuple[int, int]:
        """(training rows, test rows): what the server asks first."""
        return int(self.train_split.sizes[0]), int(self.test.sizes[0])

    def offer(self) -> Params:
        """This client's part of the data its method shares (``Algorithm.share``: FedMix's means of its own rows),
        answered to the server's first query; empty for methods that share none."""
        share = self.alg.share
        return {} if share is None else share.offer(self.train_split, self.n_classes)

    def receive(self, shared: Params) -> None:
        """The whole shared set, as the server gathered it from every client's offer (``Server.gather``)."""
        assert self.alg.share is not None
        self.alg.share.receive(self.state, shared)

    def fit(self, task: Task) -> Params:
        """Train as ``run_round`` trains this client in round ``task.t``; returns the upload (empty unless
        ``task.upload``)."""
        alg, state = self.alg, self.state
        assert alg.local is not None
        state.round = task.t
        for k, v in task.params.items():
            state.global_params[k] = v.clone()
        for k, v in task.personal.items():
            state.sent[k][0] = v
        if task.personal:
            state.fresh[0] = True
        if alg.exchange is not None and task.state:  # the server state the method's clients read (SCAFFOLD's c)
            alg.exchange.receive(state, task.state)
        scale = self.schedule.lr_scale(task.t)
        local = alg.local if scale == 1 else dataclasses.replace(alg.local, lr=alg.local.lr * scale)
        tr = torch.zeros(1, dtype=torch.int64)
        start, anchor = start_models(alg, state, tr)
        assert task.index is not None
        f = lambda x: None if x is None else x[:, None]
        plan = BatchPlan(task.index[:, None], f(task.weight), f(task.active))
        if alg.local_update is None:
            trained = self.executor.train(self.model, start, plan, self.train_split, local,
                                          anchor=anchor if local.mu else None)  # fmt: skip
        else:
            drawn = {k: v[:, None] for k, v in task.drawn.items()} if alg.share is not None else None
            peers = None if alg.peers is None else received(task.peers, self.names, alg.peers.slots)
            own = [task.local_draws] if isinstance(alg.local_update, DrawnLocal) else None  # the server drew them
            work = ClientWork(self.executor, self.model, start, anchor, plan, self.train_split, state, tr, local,
                              self.val if self.val is not None else self.held, shared=alg.shared, drawn=drawn,
                              peers=peers, local_draws=own)  # fmt: skip
            trained = alg.local_update(work)
        for k, v in trained.items():
            state.client_params[k][tr] = v
        state.fresh[tr] = False
        if not task.upload:
            return {}
        rows = {STATE + k: v[0] for k, v in alg.exchange.up(state).items()} if alg.exchange is not None else {}
        if alg.peers is not None:  # its report on its downloads (FedFomo's weights)
            rows.update({PEERS + k: v[0] for k, v in alg.peers.report(state).items()})
        return {**{k: trained[k][0] for k in self.names}, **rows}

    def probe(self, params: Params) -> float:
        """This client's answer to a probe (a selection stage that ``probes``: Power-of-Choice): its mean training loss
        on the model it would start the round from (``start_models``: the global model ``params`` received, with its
        own local parameters), as ``fedlib.core.simulation.start_losses`` computes it."""
        for k, v in params.items():
            self.state.global_params[k] = v.clone()
        start, _ = start_models(self.alg, self.state, torch.zeros(1, dtype=torch.int64))
        _, lo, n = self.executor.evaluate(self.model, start, self.train_split, True)
        return float(lo[0] / n[0])

    def evaluate(self, t: int, params: Params, plan: Params | None = None) -> Report:
        """This client's test counts on the model it is evaluated with (``evaluation_params``), the global model's
        traveling tensors ``params`` received; ``plan``: its mini-batches of the evaluation's stages (a
        ``before_eval``, a fine-tuning: ``fedlib.flower.evaluation.prepare``)."""
        alg, state = self.alg, self.state
        for k, v in params.items():
            state.global_params[k] = v.clone()
        tuned = prepare(self, t, plan or {})
        if tuned is not None:
            p, per_client = tuned, True
        elif alg.personal is not None and alg.personal.KEY not in state.extra:
            # not trained yet: its personal model is its initial one, as the method's state holds it in ``simulate``
            # (made from every client's model when the first client trains: this one's is still its initial one)
            p, per_client = state.client_params, True
        else:
            p, per_client = evaluation_params(alg, state)
        c, lo, n = self.executor.evaluate(self.model, p, self.test, per_client)
        rep = Report(self.index, float(c[0]), float(lo[0]), float(n[0]))
        if alg.report_global:
            g, gper = evaluation_params(alg, state, "global")
            gc, _, gk = self.executor.evaluate(self.model, g, self.test, gper)
            rep.gm_correct, rep.gm_rows = float(gc[0]), float(gk[0])
        if self.val is not None:
            vc, vl, vk = self.executor.evaluate(self.model, p, self.val, per_client)
            rep.val = (float(vc[0]), float(vl[0]), float(vk[0]))
        return rep

    # -- the state a ClientApp keeps between messages -----------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        s = self.state
        out = {f"client.{k}": v for k, v in s.client_params.items()}
        out.update({f"sent.{k}": v for k, v in s.sent.items()})
        out.update({f"global.{k}": v for k, v in s.global_params.items()})
        out["fresh"] = s.fresh.to(torch.uint8)
        out["round"] = torch.tensor(s.round)  # the round it last trained in (a resumed server checks it)
        for key, ms in s.extra.items():
            out.update({f"extra.{key}.{k}": v for k, v in dict(ms).items()})
        return out

    def load_state_dict(self, d: dict[str, torch.Tensor]) -> None:
        s = self.state
        extra: dict[str, dict[str, torch.Tensor]] = {}
        for name, v in d.items():
            part, _, rest = name.partition(".")
            if part == "client":
                s.client_params[rest] = v
            elif part == "sent":
                s.sent[rest] = v
            elif part == "global":
                s.global_params[rest] = v
            elif part == "fresh":
                s.fresh = v.to(torch.bool)
            elif part == "round":
                s.round = int(v)
            elif part == "extra":
                key, _, k = rest.partition(".")
                extra.setdefault(key, {})[k] = v
        s.extra = dict(extra)  # rebuilt as the method's state class by ``MethodState.of`` on first use


def client_splits(data, i: int) -> tuple[Split, Split, Split | None]:
    """Client ``i``'s training, test and validation rows of a ``FederatedData``, each as a one-client ``Split``."""
    train, test = one_client(data.train, i), one_client(data.test, i)
    assert train is not None and test is not None
    return train, test, one_client(data.val, i)


def one_client(split: Split | None, i: int) -> Split | None:
    """Client ``i``'s rows of ``split`` as a one-client ``Split`` (None for None)."""
    if split is None:
        return None
    x, y = split.client(i)
    z = torch.zeros(1, dtype=torch.int64)
    return Split(x.clone(), y.clone(), z, torch.tensor([len(y)], dtype=torch.int64))
