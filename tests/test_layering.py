"""The package's layering, read from its source with `ast` (nothing is imported): no import cycle
among onebox's modules, and no library module importing the command line.

Every `import` and `from ... import` of an onebox module counts, at module level and inside
functions alike (a lazy import is still a dependency). `import onebox.x.y` is an edge to
`onebox.x.y`; `from onebox.x import y` is one to `onebox.x.y` when `y` is a submodule, else to
`onebox.x`; a package's `__init__.py` is the package. So `onebox/x/__init__.py` importing
`onebox.x.a`, which imports `from onebox.x import b` (a submodule), is no cycle: `a` needs `b`,
not the package; `from onebox.x import name`, a name the package's `__init__` defines or
re-exports, is an edge to the package.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
CLI = "onebox.cli"
CLI_USERS = {"onebox.cli", "onebox.__main__"}
"""The only modules that may import the command line."""


def module_files(src: Path) -> dict[str, Path]:
    """Every module of the onebox package in `src` by its dotted name, a package by its
    `__init__.py`."""
    files = {}
    for path in sorted((src / "onebox").rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = path
    return files


def imported(name: str, path: Path, modules: set[str]) -> Iterator[str]:
    """The onebox modules that the module `name`, whose source is `path`, imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per dot after the first
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            # an extension module (onebox._mujoco) is no file here: its nearest package counts
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Each module of the onebox package in `src` -> the onebox modules it imports."""
    files = module_files(src)
    return {name: set(imported(name, path, set(files))) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[tuple[set[str], list[str]]]:
    """Each strongly connected component of more than one module (Tarjan's algorithm), smallest
    first, with one cycle through it, as its modules in import order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = {stack.pop()}
            while node not in component:
                component.add(stack.pop())
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    components.sort(key=lambda c: (len(c), min(c)))
    return [(component, shortest_cycle(graph, component)) for component in components]


def shortest_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the first module of `component`, within it (breadth first)."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    return [*paths[node], start]
                if nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def test_no_import_cycle() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(
        f"{', '.join(sorted(component))} (e.g. {' -> '.join(cycle)})" for component, cycle in found
    )


def test_only_the_command_line_imports_it() -> None:
    users = {name for name, targets in import_graph().items() if CLI in targets}
    assert users <= CLI_USERS, f"library modules import {CLI}: {sorted(users - CLI_USERS)}"


def test_the_reading_itself(tmp_path: Path) -> None:
    """Submodules named by `from`, imports inside functions, extension modules, relative imports
    and a cycle through a package's `__init__`, on a small stand-in package."""
    sources = {
        "__init__.py": "",
        "x/__init__.py": "from onebox.x import a\n",
        "x/a.py": "from onebox.x import b\n\ndef f():\n    import onebox.y\n",
        "x/b.py": "from . import c\nfrom onebox import _native\n",
        "x/c.py": "from onebox.x import NAME\n",  # a name of the package: its __init__
        "y.py": "",
    }
    for name, text in sources.items():
        (tmp_path / "onebox" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "onebox" / name).write_text(text)
    graph = import_graph(tmp_path)
    assert graph == {
        "onebox": set(),
        "onebox.x": {"onebox.x.a"},
        "onebox.x.a": {"onebox.x.b", "onebox.y"},
        "onebox.x.b": {"onebox.x.c", "onebox"},
        "onebox.x.c": {"onebox.x"},
        "onebox.y": set(),
    }
    cycle = ["onebox.x", "onebox.x.a", "onebox.x.b", "onebox.x.c", "onebox.x"]
    assert cycles(graph) == [(set(cycle), cycle)]
