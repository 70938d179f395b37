"""``prepare -o s3://...``: staged locally, uploaded with the manifest last, resumable, retried through faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

import shardload
from shardload.cli import main
from shardload.errors import OutputError, OutputExistsError, RemoteAccessError, RemoteError
from shardload.formats.manifest import MANIFEST_NAME
from shardload.remote import RetryPolicy, open_filesystem
from shardload.remote.upload import is_owned
from tests.helpers.faultproxy import FaultProxy
from tests.helpers.servers import S3Server

FAST = RetryPolicy(tries=4, base_delay=0.01, max_delay=0.02)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    rng = np.random.default_rng(7)
    path = tmp_path / "data.jsonl"
    lines = [json.dumps({"tokens": rng.integers(0, 1000, int(n)).tolist()}) for n in rng.integers(1, 40, 90)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"s3://bucket/upload/{tmp_path.name}/set"


def _objects(s3: S3Server, url: str) -> dict[str, bytes]:
    """Every object under ``url``, by name relative to it, with its bytes."""
    fs = s3.filesystem()
    base = url.removeprefix("s3://")
    return {k[len(base) + 1 :]: fs.cat_file(k) for k in fs.find(base)}


def _local_files(out: Path) -> dict[str, bytes]:
    return {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in out.rglob("*")
        if p.is_file() and not p.relative_to(out).as_posix().startswith(".")
    }


def _same_set(remote: dict[str, bytes], local: dict[str, bytes]) -> None:
    """The same objects, byte for byte; the manifests equal but for the time they were written."""
    assert sorted(remote) == sorted(local)
    for name in local:
        if name == MANIFEST_NAME:
            a, b = json.loads(remote[name]), json.loads(local[name])
            a.pop("created"), b.pop("created")
            assert a == b
        else:
            assert remote[name] == local[name], name


def _through(proxy: FaultProxy, s3: S3Server) -> dict[str, Any]:
    """Storage options that reach the server through ``proxy``, with botocore's and s3fs's own retries off."""
    options = {
        **s3.storage_options,
        "client_kwargs": {"endpoint_url": proxy.url},
        "config_kwargs": {"retries": {"max_attempts": 1}, "read_timeout": 5, "connect_timeout": 5},
    }
    fs, _ = open_filesystem("s3://bucket", options)  # the instance prepare gets too (fsspec caches them)
    fs.retries = 1
    return options


def _shard_puts(proxy: FaultProxy) -> int:
    return sum(1 for r in proxy.requests if r.method == "PUT" and "/shards/" in r.path)


def test_prepare_to_url_equals_a_local_prepare(s3: S3Server, src: Path, url: str, tmp_path: Path) -> None:
    stage = tmp_path / "stage"
    result = shardload.prepare(
        src, url, storage_options=s3.storage_options, staging=stage, num_shards=4, progress=False
    )
    local = shardload.prepare(src, tmp_path / "local", num_shards=4, progress=False)
    remote = _objects(s3, url)
    _same_set(remote, _local_files(tmp_path / "local"))
    assert result.path == url and result.shards == 4 and result.samples == local.samples == 90
    assert result.uploaded_bytes == sum(len(b) for b in remote.values())
    assert not stage.exists()  # removed once the upload was complete
    down = tmp_path / "down"
    s3.filesystem().get(url.removeprefix("s3://") + "/", str(down), recursive=True)
    got, want = shardload.open(down), shardload.open(tmp_path / "local")
    assert [got[i]["tokens"].tolist() for i in range(90)] == [want[i]["tokens"].tolist() for i in range(90)]
    got.close()
    want.close()


def test_write_to_url_keeps_staging_when_asked(s3: S3Server, url: str, tmp_path: Path) -> None:
    samples = [{"tokens": np.arange(n, dtype=np.int32)} for n in range(1, 30)]
    stage = tmp_path / "stage"
    result = shardload.write(
        samples, url, storage_options=s3.storage_options, staging=stage, keep_staging=True, num_shards=3
    )
    assert result.samples == 29 and result.path == url
    assert (stage / "set" / MANIFEST_NAME).read_bytes() == _objects(s3, url)[MANIFEST_NAME]


def test_cli_with_environment_settings(s3: S3Server, src: Path, url: str, tmp_path: Path) -> None:
    env = {**os.environ, **s3.env(), "PYTHONPATH": str(ROOT), "SHARDLOAD_CACHE_DIR": str(tmp_path / "cache")}
    args = ["prepare", str(src), "-o", url, "--num-shards", "3", "--no-progress", "--json"]
    run = subprocess.run([sys.executable, "-m", "shardload", *args], env=env, capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr.decode()
    result = json.loads(run.stdout)
    assert result["path"] == url and result["shards"] == 3 and result["uploaded_bytes"] > 0
    assert MANIFEST_NAME in _objects(s3, url)
    assert not any((tmp_path / "cache" / "staging").iterdir())  # the default staging, under the cache dir, is gone


def test_existing_set_is_refused_and_overwrite_leaves_no_stale_objects(
    s3: S3Server, src: Path, url: str, tmp_path: Path
) -> None:
    opts = {"storage_options": s3.storage_options, "staging": tmp_path / "stage", "progress": False}
    shardload.prepare(src, url, num_shards=5, **opts)
    before = _objects(s3, url)
    with pytest.raises(OutputExistsError, match=r"already holds a shard set.*--overwrite") as info:
        shardload.prepare(src, url, num_shards=2, **opts)
    assert url in str(info.value)
    assert _objects(s3, url) == before  # nothing touched
    shardload.prepare(src, url, num_shards=2, overwrite=True, **opts)
    shardload.prepare(src, tmp_path / "local", num_shards=2, progress=False)
    _same_set(_objects(s3, url), _local_files(tmp_path / "local"))  # no shard 2..4 of the old set is left


@pytest.mark.slow
def test_killed_upload_leaves_no_manifest_and_resume_uploads_the_rest(
    s3: S3Server, src: Path, url: str, tmp_path: Path
) -> None:
    stage = tmp_path / "stage"
    env = {**os.environ, **s3.env(), "PYTHONPATH": str(ROOT), "SHARDLOAD_KILL_AT": "upload:3"}
    args = ["prepare", str(src), "-o", url, "--num-shards", "8", "--no-progress", "--staging", str(stage)]
    run = subprocess.run([sys.executable, "-m", "shardload", *args], env=env, capture_output=True, timeout=120)
    assert run.returncode == -9, run.stderr.decode()
    left = _objects(s3, url)
    assert MANIFEST_NAME not in left and sum(n.startswith("shards/") for n in left) >= 3
    with pytest.raises(OutputExistsError, match="did not finish.*--resume"):
        shardload.prepare(src, url, storage_options=s3.storage_options, staging=stage, num_shards=8)
    with FaultProxy(s3.endpoint) as proxy:
        options = _through(proxy, s3)
        result = shardload.prepare(
            src, url, storage_options=options, staging=stage, num_shards=8, resume=True, progress=False, retry=FAST
        )
        assert 0 < _shard_puts(proxy) <= 8 - 3  # the shards recorded as uploaded are not put again
    assert result.uploaded_bytes < sum(len(b) for b in _objects(s3, url).values())
    shardload.prepare(src, tmp_path / "local", num_shards=8, progress=False)
    _same_set(_objects(s3, url), _local_files(tmp_path / "local"))
    assert not stage.exists()


def test_503s_and_a_dropped_connection_are_survived(s3: S3Server, src: Path, url: str, tmp_path: Path) -> None:
    with FaultProxy(s3.endpoint) as proxy:
        options = _through(proxy, s3)
        proxy.inject("503", method="PUT", path=r"/shards/", times=2)
        proxy.inject("drop", method="PUT", path=r"/shards/", times=1)
        proxy.inject("503", method="PUT", path=r"manifest\.json$", times=1)
        shardload.prepare(
            src, url, storage_options=options, staging=tmp_path / "stage", num_shards=3, progress=False, retry=FAST
        )
        assert proxy.hits("503") == 3 and proxy.hits("drop") == 1
    shardload.prepare(src, tmp_path / "local", num_shards=3, progress=False)
    _same_set(_objects(s3, url), _local_files(tmp_path / "local"))


def test_persistent_503_ends_in_remote_error_naming_the_url(s3: S3Server, src: Path, url: str, tmp_path: Path) -> None:
    with FaultProxy(s3.endpoint) as proxy:
        options = _through(proxy, s3)
        proxy.inject("503", method="PUT", path=r"shard-000001", times=1000)
        with pytest.raises(RemoteError, match=r"failed 4 times") as info:
            shardload.prepare(
                src, url, storage_options=options, staging=tmp_path / "stage", num_shards=3, progress=False, retry=FAST
            )
        assert url in str(info.value) and info.value.url.startswith(url)
    assert MANIFEST_NAME not in _objects(s3, url)
    assert (tmp_path / "stage" / "set" / MANIFEST_NAME).exists()  # the staged set waits for --resume


def test_cli_exits_8_on_persistent_503(
    s3: S3Server,
    src: Path,
    url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(RetryPolicy.__init__, "__defaults__", (3, 0.01, 0.02, 1.0))  # the CLI's default policy
    with FaultProxy(s3.endpoint) as proxy:
        for name, value in {**s3.env(), "AWS_ENDPOINT_URL": proxy.url, "AWS_MAX_ATTEMPTS": "1"}.items():
            monkeypatch.setenv(name, value)
        fsspec.get_filesystem_class("s3").clear_instance_cache()
        fsspec.filesystem("s3").retries = 1  # the instance the CLI gets
        proxy.inject("503", method="PUT", path=r"/shards/", times=1000)
        args = ["prepare", str(src), "-o", url, "--staging", str(tmp_path / "stage"), "--no-progress"]
        assert main(args) == 8
    assert url in capsys.readouterr().err
    fsspec.get_filesystem_class("s3").clear_instance_cache()


@pytest.mark.parametrize("fault", ["credentials", "bucket"])
def test_refused_credentials_or_missing_bucket_is_a_clear_output_error(
    s3: S3Server, src: Path, tmp_path: Path, fault: str
) -> None:
    options = {**s3.storage_options, "secret": "wrong"} if fault == "credentials" else s3.storage_options
    url = f"s3://bucket/upload/{tmp_path.name}/set" if fault == "credentials" else "s3://no-such-bucket/set"
    # refused credentials are RemoteAccessError (a RemoteError, exit 8), a missing bucket an OutputError (exit 4)
    expected = RemoteAccessError if fault == "credentials" else OutputError
    with pytest.raises(expected, match="refused" if fault == "credentials" else fault) as info:
        shardload.prepare(src, url, storage_options=options, staging=tmp_path / "stage", progress=False)
    assert url in str(info.value) and isinstance(info.value, RemoteError) == (fault == "credentials")
    assert not (tmp_path / "stage").exists()  # refused before anything was staged


def test_parts_and_merge_are_refused_for_a_url(s3: S3Server, src: Path, url: str) -> None:
    with pytest.raises(OutputError, match=r"--part K/N.*shared file system"):
        shardload.prepare(src, url, part="0/2", storage_options=s3.storage_options)
    with pytest.raises(OutputError, match=r"not a URL"):
        shardload.merge(url)
    assert _objects(s3, url) == {}


def test_objects_a_set_owns() -> None:
    owned = [
        "manifest.json",
        "shards.arrow",  # the shard table of a set of 1,000+ shards: an interrupted upload may hold it alone
        "shards/shard-000000.arrow",
        "lengths.npy",
        "lengths.labels.npy",
        "origins.arrow",
    ]
    assert all(is_owned(n) for n in owned)
    assert not any(is_owned(n) for n in ["README.md", "parts/00000-of-00002/manifest.json", "lengths.txt"])
