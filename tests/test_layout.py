"""The package tree: module names that shadow nothing, modules of a readable size, layers in folders.

The layers themselves (which folder may import which, and no cycle) are
checked by import-linter (``[tool.importlinter]`` in pyproject.toml, run by
tools/check_quality.sh); this file checks what a linter of imports does not.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import shardload

PACKAGE = Path(shardload.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))
#: a module longer than this is split along a seam (docs/design.md, "The flow and the package tree")
MAX_LINES = 500


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_named_like_a_standard_library_module(path: Path) -> None:
    name = path.parent.name if path.name == "__init__.py" else path.stem
    # Invariant: `python script.py` run inside a package folder imports the real `inspect`, `codecs`, ...
    assert name not in sys.stdlib_module_names, path


def test_no_module_is_longer_than_the_limit() -> None:
    long = {str(p.relative_to(PACKAGE)): n for p in MODULES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    # Invariant: every module stays readable in one sitting
    assert long == {}


def test_the_top_level_holds_only_the_public_surface_and_the_layers() -> None:
    files = {p.name for p in PACKAGE.glob("*.py")}
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    # Invariant: every module lives in the folder of its layer
    assert files == {"__init__.py", "__main__.py", "errors.py", "_compat.py"}
    assert folders == {
        "_base", "cli", "formats", "integrations", "load", "plan", "prepare", "remote", "schema", "sets", "testing"
    }  # fmt: skip


def test_no_module_imports_itself_back_through_others() -> None:
    # import-linter checks the layers between folders; a cycle inside one folder (a package and a module of
    # it importing each other) is found by tools/import_graph.py, whose own rule this runs
    sys.path.insert(0, str(PACKAGE.parent / "tools"))
    try:
        import import_graph
    finally:
        sys.path.pop(0)
    paths = {import_graph.module_name(p): p for p in MODULES}
    graph = {name: import_graph.imports(path, name, set(paths), top_level=False) for name, path in paths.items()}
    assert import_graph.cycles(graph) == []
