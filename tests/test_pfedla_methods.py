"""pFedLA's stage (attention kept local), FedBN (BN kept local) and Ditto (personal models with a pull to the global)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import simulate_with, small_synthetic

from fedlib.algorithms import build_algorithm
from fedlib.config.run import RunConfig
from fedlib.core.state import start_models
from fedlib.data.federated import FederatedData
from fedlib.executors import LoopExecutor, StackedExecutor
from fedlib.models.registry import build_model


def _digits_like(n_clients=3, rows=24, seed=0) -> FederatedData:
    """Random 3x28x28 'domains': client i's images are shifted by i (a feature shift), labels random."""
    g = np.random.default_rng(seed)
    xs = [g.normal(i, 1 + i, size=(rows, 3, 28, 28)).astype(np.float64) for i in range(n_clients)]
    ys = [g.integers(0, 10, rows) for _ in range(n_clients)]
    tr = [np.arange(rows * 2 // 3) for _ in range(n_clients)]
    te = [np.arange(rows * 2 // 3, rows) for _ in range(n_clients)]
    return FederatedData.from_clients("digits-like", xs, ys, tr, te, 10).to("cpu", torch.float64)


def _run(cfg, data, rounds=2, on_round=None, executor=None):
    """(algorithm, a fresh copy of the initial model, result); the loop executor reuses the module it is given."""
    alg = build_algorithm(cfg.validate(), n_samples=data.train.sizes.numpy())
    model = lambda: build_model(
        cfg.model.name, data.input_shape, 10, seed=0, dtype=torch.float64, attention=cfg.attention
    )
    res = simulate_with(
        alg,
        data,
        model(),
        executor or LoopExecutor(),
        rounds,
        local_steps=cfg.local_steps,
        batch_size=cfg.batch_size,
        progress=False,
        on_round=on_round,
    )
    return alg, model(), res


LENET = RunConfig(
    model="lenet", n_clients=3, clients_per_round=None, local_steps=2, batch_size=4, lr=0.05, dataset="synthetic"
)


def test_fedbn_keeps_bn_local():
    data = _digits_like()
    alg, model, res = _run(LENET.replace(algorithm="fedbn"), data)
    st, init = res.state, model.state_dict()
    bn = [n for n in st.client_params if "bn" in n and st.client_params[n].is_floating_point()]
    assert bn and all(not alg.shared(n) for n in bn)
    for n in bn:
        assert torch.equal(st.global_params[n], init[n])  # never aggregated
        c = st.client_params[n]
        assert not torch.allclose(c[0], c[1]) and not torch.allclose(c[1], c[2]), n  # each client its own statistics
    start, _ = start_models(alg, st, torch.arange(3))
    for n, t in start.items():
        want = st.client_params[n] if "bn" in n else st.global_params[n].expand_as(t)
        assert torch.equal(t, want), n


def test_fedbn_without_bn_is_refused():
    """FedBN on a model without BatchNorm trained silently as FedAvg (same test losses); now refused."""
    base = RunConfig(n_clients=4, clients_per_round=2, rounds=3, local_steps=3, batch_size=5, model="dnn", lr=0.1)
    with pytest.raises(ValueError, match="algorithm='fedbn' keeps the model's bn parameters.*model='dnn' has none"):
        base.replace(algorithm="fedbn").validate()
    base.replace(algorithm="fedbn", model="lenet", hidden=None).validate()


def test_models_declare_their_parameter_groups():
    """``ModelSpec.groups`` (what validation reads) is what ``param_groups`` finds in every built model."""
    from fedlib.models.groups import param_groups
    from fedlib.models.registry import MODELS

    for name, spec in MODELS.items():
        model = spec.build(spec.example_shapes[0], 10, spec.default_hidden)
        assert set(param_groups(model).values()) - {"", "attn"} == set(spec.groups), name


@pytest.mark.parametrize("algorithm", ["fedavg", "fedbn", "fedprox", "ditto", "pfedme"])
def test_pfedla_attention_never_leaves_the_client(algorithm):
    """After aggregation every client's attention parameters are the ones it trained (the server never saw them),
    they differ across clients, and the next round starts from them; the shared weights start from the global model."""
    data = _digits_like()
    cfg = LENET.replace(algorithm=algorithm, attention="se", **({"mu": 0.01} if algorithm == "fedprox" else {}))
    trained = {}

    def spy(t, sel, mixing, state):  # runs right after aggregation
        trained[t] = {n: v.clone() for n, v in state.client_params.items() if "attn" in n}

    alg, model, res = _run(cfg, data, 2, on_round=spy)
    st = res.state
    attn = [n for n in st.client_params if "attn" in n]
    assert attn and all(not alg.shared(n) for n in attn)
    for n in attn:
        assert torch.equal(st.client_params[n], trained[2][n])
        assert torch.equal(st.global_params[n], model.state_dict()[n])  # the global copy is never touched
    # clients' attention differs (LeNet's 6-channel SE slot has one hidden unit, which can start dead -- see
    # fedlib.models.local_attention -- so not every tensor moves; the 16-channel slot's do)
    assert not torch.allclose(st.client_params["attn2.fc2.weight"][0], st.client_params["attn2.fc2.weight"][1])
    start, _ = start_models(alg, st, torch.arange(3))
    for n in attn:
        assert torch.equal(start[n], st.client_params[n])
    conv = "conv1.weight"
    assert alg.shared(conv)
    if alg.start == "global":
        assert torch.equal(start[conv][1], st.global_params[conv])


def test_non_local_ablation_sends_attention():
    data = _digits_like()
    alg, model, res = _run(LENET.replace(algorithm="fedavg", attention="se", attention_local=False), data)
    attn = [n for n in res.state.global_params if "attn" in n and res.state.global_params[n].is_floating_point()]
    assert all(alg.shared(n) for n in attn)
    assert any(not torch.equal(res.state.global_params[n], model.state_dict()[n]) for n in attn)  # averaged


def test_attention_config_errors():
    with pytest.raises(ValueError, match="attention='se' needs a model with attention slots"):
        RunConfig(attention="se", model="mlp").validate()
    with pytest.raises(ValueError, match="attention_local=False"):
        RunConfig(attention_local=False, model="lenet").validate()
    with pytest.raises(ValueError, match="RunConfig.attention='cbam' is not one of"):
        RunConfig(attention="cbam", model="lenet").validate()


def _initial_client_params(monkeypatch) -> list:
    """The clients' models as round 1 starts, one dict per run trained after this call."""
    from fedlib.core import simulation

    seen, real = [], simulation.run_round

    def first(run, t):
        if t == 1:
            seen.append({k: v.clone() for k, v in run.state.client_params.items()})
        return real(run, t)

    monkeypatch.setattr(simulation, "run_round", first)
    return seen


@pytest.mark.parametrize("attention", ["se", "hybrid"])
def test_per_client_attention_draws_each_clients_own(attention, monkeypatch):
    """pFedLA Algorithm 1, line 9: each client's attention starts from its own random draw (``attention_init=
    'per_client'``): client i's from the model drawn with seed SeedSequence([seed, i]), the backbone the run's one
    draw. The default ('shared', every stored run) starts every client from the run's one model."""
    from fedlib.models.groups import param_groups
    from fedlib.models.local_attention import per_client_attention

    data, cfg = _digits_like(), LENET.replace(algorithm="fedbn", attention=attention)
    build = lambda s: build_model("lenet", data.input_shape, 10, seed=s, dtype=torch.float64, attention=attention)
    init = per_client_attention(build, 3, seed=0)
    alg = build_algorithm(cfg.validate(), n_samples=data.train.sizes.numpy())
    train = lambda **kw: simulate_with(
        alg, data, build(0), LoopExecutor(), 1, local_steps=2, batch_size=4, progress=False, **kw
    )
    seen = _initial_client_params(monkeypatch)
    train(client_init=init), train()
    own, shared = seen
    groups, model = param_groups(build(0)), build(0).state_dict()
    attn = [k for k in model if groups[k] == "attn"]
    assert sorted(init) == sorted(attn)
    for k, v in own.items():
        if groups[k] != "attn":  # the backbone: the run's one draw on every client
            assert all(torch.equal(row, model[k]) for row in v) and torch.equal(v, shared[k]), k
            continue
        assert all(torch.equal(row, shared[k][0]) for row in shared[k]), k  # 'shared': one draw for all
        for i in range(3):
            seed_i = int(np.random.SeedSequence([0, i]).generate_state(1)[0])
            assert torch.equal(v[i], build(seed_i).state_dict()[k]), (k, i)
    weights = [k for k in attn if k.endswith("weight") and own[k][0].dim() > 1]  # drawn, not set (BN, logits)
    assert weights and all(not torch.equal(own[k][0], own[k][i]) for k in weights for i in (1, 2))


def test_client_init_of_a_shared_parameter_is_refused():
    data = _digits_like()
    cfg = LENET.replace(algorithm="fedavg", attention="se")
    alg = build_algorithm(cfg.validate(), n_samples=data.train.sizes.numpy())
    model = build_model("lenet", data.input_shape, 10, seed=0, dtype=torch.float64, attention="se")
    shared = {k: v.unsqueeze(0).repeat(3, *[1] * v.dim()) for k, v in model.state_dict().items() if "conv" in k}
    with pytest.raises(ValueError, match="client_init names 'conv1.weight', a parameter the clients share"):
        simulate_with(alg, data, model, LoopExecutor(), 1, local_steps=1, batch_size=4, progress=False,
                 client_init=dict(list(shared.items())[:1]))  # fmt: skip


def test_runs_with_per_client_attention_draw_it(monkeypatch):
    """``train.train`` hands ``simulate`` each client's own draw for ``attention_init='per_client'`` only."""
    from fedlib.runs import train as runner

    got = []

    def stop(*args, client_init=None, **kwargs):
        got.append(client_init)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "simulate", stop)
    base = RunConfig(dataset="digits", partition="domains", model="lenet", algorithm="fedbn", attention="se",
                     n_clients=3, domains=("mnist", "usps", "mnist_m"), clients_per_round=None, local_epochs=1,
                     local_steps=None, domain_percent=0.02, rounds=1)  # fmt: skip
    for cfg in (base, base.replace(attention_init="per_client")):
        with pytest.raises(KeyboardInterrupt):
            runner.train(cfg, progress=False)
    assert got[0] is None
    assert got[1] and all(v.shape[0] == 3 for v in got[1].values()) and all("attn" in k for k in got[1])
    assert any(not torch.equal(v[0], v[1]) for v in got[1].values())


def test_attention_init_is_refused_where_no_attention_is_local():
    base = dict(dataset="digits", partition="domains", model="lenet", n_clients=5, clients_per_round=None)
    for extra in ({}, {"attention": "se", "attention_local": False}):
        with pytest.raises(ValueError, match="attention_init='per_client' is set but applies only when the attention"):
            RunConfig(**base, **extra, attention_init="per_client").validate()
    with pytest.raises(ValueError, match="attention_init='random' is not one of: shared, per_client"):
        RunConfig(**base, attention="se", attention_init="random").validate()
    assert RunConfig(**base, attention="se").key() == RunConfig(**base, attention="se", attention_init="shared").key()


def test_ditto_large_lambda_pins_personal_to_global():
    """lr * lambda = 1, one local step: v = v_old - lr (grad F(v_old) + lambda (v_old - w^t)) = w^t - lr grad F(v_old)."""
    data = small_synthetic(n_clients=2)
    lr, lam = 0.01, 100.0
    cfg = RunConfig(
        algorithm="ditto", lam=lam, lr=lr, n_clients=2, clients_per_round=None, local_steps=1, batch_size=6, model="dnn"
    )
    alg, model, res = _run(cfg, data, 1, executor=StackedExecutor())
    st = res.state
    from fedlib.data.federated import sample_steps

    plan = sample_steps(data.train.layout(), torch.arange(2), 1, 6, torch.Generator().manual_seed(1))
    for i in range(2):
        rows = plan.index[0, i]
        m = build_model("dnn", (60,), 10, seed=0, dtype=torch.float64)  # v_old = w^t = the initial model
        loss = F.cross_entropy(m(data.train.x[rows]), data.train.y[rows])
        grads = dict(zip([n for n, _ in m.named_parameters()], torch.autograd.grad(loss, list(m.parameters()))))
        for n, p in m.named_parameters():
            assert torch.allclose(st.extra["ditto"].v[n][i], p.detach() - lr * grads[n], rtol=0, atol=1e-12)
    # the personal models are what is evaluated, the global model is reported beside them
    assert res.metrics.gm_test_acc.notna().all()


def test_ditto_lambda_zero_personal_is_local_training():
    """lambda = 0: v_k trains on F_k alone from its own last v_k -- after one round the same as the uploaded model
    (both start from w^1 = the initial model and see the same mini-batches)."""
    data = small_synthetic(n_clients=3)
    cfg = RunConfig(
        algorithm="ditto",
        lam=0.0,
        lr=0.1,
        n_clients=3,
        clients_per_round=None,
        local_steps=3,
        batch_size=5,
        model="dnn",
    )
    captured = {}
    alg, _, res = _run(
        cfg,
        data,
        1,
        executor=StackedExecutor(),
        on_round=lambda t, s, m, st: captured.update({n: v.clone() for n, v in st.client_params.items()}),
    )
    for n, v in res.state.extra["ditto"].v.items():
        assert torch.allclose(v, captured[n], rtol=0, atol=1e-14)


@pytest.mark.parametrize("profile", ["smoke", "quick", "paper"])
def test_the_init_ablation_is_table1s_se_cells_with_per_client_attention(profile):
    """``pfedla_attention_init``: Table 1's cells of every method with SE, and FedBN's with the hybrid, every seed,
    with ``attention_init='per_client'`` and nothing else changed (notebook 31 pairs each run with its Table 1 cell)."""
    from fedlib.experiments import profiles
    from fedlib.runs.grids import expand

    wanted = lambda c: c.attention == "se" or (c.algorithm == "fedbn" and c.attention == "hybrid")
    table1 = {c.replace(attention_init="per_client").key() for c in expand(*profiles.get("pfedla_table1", profile))
              if wanted(c)}  # fmt: skip
    ablation = expand(*profiles.get("pfedla_attention_init", profile))
    assert {c.attention_init for c in ablation} == {"per_client"}
    assert {c.key() for c in ablation} == table1 and len(ablation) == len(table1) > 0
