"""Another checkout's library, measured beside this one's: the ``--baseline-tree`` of the bench tools.

A tool that takes ``--baseline-tree DIR`` runs each measurement in a fresh interpreter (``--child JOB``) whose
``PYTHONPATH`` is the checkout to measure, alternating this checkout and the baseline so that both run under the
same load, and prints after/before ratios. This module holds what every such tool shares.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

#: this checkout (the folder above tools/)
REPO = Path(__file__).resolve().parents[1]


def add_baseline_arguments(parser: argparse.ArgumentParser, *, measured: str, repeat_help: str) -> None:
    """``--baseline-tree DIR``, ``--repeat N`` and the hidden ``--child JOB`` (one measurement, printed as JSON)."""
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help=f"another shardload checkout (e.g. a git worktree of main): {measured} with its library too, "
        "in alternation, and prints the after/before ratios",
    )
    parser.add_argument("--repeat", type=int, default=1, help=repeat_help)
    parser.add_argument("--child", help=argparse.SUPPRESS)


def checked_tree(parser: argparse.ArgumentParser, tree: Path | None) -> Path | None:
    """``--baseline-tree`` resolved, or the parser's usage error when it is no shardload checkout."""
    if tree is None:
        return None
    tree = tree.resolve()
    if not (tree / "shardload" / "plan").is_dir():
        parser.error("--baseline-tree: give a shardload checkout (with shardload/plan)")
    return tree


def run_child(script: str, job: dict[str, Any], tree: Path) -> dict[str, float]:
    """``job``'s figures from ``script --child JOB``, run in a fresh interpreter importing the library at ``tree``."""
    cmd = [sys.executable, str(Path(script).resolve()), "--child", json.dumps(job)]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tree)}, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            got: dict[str, float] = json.loads(line[len("RESULT ") :])
            return got
    raise SystemExit(f"the measurement with {tree} failed:\n{out.stderr[-3000:]}")
