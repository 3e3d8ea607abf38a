"""No module of ``meshplan`` imports itself back, through any chain, counting every import: those at the top of a
module, inside functions and under ``TYPE_CHECKING`` alike (an import moved into a function still ties the two
modules together; it only hides the cycle from a reader). The graph is grimp's, the one import-linter checks the
rooms' contracts on (``.importlinter``); this test looks one level finer, between modules.

``KNOWN_CYCLES`` names the cycle that exists today and is being taken apart; each entry must still be a cycle
(remove it once it is gone), and no other cycle may appear.
"""
from __future__ import annotations

import ast
from pathlib import Path

import grimp
import networkx as nx

from tests.helpers import REPO

# Cycles being removed (and who removes them). Empty this as they go; never add to it.
KNOWN_CYCLES: dict[str, frozenset[str]] = {}


def package_files() -> list[tuple[str, Path]]:
    """(dotted module name, file) of every module of the package; its rooms are the links meshplan/<room>."""
    root = REPO / "meshplan"
    out = []
    for path in sorted(root.glob("*.py")) + sorted(p for room in root.iterdir() if room.is_dir()
                                                   for p in room.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out.append((".".join(("meshplan", *parts)).removesuffix(".__init__"), path))
    return out


def _graph() -> grimp.ImportGraph:
    return grimp.build_graph("meshplan", include_external_packages=False, cache_dir=None)


def _cycles(graph: grimp.ImportGraph) -> list[frozenset[str]]:
    """Strongly connected groups of two or more modules: each module of one reaches every other by imports."""
    g = nx.DiGraph()
    for m in graph.modules:
        g.add_node(m)
        g.add_edges_from((m, dep) for dep in graph.find_modules_directly_imported_by(m))
    return [frozenset(c) for c in nx.strongly_connected_components(g) if len(c) > 1]


def _function_level_imports() -> list[tuple[str, str, tuple[str, ...]]]:
    """(importing module, imported module, names) of every absolute ``from meshplan... import`` inside a function
    of the package, read from the source files."""
    out = []
    for module, path in package_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out += [(module, node.module, tuple(a.name for a in node.names)) for node in ast.walk(fn)
                        if isinstance(node, ast.ImportFrom) and node.level == 0
                        and (node.module or "").startswith("meshplan.")]
    return out


def test_the_graph_holds_imports_inside_functions() -> None:
    """The graph the cycle check walks holds imports made inside functions (grimp reads every import statement),
    so a cycle cannot hide in one."""
    graph = _graph()
    found = _function_level_imports()
    assert found, "no import inside a function found: the scan of the package's files is broken"
    missing = [(src, dst) for src, dst, names in found
               if not graph.direct_import_exists(importer=src, imported=dst)
               and not any(graph.direct_import_exists(importer=src, imported=f"{dst}.{n}") for n in names)]
    assert not missing, f"imports inside functions the graph lacks: {missing}"


def test_no_module_import_cycles() -> None:
    cycles = _cycles(_graph())
    known = set(KNOWN_CYCLES.values())
    new = [sorted(c) for c in cycles if c not in known]
    assert not new, f"module import cycles: {new}"
    gone = [name for name, c in KNOWN_CYCLES.items() if c not in cycles]
    assert not gone, f"no longer cycles, remove them from KNOWN_CYCLES: {gone}"
