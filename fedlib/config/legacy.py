"""Flat, dotted and schema-1 names, mapped onto the typed parts: the one module that knows them.

Every field has a flat name (``lr``, ``sigma``, ``dataset``; ``model`` is the model's name, ``selection`` the
selection rule, ``algorithm`` the method) and a dotted one (``local.lr``, ``method.sigma``, ``data.dataset``,
``model.name``, ``selection.rule``, ``method.name``). Users write either: ``RunConfig(**names)``, ``replace``,
``cfg.get`` and attribute shortcuts (``cfg.lr``), grid cells, ``--where`` filters, and the flat ``config.json``
every stored run keeps. The library itself reads the typed parts (``cfg.local.lr``): this module is used only by
``RunConfig``'s user-facing constructor and accessors, its key, and ``to_dict`` / ``from_dict``, so a field's
spelling inside fedlib is one and the flat names can stay as they are for users and stored runs.

Key stability. A run's key hashes its flat fields that differ from ``LEGACY`` (the schema-1 flat config, the
project's first stored runs) plus ``SCHEMA``; a field newer than ``LEGACY`` counts only where it differs from its
own default. So adding a field (with a default that changes nothing) keeps every stored run's key
(``tests/test_store_keys.py`` recomputes all of them), while changing an existing default would orphan stored
runs: bump ``SCHEMA`` on purpose if you must. ``config.json`` stays flat (``flat``), in ``LEGACY`` order.

User registrations (``fedlib.register_model``, ``fedlib.register_dataset``) add to the hash what the name alone
cannot say, and only for them, so no built-in key moves: a user model's ``version`` (its code cannot be hashed
faithfully, so the user bumps it) and a user data set's content hash (``fedlib.data.own.content_hash``: changed
arrays under the same name must not read a stale result). ``config.json`` holds neither: it names the registration,
which the process reading it must have made.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from fedlib.config.options import METHODS, MethodOptions
from fedlib.config.parts import PARTS, TOP
from fedlib.data import own
from fedlib.models.registry import MODELS

if TYPE_CHECKING:
    from fedlib.config.run import RunConfig

SCHEMA = 1

# The schema-1 flat config, field by field, in its order: the reference every key is computed against.
# Never edit a value here (it would orphan stored runs); new fields go into the parts, not here.
LEGACY = {
    "dataset": "synthetic",
    "partition": "natural",
    "n_clients": 100,
    "synthetic_alpha": 0.5,
    "synthetic_beta": 0.5,
    "labels_per_client": 2,
    "shard_size": 300,
    "dirichlet_alpha": 0.5,
    "train_frac": 0.75,
    "normalize": "standardize",
    "data_seed": 0,
    "domains": None,
    "domain_percent": None,
    "model": "mlr",
    "hidden": None,
    "algorithm": "fedavg",
    "rounds": 100,
    "clients_per_round": 20,
    "fraction": None,
    "fraction_schedule": None,
    "selection": "uniform",
    "attn_decay": 0.9,
    "local_steps": 20,
    "local_epochs": None,
    "batch_size": 20,
    "lr": 0.02,
    "lr_decay": 1.0,
    "momentum": 0.0,
    "weight_decay": 0.0,
    "mu": 0.0,
    "sigma": 50.0,
    "lam": 5.0,
    "amp_self_weight": 0.5,
    "mcsa_code": False,
    "beta": 1.0,
    "hf_delta": 1e-3,
    "personal_lr": 0.01,
    "inner_steps": 5,
    "server_lr": 1.0,
    "mix_lam": 0.05,
    "mix_mean_size": 10,
    "mix_taylor_scale": "sample",
    "attention": "none",
    "attention_local": True,
    "seed": 0,
    "executor": "auto",
    "device": "auto",
    "dtype": "float32",
    "eval_every": 1,
    "eval_train": False,
}

# flat names that differ from the field's own name: (part, field)
ALIASES = {"model": ("model", "name"), "selection": ("selection", "rule")}


def flat_of(part: str, name: str) -> str:
    """The flat name of field ``name`` of part ``part`` (``("model", "name")`` -> ``model``)."""
    return next((k for k, v in ALIASES.items() if v == (part, name)), name)


# flat name -> (part, field) for every part's field and the top-level ones ("" is the top level)
FLAT: dict[str, tuple[str, str]] = {flat_of(p, f.name): (p, f.name) for p, cls in PARTS.items() for f in fields(cls)}
FLAT.update({n: ("", n) for n in TOP})
# the parts' fields' own defaults by flat name: what a field newer than LEGACY is keyed against
PART_DEFAULTS: dict[str, Any] = {flat_of(p, f.name): f.default for p, cls in PARTS.items() for f in fields(cls)}


def tuples(v: Any) -> Any:
    """A JSON list (``config.json``, a grid cell) as the tuple the config holds."""
    return tuple(v) if isinstance(v, list) else v


def flat_field_names() -> tuple[str, ...]:
    """Every flat field name a config, grid cell or ``--where`` filter may use (schema-1 and newer ones)."""
    extra = [n for n in FLAT if n not in LEGACY] + [
        f.name for cls in METHODS.values() for f in fields(cls) if f.name not in LEGACY
    ]
    return tuple(LEGACY) + tuple(dict.fromkeys(extra))


def flat_name(name: str) -> str:
    """The flat name of a flat (``lr``) or dotted (``local.lr``, ``model.name``, ``method.mu``) field name, as grid
    cells and ``--where`` filters use them; a ValueError naming the allowed names when there is none (``local.mu``:
    mu is a method option, not a local one)."""
    part, dot, field_ = name.partition(".")
    if not dot and name in flat_field_names():
        return name
    if dot and part in PARTS and field_ in {f.name for f in fields(PARTS[part])}:
        return flat_of(part, field_)
    if dot and part == "method" and field_ == "name":
        return "algorithm"
    if dot and part == "method" and field_ in flat_field_names() and field_ not in FLAT:
        return field_
    raise ValueError(
        f"{name!r} is not a config field; fields (flat, or dotted such as method.mu, local.lr, model.name): "
        f"{', '.join(sorted(flat_field_names()))}"
    )


def resolve(name: str) -> tuple[str, str]:
    """(part, field) of a flat or dotted name other than the method's name; part "" is the top level, "method" the
    method's options (a schema-1 or registered option name the method may lack: ``updates`` decides)."""
    part, dot, f = name.partition(".")
    if dot:
        if part in PARTS and f in {x.name for x in fields(PARTS[part])}:
            return part, f
        if part == "method":
            return "method", f
        raise ValueError(
            f"unknown RunConfig field {name!r}; dotted names are data.*, model.*, local.*, "
            "selection.*, method.* (fields: " + ", ".join(flat_field_names()) + ")"
        )
    if name in FLAT:
        return FLAT[name]
    if name in flat_field_names():  # schema-1 and every registered method's options: ``updates`` refuses those
        return "method", name  # this method lacks, naming it ("set but algorithm=... does not use it")
    raise ValueError(f"unknown RunConfig field(s): {name}; known: {', '.join(sorted(flat_field_names()))}")


def updates(changes: dict[str, Any], method: MethodOptions) -> dict[str, dict[str, Any]]:
    """Flat or dotted ``changes`` (the method's name taken out) grouped by part: ``{part: {field: value}}``, part ""
    the top level and "method" ``method``'s own options. A method option ``method`` lacks is an error, except at its
    schema-1 default (a no-op: a flat ``config.json`` lists every schema-1 field whatever its method)."""
    out: dict[str, dict[str, Any]] = defaultdict(dict)
    for k, v in changes.items():
        part, f = resolve(k)
        out[part][f] = v
    names = {x.name for x in fields(method)}
    m = out.pop("method", {})
    bad = sorted(k for k, v in m.items() if k not in names and (k not in LEGACY or v != LEGACY[k]))
    if bad:
        own = ", ".join(sorted(names)) or "none"
        raise ValueError(
            f"RunConfig: {', '.join(bad)} set but algorithm={method.NAME!r} does not use it (its options: {own})"
        )
    out["method"] = {k: v for k, v in m.items() if k in names}
    return out


def flat(cfg: RunConfig) -> dict[str, Any]:
    """Every field of ``cfg`` under its flat name, in ``LEGACY`` order then new fields; method options the method
    does not have at their schema-1 defaults (a newer one, not in ``LEGACY``, absent). This is ``config.json``."""
    out = dict(LEGACY)
    for p, cls in PARTS.items():
        for f in fields(cls):
            out[flat_of(p, f.name)] = getattr(getattr(cfg, p), f.name)
    for name in TOP:
        out[name] = getattr(cfg, name)
    out["algorithm"] = cfg.method.NAME
    for f in fields(cfg.method):
        out[f.name] = getattr(cfg.method, f.name)
    return out


def changed(cfg: RunConfig) -> dict[str, Any]:
    """``cfg``'s flat fields that differ from their defaults (schema-1 ``LEGACY`` or, for newer fields, their own)."""
    own = {**PART_DEFAULTS, **{f.name: f.default for f in fields(cfg.method)}}
    return {k: v for k, v in flat(cfg).items() if v != LEGACY.get(k, own.get(k))}


def key(cfg: RunConfig) -> str:
    """The run's key: a hash of ``SCHEMA`` and ``changed(cfg)`` (tuples as the JSON lists ``config.json`` holds), and
    of a user model's version and a user data set's content hash (neither for built-in ones: their keys stay)."""
    mine: dict[str, Any] = {}
    spec = MODELS.get(cfg.model.name)  # None: a user model this process has not registered (validate refuses it)
    if spec is not None and spec.version is not None:
        mine["model_version"] = spec.version
    if cfg.data.dataset in own.USER_DATASETS:
        mine["data_hash"] = own.content_hash(cfg.data.dataset)
    blob = json.dumps({"schema": SCHEMA, **{k: _jsonable(v) for k, v in changed(cfg).items()}, **mine}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def check_names(d: dict[str, Any]) -> None:
    """Refuse a flat dict (``from_dict``) naming a field that is not one, naming the unknown and the known."""
    known = set(flat_field_names())
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"unknown RunConfig field(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")


def _jsonable(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v
