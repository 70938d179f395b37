"""Fixtures of the fault tests: a small pristine shard set, copied per test to be damaged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import shardload
from shardload.testing import synthetic_samples


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 samples (tokens, features, label) in 4 shards, in source order."""
    out = tmp_path_factory.mktemp("reliability") / "set"
    shardload.write(synthetic_samples(120, seed=3), out, num_shards=4, shuffle=False, progress=False)
    return out


@pytest.fixture
def damaged(pristine: Path, tmp_path: Path) -> Path:
    """A private copy of the pristine set, free to damage."""
    return Path(shutil.copytree(pristine, tmp_path / "set"))


def read_manifest(path: Path) -> dict[str, Any]:
    return json.loads((path / "manifest.json").read_text())


def write_manifest(path: Path, obj: Any) -> None:
    (path / "manifest.json").write_text(json.dumps(obj))


def shard_file(path: Path, k: int) -> Path:
    return path / read_manifest(path)["shards"][k]["file"]


def read_all(path: Path) -> int:
    """Open the set and read every sample; returns how many were read."""
    ds = shardload.open(path)
    for i in range(len(ds)):
        ds[i]
    return len(ds)
