"""The import graph of the product's packages (api/, costopt/, pricing/, providers/), read from the source
with ``ast``: no cycle between modules, and the layers import only downwards.

Every import statement counts as an edge, wherever it is (module level, inside a function, under
``if TYPE_CHECKING:``): a lazy or type-only import still couples the two modules. ``from a.b import c``
is an edge to the module ``a.b.c`` when there is one, else to ``a.b``; importing ``a.b.c`` is not taken
as an edge to its parent packages (Python runs their ``__init__`` first, but that is a dependency of
``a.b.c``'s package, not of the importer).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from costopt.settings import PROJECT_ROOT

PACKAGES = ("api", "costopt", "pricing", "providers")

#: package -> the packages it must never import (docs/architecture.md, "Layers").
FORBIDDEN: Mapping[str, frozenset[str]] = {
    "costopt": frozenset({"pricing", "providers", "api"}),
    "pricing": frozenset({"api"}),
    "providers": frozenset({"api"}),
    "api": frozenset(),
}

# Generated Alembic revisions are data, not part of the code's graph.
EXCLUDED_DIRS = (Path("costopt/db/migrations/versions"),)


def module_files(root: Path) -> dict[str, Path]:
    """Module name -> source file, for every ``.py`` file of the four packages."""
    out: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if any(rel.is_relative_to(d) for d in EXCLUDED_DIRS):
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(name: str, known: Mapping[str, Path]) -> str | None:
    """The known module ``name`` names, or its nearest known ancestor (``a.b.Thing`` -> ``a.b``)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def imported_modules(module: str, path: Path, known: Mapping[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in ``path`` that names one of the ``known`` modules."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, known)
                if target is not None:
                    yield target, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = module.split(".") if is_package else module.split(".")[:-1]
                if node.level > 1:
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join([*base_parts, node.module] if node.module else base_parts)
            else:
                base = node.module or ""
            for alias in node.names:
                target = _resolve(f"{base}.{alias.name}", known)
                if target is not None:
                    yield target, node.lineno


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """Module -> {imported module: first line importing it}, self-imports left out."""
    known = module_files(root)
    graph: dict[str, dict[str, int]] = {}
    for module, path in known.items():
        edges = graph.setdefault(module, {})
        for target, line in imported_modules(module, path, known):
            if target != module:
                edges.setdefault(target, line)
    return graph


def cycles(graph: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:
        nonlocal counter
        # Iterative, so a deep graph cannot hit the recursion limit.
        work: list[tuple[str, Iterator[str]]] = []
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        work.append((start, iter(sorted(graph.get(start, {})))))
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def describe_cycle(component: list[str], graph: Mapping[str, Mapping[str, int]]) -> str:
    members = set(component)
    edges = [
        f"{source} -> {target} (line {line})"
        for source in component
        for target, line in sorted(graph[source].items())
        if target in members
    ]
    return "cycle among " + ", ".join(component) + ":\n    " + "\n    ".join(edges)


def layering_violations(graph: Mapping[str, Mapping[str, int]]) -> list[str]:
    out = []
    for source, targets in sorted(graph.items()):
        forbidden = FORBIDDEN[source.split(".")[0]]
        for target, line in sorted(targets.items()):
            if target.split(".")[0] in forbidden:
                out.append(f"{source} imports {target} (line {line})")
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, int]]:
    return import_graph(PROJECT_ROOT)


def test_no_import_cycle_between_modules(graph: dict[str, dict[str, int]]) -> None:
    found = cycles(graph)
    assert not found, "\n".join(describe_cycle(c, graph) for c in found)


def test_layers_import_only_downwards(graph: dict[str, dict[str, int]]) -> None:
    violations = layering_violations(graph)
    assert not violations, "layering violations (docs/architecture.md, Layers):\n" + "\n".join(violations)


# The checks above are only as good as the graph: these pin down what counts as an edge and what a
# cycle is, on a small tree written for the purpose.


def _write(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_graph_counts_lazy_type_only_and_relative_imports(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "api/__init__.py": "",
            "api/a.py": "from api import b\n",
            "api/b.py": "def f():\n    import api.c\n",
            "api/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from api.d import Thing\n",
            "api/d.py": "from .a import x\n",
            "costopt/__init__.py": "",
            "costopt/core.py": "import os\nimport numpy\n",
            "costopt/sub/__init__.py": "from .inner import y\n",
            "costopt/sub/inner.py": "from .. import core\n",
            "pricing/__init__.py": "",
            "providers/__init__.py": "",
        },
    )
    graph = import_graph(tmp_path)
    assert graph["api.a"] == {"api.b": 1}
    assert graph["api.b"] == {"api.c": 2}
    assert graph["api.c"] == {"api.d": 3}
    assert graph["api.d"] == {"api.a": 1}
    assert graph["costopt.core"] == {}
    assert graph["costopt.sub"] == {"costopt.sub.inner": 1}
    assert graph["costopt.sub.inner"] == {"costopt.core": 1}
    assert cycles(graph) == [["api.a", "api.b", "api.c", "api.d"]]


def test_layering_flags_the_core_importing_upwards(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "api/__init__.py": "",
            "api/app.py": "from costopt import core\nfrom providers import sim\n",
            "costopt/__init__.py": "",
            "costopt/core.py": "def f():\n    from providers.sim import Sim\n",
            "pricing/__init__.py": "",
            "pricing/store.py": "from costopt.core import f\n",
            "providers/__init__.py": "",
            "providers/sim.py": "from api.app import x\n",
        },
    )
    graph = import_graph(tmp_path)
    assert layering_violations(graph) == [
        "costopt.core imports providers.sim (line 2)",
        "providers.sim imports api.app (line 1)",
    ]
    # costopt.core -> providers.sim -> api.app -> costopt.core
    assert cycles(graph) == [["api.app", "costopt.core", "providers.sim"]]
