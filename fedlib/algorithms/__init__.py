"""The FL methods. Each module defines its methods' options classes (``fedlib.config.options.MethodOptions``) and
registers them where they are defined (``@register``); ``METHODS`` maps a name to its class, and config
validation, the CLI and the contract tests pick new entries up from there. A method is one file: its options
(with bounds), its capabilities (``SELECTS``, ``SGD_EXTRAS``) and ``build(cfg) -> Algorithm``.

Every module of this package is imported here, so adding a method is adding one file: the first eleven in
the order the registry has always listed them (error messages and tables use it), any others after them by name.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from fedlib.config.options import METHODS

if TYPE_CHECKING:
    import numpy as np

    from fedlib.core.protocols import RunSpec
    from fedlib.core.stages import Algorithm

_FIRST = (
    "fedavg",
    "fedprox",
    "fedmcsa",
    "heurfedamp",
    "local",
    "pfedme",
    "perfedavg",
    "scaffold",
    "fedbn",
    "ditto",
    "fedmix",
)
for _name in _FIRST + tuple(sorted({m.name for m in pkgutil.iter_modules(__path__)} - set(_FIRST))):
    importlib.import_module(f"{__name__}.{_name}")

ALGORITHMS = METHODS  # name -> options class (the older name of the registry)


def build_algorithm(cfg: RunSpec, n_samples: np.ndarray | None = None) -> Algorithm:
    """The ``Algorithm`` of ``cfg``: its method's stages, with the selection stage the config names (uniform or
    AdaFL's attention, fixed or scheduled fraction) for methods that select, and the parameter groups kept on the
    clients: those the method keeps local (FedBN: ``bn``) plus pFedLA's ``attn`` when its attention is local (the
    round loop maps groups to the model's parameters with ``fedlib.models.groups.param_groups``). ``n_samples``: the
    clients' training-set sizes (AdaFL's initial scores).

    Two choices for local groups that pFedLA leaves open or reads otherwise, kept by every stored run: (1) every
    client starts from the one model the seed draws, attention included (``simulation.init_state``), where pFedLA's
    Algorithm 1 (line 9) initialises each client's W_{i,la} at random; so a unit of LeNet's one-unit SE slot that
    starts dead (``local_attention.SE``) is dead on every client of that seed at once. ``attention_init=
    'per_client'`` draws each client's attention on its own (``local_attention.per_client_attention``; the
    ablation ``pfedla_attention_init``, notebook 31). (2) A proximal term (FedProx's
    mu, Ditto's lambda) covers every trained parameter, local ones too: a local group's anchor is the client's own
    value at the round's start (FedProx) or its global-path copy (Ditto), where a global model has no counterpart."""
    from fedlib.core.selection import build_selection

    alg = cfg.method.build(cfg)
    if cfg.method.SELECTS:
        alg.select = build_selection(cfg, n_samples)
    if cfg.model.attention != "none" and cfg.model.attention_local:
        # pFedLA: the attention modules never leave the client, on top of whatever the method keeps local
        alg.local_groups = tuple(sorted(set(alg.local_groups) | {"attn"}))
    return alg
