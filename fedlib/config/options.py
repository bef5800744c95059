"""Typed option parts: small frozen dataclasses whose fields carry their own bounds.

A config is made of parts (``fedlib.config.parts``: data, model, local optimisation, selection) and
one method's options (each algorithm module defines its class, see ``MethodOptions``). A field is
declared with ``option(default, ...)``; its type comes from the annotation, its bounds and allowed
values from the keywords, and ``Part.check()`` enforces all of them, naming the field and what is
allowed: wrong types (``"no"`` for a bool, ``2.0`` for an int), NaN and infinities, values out of
range, names not in ``choices``, and a value set where ``when`` says the field does not apply.
``check_magnitude`` bounds the float fields by what the run's tensors hold (``RunConfig.validate``: its dtype).

This module imports nothing from fedlib, so models, data and algorithms can all depend on it (the run config,
``fedlib.config.run``, sits above them: it validates against their registries).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Collection, Mapping, TypeVar

_KINDS = ("bool", "int", "float", "str", "tuple")
_M = TypeVar("_M", bound="MethodOptions")


def option(
    default: Any,
    *,
    doc: str = "",
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: Collection[Any] | None = None,
    when: Callable[[Any], bool] | None = None,
    when_doc: str = "",
) -> Any:
    """A dataclass field with its checks: bounds ``ge``/``gt``/``le``/``lt``, allowed ``choices``, and
    ``when(part) -> bool`` (with ``when_doc``, e.g. "dataset='synthetic'"): where the field applies; a
    value other than the default where it does not apply is refused."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices, "when": when, "when_doc": when_doc}
    return dataclasses.field(default=default, metadata=meta)


def _kinds(annotation: Any) -> tuple[set[str], bool]:
    """(kinds, None allowed) from an annotation string such as ``'int | None'``, or the type itself where a module
    does not postpone its annotations (``mu: float`` without ``from __future__ import annotations``: the class
    ``float``, whose kind must be read off its name too, or ``mu='abc'`` would pass unchecked)."""
    if isinstance(annotation, type):
        annotation = annotation.__name__
    words = {w.strip() for w in str(annotation).replace("Optional[", "").replace("]", "").split("|")}
    kinds = {w for w in words if w in _KINDS}
    return kinds, "None" in words


def _type_ok(v: Any, kinds: set[str]) -> bool:
    if isinstance(v, bool):
        return "bool" in kinds
    if isinstance(v, int):
        return bool(kinds & {"int", "float"})
    if isinstance(v, float):
        return "float" in kinds
    if isinstance(v, str):
        return "str" in kinds
    return isinstance(v, tuple) and "tuple" in kinds


@dataclass(frozen=True)
class Part:
    """Base of every option part: ``check()`` validates each field against its declaration."""

    def check(self, where: str | None = None, rename: Callable[[str], str] | None = None) -> None:
        """Raise ValueError naming ``{where}.{field}`` (``rename`` maps a field to the name users write)."""
        where = where or type(self).__name__
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            m = f.metadata
            kinds, none_ok = _kinds(f.type)
            name = f"{where}.{rename(f.name) if rename else f.name}={v!r}"
            if v is None:
                if not none_ok:
                    raise ValueError(f"{name} must not be None")
                continue
            if kinds and not _type_ok(v, kinds):
                if kinds == {"int"}:
                    raise ValueError(f"{name} must be an integer")
                want = " or ".join(sorted(kinds)) + (" or None" if none_ok else "")
                raise ValueError(f"{name} must be of type {want}, not {type(v).__name__}")
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number")
            if m.get("choices") is not None and v not in m["choices"]:
                raise ValueError(f"{name} is not one of: {', '.join(map(str, m['choices']))}")
            _check_bounds(name, v, m)
            if m.get("when") is not None and v != f.default and not m["when"](self):
                raise ValueError(f"{name} is set but applies only when {m['when_doc']}")

    def changed(self) -> dict:
        """Fields that differ from their defaults."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) != f.default}


def check_magnitude(
    part: Part, largest: float, why: str, where: str, rename: Callable[[str], str] | None = None
) -> None:
    """Raise ValueError naming ``{where}.{field}`` when a number in one of ``part``'s float fields lies beyond
    ``largest`` in magnitude (``why``: what sets it, e.g. the largest float32). A value may be finite as a Python
    number and still not fit the tensors it is fed into: ``lr=1e39`` is a finite float but an infinite float32 step,
    found only once training runs (and an int such as ``10**400`` overflows any float); checked here, it is refused
    before any data is loaded."""
    for f in dataclasses.fields(part):
        v = getattr(part, f.name)
        if "float" not in _kinds(f.type)[0] or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if abs(v) > largest:
            raise ValueError(
                f"{where}.{rename(f.name) if rename else f.name}={v!r} must be at most {largest:.7g} in magnitude ({why})"
            )


def _check_bounds(name: str, v: Any, m: Mapping[str, Any]) -> None:
    """Bounds in the words users read: ``must be a number >= 0``, ``must be > 0``, ``must be in [0, 1)``."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return
    lo, lo_open = (m["gt"], True) if m.get("gt") is not None else (m.get("ge"), False)
    hi, hi_open = (m["lt"], True) if m.get("lt") is not None else (m.get("le"), False)
    low_bad = lo is not None and (v < lo or (lo_open and v == lo))
    high_bad = hi is not None and (v > hi or (hi_open and v == hi))
    if not (low_bad or high_bad):
        return
    if lo is not None and hi is not None:
        raise ValueError(
            f"{name} must be in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
            + (f" ({m['doc']})" if m.get("doc") else "")
        )
    if low_bad:
        raise ValueError(f"{name} must be > {lo}" if lo_open and v == lo else f"{name} must be a number >= {lo}")
    raise ValueError(f"{name} must be a number {'<' if hi_open else '<='} {hi}")


# -- method options ---------------------------------------------------------------------------------------
METHODS: dict[str, type[MethodOptions]] = {}


def register(cls: type[_M] | None = None, *, replace: bool = False) -> Any:
    """Class decorator: register a ``MethodOptions`` subclass under its ``NAME`` (where the method is defined: the
    built-in ones in ``fedlib.algorithms``, a user's in their own code, as ``fedlib.register_method``). A name taken
    by another class is refused naming both; ``@register(replace=True)`` replaces a method of the user's on purpose
    (e.g. a notebook cell run again), never a built-in one (their stored runs' keys name them)."""
    if cls is None:
        return lambda c: register(c, replace=replace)
    if not (isinstance(cls, type) and issubclass(cls, MethodOptions)) or not getattr(cls, "NAME", None):
        raise TypeError(f"register: {cls!r} must be a MethodOptions subclass with a NAME")
    old = METHODS.get(cls.NAME)
    if old is not None and old is not cls:
        builtin = old.__module__.startswith("fedlib.algorithms")
        if builtin or not replace:
            raise ValueError(
                f"method {cls.NAME!r} is registered twice ({old.__module__}, {cls.__module__}): pick another NAME"
                + ("" if builtin else " or @register(replace=True) to replace it")
            )
    METHODS[cls.NAME] = cls
    return cls


@dataclass(frozen=True)
class MethodOptions(Part):
    """One FL method: its own options (fields declared with ``option``), its capabilities and ``build``.

    Capabilities, declared (the engine asks; nothing is inferred from names):
    ``NAME``: the name configs use (``RunConfig.algorithm``). ``SELECTS``: the method samples clients each
    round (Local does not, so selection options do not apply to it). ``SGD_EXTRAS``: its client procedure
    honours SGD momentum and weight decay (pFedMe's and Per-FedAvg's steps are plain gradient steps).
    ``LOCAL_GROUPS``: parameter groups (``fedlib.models.groups.param_groups``) the method keeps on the clients; the model
    must have them (FedBN on a model without BatchNorm would silently be FedAvg, so it is refused).
    """

    NAME: ClassVar[str] = ""
    SELECTS: ClassVar[bool] = True
    SGD_EXTRAS: ClassVar[bool] = True
    LOCAL_GROUPS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The method's own option names (what ``method.<name>`` may set)."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def build(self, cfg: Any) -> Any:
        """The method's ``fedlib.core.stages.Algorithm`` for run config ``cfg`` (its selection is set by the engine)."""
        raise NotImplementedError

    def check(self, where: str | None = None, rename: Callable[[str], str] | None = None) -> None:
        super().check(where or f"method[{self.NAME}]", rename)

    def check_with(self, cfg: Any) -> None:
        """Checks of the method's options against the rest of run config ``cfg`` (``RunConfig.validate``); none by
        default."""
