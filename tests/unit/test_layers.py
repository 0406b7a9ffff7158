"""The house's import structure: the layers contract holds and no module cycle exists.

`make test` also runs `lint-imports` (the contract in pyproject.toml); this
test runs the same contract from pytest, and adds what a layers contract
cannot see: cycles between modules of one package (two modules of `checks/`
importing each other, say), which make a module impossible to read or test alone.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(modules):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = []
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        work.append((start, sorted(graph.find_modules_directly_imported_by(start) & modules)))
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append(
                        (nxt, sorted(graph.find_modules_directly_imported_by(nxt) & modules))
                    )
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_between_modules() -> None:
    graph = grimp.build_graph("auditor", cache_dir=None)
    # A package's __init__ re-exporting its modules is not a cycle worth a name;
    # every real module counts.
    modules = {m for m in graph.modules if not graph.find_children(m)}
    assert _cycles(graph, modules) == []


def test_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for m in ("p.a", "p.b", "p.c"):
        graph.add_module(m)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.a")
    graph.add_import(importer="p.c", imported="p.a")
    assert _cycles(graph, {"p.a", "p.b", "p.c"}) == [["p.a", "p.b"]]


def test_layers_contract_is_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


#: Each store's client library, and the one package (its adapter) that may import it.
STORE_CLIENTS = {"kazoo": "auditor.zk", "aetcd": "auditor.etcd"}


def test_only_each_adapter_imports_its_store_client() -> None:
    """The metadata-store port holds: above the adapters, nothing knows which store it
    talks to (test support that runs a real server of one store is its own matter)."""
    graph = grimp.build_graph("auditor", "kazoo", "aetcd", cache_dir=None)
    wrong = []
    for library, adapter in STORE_CLIENTS.items():
        importers = set()
        for module in graph.find_descendants(library) | {library}:
            importers |= graph.find_modules_that_directly_import(module)
        for importer in sorted(importers):
            if importer.startswith("auditor.") and not (
                importer == adapter
                or importer.startswith(adapter + ".")
                or importer.startswith("auditor.testing.")
            ):
                wrong.append(f"{importer} imports {library}")
    assert wrong == []
