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


def test_plan_modules_are_pure() -> None:
    stdlib = set(sys.stdlib_module_names)
    for path in sorted(PLAN_DIR.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                # Invariant: no file I/O in the planner
                assert node.func.id != "open", f"{path.name} opens a file"
                continue
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                # Invariant: only numpy, the standard library and shardload.{errors,messages,plan}
                assert (
                    top in stdlib
                    or top == "numpy"
                    or name in ("shardload.errors", "shardload.messages")
                    or name.startswith("shardload.plan")
                ), f"{path.name} imports {name}"


def test_messages_module_is_standard_library_only() -> None:
    # the plan package formats sizes with shardload.messages: it must stay as pure as the planner
    import shardload.messages as messages

    stdlib = set(sys.stdlib_module_names)
    tree = ast.parse(Path(messages.__file__).read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                assert name.split(".")[0] in stdlib or name == "shardload.errors", f"messages.py imports {name}"


def test_docstring_examples_run() -> None:
    import doctest
    import importlib

    for path in sorted(PLAN_DIR.glob("*.py")):
        name = "shardload.plan" if path.stem == "__init__" else f"shardload.plan.{path.stem}"
        result = doctest.testmod(importlib.import_module(name))
        # Invariant: the examples in the docs are true
        assert result.failed == 0, name
