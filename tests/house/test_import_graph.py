"""The house as docs/architecture.md draws it, checked on the code's own imports: no module cycle,
no arrow up the layers, no two packages of one layer importing each other, no cycle among the
entries (modules and subfolders) of any folder, no package holding more than 30 % of the product's
lines, and pools and physics reaching no I/O module. import-linter (pyproject.toml) holds the same
layers and the purity rule; this test also names what breaks them, as paths.

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

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"kvblocks"}),
    frozenset({"topology", "wire"}),
    frozenset({"physics"}),
    frozenset({"pools"}),
    frozenset({"router", "control", "simengine", "vllmplugin"}),
    frozenset({"isleserve"}),
    frozenset({"loadtest"}),
)
"""Lowest first: a module may import its own package and the layers below; packages of one layer
never import each other. `python -m X` entries (`X.__main__`) and `isle.py` sit above them all."""
PACKAGES = tuple(sorted(p for layer in LAYERS for p in layer))
LAYER_OF = {p: i for i, layer in enumerate(LAYERS) for p in layer}
IO_MODULES = ("ray", "asyncio", "socket", "subprocess", "threading", "httpx", "httptools", "uvloop",
              "multiprocessing", "selectors", "torch", "vllm")
"""What decision code never reaches: Ray, event loops, sockets, threads, processes, HTTP, and the
engine's own libraries (the vLLM plugin, `vllmplugin`, turns their tensors into plain values)."""
PURE = ("pools", "physics", "kvblocks")
MAX_SHARE = 0.30

Graph = Mapping[str, frozenset[str]]


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file, for every module of the product's packages."""
    out: dict[str, Path] = {}
    for package in PACKAGES:
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


ENTRIES = frozenset({"router.serve"})
"""Entry points by another name than `__main__`: Serve's old `import_path: router.serve:build`."""


def is_entry(module: str) -> bool:
    return module.endswith(".__main__") or module in ENTRIES


def upward_edges(graph: Graph) -> list[str]:
    """Edges to a higher layer, or to another package of the same layer (entries excepted)."""
    out = []
    for a in sorted(graph):
        if is_entry(a):
            continue
        pa = a.split(".")[0]
        for b in sorted(graph[a]):
            pb = b.split(".")[0]
            if pb != pa and LAYER_OF[pb] >= LAYER_OF[pa]:
                out.append(f"{a} imports {b} ({pb} is {'above' if LAYER_OF[pb] > LAYER_OF[pa] else 'beside'} {pa})")
    return out


def folder_cycles(graph: Graph, files: Mapping[str, Path]) -> list[str]:
    """Cycles among the entries of one folder: each edge a -> b counts, in the deepest folder holding
    both, between the entry (module or subfolder) that holds a and the one that holds b; an edge to
    or from that folder's own `__init__` is the package itself and does not count, nor does one
    from a `python -m` entry."""
    levels: dict[str, dict[str, set[str]]] = {}
    for a, targets in graph.items():
        if is_entry(a):
            continue
        for b in targets:
            if b not in files:
                continue
            pa, pb = a.split("."), b.split(".")
            common = 0
            while common < min(len(pa), len(pb)) and pa[common] == pb[common]:
                common += 1
            if common in (len(pa), len(pb)):  # one is a package holding the other
                continue
            level = levels.setdefault(".".join(pa[:common]) or "<root>", {})
            level.setdefault(pa[common], set()).add(pb[common])
    out: list[str] = []
    for folder, edges in sorted(levels.items()):
        entries: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in edges.items()}
        for ends in edges.values():
            for t in ends:
                entries.setdefault(t, frozenset())
        out.extend(f"in {folder}: {c}" for c in cycles(entries))
    return out


def shares(root: Path = ROOT) -> dict[str, float]:
    """Each package's share of the product's lines (its .py files over all of them and isle.py)."""
    lines = {p: sum(len(f.read_text().splitlines()) for f in (root / p).rglob("*.py")) for p in PACKAGES}
    total = sum(lines.values()) + len((root / "isle.py").read_text().splitlines())
    return {p: n / total for p, n in lines.items()}


def io_reached(graph: Graph, files: Mapping[str, Path], package: str) -> list[str]:
    """Paths from `package`'s modules to an import of an I/O module, through our modules."""
    direct = {m: sorted({n.split(".")[0] for n in _imported_names(files[m])} & set(IO_MODULES)) for m in files}
    out = []
    for start in sorted(m for m in graph if m.split(".")[0] == package and not is_entry(m)):
        seen, frontier = {start: [start]}, [start]
        while frontier:
            node = frontier.pop()
            if direct[node]:
                out.append(" -> ".join([*seen[node], direct[node][0]]))
                break
            for nxt in sorted(graph[node]):
                if nxt not in seen and nxt in files and not (node.split(".")[0] == "physics" and nxt == "wire"):
                    seen[nxt] = [*seen[node], nxt]
                    frontier.append(nxt)
    return out


def _imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


GRAPH = import_graph()


def test_no_import_cycles() -> None:
    found = cycles(GRAPH)
    assert not found, "import cycles (move the shared part into a module both import):\n" + "\n".join(found)


def test_no_module_imports_a_higher_layer_or_a_sibling_package() -> None:
    found = upward_edges(GRAPH)
    assert not found, ("layers, lowest first: " + " <- ".join("|".join(sorted(x)) for x in LAYERS) + ":\n"
                       + "\n".join(found))


def test_no_cycle_among_the_entries_of_any_folder() -> None:
    found = folder_cycles(GRAPH, module_files())
    assert not found, "folder-level cycles:\n" + "\n".join(found)


def test_no_package_holds_more_than_its_share() -> None:
    found = {p: round(share, 3) for p, share in shares().items() if share > MAX_SHARE}
    assert not found, f"packages over {MAX_SHARE:.0%} of the product's lines: {found}"


@pytest.mark.parametrize("package", PURE)
def test_decisions_reach_no_io_module(package: str) -> None:
    found = io_reached(GRAPH, module_files(), package)
    assert not found, f"{package} reaches I/O:\n" + "\n".join(found)


def test_the_rules_catch_what_they_forbid() -> None:
    graph: dict[str, frozenset[str]] = {
        "pools.a": frozenset({"router.x"}), "router.x": frozenset(), "control.y": frozenset({"router.x"}),
        "pools.__main__": frozenset({"control.y"})}
    assert upward_edges(graph) == ["control.y imports router.x (router is beside control)",
                                   "pools.a imports router.x (router is above pools)"]
    files = {m: Path(m.replace(".", "/") + ".py") for m in ("t", "t.a", "t.b.c", "t.b.d")}
    loop = {"t": frozenset({"t.a"}), "t.a": frozenset({"t.b.c"}), "t.b.c": frozenset({"t.a"}),
            "t.b.d": frozenset()}
    assert folder_cycles(loop, files) == ["in t: a -> b -> a"]


def test_the_graph_sees_every_kind_of_import() -> None:
    assert len(GRAPH) > 150
    assert "topology.readers.capture" in GRAPH["topology.readers"]  # module level
    assert "topology.readers.spec" in GRAPH["topology.readers"]  # inside a function
    assert "loadtest.scenario" in GRAPH["loadtest.report"]  # under `if TYPE_CHECKING:`
    assert "wire" in GRAPH["router"]  # `import wire`
    assert "physics.moecost" in GRAPH["physics.gang"]  # `from physics import moecost`: the module


def test_relative_imports_resolve(tmp_path: Path) -> None:
    for name, text in {"topology/__init__.py": "from . import model\n",
                       "topology/model.py": "from .readers.spec import X\n",
                       "topology/readers/__init__.py": "from .. import model\nfrom .spec import parse\n",
                       "topology/readers/spec.py": "def f() -> None:\n    from ..model import Y\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    for package in PACKAGES:
        (tmp_path / package).mkdir(exist_ok=True)
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


def private_crossings(files: Mapping[str, Path]) -> list[str]:
    """Private names (`_x`, not dunders) one package takes from another: imported by name, or read
    as an attribute of a module or object imported from the other package."""
    out = []
    for module, path in sorted(files.items()):
        home = module.split(".")[0]
        foreign: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] in LAYER_OF and node.module.split(".")[0] != home:
                    for a in node.names:
                        if a.name.startswith("_") and not a.name.startswith("__"):
                            out.append(f"{module} imports {node.module}.{a.name}")
                        foreign.add(a.asname or a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in LAYER_OF and a.name.split(".")[0] != home:
                        foreign.add(a.asname or a.name.split(".")[0])
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and isinstance(node.value, ast.Name) and node.value.id in foreign):
                out.append(f"{module} reads {node.value.id}.{node.attr}")
    return out


def test_no_private_name_crosses_a_package_boundary() -> None:
    found = private_crossings(module_files())
    assert not found, "private names used across packages (make them public, or move the code):\n" + "\n".join(found)


def test_a_private_crossing_is_seen(tmp_path: Path) -> None:
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "a.py").write_text("from pools.b import _hidden\nimport pools.c as c\nc._x\n")
    (tmp_path / "pools").mkdir()
    (tmp_path / "pools" / "b.py").write_text("from pools.c import _fine\n")
    files = {"control.a": tmp_path / "control" / "a.py", "pools.b": tmp_path / "pools" / "b.py"}
    assert private_crossings(files) == ["control.a imports pools.b._hidden", "control.a reads c._x"]
