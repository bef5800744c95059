"""Model registry: every model is a plain ``nn.Module``; stacked training uses its state dict with a client axis.

Names follow the papers:
- ``mlr``: multinomial logistic regression (softmax regression), FedMCSA/pFedMe's "MLR"
  (the l2 regularisation is the optimiser's ``weight_decay``).
- ``dnn``: one hidden layer with ReLU, FedMCSA/pFedMe's "DNN" (hidden 20 on Synthetic, 100 on images).
- ``mlp``: two hidden layers with ReLU, McMahan et al.'s "2NN" as used by AdaFL (784-200-200-10).

A model is stacked-trainable when it is a chain of Flatten/Linear/ReLU (``linear_chain``):
the stacked executor then runs a hand-written batched forward/backward. Any other model
falls back to the per-client loop executor. New entries are covered by the contract tests
in ``tests/test_models.py`` automatically.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable[..., nn.Module]  # build(input_shape, n_classes, hidden) -> nn.Module
    default_hidden: tuple[int, ...]
    doc: str


def _chain(input_shape, n_classes, hidden) -> nn.Module:
    d = math.prod(input_shape)
    layers: list[nn.Module] = [nn.Flatten()]
    for h in hidden:
        layers += [nn.Linear(d, h), nn.ReLU()]
        d = h
    layers.append(nn.Linear(d, n_classes))
    return nn.Sequential(*layers)


MODELS: dict[str, ModelSpec] = {
    "mlr": ModelSpec("mlr", lambda s, c, h=(): _chain(s, c, ()), (), "softmax regression (FedMCSA/pFedMe MLR)"),
    "dnn": ModelSpec("dnn", lambda s, c, h=(100,): _chain(s, c, tuple(h)[:1]), (100,),
                     "one hidden ReLU layer (FedMCSA/pFedMe DNN; 20 units on Synthetic, 100 on images)"),
    "mlp": ModelSpec("mlp", lambda s, c, h=(200, 200): _chain(s, c, tuple(h)[:2]), (200, 200),
                     "two hidden ReLU layers (McMahan et al. 2NN, AdaFL's 784-200-200-10)"),
}


def build_model(name: str, input_shape, n_classes: int, hidden=None, seed: int | None = None,
                dtype=torch.float32) -> nn.Module:
    """Build registry model ``name``; ``seed`` makes the initial weights reproducible."""
    if name not in MODELS:
        raise ValueError(f"model={name!r} is not one of: {', '.join(MODELS)}")
    spec = MODELS[name]
    hidden = spec.default_hidden if hidden is None else tuple(hidden)
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return spec.build(tuple(input_shape), n_classes, hidden).to(dtype)
    return spec.build(tuple(input_shape), n_classes, hidden).to(dtype)


def linear_chain(model: nn.Module) -> list[str] | None:
    """Names of the Linear layers if ``model`` is Sequential(Flatten?, Linear, ReLU, ..., Linear), else None.

    Such a model's state dict holds ``<name>.weight`` (out, in) and ``<name>.bias`` (out,),
    with ReLU between consecutive Linear layers: what the stacked kernel computes.
    """
    if not isinstance(model, nn.Sequential):
        return None
    mods = list(model.named_children())
    if mods and isinstance(mods[0][1], nn.Flatten):
        mods = mods[1:]
    names = []
    for j, (name, m) in enumerate(mods):
        want_linear = j % 2 == 0
        if want_linear and isinstance(m, nn.Linear) and m.bias is not None:
            names.append(name)
        elif not want_linear and isinstance(m, nn.ReLU):
            continue
        else:
            return None
    return names if mods and len(mods) % 2 == 1 else None


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
