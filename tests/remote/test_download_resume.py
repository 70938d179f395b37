"""A shard download cut midway continues from the bytes received, through a fault proxy on real servers.

Claims tested: a shard whose first GET is cut is completed by one ranged GET for exactly the rest
(also where s3fs would split a large object into concurrent ranged GETs: the first try is one
stream); a continuation onto a damaged prefix is caught by the sha256 check and the shard is then
downloaded whole from byte 0; cuts that keep getting further do not use up the retry policy, cuts
that get no further end in RemoteError after its tries; an object replaced between two tries is
never spliced into the cache (the existing "does not match the manifest, twice" error); an HTTP
server that ignores ranges gets a restart from byte 0, never a whole body appended to a prefix.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

import shardload
from shardload.errors import CorruptShardError, RemoteError
from shardload.formats.manifest import ShardInfo
from shardload.remote import RemoteOptions, download
from tests.helpers.faultproxy import FaultProxy, Request
from tests.helpers.servers import S3Server
from tests.remote.test_remote_faults import FAST, proxied
from tests.remote.test_remote_sets import assert_same, batches, downloads, make_set


def gets(proxy: FaultProxy, info: ShardInfo) -> list[Request]:
    """The GETs of shard ``info``'s object that the proxy saw, in order."""
    return [r for r in proxy.requests if r.method == "GET" and r.path.endswith("/" + info.file)]


def only(info: ShardInfo) -> str:
    return re.escape(info.file) + "$"


def shard_of(uploaded: tuple[Path, str], shard: int) -> tuple[Path, str, ShardInfo]:
    """The uploaded set's local copy, its URL and the manifest entry of its shard ``shard``."""
    local, url = uploaded
    return local, url, shardload.open(local).shards[shard]


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [None, 1024], ids=["default", "small-blocks"])
def test_a_cut_get_is_completed_by_one_ranged_get_for_the_rest(
    s3: S3Server, proxy: FaultProxy, uploaded: tuple[Path, str], tmp_path: Path, block_size: int | None
) -> None:
    local, url, info = shard_of(uploaded, 1)
    proxy.inject("truncate", method="GET", path=only(info))
    # a default_block_size below the shard's size: s3fs's get_file would fetch it in concurrent ranged GETs
    extra = {"default_block_size": block_size} if block_size else {}
    remote = proxied(s3, proxy, tmp_path / "cache", **extra)
    assert_same(batches(url, remote), batches(local))
    got = gets(proxy, info)
    half = info.bytes // 2  # what the cut first GET delivered
    assert [(r.fault, r.range) for r in got] == [("truncate", None), (None, f"bytes={half}-{info.bytes - 1}")]
    assert downloads(tmp_path / "cache")[1] == 1


@pytest.mark.slow
def test_a_continuation_onto_a_damaged_prefix_is_downloaded_again_whole(
    s3: S3Server, proxy: FaultProxy, uploaded: tuple[Path, str], tmp_path: Path
) -> None:
    local, url, info = shard_of(uploaded, 1)
    proxy.inject("truncate-corrupt", method="GET", path=only(info))
    assert_same(batches(url, proxied(s3, proxy, tmp_path / "cache")), batches(local))
    got = gets(proxy, info)
    # the damaged half, the rest appended (sha256 mismatch), then the whole shard from byte 0
    assert [r.range_start for r in got] == [None, info.bytes // 2, None]
    (cached,) = (tmp_path / "cache").glob(f"sets/*/*/{info.file}")
    assert cached.read_bytes() == (local / info.file).read_bytes()


@pytest.mark.slow
def test_cuts_that_get_further_do_not_use_up_the_tries(
    s3: S3Server, proxy: FaultProxy, uploaded: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local, url, info = shard_of(uploaded, 1)
    chunk = 256
    monkeypatch.setattr(download, "CHUNK", chunk)  # a continuation reads this shard in several requests
    cuts = FAST.tries + 2  # more cut tries than the policy has tries
    for k in range(cuts):  # GETs 1, 3, 5...: the whole GET, then one chunk into each continuation
        proxy.inject("truncate", method="GET", path=only(info), skip=2 * k)
    assert_same(batches(url, proxied(s3, proxy, tmp_path / "cache")), batches(local))
    got = gets(proxy, info)
    assert [r.fault for r in got].count("truncate") == cuts
    half = info.bytes // 2
    # each continuation starts where the last one stopped: after its one whole chunk
    starts = [r.range_start for r in got if r.fault == "truncate"]
    assert starts == [None] + [half + chunk * k + chunk for k in range(cuts - 1)]
    assert downloads(tmp_path / "cache")[1] == 1


@pytest.mark.slow
def test_cuts_that_get_no_further_end_in_remote_error_after_the_tries(
    s3: S3Server, proxy: FaultProxy, uploaded: tuple[Path, str], tmp_path: Path
) -> None:
    _, url, info = shard_of(uploaded, 2)  # sample 59's
    proxy.inject("truncate", method="GET", path=only(info))
    proxy.inject("drop", method="GET", path=only(info), times=1000)
    ss = shardload.open(url, remote=proxied(s3, proxy, tmp_path / "cache"))
    with pytest.raises(RemoteError, match=rf"downloading shard 2 .* failed {FAST.tries} times; the last error"):
        ss[59]
    got = gets(proxy, info)
    assert got[0].range is None and {r.range_start for r in got[1:]} == {info.bytes // 2}
    # one HEAD per continuation (aiohttp itself sends a GET dropped on a reused connection twice)
    heads = [r for r in proxy.requests if r.method == "HEAD" and r.path.endswith("/" + info.file)]
    assert len(heads) == FAST.tries - 1
    assert not (ss.path / info.file).exists() and not list((ss.path / "shards").glob("*.part"))


@pytest.mark.slow
def test_an_object_replaced_between_two_tries_is_not_spliced(
    s3: S3Server, proxy: FaultProxy, uploaded: tuple[Path, str], tmp_path: Path
) -> None:
    local, url, info = shard_of(uploaded, 2)
    other = bytearray((local / info.file).read_bytes())
    other[-10] ^= 0xFF  # same size, another tail
    (tmp_path / "other.arrow").write_bytes(other)
    proxy.inject("truncate", method="GET", path=only(info))
    proxy.inject("stall", method="HEAD", path=only(info), stall_s=6.0)  # the continuation's open (the upload: ms)

    def replace() -> None:  # while the continuation's HEAD is held back
        deadline = time.monotonic() + 60
        while proxy.hits("stall") == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        s3.upload(tmp_path / "other.arrow", f"{url.removeprefix('s3://' + s3.bucket + '/')}/{info.file}")

    ss = shardload.open(url, remote=proxied(s3, proxy, tmp_path / "cache"))
    thread = threading.Thread(target=replace)
    thread.start()
    try:
        with pytest.raises(CorruptShardError, match=r"does not match the manifest, twice") as err:
            ss[59]
    finally:
        thread.join()
    # the old half with the new rest, then the new object whole: the message names the latter's sha256
    assert [r.range_start for r in gets(proxy, info)] == [None, info.bytes // 2, None]
    assert f"sha256:{hashlib.sha256(other).hexdigest()}" in str(err.value) and info.checksum in str(err.value)
    assert not (ss.path / info.file).exists()


@pytest.mark.slow
@pytest.mark.parametrize("cuts", [1, 1000])
def test_http_without_ranges_restarts_a_cut_download(http_root: tuple[Path, str], tmp_path: Path, cuts: int) -> None:
    root, base = http_root
    local = make_set(tmp_path, n=60, shards=3)
    shutil.copytree(local, root / "set")
    info = shardload.open(local).shards[2]
    with FaultProxy(base) as proxy:
        proxy.inject("truncate", method="GET", path=only(info), times=cuts)
        ss = shardload.open(f"{proxy.url}/set", remote=RemoteOptions(cache_dir=tmp_path / "cache", retry=FAST))
        if cuts == 1:
            assert len(ss[59]["tokens"])
        else:  # every body cut in half: the restarts never get further
            with pytest.raises(RemoteError, match=rf"failed {FAST.tries} times; the last error"):
                ss[59]
        got = gets(proxy, info)
    # one range asked for (answered 200 with the whole body: not appended), then whole GETs only
    assert [r.range_start for r in got][:3] == [None, info.bytes // 2, None]
    assert len(got) == (3 if cuts == 1 else FAST.tries + 1)
    if cuts == 1:
        assert (ss.path / info.file).read_bytes() == (local / info.file).read_bytes()
