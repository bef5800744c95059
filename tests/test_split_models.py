"""Split-model personalisation (FedPer, FedRep, LG-FedAvg): every registered model declares its classifier head,
the methods split there, a round on two clients is what a hand computation gives, and the splits that cannot be made
are refused before training. Both executors, resumption and batching are the contract tests' (test_algorithms,
test_checkpoint, test_batching), which cover every registered method."""

import pytest
import torch
from helpers import simulate_with, small_synthetic
from torch import nn

from fedlib import RunConfig
from fedlib.algorithms import build_algorithm
from fedlib.executors import LoopExecutor, StackedExecutor
from fedlib.models.groups import HEAD, head, param_groups
from fedlib.models.registry import BUILT_IN, MODELS, build_model, register_model, unregister_model

LR = 0.1


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_every_model_declares_the_head_that_produces_its_logits(name):
    """The head group is non-empty, is one module's parameters (the last Linear), and that module's output is the
    model's output: what the model returns are the head's logits, untouched."""
    spec = MODELS[name]
    shape = spec.example_shapes[-1]
    model = build_model(name, shape, 7, seed=0).eval()
    groups = param_groups(model)
    keys = {k for k, g in groups.items() if g == HEAD}
    heads = [(n, m) for n, m in model.named_modules() if getattr(m, "fedlib_group", None) == HEAD]
    assert len(heads) == 1 and HEAD in spec.groups
    hname, module = heads[0]
    assert isinstance(module, nn.Linear) and module.out_features == 7
    assert keys == {f"{hname}.weight", f"{hname}.bias"}
    assert list(model.state_dict())[-2:] == [f"{hname}.weight", f"{hname}.bias"]  # the last layer
    seen = []
    module.register_forward_hook(lambda m, i, o: seen.append(o))
    with torch.no_grad():
        out = model(torch.randn(2, *shape))
    assert len(seen) == 1 and torch.equal(seen[0], out)


def test_a_user_model_declares_its_head():
    """register_model checks the declaration on the built model; FedPer on a model declaring no head is refused."""
    with pytest.raises(ValueError, match="declares groups=\\('head',\\) but no module"):
        register_model("nohead", lambda s, c: nn.Sequential(nn.Flatten(), nn.Linear(60, c)), groups=("head",))
    register_model("plain", lambda s, c: nn.Sequential(nn.Flatten(), nn.Linear(60, 4), nn.ReLU(), nn.Linear(4, c)))
    register_model(
        "headed",
        lambda s, c: nn.Sequential(nn.Flatten(), nn.Linear(60, 4), nn.ReLU(), head(nn.Linear(4, c))),
        groups=("head",),
    )
    try:
        for algorithm in ("fedper", "fedrep", "lgfedavg"):
            with pytest.raises(ValueError, match=f"algorithm='{algorithm}'.*model='plain'"):
                RunConfig(model="plain", algorithm=algorithm).validate()
            RunConfig(model="headed", algorithm=algorithm).validate()
    finally:
        unregister_model("plain")
        unregister_model("headed")


@pytest.mark.parametrize("algorithm", ["fedper", "fedrep", "lgfedavg"])
def test_a_model_that_is_its_head_alone_is_refused(algorithm):
    with pytest.raises(ValueError, match=f"algorithm='{algorithm}'.*model='mlr' as configured is its head alone"):
        RunConfig(model="mlr", algorithm=algorithm).validate()
    RunConfig(model="dnn", algorithm=algorithm).validate()


def test_fedrep_refuses_weight_decay():
    with pytest.raises(ValueError, match="weight_decay=0.01 set but algorithm='fedrep'"):
        RunConfig(model="dnn", algorithm="fedrep", weight_decay=0.01).validate()


# -- one round on two clients, by hand ------------------------------------------------------------------------------
def _sgd_step(params, x, y, frozen=()):
    """One full-batch SGD step of a 60-3-10 ReLU net from ``params`` (name -> tensor), ``frozen`` held."""
    p = {n: t.clone().requires_grad_(n not in frozen) for n, t in params.items()}
    h = torch.relu(x @ p["1.weight"].T + p["1.bias"])
    loss = nn.functional.cross_entropy(h @ p["3.weight"].T + p["3.bias"], y)
    grads = torch.autograd.grad(loss, [p[n] for n in p if n not in frozen])
    out = {n: t.detach().clone() for n, t in p.items()}
    for n, g in zip([n for n in p if n not in frozen], grads):
        out[n] -= LR * g
    return out


def _one_round(algorithm, executor, **kw):
    data = small_synthetic(n_clients=2, rows=8)  # 6 training rows each: one epoch of batch 6 is one full step
    cfg = RunConfig(n_clients=2, clients_per_round=2, rounds=1, local_epochs=1, batch_size=6, model="dnn",
                    hidden=(3,), lr=LR, algorithm=algorithm, **kw)  # fmt: skip
    model = build_model("dnn", data.input_shape, 10, (3,), seed=0, dtype=torch.float64)
    init = {n: t.clone() for n, t in model.state_dict().items()}
    alg = build_algorithm(cfg, n_samples=data.train.sizes.numpy())
    out = simulate_with(alg, data, model, executor, 1, local_steps=None, local_epochs=1, batch_size=6,
                        progress=False)  # fmt: skip
    return data, init, out.state


HEAD_KEYS, BODY_KEYS = ("3.weight", "3.bias"), ("1.weight", "1.bias")


def _by_hand(algorithm, data, init):
    """Each client's trained model: one SGD step (FedPer, LG-FedAvg), or FedRep's head step with the body frozen,
    then a body step with the new head frozen."""
    trained = []
    for k in range(2):
        x, y = data.train.client(k)
        if algorithm == "fedrep":
            p = _sgd_step(_sgd_step(init, x, y, frozen=BODY_KEYS), x, y, frozen=HEAD_KEYS)
        else:
            p = _sgd_step(init, x, y)
        trained.append(p)
    return trained


@pytest.mark.parametrize("executor", [StackedExecutor, LoopExecutor], ids=["stacked", "loop"])
@pytest.mark.parametrize("algorithm", ["fedper", "fedrep", "lgfedavg"])
def test_one_round_on_two_clients_by_hand(algorithm, executor):
    """The shared part of the global model is the equal-size clients' mean; the local part stays per client (the
    global copy of it untouched at its initial value); FedRep's frozen body did not move in its head step."""
    kw = {"head_passes": 1} if algorithm == "fedrep" else {}
    data, init, state = _one_round(algorithm, executor(), **kw)
    trained = _by_hand(algorithm, data, init)
    shared, local = (HEAD_KEYS, BODY_KEYS) if algorithm == "lgfedavg" else (BODY_KEYS, HEAD_KEYS)
    for n in shared:
        mean = (trained[0][n] + trained[1][n]) / 2
        torch.testing.assert_close(state.global_params[n], mean, rtol=0, atol=1e-12)
        assert not torch.allclose(trained[0][n], trained[1][n])  # the mean is not any client's own
    for n in local:
        assert torch.equal(state.global_params[n], init[n])  # never aggregated
        for k in range(2):
            torch.testing.assert_close(state.client_params[n][k], trained[k][n], rtol=0, atol=1e-12)


def test_fedrep_head_passes_train_the_head_longer():
    """head_passes = 2: two head steps (body frozen), then one body step: not the one-pass result."""
    data, init, state = _one_round("fedrep", StackedExecutor(), head_passes=2)
    for k in range(2):
        x, y = data.train.client(k)
        p = _sgd_step(_sgd_step(_sgd_step(init, x, y, BODY_KEYS), x, y, BODY_KEYS), x, y, HEAD_KEYS)
        one = _sgd_step(_sgd_step(init, x, y, BODY_KEYS), x, y, HEAD_KEYS)
        for n in HEAD_KEYS:
            torch.testing.assert_close(state.client_params[n][k], p[n], rtol=0, atol=1e-12)
            assert not torch.allclose(p[n], one[n])
