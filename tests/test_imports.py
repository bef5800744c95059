"""The import graph of fedlib, read from the source with ``ast`` (no module is imported):

(a) no cycle among MODULE-LEVEL imports inside fedlib (imports inside functions run late and may close a
    loop on purpose; ``if TYPE_CHECKING:`` blocks never run, so they close no cycle, but they do count for (b));
(b) dependencies point one way (issue "Engine v2", item 5): the models (fedlib.models, fedlib.convnets,
    fedlib.local_attention) and the data (fedlib.data.*) reach, through imports at ANY level, none of the
    config, engine, store, algorithm or paper modules;
(c) the model modules do not import pandas (the paper tables live in fedlib.papers).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "fedlib"

# Modules the models and the data must not reach (prefixes: a package covers its submodules). "fedlib"
# itself (exactly) is the package __init__, i.e. the engine's public API (RunConfig, run, Store).
FORBIDDEN = (
    "fedlib.config",
    "fedlib.simulation",
    "fedlib.runner",
    "fedlib.store",
    "fedlib.algorithms",
    "fedlib.stages",
    "fedlib.executors",
    "fedlib.experiments",
    "fedlib.profiles",
    "fedlib.report",
    "fedlib.plotting",
    "fedlib.papers",
)
RESTRICTED = ("fedlib.models", "fedlib.convnets", "fedlib.local_attention", "fedlib.data")
MODEL_MODULES = ("fedlib.models", "fedlib.convnets", "fedlib.local_attention")

# Known exceptions, each one edge, each with its reason. Remove an entry when its reason goes.
ALLOWED_EDGES: set = set()  # (importer, imported) exceptions to the one-way rule; none today
KNOWN_CYCLES: set[frozenset[str]] = set()  # module-level cycles in today's tree owned by others: none


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
    """Yield (target module, module_level) for every import in ``tree`` that lands inside ``modules``."""
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

    def visit(node: ast.AST, module_level: bool):
        if isinstance(node, ast.Import):
            for a in node.names:
                target = deepest(a.name)
                if target:
                    yield target, module_level
        elif isinstance(node, ast.ImportFrom):
            base = resolve(node.level, node.module)
            for a in node.names:
                sub = f"{base}.{a.name}"
                target = sub if sub in modules else deepest(base)  # a submodule, else a name from the module
                if target:
                    yield target, module_level
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            module_level = False
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:  # never runs: not a runtime import at all
                yield from ((t, False) for t, _ in visit(child, False))
            for child in node.orelse:
                yield from visit(child, module_level)
            return
        for child in ast.iter_child_nodes(node):
            yield from visit(child, module_level)

    yield from visit(tree, True)


def build_graph(root: Path = ROOT) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module-level edges, all edges) between the modules under ``root`` (a package directory)."""
    files = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    modules = set(files)
    top: dict[str, set[str]] = {m: set() for m in modules}
    every: dict[str, set[str]] = {m: set() for m in modules}
    for m, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for target, module_level in _imports(tree, m, path.name == "__init__.py", modules):
            if target == m:
                continue
            every[m].add(target)
            if module_level:
                top[m].add(target)
    return top, every


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


def _forbidden(module: str) -> bool:
    return module == "fedlib" or any(module == f or module.startswith(f + ".") for f in FORBIDDEN)


def _restricted(module: str) -> bool:
    return any(module == r or module.startswith(r + ".") for r in RESTRICTED)


def forbidden_paths(every: dict[str, set[str]]) -> list[list[str]]:
    """For each restricted module, the import chains (any level, transitively) that reach a forbidden module."""
    bad = []
    for src in sorted(m for m in every if _restricted(m)):
        prev, frontier = {src: None}, [src]
        while frontier:
            nxt = []
            for v in frontier:
                for w in sorted(every[v]):
                    if (v, w) in ALLOWED_EDGES or w in prev:
                        continue
                    prev[w] = v
                    if _forbidden(w):
                        path = [w]
                        while prev[path[-1]] is not None:
                            path.append(prev[path[-1]])
                        bad.append(path[::-1])
                    else:
                        nxt.append(w)
            frontier = nxt
    return bad


# -- the tests -------------------------------------------------------------------------------------
TOP, EVERY = build_graph()


def test_the_parser_sees_the_imports():
    """The graph has the edges we know are there (relative, package-relative, and function-level ones)."""
    assert {
        "fedlib.models",
        "fedlib.convnets",
        "fedlib.data",
        "fedlib.data.federated",
        "fedlib.papers.pfedla_params",
    } <= set(TOP)
    assert {"fedlib.convnets", "fedlib.local_attention"} <= TOP["fedlib.models"]  # from . import / from .x import
    assert "fedlib.data.federated" in TOP["fedlib.data"]  # from .federated import
    assert "fedlib.selection" not in TOP["fedlib.config"]  # inside validate() only
    assert "fedlib.selection" in EVERY["fedlib.config"]


def test_no_module_level_cycles():
    found = [c for c in cycles(TOP) if frozenset(c) not in KNOWN_CYCLES]
    assert not found, "module-level import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_models_and_data_import_no_engine_config_store_algorithm_or_paper_module():
    bad = forbidden_paths(EVERY)
    assert not bad, "one-way dependencies broken: " + "; ".join(" -> ".join(p) for p in bad)
    assert all((a, b) in {(a, b) for a in EVERY for b in EVERY[a]} for a, b in ALLOWED_EDGES), (
        "an allowed exception no longer exists: remove it from ALLOWED_EDGES"
    )


@pytest.mark.parametrize("module", MODEL_MODULES)
def test_model_modules_import_no_pandas(module):
    path = ROOT.parent / (module.replace(".", "/") + ".py")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0]
    assert not [n for n in names if n.split(".")[0] == "pandas"], names


def test_the_checks_have_teeth(tmp_path):
    """On a made-up package: a module-level cycle is found and named, a function-level one is not, relative
    imports resolve, TYPE_CHECKING imports are ignored, and a restricted module reaching a forbidden one
    through an intermediate module is caught."""
    pkg = tmp_path / "fedlib"
    (pkg / "data").mkdir(parents=True)
    files = {
        "__init__.py": "from .config import X\n",
        "config.py": "from . import helpers\nX = 1\n",
        "helpers.py": "import fedlib.models\nfrom fedlib.config import X\n",  # config <-> helpers: a cycle
        "models.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .stages import S\n"
        "def f():\n    from . import convnets\n",
        "convnets.py": "from .models import f\n",  # only function-level back
        "stages.py": "",
        "data/__init__.py": "from .reader import r\n",
        "data/reader.py": "def r():\n    from ..helpers import X\n",  # data -> helpers -> config
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    top, every = build_graph(pkg)
    # TYPE_CHECKING imports never run (no cycle) but are still a dependency for the one-way rule
    assert top["fedlib.models"] == set() and every["fedlib.models"] == {"fedlib.convnets", "fedlib.stages"}
    assert top["fedlib.helpers"] == {"fedlib.models", "fedlib.config"}
    found = cycles(top)
    assert found == [["fedlib.config", "fedlib.helpers", "fedlib.config"]]
    assert ["fedlib.data.reader", "fedlib.helpers", "fedlib.config"] in forbidden_paths(every)
    assert ["fedlib.data", "fedlib.data.reader", "fedlib.helpers", "fedlib.config"] in forbidden_paths(every)
    assert ["fedlib.models", "fedlib.stages"] in forbidden_paths(every)
    assert not any(p[0] == "fedlib.convnets" and p[1] != "fedlib.models" for p in forbidden_paths(every))


def test_algorithms_use_only_public_executor_names():
    """Fast paths live inside the executors package; algorithms supply objectives and never reach into it
    (algorithms/fedmix.py used to import ``_sgd_update`` and ``_fused_weight_step``)."""
    bad = []
    for path in sorted((ROOT / "algorithms").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").lstrip(".").startswith("executors"):
                bad += [f"{path.name}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert bad == []
