"""Downloads of a remote shard set through a fault-injecting proxy in front of the test S3 server.

Claims tested: 503s and a dropped connection on shard GETs are retried and the batches equal the
local set's; a body corrupted once is downloaded again (two GETs of that shard) and the batches are
right; a shard corrupted on every GET ends in CorruptShardError naming its URL and both checksums;
storage answering 503 for good ends in RemoteError naming the URL, and ``shardload inspect URL`` /
``verify URL`` exit with status 8. botocore's and s3fs's own retries are off: what is retried is ours.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import shardload
from shardload.cli import main
from shardload.errors import CorruptShardError, RemoteError
from shardload.formats.manifest import ShardInfo
from shardload.remote import RemoteOptions, RetryPolicy
from tests.helpers.faultproxy import FaultProxy
from tests.helpers.servers import S3Server
from tests.remote.test_remote_sets import assert_same, batches

FAST = RetryPolicy(tries=4, base_delay=0.01, max_delay=0.02)
SHARD_GET = r"shards/shard-\d+\.arrow$"


def proxied(s3: S3Server, proxy: FaultProxy, cache: Path, **storage_options: Any) -> RemoteOptions:
    """Options reaching ``s3`` through ``proxy``: one botocore attempt per call, short timeouts, FAST retries.

    ``storage_options``: more keywords of the filesystem.
    """
    storage = {
        **s3.storage_options,
        **storage_options,
        "client_kwargs": {"endpoint_url": proxy.url},
        "config_kwargs": {"retries": {"total_max_attempts": 1}, "read_timeout": 5, "connect_timeout": 5},
    }
    return RemoteOptions(storage_options=storage, cache_dir=cache, retry=FAST)


def shard_gets(proxy: FaultProxy, file: str) -> int:
    """GETs of the object whose path ends with ``file`` that the proxy saw."""
    return sum(1 for r in proxy.requests if r.method == "GET" and r.path.endswith("/" + file))


@pytest.mark.slow
def test_503s_and_a_dropped_connection_are_survived(
    s3: S3Server, proxy: FaultProxy, uploaded: tuple[Path, str], tmp_path: Path
) -> None:
    local, url = uploaded
    proxy.inject("503", method="GET", path=SHARD_GET, times=2)
    proxy.inject("drop", method="GET", path=SHARD_GET, times=1)
    remote = proxied(s3, proxy, tmp_path / "cache")
    assert_same(batches(url, remote), batches(local))
    assert proxy.hits("503") == 2 and proxy.hits("drop") == 1


@pytest.mark.slow
def test_a_body_corrupted_once_is_downloaded_again(
    s3: S3Server, proxy: FaultProxy, uploaded: tuple[Path, str], tmp_path: Path
) -> None:
    local, url = uploaded
    file = shardload.open(local).shards[1].file
    proxy.inject("corrupt", method="GET", path=re.escape(file) + "$", times=1)
    remote = proxied(s3, proxy, tmp_path / "cache")
    assert_same(batches(url, remote), batches(local))
    assert proxy.hits("corrupt") == 1
    assert shard_gets(proxy, Path(file).name) == 2  # the damaged body, then the sound one
    assert shard_gets(proxy, Path(shardload.open(local).shards[0].file).name) == 1


def failing_last_shard(
    kind: str, s3: S3Server, proxy: FaultProxy, uploaded: tuple[Path, str], tmp_path: Path
) -> tuple[str, ShardInfo, shardload.ShardSet]:
    """The set opened through ``proxy``, with fault ``kind`` on every GET of its last shard (sample 59's)."""
    local, url = uploaded
    info = shardload.open(local).shards[2]
    proxy.inject(kind, method="GET", path=re.escape(info.file) + "$", times=1000)
    return url, info, shardload.open(url, remote=proxied(s3, proxy, tmp_path / "cache"))


@pytest.mark.slow
def test_a_shard_corrupted_on_every_get_is_reported(
    s3: S3Server, proxy: FaultProxy, uploaded: tuple[Path, str], tmp_path: Path
) -> None:
    url, info, ss = failing_last_shard("corrupt", s3, proxy, uploaded, tmp_path)
    with pytest.raises(CorruptShardError) as err:
        ss[59]
    message = str(err.value)
    found = re.search(r"it is (sha256:[0-9a-f]+)", message)
    assert f"{url}/{info.file}" in message and info.checksum in message
    assert found is not None and found.group(1) != info.checksum
    assert shard_gets(proxy, Path(info.file).name) == 2
    assert not (ss.path / info.file).exists() and not list((ss.path / "shards").glob("*.part"))


@pytest.mark.slow
def test_persistent_503_ends_in_remote_error_naming_the_url(
    s3: S3Server, proxy: FaultProxy, uploaded: tuple[Path, str], tmp_path: Path
) -> None:
    url, info, ss = failing_last_shard("503", s3, proxy, uploaded, tmp_path)
    assert len(ss[0]["tokens"])  # the other shards are fine
    with pytest.raises(
        RemoteError, match=r"downloading shard 2 .* failed 4 times.*rate \(HTTP 503 SlowDown\)\. "
    ) as err:
        ss[59]
    assert err.value.url == f"{url}/{info.file}" and err.value.url in str(err.value)
    assert shard_gets(proxy, Path(info.file).name) == 4


def _cli_env(s3: S3Server, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_RETRY_MODE", "standard")


@pytest.mark.slow
def test_cli_exits_8_when_storage_keeps_failing(
    s3: S3Server,
    proxy: FaultProxy,
    uploaded: tuple[Path, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    local, url = uploaded
    _cli_env(s3, proxy, monkeypatch)
    proxy.inject("503", path=r"manifest\.json$", times=1000)
    assert main(["inspect", url, "--cache-dir", str(tmp_path / "c1")]) == 8
    err = capsys.readouterr().err
    tries = f"failed {RetryPolicy().tries} times"  # the CLI's default policy
    assert f"{url}/manifest.json" in err and tries in err
    proxy.clear()
    file = shardload.open(local).shards[1].file
    proxy.inject("503", method="GET", path=re.escape(file) + "$", times=1000)
    assert main(["verify", url, "--cache-dir", str(tmp_path / "c2")]) == 8
    err = capsys.readouterr().err
    assert f"{url}/{file}" in err and tries in err
