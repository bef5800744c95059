"""pFedLA's conv nets with client-local attention slots (their parameter counts: ``fedlib.papers.pfedla.params``).

Liang, Tian, Yang, Zhang, "Personalized Federated Learning with Local Attention" (pFedLA): Table 7
(LeNet with BN, the digits model), Table 8 (AlexNet with BN, the Office-31 / Office-Home / DomainNet
model), Tables 9-10 (MobileNetV2, the detection backbone; here with a classification head). Every net
takes ``attention`` in none | se | eca | ca | hybrid (``fedlib.models.local_attention``) and puts one slot after
each conv layer the paper marks. The attention is pFedLA's local part; nothing else changes.

Which parameters stay local is declared by module type (``fedlib.models.groups.param_groups``: backbone
BatchNorm -> "bn", ``fedlib.models.local_attention.ATTENTION_MODULES`` -> "attn"). The state-dict names follow
a naming convention too (what ``stages.shared_except`` matches, for hand-built algorithms): BatchNorm
layers of the backbone contain ``bn`` (``bn1``, ``blocks.4.dw_bn``), attention slots contain ``attn``
(``attn1``, ``blocks.4.attn``), and no other name contains either.

Architecture choices. pFedLA's tables are not self-consistent; the published parameter counts of Tables 2
and 4 pin down the readings used here (the arithmetic of every row and the alternatives tried are in
``fedlib.papers.pfedla.params``): LeNet ``padding=0`` (FC(256, 120) chains at 28x28 only so), slots after the
pooling of each conv block (C = 6, 16), SE r = 4; AlexNet without Table 8's non-chaining row 3 (= FedBN's
AlexNet), a slot after each of the five conv blocks, SE r = 16; MobileNetV2 (Tables 9-10) as the
MobileNetV2 paper's code (BN after every conv, no 1x1 expansion when t = 1, a Linear head), a slot after
the depthwise conv of each of the 17 bottlenecks. All nets: CA as in Hou et al. (r = 32, at least 8 mid
channels), ECA (gamma = 2, b = 1) WITH a bias (the LeNet hybrid row needs it), ``PFEDLA_ATTENTION``.

All nets use PyTorch's default initialisation. ``input_shape`` is (C, H, W); LeNet needs 28x28 for the
published count (other sizes change its FC), AlexNet any size >= 63x63, MobileNetV2 any size >= 1.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn
from torch.nn import functional as F

from fedlib.models.groups import head
from fedlib.models.local_attention import KINDS, make_attention

# Attention options pFedLA's counts imply for each net (see the module docstring); passed to make_attention.
PFEDLA_ATTENTION: dict[str, dict] = {
    "lenet": dict(se_reduction=4, ca_reduction=32, ca_min_mid=8, eca_gamma=2, eca_b=1, eca_bias=True),
    "alexnet": dict(se_reduction=16, ca_reduction=32, ca_min_mid=8, eca_gamma=2, eca_b=1, eca_bias=True),
    "mobilenetv2": dict(se_reduction=16, ca_reduction=32, ca_min_mid=8, eca_gamma=2, eca_b=1, eca_bias=True),
}

ATTENTION_OPTION_KEYS = ("se_reduction", "ca_reduction", "ca_min_mid", "eca_gamma", "eca_b", "eca_bias")


def _check_attention(attention: str) -> None:
    if attention not in KINDS:
        raise ValueError(f"attention={attention!r} is not one of: {', '.join(KINDS)}")


def _options(model: str, overrides: dict) -> dict:
    bad = set(overrides) - set(ATTENTION_OPTION_KEYS)
    if bad:
        raise TypeError(f"unknown attention options {sorted(bad)}; allowed: {', '.join(ATTENTION_OPTION_KEYS)}")
    return {**PFEDLA_ATTENTION[model], **overrides}


def _hidden(model: str, hidden, n: int) -> tuple[int, ...]:
    hidden = tuple(hidden)
    if len(hidden) != n or not all(isinstance(h, int) and h > 0 for h in hidden):
        raise ValueError(f"{model} takes hidden= {n} positive FC widths, got {hidden!r}")
    return hidden


def max_pool_2x2(x: torch.Tensor) -> torch.Tensor:
    """``F.max_pool2d(x, 2, 2)``. Without autograd on the CPU (evaluation) it is the maximum of row pairs, then of
    column pairs: the same values (a maximum is exact; NaN propagates in both). Torch's pooling kernel is a large
    share of a LeNet-BN evaluation over the digits' test sets, several times the time of this form; and rows first
    beats the four strided views' three maxima, with one thread or two: the row pairs' maximum reads whole rows,
    vectorised, and halves what the column pairs' strided one reads (measured: docs/measurements/). Training keeps
    torch's kernel, whose gradient goes to one of tied inputs."""
    if torch.is_grad_enabled() or x.device.type != "cpu":
        return F.max_pool2d(x, 2, 2)
    x = x[..., : x.shape[-2] // 2 * 2, : x.shape[-1] // 2 * 2]  # an odd last row/column is dropped, as there
    rows = torch.maximum(x[..., 0::2, :], x[..., 1::2, :])
    return torch.maximum(rows[..., 0::2], rows[..., 1::2])


def relu(x: torch.Tensor, six: bool = False) -> torch.Tensor:
    """``F.relu(x)`` (``F.relu6`` with ``six``), in place when no gradient is recorded (evaluation, where ``x`` is a
    BatchNorm's fresh output): the same values, without a new tensor, several times faster on a CPU (measured:
    docs/measurements/). With autograd it is torch's out-of-place op."""
    inplace = not torch.is_grad_enabled()
    return F.relu6(x, inplace=inplace) if six else F.relu(x, inplace=inplace)


class LeNet(nn.Module):
    """pFedLA Table 7's LeNet with BN (not FedBN's digits net, ``DigitModel``, a wider one): conv5-BN-ReLU-pool-attn
    x 2, FC-BN-ReLU x 2, FC.

    ``hidden`` = (120, 84) are the FC widths; ``padding`` = 0 makes FC(256, 120) chain at 28x28 (Table 7
    lists 1, which needs FC(400, 120)); the flatten size follows ``input_shape``. Slots ``attn1``
    (6 channels) and ``attn2`` (16). ``attention_options`` override ``PFEDLA_ATTENTION['lenet']``.
    """

    def __init__(
        self,
        input_shape=(3, 28, 28),
        n_classes: int = 10,
        hidden=(120, 84),
        attention: str = "none",
        padding: int = 0,
        **attention_options,
    ):
        super().__init__()
        _check_attention(attention)
        c, h, w = input_shape
        h1, h2 = _hidden("lenet", hidden, 2)
        opts = _options("lenet", attention_options)
        self.conv1, self.bn1 = nn.Conv2d(c, 6, 5, 1, padding), nn.BatchNorm2d(6)
        self.attn1 = make_attention(attention, 6, **opts)
        self.conv2, self.bn2 = nn.Conv2d(6, 16, 5, 1, padding), nn.BatchNorm2d(16)
        self.attn2 = make_attention(attention, 16, **opts)
        for _ in range(2):  # conv 5x5 stride 1, then 2x2 max-pool
            h, w = (h + 2 * padding - 4) // 2, (w + 2 * padding - 4) // 2
        if h < 1 or w < 1:
            raise ValueError(f"input_shape={tuple(input_shape)} is too small for LeNet")
        self.fc1, self.bn3 = nn.Linear(16 * h * w, h1), nn.BatchNorm1d(h1)
        self.fc2, self.bn4 = nn.Linear(h1, h2), nn.BatchNorm1d(h2)
        self.fc3 = head(nn.Linear(h2, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn1(max_pool_2x2(relu(self.bn1(self.conv1(x)))))
        x = self.attn2(max_pool_2x2(relu(self.bn2(self.conv2(x)))))
        x = torch.flatten(x, 1)
        x = relu(self.bn3(self.fc1(x)))
        x = relu(self.bn4(self.fc2(x)))
        return self.fc3(x)


class AlexNet(nn.Module):
    """pFedLA Table 8 without its non-chaining row 3 (= FedBN's AlexNet): five conv blocks, BN everywhere.

    Conv(3,64,11,4,2)-pool | Conv(64,192,5,1,2)-pool | Conv(192,384,3,1,1) | Conv(384,256,3,1,1) |
    Conv(256,256,3,1,1)-pool, each conv followed by BN and ReLU (then the pool 3/2 where listed) and the
    slot ``attn{j}``; AdaptiveAvgPool(6, 6); FC(9216, h1)-BN-ReLU, FC(h1, h2)-BN-ReLU, FC(h2, classes).
    ``slots``: which conv blocks (1-5) get an attention slot (all five: pFedLA's Table 11 has five
    layers); the others get ``nn.Identity``.
    """

    CONVS = (
        (64, 11, 4, 2, True),
        (192, 5, 1, 2, True),
        (384, 3, 1, 1, False),
        (256, 3, 1, 1, False),
        (256, 3, 1, 1, True),
    )  # (out channels, kernel, stride, padding, max-pool after)

    def __init__(
        self,
        input_shape=(3, 224, 224),
        n_classes: int = 10,
        hidden=(4096, 4096),
        attention: str = "none",
        slots: Iterable[int] = (1, 2, 3, 4, 5),
        **attention_options,
    ):
        super().__init__()
        _check_attention(attention)
        h1, h2 = _hidden("alexnet", hidden, 2)
        opts = _options("alexnet", attention_options)
        slots = set(slots)
        cin = input_shape[0]
        for j, (cout, k, s, p, _) in enumerate(self.CONVS, start=1):
            setattr(self, f"conv{j}", nn.Conv2d(cin, cout, k, s, p))
            setattr(self, f"bn{j}", nn.BatchNorm2d(cout))
            setattr(self, f"attn{j}", make_attention(attention if j in slots else "none", cout, **opts))
            cin = cout
        self.fc1, self.bn6 = nn.Linear(256 * 6 * 6, h1), nn.BatchNorm1d(h1)
        self.fc2, self.bn7 = nn.Linear(h1, h2), nn.BatchNorm1d(h2)
        self.fc3 = head(nn.Linear(h2, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for j, (*_, pool) in enumerate(self.CONVS, start=1):
            x = relu(getattr(self, f"bn{j}")(getattr(self, f"conv{j}")(x)))
            if pool:
                x = F.max_pool2d(x, 3, 2)
            x = getattr(self, f"attn{j}")(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, (6, 6)), 1)
        x = relu(self.bn6(self.fc1(x)))
        x = relu(self.bn7(self.fc2(x)))
        return self.fc3(x)


class Bottleneck(nn.Module):
    """pFedLA Table 10: [1x1 expand-BN-ReLU6 if t > 1] -> 3x3 depthwise (stride s)-BN-ReLU6 -> attn -> 1x1-BN.

    Residual when s = 1 and the channels match (MobileNetV2). Names: ``expand_conv/expand_bn``,
    ``dw_conv/dw_bn``, ``attn``, ``project_conv/project_bn``.
    """

    def __init__(self, cin: int, cout: int, stride: int, t: int, attention: str, opts: dict):
        super().__init__()
        mid = cin * t
        self.residual = stride == 1 and cin == cout
        if t != 1:
            self.expand_conv, self.expand_bn = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
        else:
            self.expand_conv = self.expand_bn = None
        self.dw_conv = nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False)
        self.dw_bn = nn.BatchNorm2d(mid)
        self.attn = make_attention(attention, mid, **opts)
        self.project_conv, self.project_bn = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        if self.expand_conv is not None:
            y = relu(self.expand_bn(self.expand_conv(y)), six=True)
        y = self.attn(relu(self.dw_bn(self.dw_conv(y)), six=True))
        y = self.project_bn(self.project_conv(y))
        return x + y if self.residual else y


class MobileNetV2(nn.Module):
    """pFedLA Table 9 (MobileNetV2, width 1.0) with Table 10's bottleneck; a classification head.

    Conv3x3(32, s2)-BN-ReLU6, the 17 bottlenecks of ``SETTINGS`` (t, c, n, s), Conv1x1(1280)-BN-ReLU6,
    global average pool, Linear(1280, classes) (Table 9's final 1x1 conv). Slots ``blocks.{i}.attn``.
    """

    SETTINGS = (
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    )

    def __init__(
        self, input_shape=(3, 224, 224), n_classes: int = 1000, hidden=(), attention: str = "none", **attention_options
    ):
        super().__init__()
        _check_attention(attention)
        if tuple(hidden):
            raise ValueError(f"mobilenetv2 has no hidden FC layers; got hidden={tuple(hidden)!r}")
        opts = _options("mobilenetv2", attention_options)
        self.stem_conv = nn.Conv2d(input_shape[0], 32, 3, 2, 1, bias=False)
        self.stem_bn = nn.BatchNorm2d(32)
        blocks, cin = [], 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                blocks.append(Bottleneck(cin, c, s if i == 0 else 1, t, attention, opts))
                cin = c
        self.blocks = nn.Sequential(*blocks)
        self.head_conv, self.head_bn = nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280)
        self.classifier = head(nn.Linear(1280, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = relu(self.stem_bn(self.stem_conv(x)), six=True)
        x = self.blocks(x)
        x = relu(self.head_bn(self.head_conv(x)), six=True)
        return self.classifier(x.mean(dim=(2, 3)))


NETS = {"lenet": LeNet, "alexnet": AlexNet, "mobilenetv2": MobileNetV2}


__all__ = ["LeNet", "AlexNet", "MobileNetV2", "Bottleneck", "NETS", "PFEDLA_ATTENTION", "ATTENTION_OPTION_KEYS"]
