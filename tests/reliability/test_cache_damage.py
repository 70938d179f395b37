"""A damaged copy in the node cache of a remote set is downloaded again; damage in storage is named as such.

A shard is sha256-checked against the manifest before it is renamed into the cache, so a copy that fails
the first-open checks later was damaged in the cache (disk, a stray write, a user's edit), not in storage.
Against the session's rclone S3 server (tests/conftest.py, ``s3``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload._base.checksum import file_checksum
from shardload.cli import main
from shardload.remote import RemoteOptions
from shardload.sets.verify import verify
from tests.helpers.servers import S3Server
from tests.remote.test_remote_sets import assert_same, batches, downloads, make_set, options

from .test_shards import offsets_position


def upload(s3: S3Server, local: Path, request: pytest.FixtureRequest) -> str:
    name = re.sub(r"\W", "_", request.node.name)  # a parametrized test's [id] is no key for a bucket
    return s3.upload(local, f"cache-damage/{name}/set")


def cached_copy(remote: RemoteOptions, url: str, k: int) -> Path:
    """Shard ``k``'s file in the node cache (after a read put it there)."""
    ss = shardload.open(url, remote=remote)
    path = ss.path / ss.shards[k].file
    assert path.is_file()
    return path


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def flip_footer(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-12] ^= 0xFF  # inside the Arrow footer's length / metadata
    path.write_bytes(bytes(data))


def flip_offsets(path: Path) -> None:
    pos, offsets = offsets_position(path, "tokens")
    gaps = np.diff(offsets)
    k = int(np.flatnonzero((gaps[:-1] >= 2) & (gaps[1:] >= 2))[0]) + 1  # still monotone: only the lengths check sees it
    data = bytearray(path.read_bytes())
    data[pos + 8 * k] ^= 0x01
    path.write_bytes(bytes(data))


def swap_with_next(path: Path) -> None:
    other = path.with_name(path.name.replace("000001", "000002"))
    a, b = path.read_bytes(), other.read_bytes()
    path.write_bytes(b)
    other.write_bytes(a)


DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncated": truncate,
    "footer": flip_footer,
    "offsets": flip_offsets,
    "swapped": swap_with_next,
}


@pytest.fixture
def remote_set(s3: S3Server, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, str, RemoteOptions]:
    """A 3-shard set, its copy in storage, and a node cache that holds every shard (read once)."""
    local = make_set(tmp_path, n=60, shards=3)
    url = upload(s3, local, request)
    remote = options(s3, tmp_path / "cache")
    batches(url, remote)
    assert downloads(tmp_path / "cache") == Counter(range(3))
    return local, url, remote


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_cache_copy_is_downloaded_again_and_reading_goes_on(
    remote_set: tuple[Path, str, RemoteOptions], damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    local, url, remote = remote_set
    DAMAGE[damage](cached_copy(remote, url, 1))
    with caplog.at_level(logging.WARNING, logger="shardload.remote"):
        got = batches(url, remote)
    # Invariant: the batches are the set's, as if nothing had happened to the cache
    assert_same(got, batches(local))
    # Invariant: each damaged copy was downloaded again once, nothing else was
    again = {1, 2} if damage == "swapped" else {1}
    assert downloads(remote.directory) == Counter({k: 2 if k in again else 1 for k in range(3)})
    # Invariant: one warning per damaged copy, naming the shard's URL and what was done
    warned = [r.getMessage() for r in caplog.records if "node cache" in r.getMessage()]
    assert len(warned) == len(again), warned
    assert "shard-000001.arrow" in " ".join(warned) and "downloading it again" in warned[0]


def test_damaged_cache_copy_read_by_two_workers_is_downloaded_again_once(
    remote_set: tuple[Path, str, RemoteOptions],
) -> None:
    local, url, remote = remote_set
    truncate(cached_copy(remote, url, 1))
    # timeout=: a stuck worker ends the test with a WorkerError instead of hanging it
    got = batches(url, remote, loader_options=shardload.LoaderOptions(num_workers=2, timeout=60))
    assert_same(got, batches(local))
    # Invariant: each worker that found the damage asked for a new copy; the shard was downloaded again once
    assert downloads(remote.directory) == Counter({0: 1, 1: 2, 2: 1})


def test_refetch_keeps_a_good_copy_another_holder_fetched_first(remote_set: tuple[Path, str, RemoteOptions]) -> None:
    # Two holders of one damaged copy (flock locks are per open file, so two sets in one process hold as two
    # processes do): the second to refetch finds a new file at the path and neither removes nor downloads it.
    _, url, remote = remote_set
    truncate(cached_copy(remote, url, 1))
    first, second = (shardload.open(url, remote=remote).remote for _ in range(2))
    assert first is not None and second is not None
    old = first.acquire(1)
    second.acquire(1)
    with open(old, "rb") as held:  # a mapping of the damaged copy, as a reader in another process has it
        damaged = held.read()
        first.refetch(1, shardload.CorruptShardError("truncated"))
        second.refetch(1, shardload.CorruptShardError("truncated"))
        # Invariant: one new download for both holders; the copy now in place is the good one
        assert downloads(remote.directory)[1] == 2
        assert first.manifest is not None and old.stat().st_size == first.manifest.shards[1].bytes
        # Invariant: the damaged file stays intact for whoever still has it open (unlinked, not rewritten)
        held.seek(0)
        assert held.read() == damaged
    first.release(1)
    second.release(1)


def test_cache_copy_and_storage_object_both_damaged_blames_storage(
    remote_set: tuple[Path, str, RemoteOptions], s3: S3Server
) -> None:
    _, url, remote = remote_set
    truncate(cached_copy(remote, url, 1))
    stored = cached_copy(remote, url, 0).read_bytes()  # another shard's bytes: a replaced object
    s3.filesystem().pipe(f"{url.removeprefix('s3://')}/shards/shard-000001.arrow", stored)
    with pytest.raises(shardload.CorruptShardError) as info:
        batches(url, remote)
    msg = str(info.value)
    # Invariant: the object in storage is named, by URL, as the damaged one; the set is to be uploaded again
    assert f"{url}/shards/shard-000001.arrow" in msg and "in storage is damaged" in msg, msg
    assert "prepare -o URL" in msg, msg


def test_stored_object_that_matches_its_manifest_but_is_damaged_is_blamed_on_storage(
    s3: S3Server, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # The manifest agrees with the damaged object (edited after the damage): every download matches its
    # sha256, and every copy fails the first-open check. One more download, then storage is named.
    local = make_set(tmp_path, n=60, shards=3)
    manifest = json.loads((local / "manifest.json").read_text())
    path = local / manifest["shards"][1]["file"]
    flip_footer(path)
    manifest["shards"][1].update(checksum=file_checksum(path))
    (local / "manifest.json").write_text(json.dumps(manifest))
    url = upload(s3, local, request)
    remote = options(s3, tmp_path / "cache")
    with pytest.raises(shardload.CorruptShardError) as info:
        batches(url, remote)
    msg = str(info.value)
    # Invariant: the error names the object's URL and blames storage, not the node cache
    assert f"{url}/shards/shard-000001.arrow" in msg and "damaged in storage" in msg, msg
    # Invariant: downloaded once more after the first copy failed, not more
    assert downloads(remote.directory)[1] == 2
    # Invariant: verify, with the copy in the cache or without, names the stored object and repairs nothing
    for cache in (remote, options(s3, tmp_path / "cold")):
        report = verify(url, remote=cache)
        assert report.damaged_shards == [1] and report.refetched == (), report
        assert all(p.detail.endswith(f"(in storage: {url}/shards/shard-000001.arrow)") for p in report.problems)


def test_local_set_keeps_the_rerun_prepare_advice(damaged: Path) -> None:
    flip_footer(damaged / json.loads((damaged / "manifest.json").read_text())["shards"][1]["file"])
    with pytest.raises(shardload.CorruptShardError, match=r"shard-000001\.arrow") as info:
        batches(damaged)
    # Invariant: no storage is blamed for a local set
    assert "storage" not in str(info.value)


# -- verify URL ----------------------------------------------------------------------------------------
def test_verify_url_downloads_a_damaged_cache_copy_again_and_says_so(
    remote_set: tuple[Path, str, RemoteOptions],
) -> None:
    # A flipped byte in sample values: loading cannot see it (it reads no more than asked), verify does.
    local, url, remote = remote_set
    path = cached_copy(remote, url, 0)
    data = bytearray(path.read_bytes())
    at = data.find(np.asarray(shardload.open(local)[5]["tokens"]).tobytes())
    assert at > 0
    data[at] ^= 0x10
    path.write_bytes(bytes(data))
    report = verify(url, remote=remote)
    # Invariant: the set in storage is fine, so the report is ok; the damaged cache copy is named apart
    assert report.ok, report.problems
    assert [(p.shard, p.reason) for p in report.refetched] == [(0, "checksum_mismatch")]
    assert (
        "node cache" in report.refetched[0].detail and f"{url}/shards/shard-000000.arrow" in report.refetched[0].detail
    )
    assert report.to_json()["refetched"][0]["shard"] == 0
    assert downloads(remote.directory)[0] == 2
    # Invariant: the cache holds a good copy now
    assert_same(batches(url, remote), batches(local))


def test_verify_url_cli_names_a_repaired_cache_copy_and_exits_0(
    remote_set: tuple[Path, str, RemoteOptions],
    s3: S3Server,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, url, remote = remote_set
    truncate(cached_copy(remote, url, 2))
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    assert main(["verify", url, "--cache-dir", str(remote.directory), "--no-progress"]) == 0
    out = capsys.readouterr().out
    # Invariant: the line names the shard, says the cache copy was damaged and downloaded again; no prepare advice
    assert re.search(r"shard 2 \(shards/shard-000002\.arrow\): .*node cache.*downloaded again", out), out
    assert "re-run prepare" not in out and out.rstrip().splitlines()[-1].startswith("ok:"), out


def test_verify_url_blames_a_damaged_stored_object(remote_set: tuple[Path, str, RemoteOptions], s3: S3Server) -> None:
    _, url, remote = remote_set
    truncate(cached_copy(remote, url, 1))
    s3.filesystem().pipe(f"{url.removeprefix('s3://')}/shards/shard-000001.arrow", b"not a shard")
    report = verify(url, remote=remote)
    # Invariant: one problem, of shard 1, naming its URL in storage; nothing is counted as repaired
    assert [p.shard for p in report.problems] == [1] and report.refetched == ()
    assert f"{url}/shards/shard-000001.arrow" in report.problems[0].detail
    assert "in storage is damaged" in report.problems[0].detail


# -- the cache directory ---------------------------------------------------------------------------------
def test_cache_dir_that_is_a_file_names_the_option(remote_set: tuple[Path, str, RemoteOptions], tmp_path: Path) -> None:
    _, url, remote = remote_set
    file = tmp_path / "a-file"
    file.write_text("x")
    with pytest.raises(shardload.InputError) as info:
        shardload.open(url, storage_options=remote.storage_options, cache_dir=file)
    msg = str(info.value)
    # Invariant: the setting, its value and what to do are named, not only "Not a directory"
    assert "cache_dir" in msg and str(file) in msg and "is a file" in msg and "directory" in msg, msg


@pytest.mark.parametrize("var", ["SHARDLOAD_CACHE_DIR", "XDG_CACHE_HOME"])
def test_cache_dir_env_var_that_is_a_file_names_the_variable(
    remote_set: tuple[Path, str, RemoteOptions], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, var: str
) -> None:
    _, url, remote = remote_set
    file = tmp_path / "a-file"
    file.write_text("x")
    monkeypatch.delenv("SHARDLOAD_CACHE_DIR", raising=False)
    monkeypatch.setenv(var, str(file))
    with pytest.raises(shardload.InputError) as info:
        shardload.open(url, storage_options=remote.storage_options)
    msg = str(info.value)
    # Invariant: the variable and its value are named
    assert f"${var}" in msg and str(file) in msg, msg


def test_cache_dir_under_a_file_from_the_cli_is_an_input_error(
    remote_set: tuple[Path, str, RemoteOptions],
    s3: S3Server,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, url, _ = remote_set
    (tmp_path / "a-file").write_text("x")
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    # Invariant: exit status 3 (InputError), the flag and the file in the way named on stderr
    assert main(["inspect", url, "--cache-dir", str(tmp_path / "a-file" / "cache")]) == 3
    err = capsys.readouterr().err
    assert "--cache-dir" in err and f"{tmp_path / 'a-file'} is a file" in err, err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any directory")
def test_cache_dir_not_writable_names_the_option(remote_set: tuple[Path, str, RemoteOptions], tmp_path: Path) -> None:
    _, url, remote = remote_set
    locked = tmp_path / "read-only"
    locked.mkdir(mode=0o500)
    with pytest.raises(shardload.InputError, match=r"cache_dir.*read-only.*not writable"):
        shardload.open(url, storage_options=remote.storage_options, cache_dir=locked)


def test_prepare_to_a_url_with_a_cache_dir_that_is_a_file_names_the_variable(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.jsonl").write_text('{"tokens": [1, 2, 3]}\n')
    (tmp_path / "a-file").write_text("x")
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SHARDLOAD_CACHE_DIR", str(tmp_path / "a-file"))
    url = f"s3://{s3.bucket}/cache-dir-file/set"
    # Invariant: prepare -o URL stages in the node cache, and names its setting as reading does (exit 3)
    assert main(["prepare", str(tmp_path / "a.jsonl"), "-o", url]) == 3
    err = capsys.readouterr().err
    assert "$SHARDLOAD_CACHE_DIR" in err and f"{tmp_path / 'a-file'} is a file" in err, err


# -- the mirror's metadata: manifest.json and the lengths index ----------------------------------------
def mirror_of(remote: RemoteOptions, url: str) -> Path:
    mirror = shardload.open(url, remote=remote).path
    assert (mirror / "manifest.json").is_file()
    return mirror


def garbage(path: Path) -> None:
    path.write_bytes(b"\x00garbage" * 50)


def flip_value(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40  # a high byte of the last length: far past any sample, the sum no longer the manifest's
    path.write_bytes(bytes(data))


def other_sets_manifest(tmp_path: Path) -> Callable[[Path], None]:
    other = make_set(tmp_path, "other", n=40, shards=2, seed=7)
    return lambda path: path.write_bytes((other / "manifest.json").read_bytes())


METADATA_DAMAGE: dict[str, tuple[str, Callable[[Path], None]]] = {
    "lengths-truncated": ("lengths.npy", truncate),
    "lengths-flipped": ("lengths.npy", flip_value),
    "lengths-deleted": ("lengths.npy", Path.unlink),
    "lengths-garbage": ("lengths.npy", garbage),
    "lengths-directory": ("lengths.npy", lambda p: (p.unlink(), p.mkdir(), (p / "x").write_text("x"))),
    "manifest-truncated": ("manifest.json", truncate),
    "manifest-garbage": ("manifest.json", garbage),
}


@pytest.mark.parametrize("damage", [*sorted(METADATA_DAMAGE), "manifest-other-set"])
def test_damaged_metadata_in_the_mirror_is_fetched_again_and_reading_goes_on(
    remote_set: tuple[Path, str, RemoteOptions], damage: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local, url, remote = remote_set
    name, harm = METADATA_DAMAGE.get(damage) or ("manifest.json", other_sets_manifest(tmp_path))
    harm(mirror_of(remote, url) / name)
    with caplog.at_level(logging.WARNING, logger="shardload.remote"):
        got = batches(url, remote)
        again = batches(url, remote)
    # Invariant: the batches are the set's, on this open and the next, as if nothing had happened to the cache
    assert_same(got, batches(local))
    assert_same(again, got)
    # Invariant: one warning, naming the damaged file and what was done; no shard downloaded again
    warned = [r.getMessage() for r in caplog.records if "node cache" in r.getMessage()]
    assert len(warned) == 1 and name in warned[0] and "downloading" in warned[0], warned
    assert downloads(remote.directory) == Counter(range(3))


@pytest.mark.parametrize("damage", ["lengths-garbage", "manifest-other-set"])
def test_verify_url_with_damaged_metadata_in_the_mirror_repairs_it_and_exits_0(
    remote_set: tuple[Path, str, RemoteOptions],
    s3: S3Server,
    damage: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, url, remote = remote_set
    name, harm = METADATA_DAMAGE.get(damage) or ("manifest.json", other_sets_manifest(tmp_path))
    harm(mirror_of(remote, url) / name)
    for var, value in s3.env().items():
        monkeypatch.setenv(var, value)
    # Invariant: the set in storage is intact: verify says ok, and blames neither prepare nor storage
    assert main(["verify", url, "--cache-dir", str(remote.directory), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "re-run prepare" not in captured.out + captured.err and "in storage" not in captured.out, captured


def test_metadata_damaged_in_the_mirror_and_in_storage_blames_storage_by_url(
    remote_set: tuple[Path, str, RemoteOptions], s3: S3Server
) -> None:
    _, url, remote = remote_set
    garbage(mirror_of(remote, url) / "lengths.npy")
    s3.filesystem().pipe(f"{url.removeprefix('s3://')}/lengths.npy", b"\x00garbage" * 50)
    with pytest.raises(shardload.ManifestError) as info:
        batches(url, remote)
    msg = str(info.value)
    # Invariant: the object in storage is named by its URL, and the advice is to upload the set again
    assert f"{url}/lengths.npy" in msg and "storage" in msg and "prepare -o URL" in msg, msg
    assert str(remote.directory) not in msg, msg


# -- things in the mirror the cache did not write ------------------------------------------------------------
def shards_dir_a_file(mirror: Path) -> None:
    shutil.rmtree(mirror / "shards")
    (mirror / "shards").write_text("not a directory")


def shard_a_directory(mirror: Path) -> None:
    path = mirror / "shards" / "shard-000001.arrow"
    path.unlink()
    path.mkdir()
    (path / "inner").write_text("x")


def shard_a_link_out(mirror: Path) -> None:
    outside = mirror.parents[3] / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep me")
    path = mirror / "shards" / "shard-000001.arrow"
    path.unlink()
    path.symlink_to(outside)


def shard_a_link_to_a_file_out(mirror: Path) -> None:
    outside = mirror.parents[3] / "outside.arrow"
    path = mirror / "shards" / "shard-000001.arrow"
    outside.write_bytes(path.read_bytes())  # the right bytes, but not a file the cache wrote
    path.unlink()
    path.symlink_to(outside)


KIND_DAMAGE: dict[str, tuple[Callable[[Path], None], set[int]]] = {
    "shards-dir-a-file": (shards_dir_a_file, {0, 1, 2}),
    "shard-a-directory": (shard_a_directory, {1}),
    "shard-a-link-to-a-directory-out": (shard_a_link_out, {1}),
    "shard-a-link-to-a-file-out": (shard_a_link_to_a_file_out, {1}),
}


@pytest.mark.parametrize("damage", sorted(KIND_DAMAGE))
@pytest.mark.parametrize("check", ["load", "verify"])
def test_mirror_entry_of_the_wrong_kind_is_removed_and_fetched_again(
    remote_set: tuple[Path, str, RemoteOptions], damage: str, check: str, tmp_path: Path
) -> None:
    local, url, remote = remote_set
    harm, again = KIND_DAMAGE[damage]
    harm(mirror_of(remote, url))
    before = {p: p.read_bytes() for p in tmp_path.glob("outside*") if p.is_file()} | {
        p: p.read_bytes() for p in tmp_path.glob("outside/*")
    }
    if check == "load":
        # Invariant: the batches are the set's
        assert_same(batches(url, remote), batches(local))
    else:
        report = verify(url, remote=remote)
        # Invariant: the set in storage is fine: nothing is blamed on it
        assert report.ok, report.problems
    # Invariant: the damaged entries were downloaded again, each once; the others were not
    assert downloads(remote.directory) == Counter({k: 2 if k in again else 1 for k in range(3)})
    # Invariant: nothing outside the cache was removed or changed through a link
    assert {p: p.read_bytes() for p in before} == before
    # Invariant: the cache holds a regular file for each shard now
    mirror = mirror_of(remote, url)
    assert all((mirror / "shards" / f"shard-00000{k}.arrow").is_file() for k in range(3))
    assert not any((mirror / "shards" / f"shard-00000{k}.arrow").is_symlink() for k in range(3))
