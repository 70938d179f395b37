"""Shared fixtures: small synthetic shard sets built with the public API."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload.testing import synthetic_samples


@pytest.fixture
def samples() -> list[dict[str, np.ndarray]]:
    """300 long-tailed samples with a token field, a 2D float field and a scalar label."""
    return synthetic_samples(300, seed=1)


@pytest.fixture
def shard_set(tmp_path: Path, samples: list[dict[str, np.ndarray]]) -> shardload.ShardSet:
    shardload.write(samples, tmp_path / "set", num_shards=6, shuffle=False)
    return shardload.open(tmp_path / "set")
