"""The house's size figures (issue 37's bounds): source lines, large modules, long functions, import circles.

Duplicate pairs come from the `duplicates` tool (`cd src && duplicates --seconds 120`), not from here.

    python scripts/house_figures.py [--root src/rcarun] [--list]
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

LARGE_MODULE = 500
LONG_FUNCTION = 80


def _module_name(path: Path, root: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.Module, module: str, is_package: bool) -> list[tuple[str, list[str]]]:
    """Every (module, names) an import anywhere in the file reads (lazy and typing-only imports included)."""
    found: list[tuple[str, list[str]]] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            found.append((base, [alias.name for alias in node.names]))
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of two or more modules (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
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
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("src/rcarun"))
    parser.add_argument("--list", action="store_true", help="name the large modules and long functions")
    args = parser.parse_args(argv)
    files = sorted(args.root.rglob("*.py"))
    lines = 0
    large: list[tuple[int, str]] = []
    long_functions: list[tuple[int, str]] = []
    read: dict[str, list[tuple[str, list[str]]]] = {}
    for path in files:
        text = path.read_text(encoding="utf-8")
        count = len(text.splitlines())
        lines += count
        if count > LARGE_MODULE:
            large.append((count, str(path)))
        tree = ast.parse(text)
        module = _module_name(path, args.root)
        read[module] = _imports(tree, module, path.name == "__init__.py")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                length = node.end_lineno - node.lineno + 1
                if length >= LONG_FUNCTION:
                    long_functions.append((length, f"{path}:{node.lineno} {node.name}"))
    known = set(read)
    graph: dict[str, set[str]] = {}
    for module, imports in read.items():
        edges: set[str] = set()
        for base, names in imports:
            submodules = {f"{base}.{name}" for name in names} & known
            # `from package import submodule` reads the submodule, not the package's __init__.
            edges |= submodules if submodules and len(submodules) == len(names) else {base} | submodules
        graph[module] = {name for name in edges if name in known and name != module}
    circles = _circles(graph)
    print(f"source lines: {lines:,} in {len(files)} files under {args.root}")
    print(f"modules over {LARGE_MODULE} lines: {len(large)}")
    print(f"functions of {LONG_FUNCTION}+ lines: {len(long_functions)}")
    print(f"import circles (lazy and typing-only imports included): {len(circles)}")
    for circle in circles:
        print("  " + " <-> ".join(circle))
    if args.list:
        for count, name in sorted(large, reverse=True):
            print(f"  module {count:5d} {name}")
        for count, name in sorted(long_functions, reverse=True):
            print(f"  function {count:4d} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
