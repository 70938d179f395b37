"""The import graph of the ``shardload`` package: modules, lines, cycles, and which folder reaches which.

Reads the source with ``ast`` (nothing is imported). An edge ``a -> b`` is an
import of ``b`` (or of a name from it) anywhere in ``a``: at module level, or
inside a function (``--top-level`` leaves those out, to show which cycles only
function-level imports hide). Prints:

* modules and library lines (``wc -l`` over ``shardload/**/*.py``), and the
  modules over ``--max-lines``;
* every import cycle: the strongly connected components of more than one module;
* the folder graph: for each top-level folder (or module) of the package, the
  others it imports, with one example import each.

Examples::

    python tools/import_graph.py
    python tools/import_graph.py --top-level      # only module-level imports
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "shardload"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(stmt: ast.stmt) -> bool:
    """``if TYPE_CHECKING:``: imports for the type checker only, never run."""
    test = stmt.test if isinstance(stmt, ast.If) else None
    if isinstance(test, ast.Attribute):
        return test.attr == "TYPE_CHECKING"
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"


def imports(path: Path, name: str, modules: set[str], *, top_level: bool) -> set[str]:
    """The package's modules that ``path`` (module ``name``) imports."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    nodes: list[ast.AST] = list(ast.walk(tree))
    if top_level:  # module level, including under if/try at module level, but not `if TYPE_CHECKING:`
        body = [stmt for stmt in tree.body if not _type_checking(stmt)]
        nodes = [n for stmt in body if not isinstance(stmt, (ast.FunctionDef, ast.ClassDef)) for n in ast.walk(stmt)]
        nodes += [n for stmt in body if isinstance(stmt, ast.ClassDef) for n in stmt.body]
    for node in nodes:
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith(PACKAGE):
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
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
                    out.append(sorted(component))
    return out


def folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(package)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--top-level", action="store_true", help="leave out imports inside functions")
    parser.add_argument("--max-lines", type=int, default=500)
    args = parser.parse_args()
    paths = {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}
    modules = set(paths)
    graph = {name: imports(path, name, modules, top_level=args.top_level) for name, path in paths.items()}
    lines = {name: len(path.read_text().splitlines()) for name, path in paths.items()}
    print(f"{len(modules)} modules, {sum(lines.values()):,} lines")
    big = sorted(((n, m) for m, n in lines.items() if n > args.max_lines), reverse=True)
    print(f"{len(big)} modules over {args.max_lines} lines: " + ", ".join(f"{m} ({n})" for n, m in big))
    found = cycles(graph)
    print(f"{len(found)} import cycles{' (module-level imports only)' if args.top_level else ''}:")
    for component in found:
        print("  " + " <-> ".join(component))
    edges: dict[str, dict[str, str]] = defaultdict(dict)
    for name, targets in graph.items():
        for target in targets:
            a, b = folder(name), folder(target)
            if a != b:
                edges[a].setdefault(b, f"{name} -> {target}")
    print("folder graph (each with one example):")
    for a in sorted(edges):
        print(f"  {a}: " + "; ".join(f"{b} ({ex})" for b, ex in sorted(edges[a].items())))


if __name__ == "__main__":
    main()
