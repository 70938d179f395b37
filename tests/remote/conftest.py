"""Fixtures of the remote-set tests (the session's S3 server, ``s3``, is tests/conftest.py's): an HTTP server per test,
a fault proxy in front of the S3 server and a small set uploaded to it per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.faultproxy import FaultProxy
from tests.helpers.servers import S3Server, http_server
from tests.remote.test_remote_sets import make_set


@pytest.fixture
def http_root(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A directory served over HTTP on 127.0.0.1: (directory, base URL)."""
    root = tmp_path / "www"
    root.mkdir()
    with http_server(root) as url:
        yield root, url


@pytest.fixture
def proxy(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """A fault proxy in front of the session's S3 server; s3fs's own retries off for this test."""
    import s3fs

    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    with FaultProxy(s3.endpoint) as p:
        yield p


@pytest.fixture
def uploaded(s3: S3Server, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, str]:
    """A small set on disk and its copy on the S3 server, under a prefix of this test's own."""
    local = make_set(tmp_path, n=60, shards=3)
    return local, s3.upload(local, f"faults/{request.node.name}/set")
