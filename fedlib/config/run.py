"""A run is a pure function of a frozen ``RunConfig``, made of typed parts (``fedlib.config.parts``).

    RunConfig
      data:      DataConfig       data set, partition, clients, data seed, the data set's own options
      model:     ModelConfig      registry name, hidden widths (checked against the model), pFedLA attention
      local:     LocalConfig      local optimisation: lr and its schedule, momentum, weight decay, steps/epochs, batch
      selection: SelectionConfig  uniform or AdaFL attention; clients per round, fraction or fraction schedule;
                                  the selected clients that drop out or straggle
      method:    MethodOptions    the method's own options, a class each algorithm module defines and registers
      rounds, seed, executor, device, dtype, eval_every, eval_train

Reading a config. The library reads fields through the typed parts: ``cfg.local.batch_size``, ``cfg.model.name``,
``cfg.data.n_clients``, ``cfg.selection.rule``, ``cfg.method.<option>``, ``cfg.method.NAME``, and the top-level
fields by their names. One spelling per field keeps the code greppable and typed (mypy checks ``cfg.local.lr``;
it cannot check ``cfg.get("lr")``). The flat names (``RunConfig(n_clients=..., lr=...)``, ``cfg.lr``,
``cfg.get("lr")``, ``replace(lr=...)``, grid cells, ``--where``, ``config.json``) are for users and stored runs;
``fedlib.config.legacy`` maps them onto the parts, and only the user-facing constructor and accessors, the key and
``to_dict`` / ``from_dict`` use it. A paper's part by name (``selection="adafl"``, ``local="adafl"``:
``fedlib.config.presets``) is expanded into its fields there too, so a config never holds a preset, only fields.

Every field carries its bounds (``fedlib.config.options.option``); ``validate()`` checks all of them before any data
is loaded or any training starts, naming the field and what is allowed. What a method accepts follows from its
options class: ``RunConfig(algorithm="fedmcsa-mcsa", sigma=7.0)`` is refused because FedMCSA^{-MCSA} has no sigma.
Setting a method option the method does not have is an error, except at its schema-1 default (a no-op: a flat
``config.json`` lists every field).

Key stability: ``key()`` is ``fedlib.config.legacy.key``, a hash of the flat fields that differ from the schema-1
defaults, so a new field with a neutral default keeps every stored run's key.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import warnings
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any

from fedlib import algorithms  # noqa: F401  (registers every method's options class)
from fedlib.config import legacy, presets
from fedlib.config.legacy import LEGACY, SCHEMA, flat_field_names, flat_name, flat_of
from fedlib.config.options import METHODS, MethodOptions, Part, check_magnitude, option
from fedlib.config.parts import (
    DATASETS,
    OWN_TEST,
    PARTITIONS,
    PARTS,
    TOP,
    DataConfig,
    LocalConfig,
    ModelConfig,
    SelectionConfig,
)
from fedlib.data import own
from fedlib.models.registry import MODELS, check_output

__all__ = [
    "DATASETS",
    "LEGACY",
    "OWN_TEST",
    "PARTITIONS",
    "PROFILES",
    "SCHEMA",
    "DataConfig",
    "LocalConfig",
    "ModelConfig",
    "RunConfig",
    "SelectionConfig",
    "auto_device",
    "flat_field_names",
    "flat_name",
    "from_dict",
    "resolve_profile",
]

# the largest number a float option may hold, by the run's dtype: what the tensors it is fed into hold
LARGEST = {"float32": 3.4028234663852886e38, "float64": sys.float_info.max}


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

    def __init__(
        self,
        data: DataConfig | None = None,
        model: ModelConfig | str | None = None,
        local: LocalConfig | str | None = None,
        selection: SelectionConfig | str | None = None,
        method: MethodOptions | None = None,
        **names: Any,
    ) -> None:
        """Parts (``data=DataConfig(...)``, ...) and/or flat or dotted names (``lr=0.1``, ``method.mu`` via
        ``**{"method.mu": 0.1}``); names are applied over the parts. A preset's name (``selection="adafl"``,
        ``local="adafl"``: ``fedlib.config.presets``) stands for its fields; names given beside it win."""
        given: dict[str, Any] = {"data": data, "model": model, "local": local, "selection": selection}
        for p in ("model", "selection"):  # also flat names: the model's name, the selection rule (or its preset)
            if given[p] is not None and not isinstance(given[p], PARTS[p]):
                names[p] = given.pop(p)
        if isinstance(local, str):  # a paper's local settings by name (``presets.LOCAL``)
            names["local"] = given.pop("local")
        for p, cls in PARTS.items():
            given.setdefault(p, None)
            object.__setattr__(self, p, given[p] if given[p] is not None else cls())
        object.__setattr__(self, "method", method if method is not None else _default_method())
        self._check_parts()
        for f in fields(self):
            if f.name in TOP:
                object.__setattr__(self, f.name, f.default)
        if names:
            new = self.replace(**names)
            for f in fields(self):
                object.__setattr__(self, f.name, getattr(new, f.name))

    @classmethod
    def of(cls, **names: Any) -> RunConfig:
        """A config from flat or dotted names (the same as ``RunConfig(**names)``)."""
        return cls(**names)

    # -- names (for users: the library reads the typed parts) ---------------------------------------
    @property
    def algorithm(self) -> str:
        """The method's name (``method.NAME``), under its flat name."""
        return self.method.NAME

    def __getattr__(self, name: str) -> Any:  # only called when normal lookup fails: flat names as read-only shortcuts
        if name.startswith("_") or name not in legacy.FLAT and name not in LEGACY:
            raise AttributeError(f"RunConfig has no field {name!r}")
        return self.get(name)

    def get(self, name: str) -> Any:
        """A field's value by flat (``mu``) or dotted (``method.mu``) name (``flat_name``); a method option the method
        does not have reads as its schema-1 default (what the flat ``config.json`` holds), a newer one (not in ``LEGACY``,
        e.g. FedMCSA's ``by_data_size`` on Local) as None, so a grid mixing the two methods tabulates and filters."""
        flat = self.flat()
        try:
            k = flat_name(name)
        except ValueError:
            raise KeyError(f"RunConfig has no field {name!r}; flat names: {', '.join(flat)}") from None
        return flat.get(k)

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with fields changed by flat or dotted name (the method first, so its options can follow); a preset
        (``selection="adafl"``, ``local="adafl"``) is replaced by its fields (``fedlib.config.presets.expand``)."""
        changes = presets.expand(changes)
        method = self.method
        algs = [changes.pop(k) for k in ("algorithm", "method.name") if k in changes]
        if algs:
            if len(set(algs)) > 1:
                raise ValueError(f"RunConfig: algorithm given twice with different values: {algs}")
            method = _switch_method(method, algs[0])
        updates = legacy.updates(changes, method)
        method = dataclasses.replace(method, **updates["method"])
        parts = {p: dataclasses.replace(getattr(self, p), **updates[p]) for p in PARTS}
        top = {f: updates[""][f] if f in updates[""] else getattr(self, f) for f in TOP}
        out = RunConfig(**parts, method=method)
        for f, v in top.items():
            object.__setattr__(out, f, legacy.tuples(v))
        return out

    # -- views --------------------------------------------------------------------------------------
    def flat(self) -> dict[str, Any]:
        """Every field under its flat name (``fedlib.config.legacy.flat``): ``config.json``, results frames' columns."""
        return legacy.flat(self)

    def to_dict(self) -> dict[str, Any]:
        """The flat dict ``config.json`` stores (``from_dict`` reads it back)."""
        return legacy.flat(self)

    def changed(self) -> dict[str, Any]:
        """Flat fields that differ from their defaults (schema-1 ``LEGACY`` or, for newer fields, their own)."""
        return legacy.changed(self)

    def key(self) -> str:
        """The run's store key (``fedlib.config.legacy.key``): stable across new fields with neutral defaults."""
        return legacy.key(self)

    def label(self) -> str:
        """A short human label: the fields that differ from the defaults."""
        return " ".join(f"{k}={v}" for k, v in self.changed().items()) or "defaults"

    # -- checks -------------------------------------------------------------------------------------
    def _check_candidates(self) -> None:
        """Power-of-Choice's d between the run's largest per-round count m and n_clients (it keeps m of d)."""
        import numpy as np

        from fedlib.core.selection import build_selection

        s, n = self.selection, self.data.n_clients
        sel = build_selection(self, np.ones(n))
        largest = max(sel.count(n, t) for t in range(1, self.rounds + 1))
        assert s.poc_candidates is not None
        if not largest <= s.poc_candidates <= n:
            raise ValueError(
                f"RunConfig.poc_candidates={s.poc_candidates} must be between the run's largest clients per round "
                f"(m = {largest}) and n_clients={n}: Power-of-Choice keeps m of its d candidates"
            )

    def _check_parts(self) -> None:
        """Each part of its class: a TypeError naming the part and what it takes (``RunConfig(data=5)``,
        ``RunConfig(method="fedavg")``), before ``validate`` would call ``check`` on something that has none."""
        checks: list[tuple[str, type[Part]]] = [*PARTS.items(), ("method", MethodOptions)]
        for p, cls in checks:
            v = getattr(self, p)
            if isinstance(v, cls):
                continue
            if p == "method":
                how = "to pick a method by name use algorithm=" + (repr(v) if isinstance(v, str) else "'fedavg'")
                want = "a method's options (a MethodOptions such as fedlib.config.options.METHODS['fedavg']())"
            else:
                own = [flat_of(p, f.name) for f in fields(cls)][:2]
                how = f"or set its fields by name ({', '.join(f'{n}=...' for n in own)})"
                want = f"a {cls.__name__}"
            raise TypeError(f"RunConfig.{p}={v!r:.60} must be {want}, not {type(v).__name__}; {how}")

    def validate(self) -> RunConfig:
        """Raise ValueError naming the field (as users write it: its flat name) and its allowed values; returns self
        for chaining."""
        self._check_parts()
        super().check("RunConfig")
        for p in PARTS:
            getattr(self, p).check("RunConfig", rename=partial(flat_of, p))
        self.method.check("RunConfig")
        # a float finite in Python may still overflow the run's tensors (lr=1e39 in a float32 step)
        why = f"the largest number dtype={self.dtype!r} holds"
        for p in PARTS:
            check_magnitude(getattr(self, p), LARGEST[self.dtype], why, "RunConfig", rename=partial(flat_of, p))
        check_magnitude(self.method, LARGEST[self.dtype], why, "RunConfig")
        m, s = self.method, self.selection
        if not m.SELECTS and (s.rule != "uniform" or s.fraction_schedule is not None):
            raise ValueError(
                f"RunConfig: algorithm={m.NAME!r} selects no clients, so selection and fraction_schedule do not apply"
            )
        if not m.SELECTS and (s.dropout or s.stragglers):
            raise ValueError(
                f"RunConfig: algorithm={m.NAME!r} selects no clients, so dropout and stragglers (shares of the "
                "selected clients) do not apply"
            )
        if not m.SGD_EXTRAS:
            extra = [k for k in ("momentum", "weight_decay") if getattr(self.local, k)]
            if extra:
                raise ValueError(
                    f"RunConfig: {', '.join(extra)} set but algorithm={m.NAME!r} takes plain gradient "
                    "steps (its client procedure has no momentum or weight decay)"
                )
        m.check_with(self)
        training = self.data.n_clients - round(self.data.new_client_frac * self.data.n_clients)
        if m.SELECTS and s.clients_per_round is not None and s.clients_per_round > training:
            held = (
                f" less the {self.data.n_clients - training} new_client_frac holds out"
                if training < self.data.n_clients
                else ""
            )
            raise ValueError(
                f"RunConfig.clients_per_round={s.clients_per_round} must be <= n_clients={self.data.n_clients}{held} "
                "(S clients are sampled from the N; use fraction=1.0 for all of them)"
            )
        spec = MODELS[self.model.name]
        if spec.version is not None and self.data.dataset in own.USER_DATASETS:
            # a user model on a user data set: its width against the data's classes now (the built-in data sets'
            # shapes are checked with the run's other data checks, fedlib.runs.feasibility.check_model)
            shape, classes, _ = own.info(self.data.dataset)
            where = f"RunConfig (dataset={self.data.dataset!r}): "
            check_output(self.model.name, shape, classes, self.model.hidden, self.model.attention, where)
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
        if s.rule == "power_of_choice" and s.poc_candidates is not None and m.SELECTS:
            self._check_candidates()
        if self.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ValueError("RunConfig.device='cuda' but no CUDA device is available; use 'auto' or 'cpu'")
        return self

    def check(self, where: str | None = None, rename: Any = None) -> None:
        """``validate`` (a RunConfig is a ``Part`` too)."""
        self.validate()

    def resolved_device(self) -> str:
        """Where the run trains: ``device``, or ``auto_device()`` for "auto"."""
        return self.device if self.device != "auto" else auto_device()


def auto_device() -> str:
    """What ``device="auto"`` trains on here: "cuda" where torch sees a CUDA device, else "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


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


def from_dict(d: dict[str, Any]) -> RunConfig:
    """Inverse of ``to_dict`` (JSON turns tuples into lists): a flat dict, every field or only some; unknown
    fields are an error naming them."""
    legacy.check_names(d)
    return RunConfig(**{k: legacy.tuples(v) for k, v in d.items()})


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
