"""Contract tests over every registered model: shapes, finiteness, gradients, stacked coverage."""
import pytest
import torch

from fedlib.models import MODELS, build_model, count_parameters, linear_chain


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("shape", [(60,), (1, 28, 28)])
def test_model_contract(name, shape):
    m = build_model(name, shape, 10, seed=0)
    x = torch.randn(7, *shape)
    out = m(x)
    assert out.shape == (7, 10) and torch.isfinite(out).all()
    torch.nn.functional.cross_entropy(out, torch.arange(7) % 10).backward()
    for n, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, n
    assert linear_chain(m) is not None  # every registered model is covered by the stacked kernel


def test_seeded_init_is_reproducible_and_local():
    state = torch.random.get_rng_state()
    a = build_model("dnn", (60,), 10, (20,), seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)  # seeding does not disturb the global RNG
    b = build_model("dnn", (60,), 10, (20,), seed=3)
    c = build_model("dnn", (60,), 10, (20,), seed=4)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert not torch.equal(a.state_dict()["1.weight"], c.state_dict()["1.weight"])


def test_paper_sizes():
    # FedMCSA: MLR on Synthetic 60*10+10; DNN 60-20-10; AdaFL's 784-200-200-10 MLP has 199,210 parameters
    assert count_parameters(build_model("mlr", (60,), 10)) == 610
    assert count_parameters(build_model("dnn", (60,), 10, (20,))) == 60 * 20 + 20 + 20 * 10 + 10
    assert count_parameters(build_model("mlp", (1, 28, 28), 10)) == 199_210


def test_unknown_model_names_allowed():
    with pytest.raises(ValueError, match="model='cnn' is not one of: mlr, dnn, mlp"):
        build_model("cnn", (60,), 10)


def test_linear_chain_rejects_other_shapes():
    from torch import nn
    assert linear_chain(nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 2))) is None
    assert linear_chain(nn.Sequential(nn.Linear(3, 3), nn.ReLU())) is None
    assert linear_chain(nn.Linear(3, 3)) is None
    assert linear_chain(nn.Sequential(nn.Flatten(), nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))) == ["1", "3"]
