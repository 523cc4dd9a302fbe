"""No import cycles inside uqcompress (issue 27): every module's imports form a DAG.

The graph is grimp's (the one import-linter checks): every `import` statement of the
package, top-level or inside a function, counts. Two views:

- module level: no module reaches itself through the imports of others;
- package level: inside each package, its direct children (a subpackage stands for all of its
  modules) import one another without a cycle, so that each package can be read bottom-up.

Both are checked on runtime imports and again with the `if TYPE_CHECKING:` ones: a cycle that
only annotations close still means two modules that cannot be read (or moved) apart.

On main before this test there were 3 (the `models/kinds.py` registry and the kinds' modules,
through `loading.py` and `surgery.py`; `steps/common.py` and `steps/init.py`;
`data/dataset.py` and `data/images.py`, the last one by annotations only).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

import grimp
import pytest

PACKAGE = "uqcompress"


def strongly_connected(nodes: Iterable[str], edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import cycles of a directed graph: its strongly connected components of two or
    more nodes (Tarjan's algorithm, iterative), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(nodes):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(edges.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(edges.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
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
    return sorted(found)


def module_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Sets of modules that import one another, directly or through others."""
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    return strongly_connected(graph.modules, edges)


def package_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Per package, sets of its direct children that import one another (an import from or
    into a subpackage's module counts as one from or into the subpackage)."""
    found: list[list[str]] = []
    for package in sorted(m for m in graph.modules if graph.find_children(m)):
        children = graph.find_children(package)

        def child_of(module: str, children: set[str] = children) -> str | None:
            for child in children:
                if module == child or module.startswith(child + "."):
                    return child
            return None

        edges: dict[str, set[str]] = defaultdict(set)
        for module in graph.modules:
            source = child_of(module)
            if source is None:
                continue
            for imported in graph.find_modules_directly_imported_by(module):
                target = child_of(imported)
                if target is not None and target != source:
                    edges[source].add(target)
        found += strongly_connected(children, edges)
    return found


@pytest.fixture(scope="module", params=[True, False], ids=["runtime", "with-type-checking"])
def graph(request: pytest.FixtureRequest) -> grimp.ImportGraph:
    return grimp.build_graph(PACKAGE, exclude_type_checking_imports=request.param, cache_dir=None)


def _chains(graph: grimp.ImportGraph, cycles: list[list[str]]) -> str:
    """Each cycle, with one import line per edge inside it, for the failure message."""
    lines = []
    for cycle in cycles:
        lines.append(" <-> ".join(cycle))
        members = set(cycle)
        for module in cycle:
            for imported in sorted(graph.find_modules_directly_imported_by(module) & members):
                for detail in graph.get_import_details(importer=module, imported=imported):
                    lines.append(f"    {module}:{detail['line_number']}: {detail['line_contents']}")
    return "\n".join(lines)


def test_no_module_imports_itself_through_others(graph: grimp.ImportGraph) -> None:
    cycles = module_cycles(graph)
    assert cycles == [], f"{len(cycles)} import cycle(s):\n{_chains(graph, cycles)}"


def test_no_package_has_a_cycle_among_its_children(graph: grimp.ImportGraph) -> None:
    cycles = package_cycles(graph)
    assert cycles == [], f"{len(cycles)} import cycle(s) inside packages: {cycles}"


def test_the_cycle_finder_finds_cycles() -> None:
    """The finder itself: a 3-cycle and a 2-cycle found, a DAG and self-imports not."""
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e", "d"}, "e": {"d"}, "f": {"a"}}
    assert strongly_connected(edges, edges) == [["a", "b", "c"], ["d", "e"]]
    assert strongly_connected("xyz", {"x": {"y"}, "y": {"z"}}) == []
