"""Shared fixtures: small synthetic shard sets built with the public API."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

import shardload
from shardload.testing import synthetic_samples
from tests.helpers.servers import S3Server, s3_server

# A suite started in the background by a non-interactive shell (`cmd &`, nohup) inherits SIGINT ignored, and
# every child would too: the tests that press Ctrl-C in a child process need it delivered. A handled signal is
# reset to its default in an exec'd child, so handling it here gives each child Python its KeyboardInterrupt.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# No per-example deadline: on a loaded 2-core machine a scheduling stall of a few hundred milliseconds is not a
# slow example; a failure prints the blob that reproduces it.
settings.register_profile("shardload", deadline=None, print_blob=True)
settings.load_profile("shardload")


@pytest.fixture
def samples() -> list[dict[str, np.ndarray]]:
    """300 long-tailed samples with a token field, a 2D float field and a scalar label."""
    return synthetic_samples(300, seed=1)


@pytest.fixture
def shard_set(tmp_path: Path, samples: list[dict[str, np.ndarray]]) -> shardload.ShardSet:
    shardload.write(samples, tmp_path / "set", num_shards=6, shuffle=False)
    return shardload.open(tmp_path / "set")


@pytest.fixture(scope="session")
def pristine_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 200-sample, 4-shard set written once per session; never modify it (see ``damageable_set``)."""
    out = tmp_path_factory.mktemp("pristine") / "set"
    shardload.write(synthetic_samples(200), out, num_shards=4)
    return out


@pytest.fixture
def damageable_set(pristine_set: Path, tmp_path: Path) -> Path:
    """A private copy of ``pristine_set``, free to damage."""
    return Path(shutil.copytree(pristine_set, tmp_path / "set"))


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """``rclone serve s3`` on 127.0.0.1 for the whole session; give each test its own prefix.

    Here, not in one folder's conftest, so that tests/remote and tests/reliability share one server.
    """
    with s3_server(tmp_path_factory.mktemp("s3") / "root") as server:
        yield server
