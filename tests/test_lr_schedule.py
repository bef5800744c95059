"""The lr schedule lives in one place: ``fedlib.core.simulation.run_round`` scales the optimiser ``local`` to
eta_t = eta * lr_decay^(t-1) and hands it to every client procedure, which steps with that lr and never scales it
again (nor falls back to the unscaled ``Algorithm.local``).

A contract over every registered method: a spy executor records the lr of every ``train`` call, tagged with the
round and with whether the round was training its clients then (``Run.lap``'s stages, seen by a callback). With
eta = 0.1 and lr_decay = 0.5 over 3 rounds, every call of round t that steps with the run's lr carries
0.1 * 0.5^(t-1). The step sizes a method's paper keeps apart from the schedule are identified call by call and
must stay constant:

- pFedMe (and pFedMe+MCSA): the inner problem's K steps, ``LocalSGD(lr=personal_lr, mu=lam)`` (eta_p);
- Per-FedAvg (FO and HF): the gradient probes, one step of ``LocalSGD(lr=1)`` (grad f(p) = p - SGD(p, lr=1)),
  after each alpha step (FO: one; HF: three, the gradient and the Hessian-free pair); and the one adaptation step
  before each evaluation, which steps with the configured alpha (``AdaptBeforeEval``), outside the round;
- APFL: each local step's gradient probe at the personal mixture (``LocalSGD(lr=1)``), before the step of w;
- FedALA: the probes that learn the aggregation weights W (``LocalSGD(lr=1)``), before the round's one training
  call.
"""

from __future__ import annotations

import pytest
import torch
from helpers import small_synthetic

from fedlib.algorithms import ALGORITHMS, build_algorithm
from fedlib.config.run import RunConfig
from fedlib.core.callbacks import Callback, Evaluation
from fedlib.core.simulation import simulate
from fedlib.core.state import Schedule
from fedlib.executors import LocalSGD, RunsSGD, StackedExecutor
from fedlib.models.registry import build_model

LR, DECAY, ROUNDS = 0.1, 0.5, 3


class _SpyExecutor(StackedExecutor):
    """Records (round, phase, lrs, mu, plan steps) of every ``train`` call; ``phase`` is "training" between the
    round's plan and the end of its training stage, else "other" (evaluation, the other stages)."""

    def __init__(self) -> None:
        super().__init__()
        self.round, self.phase = 0, "other"
        self.calls: list[tuple[int, str, tuple[float, ...], float, int]] = []

    def train(self, model, params, plan, data, opt, anchor=None, drift=None, *, objective=None):
        lrs = (opt.lr,) if isinstance(opt, LocalSGD) else tuple(o.lr for *_, o in opt.parts)
        assert isinstance(opt, (LocalSGD, RunsSGD))
        self.calls.append((self.round, self.phase, lrs, opt.mu, plan.steps))
        return super().train(model, params, plan, data, opt, anchor, drift, objective=objective)


class _Stages(Callback):
    """Tells the spy which round runs and whether it is training its clients (``Run.lap``)."""

    def __init__(self, spy: _SpyExecutor) -> None:
        self.spy = spy

    def on_stage(self, stage: str) -> None:
        if stage == "round":
            self.spy.round += 1
        self.spy.phase = "training" if stage == "plan" else "other"


def _run(algorithm: str) -> tuple[RunConfig, _SpyExecutor]:
    data = small_synthetic(n_clients=3, rows=60)
    cfg = RunConfig(n_clients=3, clients_per_round=2, rounds=ROUNDS, local_steps=4, batch_size=4, model="dnn", lr=LR,
                    algorithm=algorithm)  # fmt: skip
    model = build_model("dnn", data.input_shape, 10, (8,), seed=0, dtype=torch.float64)
    spy = _SpyExecutor()
    alg = build_algorithm(cfg, n_samples=data.train.sizes.numpy())
    schedule = Schedule(local_steps=4, batch_size=4, lr_decay=DECAY)
    simulate(alg, data, model, spy, schedule, rounds=ROUNDS, callbacks=[_Stages(spy), Evaluation()])
    return cfg, spy


def _eta(t: int) -> float:
    return LR * DECAY ** (t - 1)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_training_call_steps_with_the_rounds_lr(algorithm):
    cfg, spy = _run(algorithm)
    method = cfg.method
    assert spy.round == ROUNDS and spy.calls
    scheduled = 0
    for t in range(1, ROUNDS + 1):
        training = [c for c in spy.calls if c[0] == t and c[1] == "training"]
        other = [c for c in spy.calls if c[0] == t and c[1] == "other"]
        assert training, f"{algorithm}: round {t} trained nobody"
        if algorithm.startswith("pfedme"):  # every call is the inner problem: eta_p and mu = lambda, unscheduled
            for _, _, lrs, mu, _ in training:
                assert lrs == (method.personal_lr,) and mu == method.lam, f"{algorithm} round {t}: {lrs}, mu={mu}"
        elif algorithm.startswith("perfedavg"):  # alpha step, then the gradient probes (lr = 1), per meta step
            per = 4 if algorithm == "perfedavg-hf" else 2  # HF: the gradient and the Hessian-free pair
            assert len(training) % per == 0, f"{algorithm} round {t}: {len(training)} calls"
            for i, (_, _, lrs, mu, steps) in enumerate(training):
                assert steps == 1 and mu == 0, f"{algorithm} round {t} call {i}: {steps} steps, mu={mu}"
                want = _eta(t) if i % per == 0 else 1.0
                assert lrs == pytest.approx((want,), rel=1e-15), f"{algorithm} round {t} call {i}: {lrs}, not {want}"
                scheduled += i % per == 0
        elif algorithm in ("apfl", "fedala"):  # gradient probes (lr = 1) beside the round's steps
            for i, (_, _, lrs, mu, steps) in enumerate(training):
                if algorithm == "apfl":  # per local step: the probe at vbar_i, then w's step
                    want = _eta(t) if i % 2 else 1.0
                else:  # the W probes, then the one training call
                    want = _eta(t) if i == len(training) - 1 else 1.0
                assert mu == 0 and (steps == 1 or want != 1.0), f"{algorithm} round {t} call {i}: {steps}, mu={mu}"
                assert lrs == pytest.approx((want,), rel=1e-15), f"{algorithm} round {t} call {i}: {lrs}, not {want}"
                scheduled += want != 1.0
            assert algorithm == "fedala" or len(training) == 2 * 4, f"{algorithm} round {t}: {len(training)} calls"
        else:
            for i, (_, _, lrs, _, _) in enumerate(training):
                assert lrs == pytest.approx((_eta(t),) * len(lrs), rel=1e-15), (
                    f"{algorithm} round {t} call {i}: lr {lrs}, the round's lr is {_eta(t)}"
                )
                scheduled += 1
        if algorithm.startswith("perfedavg"):  # the adaptation before evaluation: alpha as configured
            assert [c[2] for c in other] == [(LR,)], f"{algorithm} round {t}: {other}"
        elif build_algorithm(cfg).finetune is not None:  # FedBABU's fine-tuning before evaluation: the round's lr
            assert [(c[2], c[3]) for c in other] == [(pytest.approx((_eta(t),), rel=1e-15), 0.0)], (
                f"{algorithm} round {t}: {other}"
            )
        else:
            assert not other, f"{algorithm} round {t}: train calls outside the training stage: {other}"
    assert algorithm.startswith("pfedme") or scheduled >= ROUNDS
