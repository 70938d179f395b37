"""The plan package's public namespace and its purity (numpy in, numpy out)."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import shardload.plan as plan

PLAN_DIR = Path(plan.__file__).parent


def test_all_is_sorted_and_importable() -> None:
    # Invariant: a curated namespace: sorted, every name exists and is documented
    assert plan.__all__ == sorted(plan.__all__)
    for name in plan.__all__:
        obj = getattr(plan, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert obj.__doc__, name


#: the base modules the planner may use: they must be as pure as the planner itself
PURE_BASE = ("shardload._base.checks", "shardload._base.messages", "shardload._base.ranges")
#: the table of 0.1.0 module paths (standard library only): the package answers old submodule names through it
COMPAT = "shardload._compat"


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(node.module or "")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            # Invariant: no file I/O in the planner
            assert node.func.id != "open", f"{path.name} opens a file"
    return names


def test_plan_modules_are_pure() -> None:
    stdlib = set(sys.stdlib_module_names)
    paths = sorted(PLAN_DIR.rglob("*.py"))
    assert len(paths) > 20  # the packing/ and mix/ folders are searched too
    for path in paths:
        for name in _imports(path):
            # Invariant: only numpy, the standard library, shardload.errors, the pure base modules and the plan
            assert (
                name.split(".")[0] in stdlib
                or name == "numpy"
                or name.startswith("numpy.")
                or name in ("shardload.errors", COMPAT, *PURE_BASE)
                or name.startswith("shardload.plan")
            ), f"{path.name} imports {name}"


def test_base_modules_of_the_planner_are_pure() -> None:
    import importlib

    stdlib = set(sys.stdlib_module_names)
    for module in (*PURE_BASE, COMPAT):
        path = Path(importlib.import_module(module).__file__ or "")
        for name in _imports(path):
            # Invariant: the base modules the planner imports import no more than it may
            assert (
                name.split(".")[0] in stdlib
                or name.split(".")[0] == "numpy"
                or name in ("shardload.errors", *PURE_BASE)
            ), f"{path.name} imports {name}"


def test_docstring_examples_run() -> None:
    import doctest
    import importlib

    for path in sorted(PLAN_DIR.rglob("*.py")):
        parts = path.relative_to(PLAN_DIR).with_suffix("").parts
        name = ".".join(("shardload", "plan", *parts)).removesuffix(".__init__")
        result = doctest.testmod(importlib.import_module(name))
        # Invariant: the examples in the docs are true
        assert result.failed == 0, name
