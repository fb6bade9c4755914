"""The module graph of topology, pools, router and loadtest has no cycles and no upward edges.

Every import counts: module level, inside functions, and under `if TYPE_CHECKING:` (a cycle that
only the type checker sees still ties the modules together). Relative imports are resolved, and
`from pkg import module` is an edge to the module, not to the package. import-linter checks the
layers too; this test also names the cycles, as a path `a -> b -> ... -> a`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit

LAYERS = ("topology", "pools", "router", "loadtest")
"""Lowest first: a module may import its own layer and the ones before it."""

Graph = Mapping[str, frozenset[str]]


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file, for every module of the four packages."""
    out: dict[str, Path] = {}
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _known(name: str, modules: Iterable[str]) -> str | None:
    """`name`, or the longest prefix of it that is one of our modules (`a.b.C` -> `a.b`)."""
    known = set(modules)
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return None


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    anchor = package[: len(package) - (node.level - 1)]
    return ".".join([*anchor, *([node.module] if node.module else [])])


def imports_of(module: str, path: Path, modules: Iterable[str]) -> frozenset[str]:
    """Our modules that `module` imports anywhere in its file."""
    known = set(modules)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(filter(None, (_known(a.name, known) for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, path.name == "__init__.py", node)
            for alias in node.names:
                target = f"{base}.{alias.name}"
                resolved = target if target in known else _known(base, known)
                if resolved is not None:
                    found.add(resolved)
    found.discard(module)
    return frozenset(found)


def import_graph(root: Path = ROOT) -> dict[str, frozenset[str]]:
    files = module_files(root)
    return {name: imports_of(name, path, files) for name, path in files.items()}


def strongly_connected(graph: Graph) -> list[list[str]]:
    """Tarjan's components (iterative: no recursion limit), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next((m for m in edges if m in graph), None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(sorted(component))
    return sorted(out)


def cycle_through(graph: Graph, component: list[str]) -> list[str]:
    """The shortest path from the component's first module back to itself, inside the component."""
    members = set(component)
    start = component[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{component} is not a cycle")


def cycles(graph: Graph) -> list[str]:
    return [" -> ".join(cycle_through(graph, c)) for c in strongly_connected(graph) if len(c) > 1]


def upward_edges(graph: Graph) -> list[str]:
    layer = {name: LAYERS.index(name.split(".")[0]) for name in graph}
    return [f"{a} imports {b} ({b.split('.')[0]} is above {a.split('.')[0]})"
            for a in sorted(graph) for b in sorted(graph[a]) if layer[b] > layer[a]]


GRAPH = import_graph()


def test_no_import_cycles() -> None:
    found = cycles(GRAPH)
    assert not found, "import cycles (move the shared part into a module both import):\n" + "\n".join(found)


def test_no_module_imports_a_higher_layer() -> None:
    found = upward_edges(GRAPH)
    assert not found, "layers are topology <- pools <- router <- loadtest:\n" + "\n".join(found)


def test_the_graph_sees_every_kind_of_import() -> None:
    assert len(GRAPH) > 150
    assert "topology.readers.capture" in GRAPH["topology.readers"]  # module level
    assert "topology.readers.spec" in GRAPH["topology.readers"]  # inside a function
    assert "loadtest.scenario" in GRAPH["loadtest.report"]  # under `if TYPE_CHECKING:`
    assert "pools" in GRAPH["router"]  # `import pools`
    assert "physics.catalog" in GRAPH["pools.config"]  # `from pools import catalog`: the module


def test_relative_imports_resolve(tmp_path: Path) -> None:
    for name, text in {"topology/__init__.py": "from . import model\n",
                       "topology/model.py": "from .readers.spec import X\n",
                       "topology/readers/__init__.py": "from .. import model\nfrom .spec import parse\n",
                       "topology/readers/spec.py": "def f() -> None:\n    from ..model import Y\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    for package in LAYERS[1:]:
        (tmp_path / package).mkdir()
    graph = import_graph(tmp_path)
    assert graph == {"topology": {"topology.model"}, "topology.model": {"topology.readers.spec"},
                     "topology.readers": {"topology.model", "topology.readers.spec"},
                     "topology.readers.spec": {"topology.model"}}
    assert cycles(graph) == ["topology.model -> topology.readers.spec -> topology.model"]


@pytest.mark.parametrize(("graph", "expected"), [
    ({"a": frozenset({"b"}), "b": frozenset()}, []),
    ({"a": frozenset({"b"}), "b": frozenset({"a"})}, ["a -> b -> a"]),
    ({"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a", "d"}), "d": frozenset()},
     ["a -> b -> c -> a"]),
    ({"a": frozenset({"b", "c"}), "b": frozenset({"a"}), "c": frozenset({"b"}),
      "x": frozenset({"y"}), "y": frozenset({"x"})}, ["a -> b -> a", "x -> y -> x"]),
])
def test_cycles_are_named_as_paths(graph: Graph, expected: list[str]) -> None:
    assert cycles(graph) == expected
