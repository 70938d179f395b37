"""``shardload upload SET URL``: a finished local set put into object storage, verified first, manifest last.

Claims tested against a real S3 server (rclone): the objects are the local files byte for byte, ``verify
URL`` accepts them and the URL loads the local set's batches; a run stopped midway (killed, or storage
failing after every retry) is finished by running it again, which puts only what is missing or differs;
another set at the URL is refused unless ``force``; a damaged local set, a local path or an HTTP URL as the
destination, a bad bucket or credentials are refused, naming what and what to do, before anything is put.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pytest

import shardload
from shardload.cli import main
from shardload.errors import (
    ManifestError,
    OutputError,
    OutputExistsError,
    RemoteAccessError,
    RemoteError,
    ShardSetError,
)
from shardload.formats.manifest import MANIFEST_NAME, Manifest
from shardload.remote import RemoteOptions
from shardload.remote.upload import SetUploader
from shardload.sets.verify import verify
from tests.helpers.faultproxy import FaultProxy
from tests.helpers.servers import S3Server
from tests.remote.test_remote_sets import assert_same, batches, make_set
from tests.remote.test_upload import FAST, ROOT, _objects, _shard_puts, _through


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"s3://bucket/upload-set/{tmp_path.name}/set"


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own node cache (where an upload keeps its record), for the library and subprocesses alike."""
    path = tmp_path / "cache"
    monkeypatch.setenv("SHARDLOAD_CACHE_DIR", str(path))
    return path


def _files(local: Path) -> dict[str, bytes]:
    """The set's files by name, as an upload puts them (a written set holds nothing else, hidden files aside)."""
    return {
        p.relative_to(local).as_posix(): p.read_bytes()
        for p in local.rglob("*")
        if p.is_file() and not p.relative_to(local).as_posix().startswith(".")
    }


def _remote(s3: S3Server, cache: Path) -> RemoteOptions:
    return RemoteOptions(storage_options=s3.storage_options, cache_dir=cache)


def test_upload_then_verify_url_then_the_same_batches(s3: S3Server, url: str, tmp_path: Path, cache: Path) -> None:
    local = make_set(tmp_path, n=120, shards=6)
    result = shardload.upload_set(local, url, storage_options=s3.storage_options, progress=False)
    files = _files(local)
    # Invariant: the objects are the set's files byte for byte, the manifest included (not rewritten)
    assert _objects(s3, url) == files
    assert (result.url, result.shards, result.samples, result.replaced) == (url, 6, 120, False)
    assert result.objects == result.uploaded_objects == len(files)
    assert result.bytes == result.uploaded_bytes == sum(len(b) for b in files.values())
    report = verify(url, remote=_remote(s3, cache))
    assert report.ok, report.problems
    assert report.shards == 6 and report.samples == 120
    for epoch in (0, 1):
        assert_same(batches(url, _remote(s3, cache), epoch=epoch), batches(local, epoch=epoch))


def test_rerun_puts_nothing_and_replaces_an_object_that_differs(
    s3: S3Server, url: str, tmp_path: Path, cache: Path
) -> None:
    local = make_set(tmp_path, n=80, shards=4)
    shardload.upload_set(local, url, storage_options=s3.storage_options, progress=False)
    shutil.rmtree(cache / "uploads")  # no record of the upload (another machine): the ETags (MD5s) tell
    again = shardload.upload_set(local, url, storage_options=s3.storage_options, progress=False)
    # Invariant: a set already there whole is left as it is: no object put, not even its manifest
    assert again.uploaded_objects == again.uploaded_bytes == 0 and again.objects == len(_files(local))
    fs = s3.filesystem()
    key = f"{url.removeprefix('s3://')}/shards/shard-000002.arrow"
    good = fs.cat_file(key)
    fs.pipe_file(key, bytes(b ^ 0xFF for b in good))  # same size, other bytes
    repaired = shardload.upload_set(local, url, storage_options=s3.storage_options, progress=False)
    assert repaired.uploaded_objects == 1 and repaired.uploaded_bytes == len(good)
    assert _objects(s3, url) == _files(local)
    assert verify(url, remote=_remote(s3, cache)).ok


def test_an_object_stored_wrong_stops_the_upload_before_the_manifest(
    s3: S3Server, url: str, tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = make_set(tmp_path, n=80, shards=4)
    fs = s3.filesystem()
    put_many = SetUploader.put_many

    def put_then_spoil(self: SetUploader, files: list[tuple[str, Path]]) -> None:
        put_many(self, files)
        for name, _ in files:
            if name == "shards/shard-000001.arrow":  # the store keeps other bytes than were sent (same size)
                key = f"{url.removeprefix('s3://')}/{name}"
                fs.pipe_file(key, bytes(b ^ 0x01 for b in fs.cat_file(key)))

    monkeypatch.setattr(SetUploader, "put_many", put_then_spoil)
    with pytest.raises(OutputError, match=r"1 object\(s\) do not match.*shard-000001.*has MD5.*run the upload again"):
        shardload.upload_set(local, url, storage_options=s3.storage_options, progress=False)
    # Invariant: the check comes before the manifest: no reader opens a set with a wrong object
    assert MANIFEST_NAME not in _objects(s3, url)
    monkeypatch.setattr(SetUploader, "put_many", put_many)
    result = shardload.upload_set(local, url, storage_options=s3.storage_options, progress=False)
    assert result.uploaded_objects == 2  # the spoiled shard and the manifest
    assert _objects(s3, url) == _files(local)


def test_killed_upload_is_finished_by_running_it_again(s3: S3Server, url: str, tmp_path: Path, cache: Path) -> None:
    local = make_set(tmp_path, n=160, shards=8)
    env = {**os.environ, **s3.env(), "PYTHONPATH": str(ROOT), "SHARDLOAD_KILL_AT": "upload:3"}
    args = ["upload", str(local), url, "--no-progress"]
    run = subprocess.run([sys.executable, "-m", "shardload", *args], env=env, capture_output=True, timeout=120)
    assert run.returncode == -9, run.stderr.decode()
    left = _objects(s3, url)
    # Invariant: a stopped upload leaves no manifest, so no reader takes the objects for a set
    assert MANIFEST_NAME not in left and sum(n.startswith("shards/") for n in left) >= 3
    with pytest.raises(ShardSetError, match="not a shard set"):
        shardload.open(url, storage_options=s3.storage_options, cache_dir=cache)
    with FaultProxy(s3.endpoint) as proxy:
        result = shardload.upload_set(local, url, storage_options=_through(proxy, s3), progress=False, retry=FAST)
        # the shards that were put whole are not put again
        assert 0 < _shard_puts(proxy) <= 8 - 3
    assert result.uploaded_objects < result.objects
    assert _objects(s3, url) == _files(local)
    assert verify(url, remote=_remote(s3, cache)).ok


def test_storage_failing_midway_then_a_rerun_completes(s3: S3Server, url: str, tmp_path: Path, cache: Path) -> None:
    local = make_set(tmp_path, n=160, shards=8)
    with FaultProxy(s3.endpoint) as proxy:
        options = _through(proxy, s3)
        proxy.inject("503", method="PUT", path=r"shard-000005", times=1000)
        with pytest.raises(RemoteError, match=r"failed 4 times") as info:
            shardload.upload_set(local, url, storage_options=options, progress=False, retry=FAST)
        assert url in str(info.value)
        assert MANIFEST_NAME not in _objects(s3, url)
        proxy.clear()
        before = _shard_puts(proxy)
        shardload.upload_set(local, url, storage_options=options, progress=False, retry=FAST)
        assert 0 < _shard_puts(proxy) - before < 8  # only the shards not put before
    assert _objects(s3, url) == _files(local)
    assert verify(url, remote=_remote(s3, cache)).ok


def test_another_set_is_refused_unless_forced(s3: S3Server, url: str, tmp_path: Path, cache: Path) -> None:
    old = make_set(tmp_path, "old", n=120, shards=6, seed=1)
    new = make_set(tmp_path, "new", n=90, shards=3, seed=2)
    shardload.upload_set(old, url, storage_options=s3.storage_options, progress=False)
    before = _objects(s3, url)
    with pytest.raises(OutputExistsError, match=r"already holds another shard set.*--force") as info:
        shardload.upload_set(new, url, storage_options=s3.storage_options, progress=False)
    assert url in str(info.value)
    assert _objects(s3, url) == before  # nothing touched
    result = shardload.upload_set(new, url, storage_options=s3.storage_options, force=True, progress=False)
    assert result.replaced and result.samples == 90
    # Invariant: after a replacement the URL holds the new set's objects only (shards 3..5 of the old one gone)
    assert _objects(s3, url) == _files(new)
    assert_same(batches(url, _remote(s3, cache)), batches(new))


def test_a_damaged_local_set_is_refused_before_anything_is_uploaded(s3: S3Server, url: str, tmp_path: Path) -> None:
    local = make_set(tmp_path, n=60, shards=3)
    shard = local / "shards" / "shard-000001.arrow"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardSetError, match=r"is damaged, nothing was uploaded.*shard 1 .*checksum_mismatch") as info:
        shardload.upload_set(local, url, storage_options=s3.storage_options, progress=False)
    assert str(local) in str(info.value) and "shardload verify" in str(info.value)
    assert _objects(s3, url) == {}
    (local / MANIFEST_NAME).unlink()
    with pytest.raises(ManifestError, match="is not a shard set"):
        shardload.upload_set(local, url, storage_options=s3.storage_options, progress=False)
    with pytest.raises(ShardSetError, match="does not exist"):
        shardload.upload_set(tmp_path / "nothing", url, storage_options=s3.storage_options, progress=False)
    assert _objects(s3, url) == {}


def test_destinations_and_sources_that_cannot_be_used_are_named(s3: S3Server, url: str, tmp_path: Path) -> None:
    local = make_set(tmp_path, n=30, shards=2)
    with pytest.raises(OutputError, match=r"is a local path.*cp -r"):
        shardload.upload_set(local, str(tmp_path / "copy"))
    with pytest.raises(OutputError, match=r"cannot write them"):
        shardload.upload_set(local, "https://example.org/sets/train")
    with pytest.raises(ShardSetError, match=r"is a URL.*shardload verify URL"):
        shardload.upload_set(url, url)
    with pytest.raises(OutputError, match="bucket.*does not exist"):
        shardload.upload_set(local, "s3://no-such-bucket/set", storage_options=s3.storage_options, retry=FAST)
    wrong = {**s3.storage_options, "secret": "wrong"}
    with pytest.raises(RemoteAccessError, match="refused"):
        shardload.upload_set(local, url, storage_options=wrong, retry=FAST)
    nobody = {**s3.storage_options, "client_kwargs": {"endpoint_url": "http://127.0.0.1:1"}}
    with pytest.raises(RemoteError, match=r"127\.0\.0\.1:1.*connection refused"):
        shardload.upload_set(local, url, storage_options=nobody, retry=FAST)
    assert _objects(s3, url) == {}


def test_cli_upload_then_verify(
    s3: S3Server, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    local = make_set(tmp_path, n=60, shards=3)
    other = make_set(tmp_path, "other", n=30, shards=2, seed=3)
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    fsspec.get_filesystem_class("s3").clear_instance_cache()
    try:
        assert main(["upload", str(local), url, "--no-progress", "--json"]) == 0
        captured = capsys.readouterr()
        result = json.loads(captured.out)
        # the progress lines are the upload's, in bytes (no samples/s of files that hold no samples)
        lines = [line for line in captured.err.splitlines() if ": upload: " in line]
        assert lines and all(line.startswith("shardload.upload: upload: ") for line in lines), captured.err
        assert not any("samples" in line for line in lines), captured.err
        assert result["url"] == url and result["uploaded_objects"] == result["objects"] > 3
        assert main(["upload", str(local), url, "--no-progress"]) == 0
        out = capsys.readouterr().out
        assert "put 0 of" in out and f"shardload verify {url}" in out
        assert main(["verify", url, "--no-progress"]) == 0
        assert "ok: 3 shards, 60 samples verified" in capsys.readouterr().out
        assert main(["upload", str(other), url, "--no-progress"]) == 4  # another set there: OutputExistsError
        assert "--force" in capsys.readouterr().err
        assert main(["upload", str(tmp_path / "none"), url, "--no-progress"]) == 5
    finally:
        fsspec.get_filesystem_class("s3").clear_instance_cache()


def test_a_merged_set_is_uploaded_with_its_parts_shards_only(
    s3: S3Server, url: str, tmp_path: Path, cache: Path
) -> None:
    from tests.prepare.test_parts import OPTIONS, prepare_parts, write_sources

    local = tmp_path / "merged"
    prepare_parts(write_sources(tmp_path, files=3), local, 2, progress=False)
    shardload.merge(local)
    (local / "NOTES.txt").write_text("not part of the set")
    result = shardload.upload_set(local, url, storage_options=s3.storage_options, progress=False)
    names = set(_objects(s3, url))
    manifest = shardload.open(local)
    # Invariant: the objects are what a reader of the set opens (the shards under parts/, the indexes,
    # the origins, the manifest), nothing else of the directory
    shards = {n for n in names if n.startswith("parts/")}
    assert shards == {info.file for info in Manifest.load(local).shards}
    assert all("/shards/" in n for n in shards) and "NOTES.txt" not in names
    assert result.shards == OPTIONS["num_shards"] * 2 and result.samples == len(manifest)
    manifest.close()
    assert shardload.upload_set(local, url, storage_options=s3.storage_options, progress=False).uploaded_objects == 0
    assert verify(url, remote=_remote(s3, cache)).ok
    assert_same(batches(url, _remote(s3, cache)), batches(local))
    # Invariant: forcing another set over it leaves exactly that set's objects (the parts' shards go too)
    plain = make_set(tmp_path, n=30, shards=2)
    shardload.upload_set(plain, url, storage_options=s3.storage_options, force=True, progress=False)
    assert set(_objects(s3, url)) == set(_files(plain))


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("workers", "2", "workers must be an integer"),
        ("workers", 0, "workers must be >= 1"),
        ("force", "yes", "force must be True or False"),
        ("progress", 1, "progress must be True or False"),
    ],
)
def test_misused_options_are_named_before_anything_is_read(
    s3: S3Server, url: str, tmp_path: Path, option: str, value: object, says: str
) -> None:
    local = make_set(tmp_path, n=10, shards=1)
    with pytest.raises(shardload.ShardloadError, match=says):
        shardload.upload_set(local, url, storage_options=s3.storage_options, **{option: value})  # type: ignore[arg-type]
    assert _objects(s3, url) == {}


def test_ctrl_c_says_to_run_it_again(s3: S3Server, url: str, tmp_path: Path) -> None:
    local = make_set(tmp_path, n=80, shards=4)
    env = {**os.environ, **s3.env(), "PYTHONPATH": str(ROOT), "SHARDLOAD_PAUSE_AT": "upload:2"}
    args = [sys.executable, "-m", "shardload", "upload", str(local), url, "--no-progress"]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while sum(n.startswith("shards/") for n in _objects(s3, url)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert "interrupted; run the same command again to finish the upload" in err.decode()
    assert MANIFEST_NAME not in _objects(s3, url)
