"""The papers' parts by name: a preset is a name that stands for a set of flat fields, expanded where it is written.

Each of the three papers plugs into one stage of a round and claims it combines with any method, so a part is
written as one name beside any ``algorithm``:

- ``selection="adafl"``: AdaFL's client selection (Chen, Chong and Quek 2021, arXiv:2101.05634, Sec. 2.2-2.3):
  attention scores from model divergence (Eqs. 1-2, alpha = 0.9) and the dynamic fraction 0.1 -> 0.5 in F = 5
  steps over the run's T rounds, every clients-per-round count cleared (``SELECTION["adafl"]``).
- ``local="adafl"`` / ``"fedmcsa"`` / ``"pfedla"``: a paper's client optimiser settings (``LOCAL``): AdaFL's lr
  0.01, momentum 0.5, E = 5, B = 10 (Sec. 3.1); FedMCSA's lr 0.02, |D| = 20, R = 20 (Sec. 5.1; the defaults);
  pFedLA's lr 0.01, E = 1 (Sec. 4.1) with B = 32 (FedBN's code: the paper gives none). None of them is ever
  implied by a method or a selection: AdaFL's selection under FedProx keeps the config's own optimiser.
- ``attention="se"`` / ``"eca"`` / ``"ca"`` / ``"hybrid"`` is pFedLA's part; it is a field already, not a preset
  (``fedlib.config.parts.ModelConfig.attention``).

Expansion is visible: ``RunConfig(selection="adafl")`` holds ``selection="attention"``,
``fraction_schedule=(0.1, 0.5, 5)``, ``clients_per_round=None``, as ``cfg.changed()`` and the repr show, and
``key()`` hashes those fields. So a preset and the explicit fields it stands for are one run under one store key,
and no stored run's key changes (no field is added). Fields given beside a preset win over it (``selection=
"adafl", attn_decay=0.8``: AdaFL's selection with another alpha), so a preset never overrides what a user wrote.
``presets_of(cfg)`` names the presets a config's fields match, for labels and reports.

Which presets combine with which methods, models and local modules: ``fedlib.config.compositions`` (the table in
docs/compositions.md is generated from it).
"""

from __future__ import annotations

from typing import Any

# selection presets: written where a selection rule goes (``selection=`` or ``selection.rule=``)
SELECTION: dict[str, dict[str, Any]] = {
    "adafl": {
        "selection": "attention",
        "attn_decay": 0.9,
        "fraction_schedule": (0.1, 0.5, 5),
        "clients_per_round": None,
        "fraction": None,
    },
}
# the papers' client optimiser settings, written as ``local=`` (the LocalConfig part's place)
LOCAL: dict[str, dict[str, Any]] = {
    "fedmcsa": {"lr": 0.02, "momentum": 0.0, "local_steps": 20, "local_epochs": None, "batch_size": 20},
    "adafl": {"lr": 0.01, "momentum": 0.5, "local_steps": None, "local_epochs": 5, "batch_size": 10},
    "pfedla": {"lr": 0.01, "momentum": 0.0, "local_steps": None, "local_epochs": 1, "batch_size": 32},
}
_RULES = ("selection", "selection.rule")  # the names a selection preset may be written under


def expand(changes: dict[str, Any]) -> dict[str, Any]:
    """``changes`` (flat or dotted names) with every preset replaced by its fields; fields given in ``changes``
    win over a preset's. A string ``local=`` that names no preset is a ValueError naming the presets; a selection
    rule that is no preset is left as it is, for ``validate`` to check against the rules."""
    out = dict(changes)
    expanded: dict[str, Any] = {}
    for name in _RULES:
        if isinstance(out.get(name), str) and out[name] in SELECTION:
            expanded.update(SELECTION[out.pop(name)])
    if isinstance(out.get("local"), str):  # anything else is left to the names' own check
        v = out.pop("local")
        if v not in LOCAL:
            raise ValueError(
                f"RunConfig.local={v!r:.60} must be a LocalConfig or the name of a paper's local settings: "
                + ", ".join(f"{k!r} ({_show(f)})" for k, f in LOCAL.items())
            )
        expanded.update(LOCAL[v])
    if "selection.rule" in out and "selection" in expanded:  # the explicit dotted rule wins, under its own name
        expanded.pop("selection")
    return {**expanded, **out}


def presets_of(cfg: Any) -> dict[str, str]:
    """The presets ``cfg`` (a ``RunConfig``) holds every field of: ``{"selection": "adafl", "local": "adafl"}``.
    A config written with explicit fields matches as well: a preset is its fields, nothing more."""
    flat = cfg.flat()
    out = {}
    for where, table in (("selection", SELECTION), ("local", LOCAL)):
        for name, fields_ in table.items():
            if all(flat[k] == v for k, v in fields_.items()):
                out[where] = name
                break
    return out


def _show(fields_: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in fields_.items())
