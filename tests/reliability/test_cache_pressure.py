"""Separate processes of one node reading one remote set through one bounded node cache (watchdog).

Claims tested: a cache limit that is accepted never deadlocks, whatever the processes of the node pin:
2 and 3 processes, with 0 and 2 loader workers each, at limits from one step's worth upward, all
finish; each one's batches equal its batches of the same set on disk; the cache records its peak size,
which is past the limit only by what the readers hold at once and the downloads under way, and a cache
that went past its limit said so (naming cache_limit) at most once per process. docs/reliability.md,
"Remote sets"; docs/remote.md, "The node cache".
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload.load.prefetch import read_order
from shardload.remote.cache import RemoteSet
from shardload.remote.options import PREFETCH_DOWNLOADS
from tests.distributed.watchdog import python, run_with_watchdog, together
from tests.helpers.servers import S3Server, s3_server
from tests.reliability.cache_pressure_job import PRESSURE_READ
from tests.remote.shared_cache_digest import digest
from tests.remote.test_remote_sets import downloads, make_set, options

JOB = str(Path(__file__).with_name("cache_pressure_job.py"))


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """``rclone serve s3`` on 127.0.0.1 for this module's tests, each under a prefix of its own."""
    with s3_server(tmp_path_factory.mktemp("s3") / "root") as server:
        yield server


def step_bytes(local: Path, world: int) -> int:
    """The most bytes of shards one batch of any rank touches (what a reader holds while it builds one)."""
    ss = shardload.open(local)
    sizes = np.array([s.bytes for s in ss.shards], dtype=np.int64)
    worst = 0
    for rank in range(world):
        plan = shardload.make_loader(local, rank=rank, world_size=world, **PRESSURE_READ).plan_sampler.plan()
        sequence, starts = read_order(plan.sample_ids, plan.batch_offsets, ss.index)
        total = np.concatenate([[0], np.cumsum(sizes[sequence])])
        worst = max(worst, int(np.diff(total[starts]).max()))
    return worst


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workers", "steps"),
    [((0, 0), 1), ((0, 2), 2), ((0, 2), 4), ((0, 2, 2), 2), ((2, 0, 2), 3)],
    ids=["2procs-w00-1step", "2procs-w02-2steps", "2procs-w02-4steps", "3procs-w022-2steps", "3procs-w202-3steps"],
)
def test_processes_sharing_a_tight_cache_all_finish(
    s3: S3Server, tmp_path: Path, workers: tuple[int, ...], steps: int
) -> None:
    local = make_set(tmp_path, n=240, shards=24)
    world = len(workers)
    url = s3.upload(local, f"pressure/{'-'.join(map(str, workers))}-{steps}/set")
    step = step_bytes(local, world)
    limit, readers = steps * step, sum(max(1, w) for w in workers)
    cache, out = tmp_path / "cache", tmp_path / "out"
    out.mkdir()
    cmds = [
        python(JOB, url, str(cache), str(out), str(r), str(world), str(w), str(limit)) for r, w in enumerate(workers)
    ]
    res = run_with_watchdog(together(cmds), timeout=90, env=s3.env())
    # Invariant: an accepted limit never deadlocks: every process finishes, none waits for room that never comes
    assert not res.hung, "the processes hung:\n" + res.tail()
    assert res.returncode == 0, res.tail()
    for r in range(world):
        record = json.loads((out / f"rank{r}.json").read_text())
        want = [digest(b) for b in shardload.make_loader(local, rank=r, world_size=world, **PRESSURE_READ)]
        # Invariant: the batches read through the shared cache are the set's on disk
        assert record["batches"] == want and want, r
    remote = shardload.open(url, remote=options(s3, cache, cache_limit=limit)).remote
    assert remote is not None
    peak = remote.peak_bytes()
    # Invariant: the cache reports its peak size, and a cache that went past its limit said so, once a process
    warned = [line for line in res.output.splitlines() if "cache_limit" in line and "past" in line]
    assert peak > 0, peak
    assert (peak > limit) == bool(warned), (peak, limit, warned)
    assert len(warned) <= readers + world, warned  # once in each process that read (loader workers too)
    # Invariant: past the limit, only by what readers hold at once (a batch built, the next being built)
    # and the downloads under way (one per reader, prefetch_downloads per process)
    largest = max(s.bytes for s in shardload.open(local).shards)
    assert peak <= max(limit, readers * 2 * step + (readers + world * PREFETCH_DOWNLOADS) * largest), peak
    print(f"limit {limit:,} bytes, peak {peak:,} bytes ({peak / limit:.2f} x), {len(warned)} warning(s)")


def test_held_shards_filling_the_limit_let_a_reader_past_it_until_they_are_released(
    s3: S3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Two readers of one node (two RemoteSets: what two processes are to the cache) and a limit of
    # three shards: the first holds three, the second needs two more. Before, the second waited
    # wait_timeout for room that only its own progress could free.
    local = make_set(tmp_path, n=60, shards=6)
    url = s3.upload(local, "pressure/held/set")
    sizes = [s.bytes for s in shardload.open(local).shards]
    limit = sizes[0] + sizes[1] + sizes[2]
    remote = options(s3, tmp_path / "cache", cache_limit=limit, wait_timeout=5.0)
    first, second = (shardload.open(url, remote=remote).remote for _ in range(2))
    assert first is not None and second is not None
    for k in range(3):
        first.acquire(k)
    with caplog.at_level("WARNING", logger="shardload.remote"):
        second.acquire(3)
        second.acquire(4)
    # Invariant: past the limit only by what is held, said once, naming cache_limit and how far it went
    assert [second.cached(k) for k in range(5)] == [True] * 5
    peak = sum(sizes[:5])
    assert second.peak_bytes() == peak
    warned = [r.getMessage() for r in caplog.records if "cache_limit" in r.getMessage()]
    assert len(warned) == 1 and f"({limit:,} bytes) to {sum(sizes[:4]):,} bytes" in warned[0], warned
    # Invariant: once released, shards past the limit are evicted at once, farthest next use first
    for k in range(3):
        first.release(k)
    assert sum(sizes[k] for k in range(6) if second.cached(k)) <= limit
    assert second.cached(3) and second.cached(4)  # still held by the second reader
    second.release(3)
    second.release(4)
    assert sum(sizes[k] for k in range(6) if second.cached(k)) <= limit


def test_a_shard_is_held_from_its_download_so_no_eviction_takes_it_before_the_reader(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reader downloaded a shard, renamed it into place, then locked it: in between, another process
    # making room could evict it, and the reader downloaded it again (8 times in a row: an error saying
    # the cache is too small). Past the limit, with evictions at every release, that gap is hit.
    local = make_set(tmp_path, n=40, shards=4)
    url = s3.upload(local, "pressure/gap/set")
    remote = options(s3, tmp_path / "cache", cache_limit=10 << 20)
    reader, other = (shardload.open(url, remote=remote).remote for _ in range(2))
    assert reader is not None and other is not None
    evicted: list[bool] = []
    orig = RemoteSet._fetch_checked

    def then_evict(self: RemoteSet, shard: int, part: Path, path: Path) -> None:
        orig(self, shard, part, path)
        evicted.append(other._remove_unused(shard))  # another process making room, right after the rename

    monkeypatch.setattr(RemoteSet, "_fetch_checked", then_evict)
    reader.acquire(2)
    # Invariant: the shard is held from its download on: not evicted, downloaded once
    assert evicted == [False] and reader.cached(2)
    assert downloads(tmp_path / "cache") == Counter([2])
