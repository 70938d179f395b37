"""Fixtures of the remote-set tests: one S3 server (rclone) per test session, an HTTP server per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.servers import S3Server, http_server, s3_server


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """``rclone serve s3`` on 127.0.0.1 for the whole session; give each test its own prefix."""
    with s3_server(tmp_path_factory.mktemp("s3") / "root") as server:
        yield server


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A directory served over HTTP on 127.0.0.1: (directory, base URL)."""
    root = tmp_path / "www"
    root.mkdir()
    with http_server(root) as url:
        yield root, url
