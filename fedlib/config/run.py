"""A run is a pure function of a frozen ``RunConfig``, made of typed parts.

    RunConfig
      data:      DataConfig       data set, partition, clients, data seed, the data set's own options
      model:     ModelConfig      registry name, hidden widths (checked against the model), pFedLA attention
      local:     LocalConfig      local optimisation: lr and its schedule, momentum, weight decay, steps/epochs, batch
      selection: SelectionConfig  uniform or AdaFL attention; clients per round, fraction or fraction schedule
      method:    MethodOptions    the method's own options, a class each algorithm module defines and registers
      rounds, seed, executor, device, dtype, eval_every, eval_train

Every field carries its bounds (``fedlib.config.options.option``); ``validate()`` checks all of them
before any data is loaded or any training starts, naming the field and what is allowed. What a
method accepts follows from its options class: ``RunConfig(algorithm="fedmcsa-mcsa", sigma=7.0)``
is refused because FedMCSA^{-MCSA} has no sigma.

Names. Every field has a flat name (``lr``, ``sigma``, ``dataset``; ``model`` is the model's name,
``selection`` the selection rule, ``algorithm`` the method) and a dotted one (``local.lr``,
``method.sigma``, ``data.dataset``, ``model.name``, ``selection.rule``, ``method.name``).
``RunConfig(**names)``, ``replace(**names)``, grid cells and ``--where`` take either; a flat name
read as an attribute (``cfg.lr``) is a shortcut for ``cfg.get("lr")``. Setting a method option
the method does not have is an error, except at its default value (a no-op: old ``config.json``
files list every field).

Key stability (``key()``). The key hashes the flat fields that differ from the schema-1 defaults
(``LEGACY``, the flat config this project stored its first 634 runs under) plus ``SCHEMA``, so
every stored run keeps its key (``tests/test_store_keys.py`` recomputes all of them). A new
field's default is left out of the key; changing an existing default orphans stored runs: bump
``SCHEMA`` on purpose if you must. ``config.json`` stays flat (``to_dict()``), in ``LEGACY`` order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import warnings
from collections import defaultdict
from dataclasses import dataclass, field, fields

from fedlib import algorithms  # noqa: F401  (registers every method's options class)
from fedlib.config.options import METHODS, MethodOptions, Part, check_magnitude, option
from fedlib.data.domains import DOMAINS
from fedlib.models.local_attention import ATTENTIONS
from fedlib.models.registry import MODELS, check_attention

SCHEMA = 1

DATASETS = ("synthetic", "mnist", "fmnist", "cifar10", "digits", "office31", "officehome", "domainnet")
PARTITIONS = {  # which partitions make sense for which data sets
    "synthetic": ("natural",),
    "mnist": ("labels", "shards", "iid", "dirichlet"),
    "fmnist": ("labels", "shards", "iid", "dirichlet"),
    "cifar10": ("labels", "shards", "iid", "dirichlet"),
    "digits": ("domains",),  # feature shift (pFedLA after FedBN): one client per domain
    "office31": ("domains",),
    "officehome": ("domains",),
    "domainnet": ("domains",),
}
# the data sets whose pixels ``normalize`` scales: Synthetic is its generator's numbers, the feature-shift sets are
# normalised per domain as FedBN does (``fedlib.data.domains``)
_PIXELS = tuple(d for d in PARTITIONS if d != "synthetic" and d not in DOMAINS)
# partitions whose clients' own test splits are the run's only test data (the others keep the data set's test set)
OWN_TEST = ("natural", "labels")
# the largest number a float option may hold, by the run's dtype: what the tensors it is fed into hold
LARGEST = {"float32": 3.4028234663852886e38, "float64": sys.float_info.max}

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


@dataclass(frozen=True)
class DataConfig(Part):
    dataset: str = option("synthetic", choices=DATASETS)
    partition: str = option(
        "natural",
        choices=tuple(dict.fromkeys(p for v in PARTITIONS.values() for p in v)),
        doc="natural (Synthetic's own clients) | labels | shards | iid | dirichlet | domains",
    )
    n_clients: int = option(100, ge=1, doc="N (FedMCSA), M (AdaFL)")
    synthetic_alpha: float = option(
        0.5,
        ge=0,
        when=lambda d: d.dataset == "synthetic",
        when_doc="dataset='synthetic'",
        doc="Synthetic(alpha, beta): model heterogeneity",
    )
    synthetic_beta: float = option(
        0.5,
        ge=0,
        when=lambda d: d.dataset == "synthetic",
        when_doc="dataset='synthetic'",
        doc="... and feature heterogeneity",
    )
    labels_per_client: int = option(
        2,
        ge=1,
        le=10,  # mnist, fmnist and cifar10 (the data sets partition='labels' splits) have 10 classes each
        when=lambda d: d.partition == "labels",
        when_doc="partition='labels'",
        doc="k labels per client, of the data set's 10 classes",
    )
    label_stride: int = option(
        1,
        ge=1,
        le=10,
        when=lambda d: d.partition == "labels",
        when_doc="partition='labels'",
        doc="client u holds the labels (label_stride * u + j) mod 10, j < k: 1 is pFedMe's script (the papers' "
        "default), k FedMCSA's copy of it (clients u, u + 5, ... then share one label pair)",
    )
    shard_size: int = option(300, ge=1, when=lambda d: d.partition == "shards", when_doc="partition='shards'")
    dirichlet_alpha: float = option(
        0.5, gt=0, when=lambda d: d.partition == "dirichlet", when_doc="partition='dirichlet'"
    )
    train_frac: float = option(
        0.75,
        gt=0,
        le=1,
        when=lambda d: d.dataset not in DOMAINS,  # a domain's client has the domain's own test set
        when_doc="the data set is not a feature-shift one (those split by domain: " + ", ".join(DOMAINS) + ")",
        doc="per-client train share (FedMCSA: 75/25); below 1 where the clients' splits are the test data",
    )
    normalize: str = option(
        "standardize",
        choices=("standardize", "unit"),
        when=lambda d: d.dataset in _PIXELS,
        when_doc="the data set is " + " or ".join(_PIXELS),
        doc="image pixels: per-pixel standardisation with the training set's statistics, or x / 255",
    )
    data_seed: int = option(
        0,
        ge=0,
        lt=2**32,  # Synthetic's generator is numpy's RandomState, which takes seeds below 2**32
        doc="partition/generation seed (0 reproduces pFedMe's Synthetic); below 2**32",
    )
    domains: tuple | None = option(None, doc="feature-shift data: which domains, one client each (None: all)")
    domain_percent: float | None = option(
        None,
        doc="share of each domain's training set (None: the data set's own -- "
        "digits 10% as FedBN, Office/DomainNet 100%); pFedLA Figure 4(c)",
    )

    def check(self, where=None, rename=None) -> None:
        self._check_domains()
        super().check(where, rename)
        if self.partition not in PARTITIONS[self.dataset]:
            raise ValueError(
                f"RunConfig.partition={self.partition!r} is not one of: {', '.join(PARTITIONS[self.dataset])}"
            )
        if self.partition in OWN_TEST and self.train_frac >= 1:
            others = ", ".join(p for p in PARTITIONS["mnist"] if p not in OWN_TEST)
            raise ValueError(
                f"RunConfig.train_frac={self.train_frac!r} must be in (0, 1) for partition={self.partition!r}: its "
                "clients' test splits (the other 1 - train_frac of each) are the run's only test data, and 1 leaves "
                f"none (every test metric NaN); the partitions that keep the data set's test set ({others}) take 1"
            )

    def _check_domains(self) -> None:
        """Feature-shift data sets: known domains, percent in (0, 1], one client per domain."""
        p = self.domain_percent
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1):
            raise ValueError(f"RunConfig.domain_percent={p!r} must be None or in (0, 1]")
        if self.dataset not in DOMAINS:
            if self.domains is not None or p is not None:
                raise ValueError(
                    f"RunConfig: domains/domain_percent set but dataset={self.dataset!r} has no domains "
                    f"(feature-shift data sets: {', '.join(DOMAINS)})"
                )
            return
        allowed, d = DOMAINS[self.dataset], self.domains
        if d is not None and (
            not isinstance(d, tuple) or not d or any(x not in allowed for x in d) or len(set(d)) != len(d)
        ):
            raise ValueError(
                f"RunConfig.domains={d!r} must be None or a tuple of distinct {self.dataset} domains "
                f"from: {', '.join(allowed)}"
            )
        n = len(d) if d is not None else len(allowed)
        if self.n_clients != n:
            raise ValueError(
                f"RunConfig.n_clients={self.n_clients!r} must equal the number of domains ({n}: one "
                f"client per domain, RunConfig.domains={d!r})"
            )


@dataclass(frozen=True)
class ModelConfig(Part):
    name: str = option("mlr", choices=tuple(MODELS), doc="see fedlib.models.registry.MODELS")
    hidden: tuple | None = option(None, doc="hidden widths, one per hidden layer of the model; None = its default")
    attention: str = option("none", choices=ATTENTIONS, doc="pFedLA module after each conv layer")
    attention_local: bool = option(
        True,
        when=lambda m: m.attention != "none",
        when_doc="attention is not 'none'",
        doc="pFedLA: attention parameters stay on the client (False: the non-local ablation)",
    )
    attention_init: str = option(
        "shared",
        choices=("shared", "per_client"),
        when=lambda m: m.attention != "none" and m.attention_local,
        when_doc="the attention is local (attention not 'none', attention_local)",
        doc="pFedLA: every client's attention starts as the seed's one model has it ('shared', every stored run), "
        "or each client's is drawn on its own ('per_client', Algorithm 1 line 9)",
    )

    def check(self, where=None, rename=None) -> None:
        h = self.hidden
        if h is not None and not (
            isinstance(h, tuple) and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in h)
        ):
            raise ValueError(f"RunConfig.hidden={h!r} must be None or a tuple of positive ints")
        super().check(where, rename)
        if self.hidden is not None:
            want = len(MODELS[self.name].default_hidden)
            if len(self.hidden) != want:
                raise ValueError(
                    f"RunConfig.hidden={self.hidden!r} has {len(self.hidden)} widths but model="
                    f"{self.name!r} has {want} hidden layer(s) (default {MODELS[self.name].default_hidden})"
                )
        check_attention(self.name, self.attention, prefix="RunConfig.")

    def __eq__(self, other):
        # ``cfg.model == "dnn"`` (the flat config's spelling, in notebooks and user code) compares the name
        if isinstance(other, str):
            return self.name == other
        return (
            NotImplemented
            if type(other) is not ModelConfig
            else dataclasses.astuple(self) == dataclasses.astuple(other)
        )


@dataclass(frozen=True)
class LocalConfig(Part):
    lr: float = option(0.02, gt=0, doc="eta")
    lr_decay: float = option(1.0, gt=0, doc="eta_t = eta * lr_decay^(t-1) (AdaFL CIFAR-10: 0.99 per round)")
    momentum: float = option(0.0, ge=0, lt=1, doc="SGD momentum (AdaFL: 0.5)")
    weight_decay: float = option(0.0, ge=0, doc="l2 regularisation")
    local_steps: int | None = option(20, ge=1, doc="R local steps per round")
    local_epochs: int | None = option(None, ge=1, doc="E local epochs (epoch-based training, with local_steps=None)")
    batch_size: int = option(20, ge=1, doc="|D| / B")

    def check(self, where=None, rename=None) -> None:
        super().check(where, rename)
        if self.local_steps is None and self.local_epochs is None:
            raise ValueError("RunConfig: local_steps or local_epochs must be set")
        if self.local_steps is not None and self.local_epochs is not None:  # one run under two keys otherwise
            raise ValueError(
                f"RunConfig: give local_steps or local_epochs, not both (set the other to None): local_epochs="
                f"{self.local_epochs} would override local_steps={self.local_steps}"
            )


@dataclass(frozen=True)
class SelectionConfig(Part):
    rule: str = option(
        "uniform",
        choices=("uniform", "attention"),
        doc="uniform | attention (AdaFL Eq. 1-2: probabilities from model divergence)",
    )
    clients_per_round: int | None = option(20, ge=1, doc="S clients uploading per round")
    fraction: float | None = option(None, gt=0, le=1, doc="C (instead of clients_per_round)")
    fraction_schedule: tuple | None = option(None, doc="AdaFL dynamic fraction (gamma_1, gamma_T, F[, T])")
    attn_decay: float = option(
        0.9,
        ge=0,
        lt=1,
        when=lambda s: s.rule == "attention",
        when_doc="selection='attention'",
        doc="AdaFL alpha: decay of the previous attention score",
    )

    def check(self, where=None, rename=None) -> None:
        super().check(where, rename)
        if self.fraction is not None and self.clients_per_round is not None:
            raise ValueError("RunConfig: give clients_per_round or fraction, not both (set the other to None)")
        fs = self.fraction_schedule
        if fs is not None:
            numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in fs)
            if not numbers or len(fs) not in (3, 4):
                raise ValueError(
                    f"RunConfig.fraction_schedule={fs!r} must be (gamma_1, gamma_T, F) or "
                    "(gamma_1, gamma_T, F, T), e.g. AdaFL's (0.1, 0.5, 5)"
                )
            if self.clients_per_round is not None or self.fraction is not None:
                raise ValueError(
                    "RunConfig: fraction_schedule replaces clients_per_round and fraction; set both to None"
                )

    def __eq__(self, other):
        # ``cfg.selection == "attention"`` (the flat config's spelling) compares the rule
        if isinstance(other, str):
            return self.rule == other
        if type(other) is not SelectionConfig:
            return NotImplemented
        return dataclasses.astuple(self) == dataclasses.astuple(other)


# flat name -> (part, field); "" is the top level, "method" the method's options
_ALIASES = {"model": ("model", "name"), "selection": ("selection", "rule")}
_PARTS = {"data": DataConfig, "model": ModelConfig, "local": LocalConfig, "selection": SelectionConfig}
_TOP = ("rounds", "seed", "executor", "device", "dtype", "eval_every", "eval_train")


def _flat_of(part: str, name: str) -> str:
    return next((k for k, v in _ALIASES.items() if v == (part, name)), name)


_FLAT = {_flat_of(p, f.name): (p, f.name) for p, cls in _PARTS.items() for f in fields(cls)}
_FLAT.update({n: ("", n) for n in _TOP})
_PART_DEFAULTS = {_flat_of(p, f.name): f.default for p, cls in _PARTS.items() for f in fields(cls)}


def _default_method() -> MethodOptions:
    return METHODS["fedavg"]()


@dataclass(frozen=True, init=False)
class RunConfig(Part):
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    local: LocalConfig = LocalConfig()
    selection: SelectionConfig = SelectionConfig()
    method: MethodOptions = field(default_factory=_default_method)
    rounds: int = option(100, ge=1, doc="T communication rounds")
    seed: int = option(
        0,
        ge=0,
        lt=2**63,  # torch's generators take a 64-bit integer (seed + 2 seeds the evaluation's)
        doc="model init, client sampling, mini-batches; below 2**63",
    )
    executor: str = option("auto", choices=("auto", "stacked", "loop"))
    device: str = option("auto", choices=("auto", "cpu", "cuda"))
    dtype: str = option("float32", choices=("float32", "float64"))
    eval_every: int = option(1, ge=1, doc="evaluate every k rounds (and always at the last)")
    eval_train: bool = option(False, doc="also compute training loss/accuracy")

    def __init__(self, data=None, model=None, local=None, selection=None, method=None, **names):
        """Parts (``data=DataConfig(...)``, ...) and/or flat or dotted names (``lr=0.1``, ``method.mu`` via
        ``**{"method.mu": 0.1}``); names are applied over the parts."""
        given = {"data": data, "model": model, "local": local, "selection": selection}
        for p in ("model", "selection"):  # also flat names: the model's name, the selection rule
            if given[p] is not None and not isinstance(given[p], _PARTS[p]):
                names[p] = given.pop(p)
        for p, cls in _PARTS.items():
            given.setdefault(p, None)
            object.__setattr__(self, p, given[p] if given[p] is not None else cls())
        object.__setattr__(self, "method", method if method is not None else _default_method())
        self._check_parts()
        for f in fields(self):
            if f.name in _TOP:
                object.__setattr__(self, f.name, f.default)
        if names:
            new = self.replace(**names)
            for f in fields(self):
                object.__setattr__(self, f.name, getattr(new, f.name))

    @classmethod
    def of(cls, **names) -> "RunConfig":
        """A config from flat or dotted names (the same as ``RunConfig(**names)``)."""
        return cls(**names)

    # -- names --------------------------------------------------------------------------------------
    @property
    def algorithm(self) -> str:
        return self.method.NAME

    def __getattr__(self, name):  # only called when normal lookup fails: flat names as read-only shortcuts
        if name.startswith("_") or name not in _FLAT and name not in LEGACY:
            raise AttributeError(f"RunConfig has no field {name!r}")
        return self.get(name)

    def get(self, name: str):
        """A field's value by flat (``mu``) or dotted (``method.mu``) name (``flat_name``); a method option the method
        does not have reads as its schema-1 default (what the flat ``config.json`` holds), a newer one (not in ``LEGACY``,
        e.g. FedMCSA's ``by_data_size`` on Local) as None, so a grid mixing the two methods tabulates and filters."""
        flat = self.flat()
        try:
            k = flat_name(name)
        except ValueError:
            raise KeyError(f"RunConfig has no field {name!r}; flat names: {', '.join(flat)}") from None
        return flat.get(k)

    def _resolve(self, name: str, method: MethodOptions) -> tuple[str, str]:
        part, dot, f = name.partition(".")
        if dot:
            if part in _PARTS and f in {x.name for x in fields(_PARTS[part])}:
                return part, f
            if part == "method":
                return "method", f
            raise ValueError(
                f"unknown RunConfig field {name!r}; dotted names are data.*, model.*, local.*, "
                "selection.*, method.* (fields: " + ", ".join(flat_field_names()) + ")"
            )
        if name in _FLAT:
            return _FLAT[name]
        if name in flat_field_names():  # schema-1 and every registered method's options: ``replace`` refuses those
            return "method", name  # this method lacks, naming it ("set but algorithm=... does not use it")
        raise ValueError(f"unknown RunConfig field(s): {name}; known: {', '.join(sorted(flat_field_names()))}")

    def replace(self, **changes) -> "RunConfig":
        """A copy with fields changed by flat or dotted name (the method first, so its options can follow)."""
        method = self.method
        algs = [changes.pop(k) for k in ("algorithm", "method.name") if k in changes]
        if algs:
            if len(set(algs)) > 1:
                raise ValueError(f"RunConfig: algorithm given twice with different values: {algs}")
            method = _switch_method(method, algs[0])
        updates: dict[str, dict] = defaultdict(dict)
        for k, v in changes.items():
            part, f = self._resolve(k, method)
            updates[part][f] = v
        m = updates.pop("method", {})
        names = {x.name for x in fields(method)}
        unused = {k: v for k, v in m.items() if k not in names}
        bad = sorted(k for k, v in unused.items() if k not in LEGACY or v != LEGACY[k])
        if bad:
            own = ", ".join(sorted(names)) or "none"
            raise ValueError(
                f"RunConfig: {', '.join(bad)} set but algorithm={method.NAME!r} does not use it (its options: {own})"
            )
        method = dataclasses.replace(method, **{k: v for k, v in m.items() if k in names})
        parts = {p: dataclasses.replace(getattr(self, p), **updates[p]) for p in _PARTS}
        top = {f: updates[""][f] if f in updates[""] else getattr(self, f) for f in _TOP}
        out = RunConfig(**parts, method=method)
        for f, v in top.items():
            object.__setattr__(out, f, _tuple(v))
        return out

    # -- views --------------------------------------------------------------------------------------
    def flat(self) -> dict:
        """Every field under its flat name, in ``LEGACY`` order then new fields; method options the method does not
        have at their schema-1 defaults. This is ``config.json`` and the columns of results frames."""
        out = dict(LEGACY)
        for p in _PARTS:
            for f in fields(_PARTS[p]):
                out[_flat_of(p, f.name)] = getattr(getattr(self, p), f.name)
        for f in _TOP:
            out[f] = getattr(self, f)
        out["algorithm"] = self.method.NAME
        for f in fields(self.method):
            out[f.name] = getattr(self.method, f.name)
        return out

    def to_dict(self) -> dict:
        return self.flat()

    def changed(self) -> dict:
        """Flat fields that differ from their defaults (schema-1 ``LEGACY`` or, for newer fields, their own)."""
        own = {**_PART_DEFAULTS, **{f.name: f.default for f in fields(self.method)}}  # newer fields' own defaults
        return {k: v for k, v in self.flat().items() if v != LEGACY.get(k, own.get(k))}

    def key(self) -> str:
        blob = json.dumps({"schema": SCHEMA, **_jsonable(self.changed())}, sort_keys=True)
        return hashlib.sha1(blob.encode()).hexdigest()[:16]

    def label(self) -> str:
        """A short human label: the fields that differ from the defaults."""
        return " ".join(f"{k}={v}" for k, v in self.changed().items()) or "defaults"

    # -- checks -------------------------------------------------------------------------------------
    def _check_parts(self) -> None:
        """Each part of its class: a TypeError naming the part and what it takes (``RunConfig(data=5)`` and
        ``RunConfig(method="fedavg")`` reached "'int' object has no attribute 'check'" in ``validate``)."""
        for p, cls in (*_PARTS.items(), ("method", MethodOptions)):
            v = getattr(self, p)
            if isinstance(v, cls):
                continue
            if p == "method":
                how = "to pick a method by name use algorithm=" + (repr(v) if isinstance(v, str) else "'fedavg'")
                want = "a method's options (a MethodOptions such as fedlib.config.options.METHODS['fedavg']())"
            else:
                own = [_flat_of(p, f.name) for f in fields(cls)][:2]
                how = f"or set its fields by name ({', '.join(f'{n}=...' for n in own)})"
                want = f"a {cls.__name__}"
            raise TypeError(f"RunConfig.{p}={v!r:.60} must be {want}, not {type(v).__name__}; {how}")

    def validate(self) -> "RunConfig":
        """Raise ValueError naming the field and its allowed values; returns self for chaining."""
        self._check_parts()
        super().check("RunConfig")
        for p in _PARTS:
            getattr(self, p).check("RunConfig", rename=lambda f, p=p: _flat_of(p, f))
        self.method.check("RunConfig")
        why = f"the largest number dtype={self.dtype!r} holds"  # lr=1e39 overflowed a float32 step once training ran
        for p in _PARTS:
            check_magnitude(
                getattr(self, p), LARGEST[self.dtype], why, "RunConfig", rename=lambda f, p=p: _flat_of(p, f)
            )
        check_magnitude(self.method, LARGEST[self.dtype], why, "RunConfig")
        m, s = self.method, self.selection
        if not m.SELECTS and (s.rule != "uniform" or s.fraction_schedule is not None):
            raise ValueError(
                f"RunConfig: algorithm={m.NAME!r} selects no clients, so selection and fraction_schedule do not apply"
            )
        if not m.SGD_EXTRAS:
            extra = [k for k in ("momentum", "weight_decay") if getattr(self.local, k)]
            if extra:
                raise ValueError(
                    f"RunConfig: {', '.join(extra)} set but algorithm={m.NAME!r} takes plain gradient "
                    "steps (its client procedure has no momentum or weight decay)"
                )
        m.check_with(self)
        if m.SELECTS and s.clients_per_round is not None and s.clients_per_round > self.data.n_clients:
            raise ValueError(
                f"RunConfig.clients_per_round={s.clients_per_round} must be <= n_clients={self.data.n_clients} "
                "(S clients are sampled from the N; use fraction=1.0 for all of them)"
            )
        spec = MODELS[self.model.name]
        lacking = [g for g in m.LOCAL_GROUPS if g not in spec.groups]
        if lacking:
            having = ", ".join(n for n, sp in MODELS.items() if all(g in sp.groups for g in m.LOCAL_GROUPS))
            raise ValueError(
                f"RunConfig: algorithm={m.NAME!r} keeps the model's {'/'.join(lacking)} parameters on the clients, "
                f"but model={self.model.name!r} has none (it would train as FedAvg); models that have them: {having}"
            )
        if s.fraction_schedule is not None:
            from fedlib.core.selection import StepFraction  # raises naming what is wrong

            fs = s.fraction_schedule
            StepFraction(float(fs[0]), float(fs[1]), fs[2], fs[3] if len(fs) == 4 else self.rounds)
        if self.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ValueError("RunConfig.device='cuda' but no CUDA device is available; use 'auto' or 'cpu'")
        return self

    def check(self, where=None, rename=None) -> None:
        self.validate()

    def resolved_device(self) -> str:
        return self.device if self.device != "auto" else auto_device()


def auto_device() -> str:
    """What ``device="auto"`` trains on here: "cuda" where torch sees a CUDA device, else "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _tuple(v):
    return tuple(v) if isinstance(v, list) else v


def _switch_method(old: MethodOptions, name: str) -> MethodOptions:
    """The options of method ``name``, carrying over the old method's changed options that it has too."""
    if name not in METHODS:
        raise ValueError(f"RunConfig.algorithm={name!r} is not one of: {', '.join(METHODS)}")
    cls = METHODS[name]
    if cls is type(old):
        return old
    names = {f.name for f in fields(cls)}
    carried = old.changed()
    dropped = sorted(set(carried) - names)
    if dropped:
        raise ValueError(
            f"RunConfig: switching algorithm {old.NAME!r} -> {name!r} would drop "
            + ", ".join(f"{k}={carried[k]!r}" for k in dropped)
            + f" ({name!r} does not use it)"
        )
    return cls(**carried)


def flat_field_names() -> tuple[str, ...]:
    """Every flat field name a config, grid cell or ``--where`` filter may use (schema-1 and newer ones)."""
    extra = [n for n in _FLAT if n not in LEGACY] + [
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
    if dot and part in _PARTS and field_ in {f.name for f in fields(_PARTS[part])}:
        return _flat_of(part, field_)
    if dot and part == "method" and field_ == "name":
        return "algorithm"
    if dot and part == "method" and field_ in flat_field_names() and field_ not in _FLAT:
        return field_
    raise ValueError(
        f"{name!r} is not a config field; fields (flat, or dotted such as method.mu, local.lr, model.name): "
        f"{', '.join(sorted(flat_field_names()))}"
    )


def _jsonable(d: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def from_dict(d: dict) -> RunConfig:
    """Inverse of ``to_dict`` (JSON turns tuples into lists): a flat dict, every field or only some; unknown
    fields are an error naming them."""
    known = set(flat_field_names())
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"unknown RunConfig field(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    return RunConfig(**{k: _tuple(v) for k, v in d.items()})


PROFILES = ("smoke", "quick", "paper")


def resolve_profile(profile: str | None = None) -> str:
    """The run profile: an explicit ``profile`` wins, then env ``FEDLIB_PROFILE`` (how CI forces 'smoke' on code that
    does not name one), then 'quick'. When both are given and differ, a warning says which one won."""
    env = os.environ.get("FEDLIB_PROFILE") or None
    for where, value in (("profile", profile), ("FEDLIB_PROFILE", env)):
        if value is not None and value not in PROFILES:
            raise ValueError(f"{where}={value!r} is not one of: {', '.join(PROFILES)}")
    if profile and env and profile != env:
        warnings.warn(f"profile={profile!r} given explicitly wins over FEDLIB_PROFILE={env!r}", stacklevel=2)
    return profile or env or "quick"
