"""The fault proxy injects what it is told and nothing else, and with_retries gets through it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shardload.errors import RemoteError
from shardload.remote import RetryPolicy, open_filesystem, with_retries
from tests.helpers.faultproxy import FaultProxy
from tests.helpers.servers import S3Server

FAST = RetryPolicy(tries=4, base_delay=0.01, max_delay=0.02)


def _open(url: str, s3: S3Server, proxy: FaultProxy, read_timeout: float = 10.0) -> tuple[Any, str]:
    """The object through the proxy, with botocore's and s3fs's own retries off: what is retried is ours.

    The timeout is long enough that a slow answer on a loaded machine is not a fault the tests did not inject.
    """
    options = {
        **s3.storage_options,
        "client_kwargs": {"endpoint_url": proxy.url},
        "config_kwargs": {"retries": {"max_attempts": 1}, "read_timeout": read_timeout, "connect_timeout": 10},
    }
    fs, path = open_filesystem(url, options)
    fs.retries = 1
    return fs, path


@pytest.fixture
def obj(s3: S3Server, tmp_path: Path) -> tuple[str, bytes]:
    data = bytes(range(256)) * 400
    f = tmp_path / "obj.bin"
    f.write_bytes(data)
    return s3.upload(f, f"proxy/{tmp_path.name}/obj.bin"), data


def test_transparent_without_faults(s3: S3Server, obj: tuple[str, bytes]) -> None:
    url, data = obj
    with FaultProxy(s3.endpoint) as proxy:
        fs, path = _open(url, s3, proxy)
        assert fs.cat_file(path) == data
        assert proxy.requests and proxy.hits() == 0


@pytest.mark.parametrize("kind", ["503", "500", "drop", "truncate"])
def test_transient_fault_then_success(s3: S3Server, obj: tuple[str, bytes], kind: str) -> None:
    url, data = obj
    with FaultProxy(s3.endpoint) as proxy:
        fs, path = _open(url, s3, proxy)
        proxy.inject(kind, method="GET", path=r"obj\.bin$", times=2)
        got = with_retries(lambda: fs.cat_file(path), url=url, what="reading obj", policy=FAST)
        assert got == data
        assert proxy.hits(kind) == 2


def test_corrupt_changes_one_byte(s3: S3Server, obj: tuple[str, bytes]) -> None:
    url, data = obj
    with FaultProxy(s3.endpoint) as proxy:
        fs, path = _open(url, s3, proxy)
        proxy.inject("corrupt", method="GET", path=r"obj\.bin$")
        bad = fs.cat_file(path)
        assert len(bad) == len(data) and sum(a != b for a, b in zip(bad, data)) == 1
        assert fs.cat_file(path) == data  # once only


def test_persistent_503_ends_in_remote_error(s3: S3Server, obj: tuple[str, bytes]) -> None:
    url, _ = obj
    with FaultProxy(s3.endpoint) as proxy:
        fs, path = _open(url, s3, proxy)
        proxy.inject("503", method="GET", path=r"obj\.bin$", times=100)
        with pytest.raises(RemoteError, match=r"failed 4 times") as info:
            with_retries(lambda: fs.cat_file(path), url=url, what="reading obj", policy=FAST)
        assert info.value.url == url


@pytest.mark.slow
def test_stall_past_the_client_timeout_is_retried(s3: S3Server, obj: tuple[str, bytes]) -> None:
    url, data = obj
    with FaultProxy(s3.endpoint) as proxy:
        fs, path = _open(url, s3, proxy, read_timeout=2.0)
        proxy.inject("stall", method="GET", path=r"obj\.bin$", stall_s=4.0)  # past the 2 s read timeout
        got = with_retries(lambda: fs.cat_file(path), url=url, what="reading obj", policy=FAST)
        assert got == data and proxy.hits("stall") == 1
