"""A few real runs of `python -m shardload`, as a user's shell would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import shardload

REPO = Path(shardload.__file__).resolve().parent.parent


def python(*args: object) -> subprocess.CompletedProcess[str]:
    # The package may not be pip-installed where the tests run: point Python at this checkout.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, env=env, timeout=120)


def run(*args: object) -> subprocess.CompletedProcess[str]:
    return python("-m", "shardload", *args)


@pytest.mark.slow
def test_version_subprocess() -> None:
    p = run("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"shardload {shardload.__version__}"


@pytest.mark.slow
def test_prepare_verify_inspect_subprocess(npy_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = run("prepare", npy_dir, "-o", out, "--num-shards", "2", "--workers", "2", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["samples"] == 60
    assert "shardload.prepare" in p.stderr  # INFO logs go to stderr, never into the JSON
    p = run("verify", out)
    assert (p.returncode, p.stdout) == (0, "ok: 2 shards, 60 samples verified\n")
    (out / "shards" / "shard-000001.arrow").unlink()
    p = run("verify", out, "--json")
    assert p.returncode == 1 and json.loads(p.stdout)["problems"][0]["reason"] == "missing"
    p = run("inspect", out / "nope")
    assert p.returncode == 5 and p.stderr.startswith("shardload: error: ") and "Traceback" not in p.stderr


@pytest.mark.slow
def test_data_commands_do_not_import_torch(npy_dir: Path, tmp_path: Path) -> None:
    # prepare/inspect/verify/plan start in well under a second: none of them may pull in torch.
    out = tmp_path / "out"
    code = f"""
import sys
from shardload.cli import main
assert main(["prepare", {str(npy_dir)!r}, "-o", {str(out)!r}, "--json"]) == 0
for argv in (["inspect", {str(out)!r}], ["verify", {str(out)!r}], ["plan", {str(out)!r}, "--world-size", "2", "--batch-size", "4"]):
    assert main(argv) == 0
print("torch" in sys.modules, "lightning" in sys.modules, file=sys.stderr)
"""
    p = python("-c", code)
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines()[-1] == "False False"
