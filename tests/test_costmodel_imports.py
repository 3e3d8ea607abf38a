"""The cost model's modules import each other without cycles, counting imports inside functions too (grimp's graph
holds every import statement), so no cycle hides behind a deferred import."""
from __future__ import annotations

import grimp


def _cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """Strongly connected groups of more than one module among ``package``'s modules (Tarjan)."""
    mods = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    inside = set(mods)
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.find_modules_directly_imported_by(v) & inside):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for m in mods:
        if m not in index:
            visit(m)
    return out


def test_costmodel_has_no_import_cycle():
    graph = grimp.build_graph("meshplan", cache_dir=None)
    assert "meshplan.costmodel.datasets.neusight" in graph.modules  # the graph sees the loaders
    assert _cycles(graph, "meshplan.costmodel") == []
