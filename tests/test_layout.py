"""The house keeps its shape: no module imports another that imports it back (not even lazily,
nor for types only), each room imports only rooms below it, the top level reads as a map, and
``docs/architecture.md``'s layout table names exactly the modules there are."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mailsvc"

#: The rooms, lowest first: a module may import modules of its own room and of the rooms below.
#: The vocabulary every room speaks is the lowest; what only the top (the app, the routing
#: table, the command line) may know is the highest.
ROOMS = [
    ("vocabulary", {"errors", "statuses", "ids", "timestamps", "settings"}),
    ("store", {"store"}),
    ("ops", {"ops"}),
    ("queues", {"queues"}),
    ("http", {"http"}),
    ("limits", {"limits"}),
    ("mail", {"mail"}),
    ("webhooks", {"webhooks"}),
    ("delivery", {"delivery"}),
    ("inbound", {"inbound"}),
    ("api", {"api"}),
    (
        "top",
        {
            "routes",
            "app",
            "dashboard",
            "submission",
            "operator",
            "cli",
            "wsgi",
            "__init__",
            "__main__",
        },
    ),
]
#: Modules directly under mailsvc/, at most (besides __init__ and __main__).
MOST_TOP_LEVEL_MODULES = 10


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str) -> set[str]:
    """Every mailsvc module ``name`` imports, wherever the import stands (at the top, inside a
    function, under ``TYPE_CHECKING``)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                if f"{target}.{alias.name}" in MODULES:
                    found.add(f"{target}.{alias.name}")
                elif target in MODULES:
                    found.add(target)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name
                while target and target not in MODULES:
                    target = target.rpartition(".")[0]
                if target:
                    found.add(target)
    found.discard(name)
    return found


GRAPH = {name: imports(name) for name in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
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


def room(name: str) -> int:
    first = name.split(".")[1] if "." in name else "__init__"
    for number, (_, members) in enumerate(ROOMS):
        if first in members:
            return number
    raise AssertionError(f"{name} is in no room: add it to ROOMS (and to the layout table)")


def test_no_module_imports_one_that_imports_it_back():
    assert cycles(GRAPH) == []


def test_each_room_imports_only_rooms_below_it():
    upward = [
        f"{name} ({ROOMS[room(name)][0]}) imports {target} ({ROOMS[room(target)][0]})"
        for name, targets in GRAPH.items()
        for target in sorted(targets)
        if room(target) > room(name)
    ]
    assert upward == []


def test_the_top_level_reads_as_a_map():
    top = sorted(
        path.stem for path in PACKAGE.glob("*.py") if path.stem not in ("__init__", "__main__")
    )
    assert len(top) <= MOST_TOP_LEVEL_MODULES, top


def test_every_package_says_what_it_holds():
    for path in PACKAGE.rglob("__init__.py"):
        docstring = ast.get_docstring(ast.parse(path.read_text()))
        assert docstring and len(docstring) > 40, f"{path} has no docstring that says what it holds"


def test_the_architecture_documents_layout_table_is_the_tree():
    """Each row of the table names a module or a package (with its modules) of mailsvc/."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("<!-- layout -->")[1].split("<!-- /layout -->")[0]
    documented: set[str] = set()
    for row in re.findall(r"^\| `(mailsvc/[^`]*)` \|([^|]*)\|", table, re.MULTILINE):
        where, modules = row
        if where.endswith(".py"):
            documented.add(where)
        else:
            # (A package whose code is all in its __init__ names no module.)
            names = re.findall(r"`([a-z_0-9]+)`", modules)
            documented.update(f"{where}{name}.py" for name in names)
    tree = {
        str(path.relative_to(ROOT))
        for path in PACKAGE.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    }
    assert sorted(tree - documented) == [], "in the tree, not in the table"
    assert sorted(documented - tree) == [], "in the table, not in the tree"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_module_is_in_a_room(name):
    room(name)


BENCH = sorted(path.stem for path in (ROOT / "tests" / "bench").glob("*.py"))


@pytest.mark.parametrize("name", BENCH)
def test_each_bench_module_imports_with_this_layout(name):
    """The bench is run by hand, not by the suite: this catches a move that left it behind."""
    importlib.import_module(f"tests.bench.{name}")
