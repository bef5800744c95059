"""Which of the papers' parts combine with which: the grid, each cell's outcome, and the table the docs print.

A run composes five choices (``fedlib.config.presets``): the selection rule (``SELECTIONS``: uniform, AdaFL's
attention at a fixed count, Power-of-Choice, the ``adafl`` preset with its dynamic fraction), the method (every registered one,
``fedlib.config.options.METHODS``), pFedLA's local module (``LOCAL_MODULES``), the model kind (``KINDS``, each with
a representative model; ``kind_of`` sorts every registered model into one) and a paper's local optimiser settings
(``LOCAL_PRESETS``; None keeps the config's own). A cell's outcome is what ``RunConfig.validate`` says of its config
(``refusal``): None (it runs) or the message it raises, so this module states no rule of its own and the table
cannot drift from what the library does. ``tests/test_compositions.py`` trains every cell that runs on tiny data
and checks that the table in docs/compositions.md is ``markdown()``.

The grid has 4 x (every method) x 5 x 4 x 4 cells; it is printed as its pairs (``PAIRS``: method x selection, method x kind,
method x local module, method x local settings, local module x kind), each at neutral values of the other choices
(``pair_config``). That is exact because every refusal is one of a pair: a cell runs if and only if all its pairs
run (``factored``, checked over the whole grid by the test), so a new rule that ties three choices together fails
the test instead of leaving the table wrong.

pFedLA's modules on a model without attention slots are refused, not generalised: the slots are pFedLA's conv nets'
own (after each conv layer of LeNet, AlexNet, MobileNetV2, Tables 7-10), the Linear chains have no conv layer to
put one after, and FedMix's CNN (AdaFL's CIFAR-10 model) is a published architecture without them; CA's BatchNorm
would also take it off the buffer-free kernel it runs on (``fedlib.models.registry.kernel_of``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fedlib.config.options import METHODS
from fedlib.config.parts import RULES
from fedlib.config.presets import LOCAL, SELECTION
from fedlib.config.run import RunConfig
from fedlib.models.groups import HEAD
from fedlib.models.local_attention import ATTENTIONS
from fedlib.models.registry import MODELS, groups_of

SELECTIONS = (*RULES, *SELECTION)  # the rules, then the presets
LOCAL_MODULES = ATTENTIONS  # none, se, eca, ca, hybrid
LOCAL_PRESETS: tuple[str | None, ...] = (None, *LOCAL)


@dataclass(frozen=True)
class Kind:
    """A model kind: its label in the table, the registered model that stands for it and the data it runs on."""

    label: str
    model: str
    fields: tuple[tuple[str, Any], ...]


KINDS = {
    "chain": Kind("DNN / MLP (Linear chains)", "dnn", (("dataset", "synthetic"),)),
    "head": Kind("MLR (its head alone)", "mlr", (("dataset", "synthetic"),)),
    "conv": Kind("CNN (no BatchNorm)", "cnn", (("dataset", "mnist"), ("partition", "iid"))),
    "bn": Kind("BN nets (LeNet, AlexNet, MobileNetV2)", "lenet", (("dataset", "mnist"), ("partition", "iid"))),
}
# the config every cell is made from: small, so that a cell's config trains in a test; the sizes decide no outcome
BASE = RunConfig.of(n_clients=4, clients_per_round=2, rounds=5, local_steps=1, batch_size=4, lr=0.01)


def kind_of(model: str) -> str:
    """The kind of registered model ``model``, from what its ``ModelSpec`` declares: BatchNorm layers (``groups``
    holds "bn": pFedLA's nets, FedBN's subject), no parameter outside its declared head (MLR: nothing for the
    split-model methods to split), a Linear chain (kernel "chain"), else a conv net without them."""
    spec = MODELS[model]
    if "bn" in spec.groups:
        return "bn"
    if not groups_of(model) - {HEAD, "attn"}:
        return "head"
    return "chain" if spec.kernel == "chain" else "conv"


@dataclass(frozen=True)
class Cell:
    """One combination of the five choices."""

    selection: str
    method: str
    module: str
    kind: str
    local: str | None = None

    def config(self, base: RunConfig = BASE, model: str | None = None) -> RunConfig:
        """The cell's config over ``base``: ``model`` (default: the kind's representative) instead of the kind's."""
        kind = KINDS[self.kind]
        names: dict[str, Any] = dict(kind.fields, model=model or kind.model, algorithm=self.method)
        names.update(attention=self.module, selection=self.selection)
        if self.local is not None:
            names["local"] = self.local
        return base.replace(**names)

    def name(self) -> str:
        return "-".join(v for v in (self.method, self.selection, self.module, self.kind, self.local) if v)


def refusal(cfg: RunConfig) -> str | None:
    """What ``cfg.validate()`` raises (its message), or None where the config runs."""
    try:
        cfg.validate()
    except ValueError as e:
        return str(e)
    return None


def cells() -> Iterator[Cell]:
    """Every cell of the grid."""
    for s, m, a, k, loc in itertools.product(SELECTIONS, METHODS, LOCAL_MODULES, KINDS, LOCAL_PRESETS):
        yield Cell(s, m, a, k, loc)


def cheapest_kind(method: str, module: str = "none") -> str:
    """The first kind (``KINDS`` order: cheapest first) that takes ``method`` and ``module`` (each with the other
    at its neutral value); the last kind where none does."""
    for k in KINDS:
        if refusal(Cell("uniform", method, "none", k).config()) is None:
            if refusal(Cell("uniform", "fedavg", module, k).config()) is None:
                return k
    return list(KINDS)[-1]


# the pairs the table prints: (row axis, column axis); the other choices at their neutral values (``pair_config``)
PAIRS = (("method", "selection"), ("method", "kind"), ("method", "module"), ("method", "local"), ("module", "kind"))


def pair_config(row: str, col: str, a: Any, b: Any) -> RunConfig:
    """The config of pair (``row``=a, ``col``=b): uniform selection, no local module, the config's own local
    settings, and the cheapest kind that takes the method and the module, for the choices not in the pair."""
    v: dict[str, Any] = {"selection": "uniform", "method": "fedavg", "module": "none", "local": None}
    v.update({row: a, col: b})
    if "kind" not in (row, col):
        v["kind"] = cheapest_kind(v["method"], v["module"])
    return Cell(**v).config()


def pair_outcomes() -> dict[tuple[str, str], dict[tuple[Any, Any], str | None]]:
    """For every pair of ``PAIRS``, each value pair's refusal (None: runs)."""
    axes: dict[str, tuple[Any, ...]] = {"method": tuple(METHODS), "selection": SELECTIONS, "kind": tuple(KINDS)}
    axes.update(module=LOCAL_MODULES, local=LOCAL_PRESETS)
    return {(r, c): {(a, b): refusal(pair_config(r, c, a, b)) for a in axes[r] for b in axes[c]} for r, c in PAIRS}


def factored(cell: Cell, pairs: dict[tuple[str, str], dict[tuple[Any, Any], str | None]]) -> list[str]:
    """The refusals of ``cell``'s pairs (empty: every pair runs, so the cell must)."""
    v: dict[str, Any] = {"method": cell.method, "selection": cell.selection, "kind": cell.kind}
    v.update(module=cell.module, local=cell.local)
    out = []
    for (r, c), outcomes in pairs.items():
        why = outcomes.get((v[r], v[c]))
        if why is not None:
            out.append(why)
    return out


def markdown() -> str:
    """The tables of docs/compositions.md: methods x (selection, model kind, local module, local settings), then
    local module x model kind; a refused cell cites its note, the message ``validate`` raises."""
    pairs = pair_outcomes()
    notes: dict[str, int] = {}

    def show(why: str | None) -> str:
        if why is None:
            return "runs"
        return f"refused [{notes.setdefault(why, len(notes) + 1)}]"

    cols: list[tuple[str, str, Any]] = [("selection", f"`{s}`", s) for s in SELECTIONS]
    cols += [("kind", k.label.split(" (")[0], name) for name, k in KINDS.items()]
    cols += [("module", f"`{a}`", a) for a in LOCAL_MODULES if a != "none"]
    cols += [("local", f"`local={p}`", p) for p in LOCAL_PRESETS if p is not None]
    lines = [
        "| method | " + " | ".join(c[1] for c in cols) + " |",
        "| --- |" + " --- |" * len(cols),
    ]
    for m in METHODS:
        row = [show(pairs["method", axis][m, v]) for axis, _, v in cols]
        lines.append(f"| `{m}` | " + " | ".join(row) + " |")
    lines += ["", "| local module | " + " | ".join(k.label for k in KINDS.values()) + " |"]
    lines.append("| --- |" + " --- |" * len(KINDS))
    for a in LOCAL_MODULES:
        lines.append(f"| `{a}` | " + " | ".join(show(pairs["module", "kind"][a, k]) for k in KINDS) + " |")
    lines.append("")
    lines += [f"{i}. {why}" for why, i in notes.items()]
    return "\n".join(lines) + "\n"
