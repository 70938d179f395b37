"""Storage errors and remote options that used to come out unclear, against the servers on 127.0.0.1.

Claims tested: a ``400`` from the store is a ``RemoteError`` naming the URL, the call and the status,
not retried (exit 8 from the CLI); ``s3://bucket/a//set`` is refused before any request, naming the
fix; ``S3://`` reads as ``s3://`` (one cache); ``verify`` reports a shard missing from storage as
``missing``; a lengths index missing from storage names its URL; ``storage_options``/``staging``/
``keep_staging``/``retry`` with a local output are refused with nothing written; an unreachable
endpoint fails within our policy's waits, botocore's and s3fs's retries being off unless the user
sets botocore's.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.cli import main
from shardload.errors import InputError, RemoteError, ShardSetError
from shardload.remote import RemoteOptions, RetryPolicy, open_filesystem
from shardload.sets.verify import verify
from tests.helpers.faultproxy import FaultProxy
from tests.helpers.servers import S3Server, free_port
from tests.remote.test_remote_sets import make_set

FAST = RetryPolicy(tries=3, base_delay=0.01, max_delay=0.02)


def _uploaded(s3: S3Server, tmp_path: Path, prefix: str, n: int = 60, shards: int = 3) -> tuple[Path, str]:
    local = make_set(tmp_path, n=n, shards=shards)
    return local, s3.upload(local, f"errors/{tmp_path.name}/{prefix}")


def _through(s3: S3Server, proxy: FaultProxy, cache: Path) -> RemoteOptions:
    """Only the endpoint changed: the client's retry settings are shardload's defaults."""
    storage = {**s3.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
    return RemoteOptions(storage_options=storage, cache_dir=cache, retry=FAST)


def test_a_400_is_a_remote_error_naming_the_url_the_call_and_the_status(s3: S3Server, tmp_path: Path) -> None:
    local, url = _uploaded(s3, tmp_path, "bad-request")
    info = shardload.open(local).shards[2]  # sample 59's
    with FaultProxy(s3.endpoint) as proxy:
        proxy.inject("400", method="GET", path=re.escape(info.file) + "$", times=1000)
        ss = shardload.open(url, remote=_through(s3, proxy, tmp_path / "cache"))
        assert len(ss[0]["tokens"])  # the other shards are fine
        with pytest.raises(
            RemoteError, match=r"downloading shard 2 \(.*\) failed: .*\(HTTP 400 InvalidRequest\)"
        ) as err:
            ss[59]
        gets = [r for r in proxy.requests if r.method == "GET" and r.path.endswith(info.file)]
    assert err.value.url == f"{url}/{info.file}" and err.value.url in str(err.value)
    assert "check the URL" in str(err.value)
    assert len(gets) == 1  # another try would get the same answer


def test_cli_exits_8_on_a_400(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, url = _uploaded(s3, tmp_path, "bad-request-cli", n=20, shards=2)
    with FaultProxy(s3.endpoint) as proxy:
        for name, value in {**s3.env(), "AWS_ENDPOINT_URL": proxy.url}.items():
            monkeypatch.setenv(name, value)
        proxy.inject("400", path=r"manifest\.json$", times=1000)
        assert main(["inspect", url, "--cache-dir", str(tmp_path / "cache")]) == 8
    err = capsys.readouterr().err
    assert f"{url}/manifest.json" in err and "HTTP 400" in err


def test_an_empty_path_segment_is_refused_before_any_request(s3: S3Server, tmp_path: Path) -> None:
    bad = "s3://bucket/errors/a//set"
    with FaultProxy(s3.endpoint) as proxy:
        storage = {**s3.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
        with pytest.raises(RemoteError, match=r"s3://bucket/errors/a//set: .*empty segment.*s3://bucket/errors/a/set"):
            shardload.open(bad, storage_options=storage, cache_dir=tmp_path / "cache")
        with pytest.raises(RemoteError, match="empty segment"):
            shardload.write(
                [{"tokens": np.arange(3, dtype=np.int32)}], bad, storage_options=storage, staging=tmp_path / "stage"
            )
        assert proxy.requests == []
    assert not (tmp_path / "cache").exists() and not (tmp_path / "stage").exists()


def test_an_upper_case_scheme_reads_as_lower_case(s3: S3Server, tmp_path: Path) -> None:
    local, url = _uploaded(s3, tmp_path, "upper", n=20, shards=2)
    upper = "S3" + url[2:]
    got = shardload.open(upper, storage_options=s3.storage_options, cache_dir=tmp_path / "cache")
    want = shardload.open(local)
    assert [got[i]["tokens"].tolist() for i in range(20)] == [want[i]["tokens"].tolist() for i in range(20)]
    shardload.open(url, storage_options=s3.storage_options, cache_dir=tmp_path / "cache")
    assert len(list((tmp_path / "cache" / "sets").iterdir())) == 1  # one URL, one mirror


def test_verify_reports_a_shard_missing_from_storage_as_missing(s3: S3Server, tmp_path: Path) -> None:
    local, url = _uploaded(s3, tmp_path, "missing", n=30, shards=3)
    file = shardload.open(local).shards[1].file
    s3.filesystem().rm(f"{url[5:]}/{file}")
    report = verify(url, remote=RemoteOptions(storage_options=s3.storage_options, cache_dir=tmp_path / "cache"))
    assert [(p.shard, p.file, p.reason) for p in report.problems] == [(1, file, "missing")]
    assert f"{url}/{file}" in report.problems[0].detail


def test_a_lengths_index_missing_from_storage_names_its_url(s3: S3Server, tmp_path: Path) -> None:
    local, url = _uploaded(s3, tmp_path, "no-index", n=20, shards=2)
    s3.filesystem().rm(f"{url[5:]}/{shardload.open(local).manifest.lengths_file}")
    with pytest.raises(ShardSetError, match=rf"{re.escape(url)}/lengths\.npy: .*no such object.*prepare -o URL"):
        shardload.open(url, storage_options=s3.storage_options, cache_dir=tmp_path / "cache")


@pytest.mark.parametrize(
    "given",
    [
        {"staging": "stage"},
        {"storage_options": {"key": "k"}},
        {"keep_staging": True},
        {"retry": RetryPolicy(tries=2)},
    ],
)
@pytest.mark.parametrize("how", ["write", "prepare"])
def test_remote_options_with_a_local_output_are_refused(tmp_path: Path, given: dict[str, Any], how: str) -> None:
    given = {k: tmp_path / v if k == "staging" else v for k, v in given.items()}
    out = tmp_path / "out"
    name = next(iter(given))
    with pytest.raises(
        InputError, match=rf"{name}=( \(--[a-z-]+\))? applies only to a URL output.*{re.escape(str(out))}"
    ):
        if how == "write":
            shardload.write([{"tokens": np.arange(3, dtype=np.int32)}], out, progress=False, **given)
        else:
            src = tmp_path / "src.npy"
            np.save(src, np.arange(3, dtype=np.int32))
            shardload.prepare(src, out, progress=False, **given)
    assert not out.exists() and not (tmp_path / "stage").exists()


def test_an_unreachable_endpoint_fails_within_our_policy(tmp_path: Path) -> None:
    storage = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{free_port()}"}}
    policy = RetryPolicy(tries=2, base_delay=0.01, max_delay=0.01)
    started = time.monotonic()
    with pytest.raises(RemoteError, match=r"failed 2 times.*EndpointConnectionError"):
        shardload.open(
            "s3://bucket/set", remote=RemoteOptions(storage_options=storage, cache_dir=tmp_path, retry=policy)
        )
    # botocore's 5 attempts with backoff inside each try took ~10 s a try (s3fs 2026.9, botocore 1.43): two
    # tries of that are 20 s; ours take well under a second on a quiet machine (the bound allows a loaded one)
    assert time.monotonic() - started < 12.0


def test_the_s3_client_retries_once_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    base: dict[str, Any] = {"key": "k", "secret": "s", "skip_instance_cache": True}
    fs, _ = open_filesystem("s3://bucket/set", base)
    assert fs.retries == 1 and fs.config_kwargs["retries"]["total_max_attempts"] == 1
    assert fs.config_kwargs["connect_timeout"] > 0 and fs.config_kwargs["read_timeout"] > 0
    mine = {"retries": {"max_attempts": 7}, "read_timeout": 120}
    fs, _ = open_filesystem("s3://bucket/set", {**base, "config_kwargs": mine})
    assert fs.config_kwargs["retries"] == {"max_attempts": 7} and fs.config_kwargs["read_timeout"] == 120
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    fs, _ = open_filesystem("s3://bucket/set", base)
    assert "retries" not in fs.config_kwargs  # the environment's setting stands


@pytest.mark.parametrize("url", ["s3://", "s3:///", "s3:///set", "gs:///set"])
def test_a_url_without_a_bucket_says_so(url: str) -> None:
    from shardload.remote.url import normalize_url

    with pytest.raises(RemoteError, match=r"no bucket \(or host\) between '\w+://' and the path"):
        normalize_url(url)
