"""The public namespace: ``shardload.__all__``, its docstrings, and the error hierarchy.

Users import from ``shardload`` only, and the API reference (docs/api.md) is
generated from the docstrings, so a missing or stale name or docstring is a
documentation bug that these tests catch. That ``import shardload`` does not
import torch is checked by ``tests/cli/test_cli_subprocess.py``.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
from pathlib import Path
from types import FunctionType

import pytest

import shardload
from shardload import errors

ROOT = Path(__file__).resolve().parents[1]
#: public names outside ``__all__``: ``shardload.open`` would shadow the builtin under ``import *``
OUTSIDE_ALL = ["open"]
PUBLIC = [name for name in shardload.__all__ if name != "__version__"] + OUTSIDE_ALL


def _resolve(name: str) -> object:
    # getattr runs the lazy loader for the names that need torch.
    return getattr(shardload, name)


def _own_public_methods(cls: type) -> dict[str, FunctionType]:
    """Public functions, properties, class and static methods defined by ``cls`` itself."""
    found = {}
    for key, value in vars(cls).items():
        if key.startswith("_"):
            continue
        if isinstance(value, property):
            value = value.fget
        elif isinstance(value, (classmethod, staticmethod)):
            value = value.__func__
        if isinstance(value, FunctionType):
            found[key] = value
    return found


def test_all_is_sorted_and_has_no_duplicates() -> None:
    names = list(shardload.__all__)
    # Invariant: one entry per name, in plain sorted() order, so additions land in one obvious place
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    assert names == sorted(names)


@pytest.mark.parametrize("name", shardload.__all__)
def test_every_exported_name_resolves(name: str) -> None:
    assert _resolve(name) is not None


def test_star_import_keeps_the_builtin_open() -> None:
    namespace: dict[str, object] = {}
    exec("from shardload import *", namespace)
    # Invariant: `from shardload import *` shadows no builtin; the shard-set opener stays shardload.open
    assert not set(namespace) & set(vars(builtins)) - {"__builtins__"}
    assert "open" not in namespace and shardload.open is shardload.sets.shardset.open_shard_set


def test_lazy_names_are_exported_and_resolve_to_their_module() -> None:
    lazy = shardload._LAZY
    assert set(lazy) <= set(shardload.__all__)
    for name, module in lazy.items():
        # Invariant: the lazy loader returns the very object its module defines
        assert _resolve(name) is getattr(importlib.import_module(module), name)


def test_unknown_attribute_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        shardload.no_such_name  # noqa: B018


def test_version_matches_pyproject() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'^version = "([^"]+)"', text, re.MULTILINE)
    assert match is not None
    assert shardload.__version__ == match.group(1)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_has_a_docstring(name: str) -> None:
    obj = _resolve(name)
    assert (obj.__doc__ or "").strip(), f"shardload.{name} has no docstring"


@pytest.mark.parametrize("name", [n for n in PUBLIC if inspect.isclass(_resolve(n))])
def test_every_public_method_of_a_public_class_has_its_own_docstring(name: str) -> None:
    cls = _resolve(name)
    # An override's own docstring, not the base class's: the reference shows what this class does.
    missing = [key for key, fn in _own_public_methods(cls).items() if not (fn.__doc__ or "").strip()]
    assert not missing, f"shardload.{name}: no docstring on {missing}"


def test_every_module_has_a_docstring() -> None:
    # Parsed, not imported: optional dependencies of a format need not be installed.
    missing = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "shardload").rglob("*.py"))
        if not ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not missing


def _error_classes() -> dict[str, type[BaseException]]:
    return {
        name: obj
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    }


def test_every_error_derives_from_shardload_error_and_is_exported() -> None:
    classes = _error_classes()
    assert "ShardloadError" in classes and len(classes) > 1
    for name, cls in classes.items():
        # Invariant: one `except ShardloadError` catches every error shardload raises on purpose
        assert issubclass(cls, errors.ShardloadError), name
    assert set(errors.__all__) == set(classes)
    assert list(errors.__all__) == sorted(errors.__all__)
    assert set(classes) <= set(shardload.__all__)
    for name, cls in classes.items():
        assert getattr(shardload, name) is cls


def _drawn_tree() -> dict[str, tuple[str | None, str | None]]:
    """``name -> (drawn parent, built-in base in parentheses)`` from the errors module docstring."""
    doc = errors.__doc__ or ""
    line_re = re.compile(r"^(?P<indent>[ |]*)(?:\+-- )?(?P<name>[A-Z]\w*Error)(?: \((?P<base>\w+)\))?(?:\s|$)")
    drawn: dict[str, tuple[str | None, str | None]] = {}
    stack: list[tuple[int, str]] = []  # (column of the name, name) of the open branches
    for line in doc.splitlines():
        m = line_re.match(line)
        if m is None or not line.startswith("    "):
            continue
        column = m.start("name")
        while stack and stack[-1][0] >= column:
            stack.pop()
        parent = stack[-1][1] if stack else None
        drawn[m.group("name")] = (parent, m.group("base"))
        stack.append((column, m.group("name")))
    return drawn


def test_errors_docstring_draws_the_hierarchy_as_coded() -> None:
    drawn = _drawn_tree()
    classes = _error_classes()
    # Invariant: the tree in shardload/errors.py names every error class once, under its real parent
    assert set(drawn) == set(classes)
    for name, (parent, builtin) in drawn.items():
        cls = classes[name]
        shardload_bases = [b.__name__ for b in cls.__bases__ if b.__module__ == errors.__name__]
        other_bases = [b.__name__ for b in cls.__bases__ if b.__module__ != errors.__name__]
        if parent is None:
            assert cls is errors.ShardloadError
        else:
            assert shardload_bases == [parent], name
            assert other_bases == ([builtin] if builtin else []), name


def test_api_reference_documents_every_public_name() -> None:
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    targets = set(re.findall(r"^::: ([\w.]+)", text, re.MULTILINE))
    documented = set()
    for target in targets:
        module_name, _, attr = target.rpartition(".")
        if target == "shardload.errors":
            documented |= set(errors.__all__)
            continue
        obj = getattr(importlib.import_module(module_name), attr)
        documented |= {name for name in PUBLIC if _resolve(name) is obj}
    assert not set(PUBLIC) - documented, "add these to docs/api.md"
