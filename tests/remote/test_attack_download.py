"""Attacks on cut shard downloads and their continuation, against real servers on 127.0.0.1.

A shard download cut midway continues from the bytes already in its ``.part`` file (ranged GETs of
``CHUNK`` bytes); the final size and sha256 check decides. These tests cut it where it hurts (byte
0, the last byte, every request of a continuation, chunk boundaries), change the object between
two tries, answer ranged GETs wrongly, kill the downloading process, and check that the cache ends
with the right bytes or a clear error, and never with a mix of two objects or a ``.part`` left over.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import shardload.remote.download as download
from shardload.errors import CorruptShardError, RemoteError, ShardSetError
from shardload.remote import RemoteOptions, RetryPolicy
from shardload.remote.cache import RemoteSet
from tests.distributed.watchdog import REPO, python, run_with_watchdog, together
from tests.helpers.faultproxy import FaultProxy
from tests.helpers.servers import S3Server
from tests.remote.test_remote_faults import proxied
from tests.remote.test_remote_sets import assert_same, batches, downloads

SHARD = r"shard-000001\.arrow$"
FAST = RetryPolicy(tries=4, base_delay=0.0, max_delay=0.0)


def opened(s3: S3Server, proxy: FaultProxy, url: str, cache: Path, **kw: Any) -> RemoteSet:
    """The set at ``url``, opened through ``proxy`` (FAST retries unless ``retry=`` says otherwise)."""
    base = proxied(s3, proxy, cache)
    options = RemoteOptions(storage_options=base.storage_options, cache_dir=cache, retry=kw.pop("retry", FAST), **kw)
    rs = RemoteSet(url, options)
    rs.open()
    return rs


def same(rs: RemoteSet, local: Path, shard: int = 1) -> bool:
    """Whether shard ``shard`` is in the cache with exactly the bytes of the local set's."""
    assert rs.manifest is not None
    file = rs.manifest.shards[shard].file
    return (rs.mirror / file).read_bytes() == (local / file).read_bytes()


def gets(proxy: FaultProxy) -> list[int | None]:
    """The first byte each GET of shard 1 asked for (``None``: a whole GET), in order."""
    return [r.range_start for r in proxy.requests if r.method == "GET" and r.path.endswith("shard-000001.arrow")]


def leftovers(rs: RemoteSet) -> list[Path]:
    return sorted(rs.mirror.rglob("*.part"))


@pytest.fixture
def target(uploaded: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str, int]:
    """(the local set, its URL, shard 1's size), ``CHUNK`` a quarter of shard 1 (a continuation takes several GETs)."""
    local, url = uploaded
    size = sorted((local / "shards").glob("*.arrow"))[1].stat().st_size
    monkeypatch.setattr(download, "CHUNK", size // 4)
    return local, url, size


@pytest.mark.parametrize("keep", [-1, 0], ids=["cut-before-the-last-byte", "cut-before-the-first-byte"])
def test_a_cut_on_the_last_or_the_first_byte(
    s3: S3Server, proxy: FaultProxy, target: tuple[Path, str, int], tmp_path: Path, keep: int
) -> None:
    """One byte missing: one ranged GET of one byte; nothing received: a whole GET again."""
    local, url, size = target
    proxy.inject("truncate", method="GET", path=SHARD, keep=keep)
    rs = opened(s3, proxy, url, tmp_path / "cache")
    assert rs.download(1, urgent=True)
    assert same(rs, local)
    assert gets(proxy) == [None, size - 1 if keep == -1 else None]
    assert leftovers(rs) == []


@pytest.mark.parametrize("extra", [0, 1])
def test_a_shard_of_exactly_chunk_or_chunk_plus_one_bytes(
    s3: S3Server,
    proxy: FaultProxy,
    target: tuple[Path, str, int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    extra: int,
) -> None:
    local, url, size = target
    chunk = (size - extra) // 2  # the continuation from the middle reads exactly CHUNK, or CHUNK + 1 bytes
    monkeypatch.setattr(download, "CHUNK", size - chunk - extra)
    proxy.inject("truncate", method="GET", path=SHARD, keep=chunk)
    rs = opened(s3, proxy, url, tmp_path / "cache")
    assert rs.download(1, urgent=True)
    assert same(rs, local)
    starts = gets(proxy)
    assert starts[0] is None and starts[1] == chunk and len(starts) == 2 + extra


def test_cuts_on_every_request_of_a_continuation_end_in_remote_error(
    s3: S3Server, proxy: FaultProxy, target: tuple[Path, str, int], tmp_path: Path
) -> None:
    _local, url, size = target
    proxy.inject("truncate", method="GET", path=SHARD, times=1000)
    rs = opened(s3, proxy, url, tmp_path / "cache")
    with pytest.raises(RemoteError, match=r"downloading shard 1 \(s3://.*shard-000001\.arrow\) failed 4 times"):
        rs.download(1, urgent=True)
    starts = gets(proxy)
    assert starts[0] is None and starts[1:] == [size // 2] * 3  # no chunk ever completes: no progress after the first
    assert not rs.cached(1) and leftovers(rs) == []


def test_no_retry_policy_fails_a_cut_download_at_once(
    s3: S3Server, proxy: FaultProxy, target: tuple[Path, str, int], tmp_path: Path
) -> None:
    _, url, _ = target
    proxy.inject("truncate", method="GET", path=SHARD, times=1000)
    rs = opened(s3, proxy, url, tmp_path / "cache", retry=RetryPolicy(tries=1))
    with pytest.raises(RemoteError, match=r"failed 1 time;"):
        rs.download(1, urgent=True)
    assert gets(proxy) == [None]
    assert leftovers(rs) == []


def test_a_proxy_ignoring_ranges_gets_a_restart_from_byte_0(
    s3: S3Server, proxy: FaultProxy, target: tuple[Path, str, int], tmp_path: Path
) -> None:
    local, url, size = target
    proxy.inject("truncate", method="GET", path=SHARD)  # the first (whole) GET
    proxy.inject("ignore-range", method="GET", path=SHARD, skip=1)  # the continuation gets 200 and the whole body
    proxy.inject("truncate", method="GET", path=SHARD, skip=2)  # the restart is cut too
    rs = opened(s3, proxy, url, tmp_path / "cache")
    assert rs.download(1, urgent=True)
    assert same(rs, local)
    assert gets(proxy) == [None, size // 2, None, None]  # after a server ignored a range, no range is asked again


def test_a_206_of_the_wrong_range_is_never_kept(
    s3: S3Server, proxy: FaultProxy, target: tuple[Path, str, int], tmp_path: Path
) -> None:
    """A proxy answering every ranged GET with the object's first bytes, and cutting whole GETs twice.

    The continuation appends wrong bytes of the right length: only the sha256 can tell. The second
    download must not trust ranges again, or the shard is reported as damaged in storage, twice.
    """
    local, url, _size = target
    proxy.inject("wrong-range", method="GET", path=SHARD, times=1000, ranged=True)
    proxy.inject("truncate", method="GET", path=SHARD, times=2, ranged=False)
    rs = opened(s3, proxy, url, tmp_path / "cache")
    assert rs.download(1, urgent=True)
    assert same(rs, local)
    assert proxy.hits("wrong-range") >= 1 and proxy.hits("truncate") == 2
    assert leftovers(rs) == []


def replace_object(s3: S3Server, url: str, data: bytes, tmp_path: Path) -> None:
    """Put ``data`` as the object at ``url`` through the S3 API."""
    tmp = tmp_path / "replacement"
    tmp.write_bytes(data)
    s3.filesystem().put_file(str(tmp), url.removeprefix("s3://"))


@pytest.mark.parametrize("change", ["same size", "longer", "shorter", "deleted"])
def test_the_object_changed_between_the_cut_try_and_its_continuation(
    s3: S3Server,
    proxy: FaultProxy,
    target: tuple[Path, str, int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: str,
) -> None:
    local, url, _size = target
    rs = opened(s3, proxy, url, tmp_path / "cache")
    shard_url = rs.shard_url(1)
    original = (local / rs.manifest.shards[1].file).read_bytes()  # type: ignore[union-attr]
    new = {"same size": original[::-1], "longer": original + b"x", "shorter": original[:-1], "deleted": b""}[change]
    tries = download._Download.attempt

    def attempt(job: download._Download) -> None:
        if job.tries == 1:  # between the cut first try and the next
            if change == "deleted":
                s3.filesystem().rm_file(shard_url.removeprefix("s3://"))
            else:
                replace_object(s3, shard_url, new, tmp_path)
        tries(job)

    monkeypatch.setattr(download._Download, "attempt", attempt)
    proxy.inject("truncate", method="GET", path=SHARD)
    with pytest.raises(CorruptShardError) as err:
        rs.download(1, urgent=True)
    text = str(err.value)
    assert shard_url in text and f"shardload verify {url}" in text
    if change == "deleted":
        assert "is missing from storage" in text
    elif change == "same size":
        assert f"it is sha256:{hashlib.sha256(new).hexdigest()}" in text  # the new object, whole, not a mix
    else:
        assert f"it is {len(new)} bytes" in text
        assert [s for s in gets(proxy) if s is not None] == []  # a size not the manifest's: no range asked
    assert not rs.cached(1) and leftovers(rs) == []


def test_a_link_giving_one_more_byte_per_try_does_not_reset_the_count_each_time(
    s3: S3Server, proxy: FaultProxy, target: tuple[Path, str, int], tmp_path: Path
) -> None:
    """A server ignoring ranges behind a link cut one byte later on each try: every try gets further.

    Were each byte of progress a reason to start the policy's count afresh, ``tries`` would bound
    nothing: a 256 MiB shard could take 268 million tries. Progress is counted in chunks instead, so
    the tries are at most ``tries * (size / CHUNK + 2)``.
    """
    _, url, size = target
    policy = RetryPolicy(tries=2, base_delay=0.0, max_delay=0.0)
    proxy.inject("ignore-range", method="GET", path=SHARD, times=1000, ranged=True)
    for k in range(60):
        proxy.inject("truncate", method="GET", path=SHARD, ranged=False, skip=k, keep=100 + k)
    rs = opened(s3, proxy, url, tmp_path / "cache", retry=policy)
    with pytest.raises(RemoteError, match="failed 2 times"):
        rs.download(1, urgent=True)
    whole = [s for s in gets(proxy) if s is None]
    assert len(whole) <= policy.tries * (size // download.CHUNK + 2) < 60
    assert leftovers(rs) == []


_READER = """
import hashlib, json, sys
import shardload.remote.download as download
from shardload.remote import RemoteOptions, RetryPolicy
from shardload.remote.cache import RemoteSet
url, storage, cache, chunk = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
download.CHUNK = chunk
rs = RemoteSet(url, RemoteOptions(storage_options=storage, cache_dir=cache, retry=RetryPolicy(4, 0.0, 0.0)))
rs.open()
path = rs.acquire(1)
print("sha256:" + hashlib.sha256(path.read_bytes()).hexdigest(), flush=True)
"""


def reader(url: str, rs: RemoteSet) -> list[str]:
    """A command reading shard 1 of ``url`` through the cache and options of ``rs``, printing its sha256."""
    storage = json.dumps(rs.options.storage_options)
    return python("-c", _READER, url, storage, str(rs.options.directory), str(download.CHUNK))


@pytest.mark.slow
def test_two_processes_and_a_cut_download_one_downloads_both_read_the_right_bytes(
    s3: S3Server, proxy: FaultProxy, target: tuple[Path, str, int], tmp_path: Path
) -> None:
    _, url, size = target
    rs = opened(s3, proxy, url, tmp_path / "cache")
    proxy.inject("truncate", method="GET", path=SHARD, ranged=False)
    proxy.inject("stall", method="GET", path=SHARD, ranged=True, stall_s=1.5)  # the other one arrives meanwhile
    proxy.inject("truncate", method="GET", path=SHARD, ranged=True, skip=1)
    out = run_with_watchdog(together([reader(url, rs), reader(url, rs)]), timeout=60)
    assert out.returncode == 0, out.tail()
    want = rs.manifest.shards[1].checksum  # type: ignore[union-attr]
    assert re.findall(r"^sha256:\w+$", out.output, re.M) == [want, want]
    assert downloads(tmp_path / "cache")[1] == 1
    starts = gets(proxy)
    assert starts.count(None) == 1 and size // 2 in starts  # one whole GET, continued
    assert leftovers(rs) == []


def test_a_process_killed_mid_continuation_leaves_nothing_the_next_reader_trips_on(
    s3: S3Server, proxy: FaultProxy, target: tuple[Path, str, int], tmp_path: Path
) -> None:
    local, url, size = target
    rs = opened(s3, proxy, url, tmp_path / "cache")
    proxy.inject("truncate", method="GET", path=SHARD, ranged=False)
    proxy.inject("stall", method="GET", path=SHARD, ranged=True, stall_s=30)
    victim = subprocess.Popen(reader(url, rs), env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 30
        while size // 2 not in gets(proxy):  # the continuation has started
            assert victim.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        part = rs._path(1).with_name(f".{rs._path(1).name}.{victim.pid}.part")
        assert part.stat().st_size == size // 2
        victim.send_signal(signal.SIGKILL)
    finally:
        victim.kill()
        victim.wait()
    assert rs.download(1, urgent=True)
    assert same(rs, local)
    assert leftovers(rs) == []


@pytest.mark.slow
def test_a_growing_part_keeps_its_room_in_a_full_cache(
    s3: S3Server, proxy: FaultProxy, target: tuple[Path, str, int], tmp_path: Path
) -> None:
    """With room for one shard, a prefetch of another shard while shard 1's continuation runs finds none."""
    local, url, size = target
    sizes = [p.stat().st_size for p in sorted((local / "shards").glob("*.arrow"))]
    rs = opened(s3, proxy, url, tmp_path / "cache", cache_limit=max(sizes), wait_timeout=0.5)
    proxy.inject("truncate", method="GET", path=SHARD, ranged=False)
    proxy.inject("stall", method="GET", path=SHARD, ranged=True, stall_s=8)  # the checks below take well under 8 s
    other = subprocess.Popen(reader(url, rs), env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while size // 2 not in gets(proxy):
            assert other.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        assert not rs.download(0, urgent=False)  # the part being continued holds the room
        with pytest.raises(ShardSetError, match="is full"):
            rs.download(0, urgent=True)
        assert other.wait(30) == 0
    finally:
        other.kill()
        other.wait()
    assert rs.cached(1) and leftovers(rs) == []
    assert rs.download(0, urgent=True) and not rs.cached(1)  # shard 1 is no longer in use: evicted
    assert sum(p.stat().st_size for p in rs.mirror.rglob("*.arrow")) <= max(sizes)


def test_the_loader_with_two_workers_through_cut_downloads_gives_the_local_batches(
    s3: S3Server, proxy: FaultProxy, target: tuple[Path, str, int], tmp_path: Path
) -> None:
    local, url, _ = target
    shard_get = r"shards/shard-\d+\.arrow$"
    proxy.inject("truncate", method="GET", path=shard_get, ranged=False, times=4)
    proxy.inject("truncate", method="GET", path=shard_get, ranged=True, times=2)
    remote = opened(s3, proxy, url, tmp_path / "cache").options
    assert_same(batches(url, remote, num_workers=2), batches(local))
    assert proxy.hits("truncate") >= 4
    assert [r for r in proxy.requests if r.range_start and "/shards/" in r.path] != []  # cuts were continued


def test_an_http_server_without_ranges_behind_a_cutting_link_gets_a_restart(
    http_root: tuple[Path, str], uploaded: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python's http.server answers a ranged GET with 200 and the whole body: never appended to the part."""
    local, _ = uploaded
    root, base = http_root
    shutil.copytree(local, root / "set")
    size = sorted((local / "shards").glob("*.arrow"))[1].stat().st_size
    monkeypatch.setattr(download, "CHUNK", size // 4)
    with FaultProxy(base) as proxy:
        proxy.inject("truncate", method="GET", path=SHARD, ranged=False)
        rs = RemoteSet(f"{proxy.url}/set", RemoteOptions(cache_dir=tmp_path / "cache", retry=FAST))
        rs.open()
        assert rs.download(1, urgent=True)
        assert same(rs, local)
        starts = gets(proxy)
    assert starts == [None, size // 2, None]  # the cut whole GET, the range answered 200, the restart
    assert leftovers(rs) == []


def test_a_link_cutting_every_response_longer_than_a_third_of_a_chunk_still_finishes(
    s3: S3Server, proxy: FaultProxy, target: tuple[Path, str, int], tmp_path: Path
) -> None:
    """A link (a NAT, a proxy) that cuts every response after fewer bytes than a chunk.

    A ranged GET cut midway appends nothing (its body is read whole): with a fixed chunk no
    continuation could ever get further, and the download failed where ranges of fewer bytes pass.
    """
    local, url, _ = target
    carried = download.CHUNK // 3
    proxy.inject("truncate", method="GET", path=SHARD, ranged=False, keep=carried)
    proxy.inject("truncate", method="GET", path=SHARD, ranged=True, keep=carried, times=1000)
    rs = opened(s3, proxy, url, tmp_path / "cache")
    assert rs.download(1, urgent=True)
    assert same(rs, local)
    asked = [r.range for r in proxy.requests if r.range is not None and r.path.endswith("shard-000001.arrow")]
    lengths = [int(b) - int(a) + 1 for a, b in (x.removeprefix("bytes=").split("-") for x in asked)]
    assert lengths[0] == download.CHUNK and min(lengths) <= carried  # halved until a read passes the link
    assert leftovers(rs) == []
