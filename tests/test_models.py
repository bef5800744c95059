"""Contract tests over every registered model: shapes, finiteness, gradients, stacked coverage, attention slots."""

import math

import pytest
import torch
from torch import nn

from fedlib.models.groups import param_groups
from fedlib.models.local_attention import ATTENTIONS, CA, SE
from fedlib.models.registry import (
    KERNELS,
    MODELS,
    ModelSpec,
    build_model,
    count_parameters,
    kernel_of,
    linear_chain,
    register_model,
    unregister_model,
)

CASES = [(name, shape) for name in sorted(MODELS) for shape in MODELS[name].example_shapes]


@pytest.mark.parametrize("name,shape", CASES, ids=[f"{n}-{'x'.join(map(str, s))}" for n, s in CASES])
def test_model_contract(name, shape):
    """Every registered model on each input shape it declares (flat vectors, 28x28 digits, Office-sized images)."""
    _contract(name, shape)
    assert MODELS[name].kernel == {"mlr": "chain", "dnn": "chain", "mlp": "chain", "cnn": "vmap"}.get(name, "loop")


class _UserNet(nn.Module):
    """A user's conv net, with BatchNorm when ``bn`` (its running statistics: the loop kernel)."""

    def __init__(self, shape, n_classes, hidden, bn=False):
        super().__init__()
        self.conv = nn.Conv2d(shape[0], hidden[0], 3, padding=1)
        self.norm = nn.BatchNorm2d(hidden[0]) if bn else nn.Identity()
        self.head = nn.Linear(hidden[0] * shape[1] * shape[2], n_classes)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.conv(x))).flatten(1))


# models as users register them (``register_model``): the kernel each is read as, and its registration's arguments
USER_MODELS = {
    "user-chain": ("chain", lambda s, c: nn.Sequential(nn.Flatten(), nn.Linear(math.prod(s), c)), {}),
    "user-conv": ("vmap", _UserNet, {"default_hidden": (3,), "example_shapes": ((1, 28, 28), (3, 8, 8))}),
    "user-bn": ("loop", lambda s, c, h: _UserNet(s, c, h, bn=True),
                {"default_hidden": (3,), "groups": ("bn",), "example_shapes": ((3, 8, 8),)}),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(USER_MODELS))
def test_registered_model_contract(name):
    """The contract holds for models registered by users, on each of their example shapes; the kernel read off
    each (``kernel=None``) is what it structurally is."""
    kernel, builder, kw = USER_MODELS[name]
    spec = register_model(name, builder, **kw)
    try:
        assert spec.kernel == kernel and spec.version == 1
        for shape in spec.example_shapes:
            _contract(name, shape)
        if "bn" in spec.groups:
            assert "bn" in param_groups(build_model(name, spec.example_shapes[0], 10)).values()
    finally:
        unregister_model(name)
    assert name not in MODELS


def _contract(name, shape):
    spec = MODELS[name]
    m = build_model(name, shape, 10, seed=0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, *shape, generator=g)
    out = m(x)
    assert out.shape == (7, 10) and torch.isfinite(out).all()
    torch.nn.functional.cross_entropy(out, torch.arange(7) % 10).backward()
    for n, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, n
    # the Linear chains are covered by the stacked kernel; the conv nets go to the per-client loop executor
    assert (linear_chain(m) is not None) == (spec.kernel == "chain")
    # the declared kernel is what the model structurally is (cnn: buffer-free conv net -> vmap; BN nets -> loop)
    assert m.fedlib_kernel == spec.kernel == kernel_of(m)
    del m.fedlib_kernel
    assert kernel_of(m) == spec.kernel
    if spec.attention_slots:  # backbone BN layers are the only names with "bn"; no "attn" without attention
        bns = {n for n, mod in m.named_modules() if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)}
        assert bns and all("bn" in n for n in bns)
        assert all(("bn" in k) == (k.rsplit(".", 1)[0] in bns) for k in m.state_dict())
        assert not any("attn" in k for k in m.state_dict())


@pytest.mark.parametrize("name", [n for n in sorted(MODELS) if MODELS[n].attention_slots])
def test_attention_keyword_builds_slots(name):
    shape = MODELS[name].example_shapes[-1]
    hidden = (16, 8) if MODELS[name].default_hidden else None
    m = build_model(name, shape, 5, hidden, seed=0, attention="se")
    keys = [k for k in m.state_dict() if "attn" in k]
    assert keys and all(".fc1." in k or ".fc2." in k for k in keys)
    assert m(torch.randn(2, *shape)).shape == (2, 5)
    with pytest.raises(ValueError, match="attention='cbam' is not one of: none, se, eca, ca, hybrid"):
        build_model(name, shape, 5, hidden, attention="cbam")


@pytest.mark.parametrize("name", [n for n in sorted(MODELS) if not MODELS[n].attention_slots])
def test_attention_needs_slots(name):
    with pytest.raises(
        ValueError, match=f"attention='se' needs a model with attention slots .*model='{name}' has none"
    ):
        build_model(name, MODELS[name].example_shapes[0], 10, attention="se")
    build_model(name, MODELS[name].example_shapes[0], 10, attention="none")  # the default stays valid


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
    with pytest.raises(ValueError, match="model='resnet' is not one of: mlr, dnn, mlp, .*lenet, alexnet, mobilenetv2"):
        build_model("resnet", (60,), 10)


def test_linear_chain_rejects_other_shapes():
    from torch import nn

    assert linear_chain(nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 2))) is None
    assert linear_chain(nn.Sequential(nn.Linear(3, 3), nn.ReLU())) is None
    assert linear_chain(nn.Linear(3, 3)) is None
    assert linear_chain(nn.Sequential(nn.Flatten(), nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))) == ["1", "3"]


# -- declared capabilities: kernel_of and param_groups ------------------------------------------------------
def test_kernel_of_undeclared_modules_fall_back_to_structure():
    assert kernel_of(nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))) == "chain"
    assert kernel_of(nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))) == "vmap"  # not a chain, no buffers
    assert kernel_of(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten())) == "vmap"
    assert kernel_of(nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 2))) == "loop"


def test_kernel_of_reads_and_checks_the_declaration():
    chain = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    chain.fedlib_kernel = "loop"  # conservative declarations are honoured
    assert kernel_of(chain) == "loop"
    chain.fedlib_kernel = "vmap"
    assert kernel_of(chain) == "vmap"
    conv = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten())
    conv.fedlib_kernel = "chain"
    with pytest.raises(ValueError, match="declares kernel 'chain' but is not a Flatten/Linear/ReLU chain"):
        kernel_of(conv)
    bn = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    bn.fedlib_kernel = "vmap"
    with pytest.raises(ValueError, match="declares kernel 'vmap' but has buffers"):
        kernel_of(bn)
    bn.fedlib_kernel = "gpu"
    with pytest.raises(ValueError, match="fedlib_kernel='gpu' is not one of: chain, vmap, loop"):
        kernel_of(bn)
    with pytest.raises(ValueError, match="kernel='fast' is not one of: chain, vmap, loop"):
        ModelSpec("x", lambda s, c, h: nn.Linear(1, 1), (), "doc", kernel="fast")
    assert KERNELS == ("chain", "vmap", "loop")


GROUP_CASES = [(n, a) for n in sorted(MODELS) for a in (ATTENTIONS if MODELS[n].attention_slots else ("none",))]


@pytest.mark.parametrize("name,attention", GROUP_CASES, ids=[f"{n}-{a}" for n, a in GROUP_CASES])
def test_param_groups_agree_with_the_naming_convention(name, attention):
    """Switching FedBN/pFedLA from the name markers ('bn', 'attn' in the state-dict name, stages.shared_except)
    to param_groups changes no result: on every registered model with every attention option the two agree."""
    m = build_model(name, MODELS[name].example_shapes[-1], 10, attention=attention)
    groups = param_groups(m)
    assert list(groups) == list(m.state_dict())
    for k, g in groups.items():
        assert ("bn" in k) == (g == "bn") and ("attn" in k) == (g == "attn"), (k, g)
    assert ("attn" in groups.values()) == (attention != "none")
    assert ("bn" in groups.values()) == MODELS[name].attention_slots  # the pFedLA nets have BN, the others none


def test_param_groups_by_type_not_name():
    """A BatchNorm not named 'bn' is still 'bn'; attention modules under any name are 'attn', BN inside included;
    a module may declare its group."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3)
            self.norm = nn.BatchNorm2d(8)  # backbone BN, no "bn" in its name
            self.gate = CA(8)  # attention, no "attn" in its name; holds a BatchNorm ("norm")
            self.squeeze = SE(8, 4)
            self.head = nn.Sequential(nn.Flatten(), nn.Linear(8, 2))
            self.abnormal = nn.Linear(2, 2)  # "bn" and "norm" in its name, yet not a BatchNorm
            self.custom = nn.Linear(2, 2)
            self.custom.fedlib_group = "attn"  # a declared group

    net = Net()
    groups = param_groups(net)
    assert list(groups) == list(net.state_dict())
    assert {k for k, g in groups.items() if g == "bn"} == {
        "norm.weight",
        "norm.bias",
        "norm.running_mean",
        "norm.running_var",
        "norm.num_batches_tracked",
    }
    attn = {k for k, g in groups.items() if g == "attn"}
    assert {
        "gate.norm.weight",
        "gate.norm.running_mean",
        "gate.norm.num_batches_tracked",
        "gate.reduce.weight",
        "squeeze.fc1.weight",
        "custom.weight",
        "custom.bias",
    } <= attn
    assert attn == {k for k in groups if k.startswith(("gate.", "squeeze.", "custom."))}
    assert {k for k, g in groups.items() if g == ""} == {
        "conv.weight",
        "conv.bias",
        "head.1.weight",
        "head.1.bias",
        "abnormal.weight",
        "abnormal.bias",
    }
    # a bare BatchNorm as the whole model, and a BN shared under two names, are both found
    assert set(param_groups(nn.BatchNorm1d(3)).values()) == {"bn"}
    shared = nn.BatchNorm1d(3)
    twice = nn.Sequential(shared, nn.ReLU(), shared)
    assert set(param_groups(twice).values()) == {"bn"} and len(param_groups(twice)) == len(twice.state_dict())
