"""``shardload upload`` under careless use: the local set is rewritten while it is being uploaded, or is still
being prepared. The upload never makes a set in storage of files it did not verify together: it stops before the
manifest is put, naming the set, and a run once the set is finished puts it whole."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import shardload
import shardload.sets.upload as upload_module
from shardload._base.output import OutputLock
from shardload.errors import InputError, ManifestError, OutputError, OutputLockedError, ShardSetError
from shardload.remote import RemoteOptions
from shardload.sets.verify import verify
from shardload.testing import synthetic_samples
from tests.helpers.servers import S3Server
from tests.remote.test_remote_sets import make_set


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("SHARDLOAD_CACHE_DIR", str(path))
    return path


@pytest.mark.parametrize("shards", [6, 9, 0])  # the same file names, more shards than verified, a shard removed
def test_a_set_replaced_while_it_is_uploaded_is_not_made_a_set_in_storage(
    s3: S3Server, tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, shards: int
) -> None:
    url = f"s3://bucket/upload-hostile/{tmp_path.name}/set"
    local = make_set(tmp_path, n=120, shards=6)
    verified = upload_module._refuse_damaged

    def then_replaced(*args: object) -> None:  # as a `prepare --overwrite` of the same directory, committed now
        verified(*args)  # type: ignore[arg-type]
        if shards:
            shardload.write(synthetic_samples(90, seed=2), local, num_shards=shards, overwrite=True, progress=False)
        else:
            (local / "shards" / "shard-000002.arrow").unlink()

    monkeypatch.setattr(upload_module, "_refuse_damaged", then_replaced)
    with pytest.raises(OutputError, match=rf"{local}: changed while it was uploaded .*manifest.json was not put"):
        shardload.upload_set(local, url, storage_options=s3.storage_options, progress=False)
    fs = s3.filesystem()
    assert not fs.exists(f"{url.removeprefix('s3://')}/manifest.json")  # no reader opens a mix of two sets
    monkeypatch.setattr(upload_module, "_refuse_damaged", verified)
    if not shards:  # the set on disk is damaged now: refused, nothing more put
        with pytest.raises(ShardSetError, match="is damaged, nothing was uploaded"):
            shardload.upload_set(local, url, storage_options=s3.storage_options, progress=False)
        return
    result = shardload.upload_set(local, url, storage_options=s3.storage_options, progress=False)
    assert (result.shards, result.samples) == (shards, 90)
    assert verify(url, remote=RemoteOptions(storage_options=s3.storage_options, cache_dir=cache)).ok


def test_a_set_being_prepared_is_named_as_such(s3: S3Server, tmp_path: Path) -> None:
    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps({"tokens": [i, i + 1]}) + "\n" for i in range(20)))
    out = tmp_path / "out"
    mod = tmp_path / "slowmap.py"
    # the first sample (the schema's) at once, then slowly: the run holds its lock meanwhile
    mod.write_text(
        "import time\n\ndef slow(sample):\n    time.sleep(30 if sample['tokens'][0] else 0)\n    return sample\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardload", "prepare", str(src), "-o", str(out), "--map", f"{mod}:slow"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (out / ".prepare.lock").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        with pytest.raises(ManifestError, match="A prepare is writing it right now: wait for it to finish") as caught:
            shardload.upload_set(out, "s3://bucket/upload-hostile/being-written", storage_options=s3.storage_options)
        assert "--resume" not in str(caught.value)
    finally:
        proc.kill()
        proc.wait()


def test_an_object_deleted_from_storage_is_found_though_its_shard_is_cached(
    s3: S3Server, tmp_path: Path, cache: Path
) -> None:
    url = f"s3://bucket/upload-hostile/{tmp_path.name}/set"
    local = make_set(tmp_path, n=60, shards=3)
    shardload.upload_set(local, url, storage_options=s3.storage_options, progress=False)
    remote = RemoteOptions(storage_options=s3.storage_options, cache_dir=cache)
    assert verify(url, remote=remote).ok  # every shard is in the node cache now
    fs = s3.filesystem()
    fs.rm(f"{url.removeprefix('s3://')}/shards/shard-000001.arrow")
    report = verify(url, remote=remote)
    # the good copy in the cache does not hide that storage lost the object
    assert [(p.shard, p.reason) for p in report.problems] == [(1, "missing")]
    assert "is missing from storage (its copy in the node cache is good)" in report.problems[0].detail
    assert "shardload upload SET URL" in report.problems[0].detail
    fs.pipe(f"{url.removeprefix('s3://')}/shards/shard-000001.arrow", b"short")
    report = verify(url, remote=remote)
    assert [(p.shard, p.reason) for p in report.problems] == [(1, "size_mismatch")]
    # a rerun of the upload puts it back
    result = shardload.upload_set(local, url, storage_options=s3.storage_options, progress=False)
    assert result.uploaded_objects == 1
    assert verify(url, remote=remote).ok


def test_a_bad_cache_dir_or_a_second_upload_is_said_before_the_set_is_verified(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"s3://bucket/upload-hostile/{tmp_path.name}/set"
    local = make_set(tmp_path, n=60, shards=3)
    verified: list[object] = []
    monkeypatch.setattr(upload_module, "_refuse_damaged", lambda *args: verified.append(args))
    not_a_dir = tmp_path / "cache-is-a-file"
    not_a_dir.write_text("")
    monkeypatch.setenv("SHARDLOAD_CACHE_DIR", str(not_a_dir))
    with pytest.raises(InputError, match=r"cache-is-a-file is a file, not a directory"):
        shardload.upload_set(local, url, storage_options=s3.storage_options, progress=False)
    monkeypatch.setenv("SHARDLOAD_CACHE_DIR", str(tmp_path / "cache"))
    held = OutputLock(upload_module._record_dir(url) / ".lock", busy="held by this test")
    held.acquire()
    try:
        with pytest.raises(OutputLockedError, match="another upload to this URL runs on this machine right now"):
            shardload.upload_set(local, url, storage_options=s3.storage_options, progress=False)
    finally:
        held.release(remove=False)
    # the set is read once an upload can go on: not before
    assert verified == []
