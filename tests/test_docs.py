"""The docs name tests as evidence (docs/reliability.md, docs/design.md): every one named must exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_ID = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def functions_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_test_named_in_the_docs_exists() -> None:
    named = {
        (doc.name, f, name) for doc in (ROOT / "docs").glob("*.md") for f, name in TEST_ID.findall(doc.read_text())
    }
    assert len(named) > 100  # the reliability table alone names far more
    missing = [
        f"{doc}: {f}::{name}"
        for doc, f, name in sorted(named)
        if not (ROOT / f).is_file() or name not in functions_in(ROOT / f)
    ]
    # Invariant: a row of evidence in the docs points at a test that runs
    assert not missing, "\n".join(missing)
