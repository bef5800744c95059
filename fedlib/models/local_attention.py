"""pFedLA's client-local attention modules: SE, ECA, CA and the hybrid (pFedLA_h).

Liang, Tian, Yang, Zhang, "Personalized Federated Learning with Local Attention" (pFedLA), Sec. 3.3-3.4.
Every module maps a feature map ``h`` of shape (N, C, H, W) to ``a ⊙ h`` (Eq. 6), where ``a`` is the
module's attention mask (``mask(h)``, broadcastable to ``h``); the hybrid mixes the masks of SE, ECA and
CA with softmax-normalised learnable weights (Eqs. 7-8).

Modules and their papers (argument -> symbol):

- ``SE`` — squeeze-and-excitation, Hu, Shen, Sun, CVPR 2018. ``reduction`` -> r: the excitation is
  ``sigmoid(W2 relu(W1 z))`` with ``z`` the global average over H x W, ``W1`` (C/r x C), ``W2`` (C x C/r).
  No biases (the SE paper's parameter count 2 C^2 / r counts the two weight matrices only); C/r is
  floored and at least 1.
- ``ECA`` — efficient channel attention, Wang et al., CVPR 2020. ``gamma`` -> gamma, ``b`` -> b: a 1-D
  convolution of size ``k = psi(C) = |log2(C)/gamma + b/gamma|_odd`` over the channel axis of ``z``, zero
  padded, then a sigmoid. ``|t|_odd`` is the nearest odd number; exact ties (t even, e.g. C = 8 or 128)
  go up, as in the ECA authors' code (``t = int(...); k = t if t % 2 else t + 1``). ``bias``: the ECA
  code's conv has none (``bias=False``, this class's default); pFedLA's published counts imply a bias
  (see ``fedlib.models.convnets``, where the pFedLA nets set ``eca_bias=True``).
- ``CA`` — coordinate attention, Hou, Zhou, Feng, CVPR 2021. ``reduction`` -> r, ``min_mid`` -> the CA
  code's floor of 8: pool along W and along H, concatenate, a shared 1x1 conv C -> mip = max(8, C // r)
  with bias, BatchNorm, h-swish, split, two 1x1 convs mip -> C with bias (``conv_h``, ``conv_w``), two
  sigmoids; the mask is ``a_h (N,C,H,1) * a_w (N,C,1,W)``. r = 32 as in the CA paper.
- ``Hybrid`` — pFedLA_h: one learnable logit per mechanism, ``u = [u_SE, u_ECA, u_CA]``, normalised by a
  softmax (Eq. 7) and initialised to zeros, i.e. 1/3 each (the paper's "initialized equally"); the mask is
  ``sum_k softmax(u)_k a_k`` (Eq. 8). pFedLA does not say whether u is per slot or per model: Table 11
  reports one weight per layer, so u is per slot (3 parameters per slot).

Grouping contract: ``ATTENTION_MODULES`` (SE, ECA, CA, Hybrid) is what ``fedlib.models.groups.param_groups``
maps to the group "attn" (by type, with everything inside, CA's BatchNorm included); the names below
are the older convention, which param_groups agrees with on every registered model (tests/test_models.py).

Naming contract (what the federated engine relied on): a model puts each module in a slot whose
attribute name contains ``attn`` (``attn1``, ``blocks.3.attn``), so every parameter and buffer of an
attention module has ``attn`` in its state-dict name and ``shared_except("attn")`` keeps them on the
client. No name inside these modules contains ``bn``: the BatchNorm inside CA is called ``norm``, so it
belongs to the attention module and NOT to FedBN's "bn" set. Choice, and why: under FedBN + pFedLA it is
local either way (it matches "attn"); when attention is made non-local (pFedLA's Fig. 4(b) ablation)
the whole attention module, its BN included, is what "sharing the attention" means, and FedBN's local BN
layers are the backbone's BN layers (those of the FedBN paper's models). To keep CA's BN local as well
under FedBN with shared attention, add the marker: ``shared_except("bn", "ca.norm")``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

# The attention options, one list: defined here (the model side) so that fedlib.config.run imports it from here,
# never the other way round (models import nothing from the engine or the config).
ATTENTIONS = ("none", "se", "eca", "ca", "hybrid")
KINDS = ATTENTIONS


def eca_kernel_size(channels: int, gamma: float = 2, b: float = 1) -> int:
    """ECA's adaptive kernel size psi(C) = |log2(C)/gamma + b/gamma|_odd (ties go up, as the ECA code)."""
    t = int(abs((math.log2(channels) + b) / gamma))
    return t if t % 2 else t + 1


class _Attention(nn.Module):
    """An attention slot: its output is the input times the module's ``mask(x)``, and it is a local module (pFedLA
    keeps it on the client: its ``fedlib_group``, read by ``fedlib.models.groups``)."""

    fedlib_group = "attn"

    def mask(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.mask(x)


class SE(_Attention):
    """Squeeze-and-excitation (Hu et al. 2018): mask = sigmoid(W2 relu(W1 avgpool(h))), W1: C -> max(1, C // r).

    In pFedLA's nets the slot input follows a ReLU, so z >= 0; with very few hidden units (LeNet's first
    slot has C // r = 1) a unit can start dead under PyTorch's default init (W1 z <= 0 for every input,
    about half the time for one unit), and that slot's mask then stays at sigmoid(0) = 1/2: a property
    of SE at this size, kept as is.
    """

    def __init__(self, channels: int, reduction: int = 16):
        super().__init__()
        self.hidden = max(1, channels // reduction)
        self.fc1 = nn.Linear(channels, self.hidden, bias=False)
        self.fc2 = nn.Linear(self.hidden, channels, bias=False)

    def mask(self, x: torch.Tensor) -> torch.Tensor:
        z = x.mean(dim=(2, 3))
        return torch.sigmoid(self.fc2(torch.relu(self.fc1(z))))[:, :, None, None]


class ECA(_Attention):
    """Efficient channel attention (Wang et al. 2020): mask = sigmoid(conv1d_k(avgpool(h)) over channels)."""

    def __init__(self, channels: int, gamma: float = 2, b: float = 1, bias: bool = False):
        super().__init__()
        self.k = eca_kernel_size(channels, gamma, b)
        self.conv = nn.Conv1d(1, 1, self.k, padding=(self.k - 1) // 2, bias=bias)

    def mask(self, x: torch.Tensor) -> torch.Tensor:
        z = x.mean(dim=(2, 3)).unsqueeze(1)  # (N, 1, C): channels as the 1-D axis
        return torch.sigmoid(self.conv(z)).squeeze(1)[:, :, None, None]


class CA(_Attention):
    """Coordinate attention (Hou et al. 2021): mask = a_h (N,C,H,1) * a_w (N,C,1,W), mip = max(min_mid, C // r)."""

    def __init__(self, channels: int, reduction: int = 32, min_mid: int = 8):
        super().__init__()
        self.mid = max(min_mid, channels // reduction, 1)
        self.reduce = nn.Conv2d(channels, self.mid, 1)
        self.norm = nn.BatchNorm2d(self.mid)  # named "norm", not "bn": see the module docstring
        self.act = nn.Hardswish()  # h-swish: x relu6(x + 3) / 6
        self.conv_h = nn.Conv2d(self.mid, channels, 1)
        self.conv_w = nn.Conv2d(self.mid, channels, 1)

    def mask(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[2], x.shape[3]
        x_h = x.mean(dim=3, keepdim=True)  # (N, C, H, 1): pooled along W
        x_w = x.mean(dim=2, keepdim=True).transpose(2, 3)  # (N, C, W, 1): pooled along H
        y = self.act(self.norm(self.reduce(torch.cat([x_h, x_w], dim=2))))
        y_h, y_w = torch.split(y, [h, w], dim=2)
        a_h = torch.sigmoid(self.conv_h(y_h))  # (N, C, H, 1)
        a_w = torch.sigmoid(self.conv_w(y_w.transpose(2, 3)))  # (N, C, 1, W)
        return a_h * a_w


class Hybrid(_Attention):
    """pFedLA_h (Eqs. 7-8): mask = sum_k softmax(u)_k a_k over k in (SE, ECA, CA); u starts at 0 (1/3 each)."""

    MECHANISMS = ("se", "eca", "ca")

    def __init__(
        self,
        channels: int,
        se_reduction: int = 16,
        ca_reduction: int = 32,
        ca_min_mid: int = 8,
        eca_gamma: float = 2,
        eca_b: float = 1,
        eca_bias: bool = False,
    ):
        super().__init__()
        self.se = SE(channels, se_reduction)
        self.eca = ECA(channels, eca_gamma, eca_b, eca_bias)
        self.ca = CA(channels, ca_reduction, ca_min_mid)
        self.logits = nn.Parameter(torch.zeros(len(self.MECHANISMS)))  # u^j: unnormalised weights (Eq. 7)

    def weights(self) -> torch.Tensor:
        """The normalised weights u-hat (Eq. 7), in the order SE, ECA, CA (what pFedLA's Table 11 reports)."""
        return torch.softmax(self.logits, dim=0)

    def mask(self, x: torch.Tensor) -> torch.Tensor:
        u = self.weights()
        return u[0] * self.se.mask(x) + u[1] * self.eca.mask(x) + u[2] * self.ca.mask(x)


def make_attention(
    kind: str,
    channels: int,
    *,
    se_reduction: int = 16,
    ca_reduction: int = 32,
    ca_min_mid: int = 8,
    eca_gamma: float = 2,
    eca_b: float = 1,
    eca_bias: bool = False,
) -> nn.Module:
    """The attention module for one slot: ``kind`` in none | se | eca | ca | hybrid (none: ``nn.Identity``).

    The keyword defaults are the original papers' (SE r = 16, CA r = 32 with 8 mid channels at least,
    ECA gamma = 2, b = 1 without bias); ``fedlib.models.convnets`` passes pFedLA's per-model choices.
    """
    if kind not in KINDS:
        raise ValueError(f"attention={kind!r} is not one of: {', '.join(KINDS)}")
    if kind == "none":
        return nn.Identity()
    if kind == "se":
        return SE(channels, se_reduction)
    if kind == "eca":
        return ECA(channels, eca_gamma, eca_b, eca_bias)
    if kind == "ca":
        return CA(channels, ca_reduction, ca_min_mid)
    return Hybrid(channels, se_reduction, ca_reduction, ca_min_mid, eca_gamma, eca_b, eca_bias)


# The module types pFedLA keeps on the client: fedlib.models.groups.param_groups puts them (and all they contain) in "attn".
ATTENTION_MODULES = (SE, ECA, CA, Hybrid)


def hybrid_logits(model: nn.Module) -> list[str]:
    """State-dict names of every pFedLA_h module's mixing logits u (Eq. 7), sorted by name: found by module type,
    so the round loop's hybrid-weight trace never guesses from names."""
    return sorted(f"{name}.logits" for name, m in model.named_modules() if isinstance(m, Hybrid))


def per_client_attention(build, n_clients: int, seed: int) -> dict[str, torch.Tensor]:
    """Each client's attention drawn on its own, as pFedLA's Algorithm 1 (line 9) initialises W_{i,la} "randomly"
    for every client i (``ModelConfig.attention_init='per_client'``; the default 'shared' starts every client from
    the seed's one model, attention included). Client i's modules are those of ``build(seed_i)``, a whole model
    drawn with its own seed (seed_i from ``numpy.random.SeedSequence([seed, i])``, so no client's draw is another
    run's model), whose backbone is dropped: the backbone stays the run's shared draw. Returns every parameter and
    buffer of the "attn" group (``fedlib.models.groups.param_groups``) as name -> (n_clients, ...).

    Why it matters: a slot with one hidden unit (LeNet's SE, C // r = 1) starts dead on some draws (``SE``); from
    one shared draw, a dead unit is dead on every client of that seed at once."""
    import numpy as np

    from fedlib.models.groups import param_groups

    rows = []
    for i in range(n_clients):
        model = build(int(np.random.SeedSequence([seed, i]).generate_state(1)[0]))
        groups = param_groups(model)
        rows.append({k: v for k, v in model.state_dict().items() if groups[k] == "attn"})
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}
