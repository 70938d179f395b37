"""Fixtures of the CLI tests: a built shard set, raw .npy input, and an in-process runner."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardload.cli import main


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        # Invariant: with --json, stdout is exactly one JSON object on one line
        assert self.out.count("\n") == 1, self.out
        return json.loads(self.out)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """``cli("verify", path)`` runs ``main([...])`` in-process and captures its output."""

    def run(*argv: Any) -> Result:
        capsys.readouterr()
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def shard_set(damageable_set: Path) -> Path:
    """A private copy of a 200-sample, 4-shard set."""
    return damageable_set


@pytest.fixture
def npy_dir(tmp_path: Path) -> Path:
    """60 int64 token arrays of varying length, one .npy file each."""
    d = tmp_path / "npy"
    d.mkdir()
    rng = np.random.default_rng(0)
    for i in range(60):
        np.save(d / f"s{i:03d}.npy", rng.integers(0, 100, size=int(rng.integers(1, 40))))
    return d
