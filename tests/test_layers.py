"""The package's layers, read from the source with ``ast`` (no module is imported).

Every module belongs to a layer (``LAYERS``, bottom first); a module imports only modules of its own layer or of
layers below, counting imports inside functions and type-only ones (``if TYPE_CHECKING:``): every arrow points
down. No import circle closes at run time, counting imports inside functions (type-only imports never run, so
they close none). The papers' modules run nothing (they import no training or experiment module), the model
modules import no pandas, and the algorithms use only the executors' public names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "fedlib"

# bottom first; a module is in the layer of the longest prefix that names it ("fedlib" alone: the package's
# public API, above everything). config.options is the vocabulary every layer declares options with; the run config
# sits above the registries it validates against (methods, models, data sets).
LAYERS = (
    ("fedlib.config.options",),
    ("fedlib.data", "fedlib.models"),
    ("fedlib.executors",),
    ("fedlib.core",),
    ("fedlib.algorithms",),
    ("fedlib.config",),
    ("fedlib.runs", "fedlib.plotting"),  # plotting imports nothing of fedlib; ``Results.plot`` draws with it
    ("fedlib.papers",),
    ("fedlib.experiments", "fedlib.flower"),  # flower: the methods as Flower apps (the runs' config, data and store)
    ("fedlib",),
)
# what the papers' modules must not import: they are pure functions of (profile, available data) and of the store
RUNNERS = ("fedlib.runs.train", "fedlib.runs.grids", "fedlib.runs.pool", "fedlib.runs.batching", "fedlib.runs.ray_backend",
           "fedlib.runs.scheduling", "fedlib.runs.worker", "fedlib.core.simulation", "fedlib.experiments")  # fmt: skip
MODEL_MODULES = (
    "fedlib.models.registry",
    "fedlib.models.groups",
    "fedlib.models.convnets",
    "fedlib.models.local_attention",
)


def layer_of(module: str) -> int:
    best, rank = -1, None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    if rank is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS")
    return rank


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool, modules: set[str]):
    """Yield (target module, kind) for every import in ``tree`` that lands inside ``modules``; kind: "module"
    (runs at import), "function" (runs when the function does) or "typing" (``if TYPE_CHECKING:``, never runs)."""
    package = module if is_package else module.rpartition(".")[0]

    def resolve(level: int, name: str | None) -> str:
        if level == 0:
            return name or ""
        base = package.split(".")
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([name] if name else []))

    def deepest(name: str) -> str | None:  # import a.b.c binds a, runs a.b.c: the deepest module of ours
        parts = name.split(".")
        for k in range(len(parts), 0, -1):
            if ".".join(parts[:k]) in modules:
                return ".".join(parts[:k])
        return None

    def visit(node: ast.AST, kind: str):
        if isinstance(node, ast.Import):
            for a in node.names:
                target = deepest(a.name)
                if target:
                    yield target, kind
        elif isinstance(node, ast.ImportFrom):
            base = resolve(node.level, node.module)
            for a in node.names:
                sub = f"{base}.{a.name}"
                target = sub if sub in modules else deepest(base)  # a submodule, else a name from the module
                if target:
                    yield target, kind
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and kind == "module":
            kind = "function"
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:  # never runs: not a runtime import at all
                yield from visit(child, "typing")
            for child in node.orelse:
                yield from visit(child, kind)
            return
        for child in ast.iter_child_nodes(node):
            yield from visit(child, kind)

    yield from visit(tree, "module")


def build_graph(root: Path = ROOT) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(run-time edges: module and function level, all edges: type-only ones too) between the modules under
    ``root`` (a package directory)."""
    files = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    modules = set(files)
    runtime: dict[str, set[str]] = {m: set() for m in modules}
    every: dict[str, set[str]] = {m: set() for m in modules}
    for m, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for target, kind in _imports(tree, m, path.name == "__init__.py", modules):
            if target == m or m.startswith(target + "."):  # a package's own __init__ runs before its modules
                continue
            every[m].add(target)
            if kind != "typing":
                runtime[m].add(target)
    return runtime, every


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected component with more than one module, as one cycle through it (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(_cycle_in(graph, set(comp)))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _cycle_in(graph, comp: set[str]) -> list[str]:
    start = min(comp)
    prev, frontier = {start: None}, [start]  # breadth-first back to start inside the component
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return path[::-1] + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(comp)


def upward(every: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every import (any level, type-only too) from a module into a layer above its own."""
    return sorted((a, b) for a in every for b in every[a] if layer_of(b) > layer_of(a))


# -- the tests -------------------------------------------------------------------------------------
RUNTIME, EVERY = build_graph()


def test_the_parser_sees_the_imports():
    """The graph has the edges we know are there (package-level, submodule and function-level ones)."""
    assert {"fedlib.models", "fedlib.models.convnets", "fedlib.data", "fedlib.data.federated"} <= set(RUNTIME)
    assert "fedlib.models.convnets" in RUNTIME["fedlib.models.registry"]
    assert "fedlib.models.groups" in RUNTIME["fedlib.models.local_attention"]
    assert "fedlib.data.federated" in RUNTIME["fedlib.data"]
    assert "fedlib.core.selection" in RUNTIME["fedlib.algorithms"]  # inside build_algorithm only
    assert "fedlib.core.callbacks" in EVERY["fedlib.core.state"] - RUNTIME["fedlib.core.state"]  # type-only


def test_every_module_is_in_a_layer():
    for m in RUNTIME:
        layer_of(m)


def test_no_import_circle_counting_imports_inside_functions():
    found = cycles(RUNTIME)
    assert not found, "import circles: " + "; ".join(" -> ".join(c) for c in found)


def test_every_import_points_down_the_layers():
    bad = upward(EVERY)
    assert not bad, "upward imports: " + "; ".join(
        f"{a} (layer {layer_of(a)}) -> {b} (layer {layer_of(b)})" for a, b in bad
    )


def test_the_papers_run_nothing():
    bad = [(a, b) for a in EVERY if a.startswith("fedlib.papers") for b in EVERY[a]
           if any(b == r or b.startswith(r + ".") for r in RUNNERS)]  # fmt: skip
    assert not bad, bad


@pytest.mark.parametrize("module", MODEL_MODULES)
def test_model_modules_import_no_pandas(module):
    path = ROOT.parent / (module.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0]
    assert not [n for n in names if n.split(".")[0] == "pandas"], names


def test_the_checks_have_teeth(tmp_path):
    """On a made-up package: a circle closed by a function-level import is found and named, one closed only by a
    type-only import is not; relative imports resolve; an upward import, a type-only one included, is caught."""
    pkg = tmp_path / "fedlib"
    (pkg / "data").mkdir(parents=True)
    (pkg / "core").mkdir()
    files = {
        "__init__.py": "",
        "core/__init__.py": "",
        "core/state.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .callbacks import C\n",
        "core/callbacks.py": "from fedlib.core.state import S\n",  # type-only back: no circle
        "core/simulation.py": "from . import stages\n",
        "core/stages.py": "def f():\n    from fedlib.core import simulation\n",  # a function-level circle
        "data/__init__.py": "from .reader import r\n",
        "data/reader.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..core.state import S\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    runtime, every = build_graph(pkg)
    assert runtime["fedlib.core.state"] == set() and every["fedlib.core.state"] == {"fedlib.core.callbacks"}
    assert cycles(runtime) == [["fedlib.core.simulation", "fedlib.core.stages", "fedlib.core.simulation"]]
    assert upward(every) == [("fedlib.data.reader", "fedlib.core.state")]


def test_algorithms_use_only_public_executor_names():
    """Fast paths live inside the executors package; algorithms supply objectives and never reach into it
    (no import of private names such as ``_sgd_update`` or ``_fused_weight_step``)."""
    bad = []
    for path in sorted((ROOT / "algorithms").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").lstrip(".").startswith("executors"):
                bad += [f"{path.name}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert bad == []
