"""``shardload demo``: its job stays out of the library, and running it leaves the caller's process as it was.

Each check runs in a fresh interpreter, since what is imported and which
warning filters are set are facts about a whole process. torch and Lightning
are imported before the "before" snapshot: they add warning filters of their
own when first imported, which is not shardload's doing.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.distributed.watchdog import python, run_with_watchdog

pytestmark = pytest.mark.slow

DEMO_JOB = "shardload.cli._demo_job"


def run_snippet(code: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter; it prints one ``RESULT {json}`` line, returned here."""
    res = run_with_watchdog(python("-c", textwrap.dedent(code)), timeout=240)
    assert res.returncode == 0, res.tail()
    lines = [line for line in res.output.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, res.tail()
    return dict(json.loads(lines[0][len("RESULT ") :]))


def test_importing_the_library_imports_no_demo_and_sets_no_warning_filter() -> None:
    r = run_snippet(
        f"""
        import importlib, json, pkgutil, sys, warnings
        import lightning.pytorch, torch
        before = list(warnings.filters)
        import shardload
        public = [
            m.name for m in pkgutil.walk_packages(shardload.__path__, "shardload.")
            if not any(part.startswith("_") for part in m.name.split(".")[1:])
        ]
        for name in public:
            importlib.import_module(name)
        print("RESULT " + json.dumps({{
            "public": public,
            "demo_imported": {DEMO_JOB!r} in sys.modules,
            "filters_kept": warnings.filters == before,
        }}))
        """
    )
    assert "shardload.cli.demo" in r["public"] and "shardload.integrations.datamodule" in r["public"]
    assert not r["demo_imported"]
    assert r["filters_kept"]


def test_the_demo_run_in_process_keeps_the_callers_warning_filters_and_log_level(tmp_path: Path) -> None:
    argv = ["demo", "--workdir", str(tmp_path), "--train-samples", "64", "--val-samples", "13"]
    r = run_snippet(
        f"""
        import json, logging, sys, warnings
        import lightning.pytorch, torch
        from shardload.cli import main
        before = list(warnings.filters)
        level = logging.getLogger("lightning.pytorch").level
        code = main({[*argv, "--devices", "1", "--no-progress"]!r})
        print("RESULT " + json.dumps({{
            "code": code,
            "demo_imported": {DEMO_JOB!r} in sys.modules,
            "filters_kept": warnings.filters == before,
            "level_kept": logging.getLogger("lightning.pytorch").level == level,
        }}))
        """
    )
    assert r["code"] == 0 and r["demo_imported"]
    assert r["filters_kept"]
    assert r["level_kept"]
